// The web chat UI in headless Chromium (playwright-core + Debian's /usr/bin/chromium) against
// `hearth serve --fake-engine`: send a message, watch the streamed reply, stop a slow one, and make
// sure model text is rendered as text. Screenshots go to $HEARTH_E2E_OUT. Run by ctest as e2e_web_ui.
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

test('send a message and see the streamed reply', async () => {
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(server.url + '/');
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

test('stop button aborts a long reply', async () => {
  const page = await context.newPage();
  await page.goto(server.url + '/');
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
  await page.close();
});

test('model output is rendered as text, never as HTML', async () => {
  const page = await context.newPage();
  let dialogs = 0;
  page.on('dialog', async (d) => { dialogs++; await d.dismiss(); });
  await page.goto(server.url + '/');
  const evil = '<img src=x onerror="alert(1)"><b>bold</b>';
  await page.fill('#input', 'emit:' + evil);
  await page.click('#send');
  await page.waitForFunction(() => document.getElementById('status').textContent.startsWith('finish'));
  assert.equal(await page.locator('.msg.assistant .body').last().textContent(), evil);
  assert.equal(await page.locator('#messages img').count(), 0);
  assert.equal(await page.locator('#messages b').count(), 0);
  assert.equal(dialogs, 0);
  await page.screenshot({ path: path.join(outDir, 'web_ui_text_only.png') });
  await page.close();
});

test('adapter picker lists mounted adapters and sends the choice', async () => {
  const lora = new URL('../golden/lora/llama_mha/', import.meta.url).pathname;
  const real = await startServer(['--model', tinyModelWithTemplate('llama_mha'), '--device', 'cpu', '--adapter', `tuned=${lora}`]);
  const page = await context.newPage();
  try {
    const sent = [];
    page.on('request', (r) => { if (r.url().endsWith('/v1/chat/completions')) sent.push(JSON.parse(r.postData())); });
    await page.goto(real.url + '/');
    await page.waitForFunction(() => [...document.querySelectorAll('#adapter option')].some((o) => o.value === 'tuned'));
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
