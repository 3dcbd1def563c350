// The web chat UI in headless Chromium (playwright-core + Debian's /usr/bin/chromium) against
// `hearth serve --fake-engine`: streamed replies, stop, failed turns left out of the history, empty
// answers, Markdown, thinking, reload, API key, and model text that never becomes HTML.
// Screenshots go to $HEARTH_E2E_OUT. Run by ctest as e2e_web_ui.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, npmPackage, tinyModelWithTemplate } from './serve_helper.mjs';

const { chromium } = npmPackage('playwright-core');
const executablePath = process.env.HEARTH_CHROMIUM || '/usr/bin/chromium';
const outDir = process.env.HEARTH_E2E_OUT || fs.mkdtempSync(path.join(os.tmpdir(), 'hearth-e2e-'));
let server;
let context;
let userDataDir;

before(async () => {
  if (!fs.existsSync(executablePath)) throw new Error(`${executablePath} not found: run scripts/setup (installs chromium)`);
  fs.mkdirSync(outDir, { recursive: true });
  server = await startServer(['--fake-delay-ms', '15']);
  userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'hearth-chromium-'));
  context = await chromium.launchPersistentContext(userDataDir, {
    executablePath,
    headless: true,
    viewport: { width: 1100, height: 700 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
});

after(async () => {
  if (context) await context.close();
  if (userDataDir) fs.rmSync(userDataDir, { recursive: true, force: true });
  if (server) assert.equal((await server.stop()).code, 0);
});

// A page on `url` with no stored conversation or system prompt (the tests share the context's
// localStorage).
async function freshPage(url = server.url) {
  const page = await context.newPage();
  await page.goto(url + '/');
  await page.evaluate(() => { localStorage.removeItem('hearth.chat'); localStorage.removeItem('hearth.system'); });
  await page.reload();
  return page;
}

// The JSON bodies the page sends to /v1/chat/completions, in order.
function recordRequests(page) {
  const sent = [];
  page.on('request', (r) => { if (r.url().endsWith('/v1/chat/completions')) sent.push(JSON.parse(r.postData())); });
  return sent;
}

// Types `text`, sends it and waits until that turn has ended (reply done, failed or stopped).
async function sendAndWait(page, text) {
  const n = await page.locator('.msg.assistant').count();
  await page.fill('#input', text);
  await page.click('#send');
  await page.waitForFunction((k) => document.querySelectorAll('.msg.assistant').length === k &&
    !document.getElementById('send').disabled, n + 1);
  return page.locator('.msg.assistant').last();
}

test('send a message and see the streamed reply', async () => {
  const page = await freshPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.waitForFunction(() => document.getElementById('model').textContent.includes('fake-model'));
  await page.fill('#system', 'You are terse.');
  await page.fill('#input', 'hello streaming world from the browser');
  // Record how the reply grows, to see it arrive in pieces rather than all at once.
  await page.evaluate(() => {
    window.__lengths = [];
    new MutationObserver(() => {
      const b = document.querySelector('.msg.assistant .body');
      if (b) window.__lengths.push(b.textContent.length);
    }).observe(document.getElementById('messages'), { subtree: true, childList: true, characterData: true });
  });
  await page.click('#send');
  const reply = page.locator('.msg.assistant .body').last();
  await reply.waitFor();
  await page.waitForFunction(() => document.getElementById('status').textContent.startsWith('finish'));
  assert.equal(await reply.textContent(), 'hello streaming world from the browser');
  assert.match(await page.textContent('#status'), /finish: stop · 7 tokens/);
  const lengths = await page.evaluate(() => window.__lengths);
  assert.ok(new Set(lengths).size >= 3, `reply grew in steps: ${JSON.stringify(lengths)}`);
  await page.screenshot({ path: path.join(outDir, 'web_ui_chat.png') });
  // A second turn carries the conversation.
  await page.fill('#input', 'second turn');
  await page.press('#input', 'Enter');
  await page.waitForFunction(() => document.querySelectorAll('.msg.assistant').length === 2 &&
    document.getElementById('status').textContent.startsWith('finish'));
  assert.equal(await page.locator('.msg.assistant .body').nth(1).textContent(), 'second turn');
  assert.deepEqual(errors, []);
  await page.close();
});

test('stop button aborts a long reply, which is marked and left out of the history', async () => {
  const page = await freshPage();
  const sent = recordRequests(page);
  await page.fill('#input', 'emit:' + 'long reply '.repeat(60));
  await page.click('#send');
  const reply = page.locator('.msg.assistant .body').last();
  await page.waitForFunction(() => (document.querySelector('.msg.assistant .body')?.textContent.length ?? 0) > 10);
  await page.click('#stop');
  await page.waitForFunction(() => document.getElementById('status').textContent === 'stopped');
  const len = (await reply.textContent()).length;
  assert.ok(len > 0 && len < 600, `partial reply kept (${len} chars)`);
  assert.equal(await page.isDisabled('#stop'), true);
  assert.equal(await page.isEnabled('#send'), true);
  assert.match(await page.locator('.msg.assistant .note.error').last().textContent(), /^Stopped — this turn is not kept/);
  assert.equal(await page.locator('.msg.assistant.error').count(), 1);
  await sendAndWait(page, 'after the stop');
  assert.deepEqual(sent[1].messages, [{ role: 'user', content: 'after the stop' }]);
  await page.close();
});

test('failed turns (HTTP error, error mid-stream, network error) are shown and not sent again', async () => {
  const page = await freshPage();
  const sent = recordRequests(page);
  await sendAndWait(page, 'first turn');
  // HTTP 400 before streaming.
  let reply = await sendAndWait(page, 'say __bad_prompt__ please');
  assert.match(await reply.locator('.note.error').textContent(), /^Error: prompt: contains __bad_prompt__.*not kept/);
  assert.equal(await page.textContent('#status'), 'error');
  // An error event after the first streamed token: the partial text stays visible, marked.
  reply = await sendAndWait(page, 'now __fail_generate__ midway');
  assert.equal(await reply.locator('.body').textContent(), 'now');
  assert.match(await reply.locator('.note.error').textContent(), /^Error: .*not kept/);
  // The network fails.
  await page.route('**/v1/chat/completions', (r) => r.abort('connectionreset'));
  reply = await sendAndWait(page, 'lost on the wire');
  await page.unroute('**/v1/chat/completions');
  assert.match(await reply.locator('.note.error').textContent(), /^Error: network error/);
  assert.equal(await page.locator('.msg.assistant.error').count(), 3);
  assert.equal(await page.locator('.msg.user.failed').count(), 3);
  await page.screenshot({ path: path.join(outDir, 'web_ui_errors.png') });
  // The next turn carries only the turns that worked.
  await sendAndWait(page, 'last turn');
  assert.deepEqual(sent.at(-1).messages, [
    { role: 'user', content: 'first turn' }, { role: 'assistant', content: 'first turn' },
    { role: 'user', content: 'last turn' }]);
  assert.equal(await page.locator('.msg.assistant').last().locator('.body').textContent(), 'last turn');
  await page.close();
});

test('an empty answer says so, with the finish reason', async () => {
  const page = await freshPage();
  const sent = recordRequests(page);
  const reply = await sendAndWait(page, 'emit:');
  assert.equal(await reply.locator('.body').textContent(), '');
  assert.equal(await reply.locator('.note').isVisible(), true);
  assert.equal(await reply.locator('.note').textContent(), 'The model returned no text (finish reason: stop).');
  assert.equal(await reply.evaluate((d) => d.classList.contains('error')), false);
  // The empty answer is a real turn: it is kept (as "") and the conversation goes on.
  await sendAndWait(page, 'and now words');
  assert.deepEqual(sent.at(-1).messages.slice(0, 2), [{ role: 'user', content: 'emit:' }, { role: 'assistant', content: '' }]);
  await page.close();
});

test('Markdown renders: paragraphs, emphasis, lists, inline and fenced code, safe links', async () => {
  const page = await freshPage();
  // " 2." under "1. first" is its sibling (CommonMark: indented less than the item's content).
  const md = ['Intro with **bold**, *em* and `x < y`.', '', '- one', '- two', '', '1. first', ' 2. second', '',
    '```cpp', 'int main() { return a<b>c; }', '```', '',
    'See [the docs](https://example.com/docs) and [bad](javascript:alert(1)).'].join('\n');
  const reply = await sendAndWait(page, 'emit:' + md);
  const body = reply.locator('.body');
  assert.equal(await body.locator('p strong').textContent(), 'bold');
  assert.equal(await body.locator('p em').textContent(), 'em');
  assert.equal(await body.locator('p code').first().textContent(), 'x < y');
  assert.deepEqual(await body.locator('ul > li').allTextContents(), ['one', 'two']);
  assert.deepEqual(await body.locator('ol > li').allTextContents(), ['first', 'second']);
  assert.equal(await body.locator('ol ol').count(), 0);
  assert.equal(await body.locator('pre > code.language-cpp').textContent(), 'int main() { return a<b>c; }');
  assert.equal(await body.locator('b').count(), 0);
  const links = body.locator('a');
  assert.equal(await links.count(), 1);
  assert.equal(await links.getAttribute('href'), 'https://example.com/docs');
  assert.match(await links.getAttribute('rel'), /noopener/);
  assert.match(await body.locator('p').last().textContent(), /\[bad\]\(javascript:alert\(1\)\)/);
  await page.screenshot({ path: path.join(outDir, 'web_ui_markdown.png') });
  await page.close();
});

test('the conversation survives a reload; New chat clears it', async () => {
  const page = await freshPage();
  const sent = recordRequests(page);
  await sendAndWait(page, 'remember me');
  await sendAndWait(page, 'emit:**kept** answer');
  await page.reload();
  await page.waitForFunction(() => document.querySelectorAll('.msg').length === 4);
  assert.deepEqual(await page.locator('.msg .body').allTextContents(), ['remember me', 'remember me', 'emit:**kept** answer', 'kept answer']);
  assert.equal(await page.locator('.msg.assistant strong').textContent(), 'kept');
  await sendAndWait(page, 'third');
  assert.deepEqual(sent.at(-1).messages.map((m) => m.content), ['remember me', 'remember me', 'emit:**kept** answer', '**kept** answer', 'third']);
  await page.click('#clear');
  assert.equal(await page.locator('.msg').count(), 0);
  await page.reload();
  await page.waitForFunction(() => document.getElementById('model').textContent.includes('fake-model'));
  assert.equal(await page.locator('.msg').count(), 0);
  await page.close();
});

test('reasoning_content is shown in a collapsible thinking block', async () => {
  const thinker = await startServer(['--fake-think-tags']);
  const page = await freshPage(thinker.url);
  try {
    const reply = await sendAndWait(page, 'emit:<think>pondering <b>deeply</b></think>The **answer**.');
    const details = reply.locator('details.thinking');
    assert.equal(await details.isVisible(), true);
    assert.equal(await details.evaluate((d) => d.open), false);
    assert.equal(await details.locator('summary').textContent(), 'thinking');
    await details.locator('summary').click();
    assert.equal(await details.locator('.thinking-body').textContent(), 'pondering <b>deeply</b>');
    assert.equal(await reply.locator('.body').textContent(), 'The answer.');
    assert.equal(await reply.locator('b').count(), 0);
    // Cut by max_tokens while still thinking: no answer, and the note says why.
    await page.fill('#max-tokens', '5');
    const only = await sendAndWait(page, 'emit:<think>just thinking, never answering');
    assert.equal(await only.locator('.thinking-body').textContent(), 'just thi');
    assert.equal(await only.locator('.note').textContent(), 'The model returned no answer text, only thinking (finish reason: length).');
    await page.screenshot({ path: path.join(outDir, 'web_ui_thinking.png') });
  } finally {
    await page.close();
    assert.equal((await thinker.stop()).code, 0);
  }
});

test('model output is rendered as text, never as HTML', async () => {
  const page = await freshPage();
  let dialogs = 0;
  page.on('dialog', async (d) => { dialogs++; await d.dismiss(); });
  const evil = '<img src=x onerror="alert(1)"><b>bold</b>';
  await page.fill('#input', 'emit:' + evil);
  await page.click('#send');
  await page.waitForFunction(() => document.getElementById('status').textContent.startsWith('finish'));
  assert.equal(await page.locator('.msg.assistant .body').last().textContent(), evil);
  assert.equal(await page.locator('#messages img').count(), 0);
  assert.equal(await page.locator('#messages b').count(), 0);
  assert.equal(dialogs, 0);
  await page.screenshot({ path: path.join(outDir, 'web_ui_text_only.png') });
  // Stored and rendered again after a reload: still text.
  await page.reload();
  await page.waitForFunction(() => document.querySelectorAll('.msg.assistant').length === 1);
  assert.equal(await page.locator('.msg.assistant .body').textContent(), evil);
  assert.equal(await page.locator('#messages img').count(), 0);
  // Markdown constructs do not open a way in either: code, link text, emphasis stay text.
  const md = 'emit:`<img src=x onerror=alert(2)>` **<img src=x onerror=alert(3)>** [<img src=x onerror=alert(4)>](https://e.x)';
  await sendAndWait(page, md);
  assert.equal(await page.locator('#messages img').count(), 0);
  assert.equal(await page.locator('.msg.assistant code').last().textContent(), '<img src=x onerror=alert(2)>');
  assert.equal(await page.locator('.msg.assistant a').last().textContent(), '<img src=x onerror=alert(4)>');
  assert.equal(dialogs, 0);
  await page.close();
});

test('an API key entered on the page unlocks the model and adapter picker without a reload', async () => {
  const lora = new URL('../golden/lora/llama_mha/', import.meta.url).pathname;
  const real = await startServer(['--model', tinyModelWithTemplate('llama_mha'), '--device', 'cpu', '--adapter', `tuned=${lora}`,
    '--api-key', 'e2e-secret']);
  const page = await freshPage(real.url);
  try {
    const sent = recordRequests(page);
    // Without the key: the page says why, and the picker stays off.
    await page.waitForFunction(() => document.getElementById('model').textContent.startsWith('model unavailable'));
    assert.match(await page.textContent('#model'), /API key/);
    assert.equal(await page.isDisabled('#adapter'), true);
    // Type the key: no reload, no Enter.
    await page.fill('#api-key', 'e2e-secret');
    await page.waitForFunction(() => [...document.querySelectorAll('#adapter option')].some((o) => o.value === 'tuned'));
    await page.waitForFunction(() => !document.getElementById('model').textContent.startsWith('model unavailable'));
    assert.equal(await page.isEnabled('#adapter'), true);
    await page.selectOption('#adapter', 'tuned');
    await page.fill('#max-tokens', '8');
    await page.fill('#input', 'hello');
    await page.click('#send');
    await page.waitForFunction(() => document.getElementById('status').textContent.startsWith('finish'));
    assert.equal(sent.length, 1);
    assert.equal(sent[0].adapter, 'tuned');
    assert.match(await page.textContent('#status'), /finish: (length|stop)/);
  } finally {
    await page.close();
    assert.equal((await real.stop()).code, 0);
  }
});
