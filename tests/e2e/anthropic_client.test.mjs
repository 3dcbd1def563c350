// The official `@anthropic-ai/sdk` client against `hearth serve --fake-engine`: messages.create
// (plain and streamed, through the SDK's stream helper), stop sequences, a tool_use round trip,
// countTokens, errors as the SDK's error classes, x-api-key auth; then against the real engine on a
// tiny model (greedy: the streamed text equals the plain one). Run by ctest as e2e_anthropic_client.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, npmPackage, tinyModelWithTemplate } from './serve_helper.mjs';

const sdk = npmPackage('@anthropic-ai/sdk');
const Anthropic = sdk.Anthropic ?? sdk.default;
let server;
let client;

before(async () => {
  server = await startServer();
  client = new Anthropic({ baseURL: server.url, apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  const { code } = await server.stop();
  assert.equal(code, 0, 'hearth serve exits 0 on SIGTERM');
});

test('messages.create, plain', async () => {
  const m = await client.messages.create({
    model: 'fake-model', max_tokens: 64, system: 'sys', messages: [{ role: 'user', content: 'hello from node' }],
  });
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg_/);
  assert.equal(m.model, 'fake-model');
  assert.deepEqual(m.content, [{ type: 'text', text: 'hello from node' }]);
  assert.equal(m.stop_reason, 'end_turn');
  assert.equal(m.stop_sequence, null);
  // "system: sys\nuser: hello from node\nassistant:" = 7 fake tokens; 3 words + EOS.
  assert.equal(m.usage.input_tokens, 7);
  assert.equal(m.usage.output_tokens, 4);
});

test('messages.create, streamed through the SDK stream helper', async () => {
  const stream = client.messages.stream({ model: 'fake-model', max_tokens: 64, messages: [{ role: 'user', content: 'one two three' }] });
  const types = [];
  let text = '';
  stream.on('streamEvent', (e) => types.push(e.type));
  stream.on('text', (t) => { text += t; });
  const final = await stream.finalMessage();
  assert.equal(text, 'one two three');
  assert.deepEqual(final.content, [{ type: 'text', text: 'one two three' }]);
  assert.equal(final.stop_reason, 'end_turn');
  assert.equal(final.usage.output_tokens, 4);
  assert.equal(types[0], 'message_start');
  assert.equal(types.at(-1), 'message_stop');
  assert.equal(types.at(-2), 'message_delta');
  // And as raw events with stream: true.
  const raw = await client.messages.create({ model: 'fake-model', max_tokens: 64, stream: true, messages: [{ role: 'user', content: 'a b' }] });
  const seen = [];
  for await (const e of raw) seen.push(e.type);
  assert.deepEqual(seen, ['message_start', 'content_block_start', 'content_block_delta', 'content_block_delta',
    'content_block_stop', 'message_delta', 'message_stop']);
});

test('stop sequences and max_tokens', async () => {
  const s = await client.messages.create({
    model: 'fake-model', max_tokens: 64, stop_sequences: ['\n'], messages: [{ role: 'user', content: 'emit:first line\nsecond' }],
  });
  assert.equal(s.content[0].text, 'first line');
  assert.equal(s.stop_reason, 'stop_sequence');
  assert.equal(s.stop_sequence, '\n');
  const l = await client.messages.create({ model: 'fake-model', max_tokens: 2, messages: [{ role: 'user', content: 'a b c d' }] });
  assert.equal(l.content[0].text, 'a b');
  assert.equal(l.stop_reason, 'max_tokens');
});

const tools = [{
  name: 'get_weather', description: 'Weather for a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
}];
const toolCallText = 'emit:<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>';

test('tool_use round trip, plain and streamed', async () => {
  const messages = [{ role: 'user', content: toolCallText }];
  const r1 = await client.messages.create({ model: 'fake-model', max_tokens: 64, messages, tools });
  assert.equal(r1.stop_reason, 'tool_use');
  assert.equal(r1.content.length, 1);
  const use = r1.content[0];
  assert.equal(use.type, 'tool_use');
  assert.match(use.id, /^toolu_/);
  assert.equal(use.name, 'get_weather');
  assert.deepEqual(use.input, { city: 'Paris' });

  messages.push({ role: 'assistant', content: r1.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '18 C and sunny' }] });
  const r2 = await client.messages.create({ model: 'fake-model', max_tokens: 64, messages, tools });
  assert.deepEqual(r2.content, [{ type: 'text', text: 'Tool result: 18 C and sunny' }]);
  assert.equal(r2.stop_reason, 'end_turn');

  const stream = client.messages.stream({ model: 'fake-model', max_tokens: 64, messages: [{ role: 'user', content: toolCallText }], tools });
  const final = await stream.finalMessage();
  assert.equal(final.stop_reason, 'tool_use');
  assert.equal(final.content[0].type, 'tool_use');
  assert.deepEqual(final.content[0].input, { city: 'Paris' });
});

test('countTokens matches the usage of the same request', async () => {
  const req = { model: 'fake-model', system: 'be nice', messages: [{ role: 'user', content: 'hello there' }] };
  const c = await client.messages.countTokens(req);
  assert.deepEqual(c, { input_tokens: 7 });
  const m = await client.messages.create({ ...req, max_tokens: 8 });
  assert.equal(m.usage.input_tokens, 7);
});

test('errors surface as the SDK error classes', async () => {
  await assert.rejects(
    client.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 8, messages: [{ role: 'user', content: 'x' }] }),
    (err) => {
      assert.ok(err instanceof Anthropic.NotFoundError, `got ${err.constructor.name}`);
      assert.equal(err.status, 404);
      assert.equal(err.error.type, 'error');
      assert.equal(err.error.error.type, 'not_found_error');
      assert.match(err.message, /claude-sonnet-4-5/);
      return true;
    });
  await assert.rejects(
    client.messages.create({ model: 'fake-model', max_tokens: 8, temperature: 3, messages: [{ role: 'user', content: 'x' }] }),
    (err) => err instanceof Anthropic.BadRequestError && err.error.error.type === 'invalid_request_error' && /temperature/.test(err.message));
  await assert.rejects(
    client.messages.create({ model: 'fake-model', max_tokens: 8, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'http://x/y.png' } }] }] }),
    (err) => err instanceof Anthropic.BadRequestError && /image/.test(err.message));
});

test('x-api-key is checked when the server has a key', async () => {
  const keyed = await startServer(['--api-key', 'k123']);
  try {
    const bad = new Anthropic({ baseURL: keyed.url, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(bad.messages.create({ model: 'fake-model', max_tokens: 8, messages: [{ role: 'user', content: 'x' }] }),
      (err) => err instanceof Anthropic.AuthenticationError && err.error.error.type === 'authentication_error');
    const good = new Anthropic({ baseURL: keyed.url, apiKey: 'k123', maxRetries: 0 });
    const m = await good.messages.create({ model: 'fake-model', max_tokens: 8, messages: [{ role: 'user', content: 'ok' }] });
    assert.equal(m.content[0].text, 'ok');
  } finally {
    assert.equal((await keyed.stop()).code, 0);
  }
});

describe('real engine on a tiny model', () => {
  let real;
  let rc;
  before(async () => {
    real = await startServer(['--model', tinyModelWithTemplate('llama_mha'), '--device', 'cpu']);
    rc = new Anthropic({ baseURL: real.url, apiKey: 'unused', maxRetries: 0 });
  });
  after(async () => {
    assert.equal((await real.stop()).code, 0);
  });

  test('greedy: the streamed message equals the plain one', async () => {
    const req = { model: 'llama_mha', max_tokens: 16, temperature: 0, system: 'Be brief.', messages: [{ role: 'user', content: 'Tell me about the sky.' }] };
    const m = await rc.messages.create(req);
    assert.equal(m.content[0].type, 'text');
    assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason));
    assert.ok(m.usage.input_tokens > 10, `input_tokens ${m.usage.input_tokens}`);
    const final = await rc.messages.stream(req).finalMessage();
    assert.equal(final.content[0].text, m.content[0].text);
    assert.equal(final.usage.output_tokens, m.usage.output_tokens);
    // The same prompt again is served from the prompt cache: Anthropic counts those tokens apart.
    assert.equal(final.usage.input_tokens + final.usage.cache_read_input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
    const c = await rc.messages.countTokens({ model: 'llama_mha', system: req.system, messages: req.messages });
    assert.equal(c.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
  });
});
