// The official `openai` npm client against `hearth serve --fake-engine`: chat (plain and streamed),
// completions, a tool-call round trip, responses (plain, streamed, function calls), models, unknown
// models, errors surfaced as the client's error classes, and a clean SIGTERM exit; then against the
// real engine on a tiny model with a chat template (chat, completions and responses, streamed and
// not, adapters list). Run by ctest as e2e_openai (node --test).
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, npmPackage, tinyModelWithTemplate } from './serve_helper.mjs';

const { OpenAI } = npmPackage('openai');
let server;
let client;

before(async () => {
  server = await startServer();
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  const { code, ms } = await server.stop();
  assert.equal(code, 0, 'hearth serve exits 0 on SIGTERM');
  assert.ok(ms < 3000, `exited in ${ms} ms`);
});

test('models.list returns the served model', async () => {
  const page = await client.models.list();
  assert.equal(page.data.length, 1);
  assert.equal(page.data[0].id, 'fake-model');
});

test('chat completion, non-streaming', async () => {
  const r = await client.chat.completions.create({
    model: 'fake-model', messages: [{ role: 'system', content: 'sys' }, { role: 'user', content: 'hello from node' }],
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, 'fake-model');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].message.content, 'hello from node');
  assert.equal(r.choices[0].finish_reason, 'stop');
  // "system: sys\nuser: hello from node\nassistant:" = 7 fake tokens; 3 words + EOS.
  assert.deepEqual(r.usage, { prompt_tokens: 7, completion_tokens: 4, total_tokens: 11, prompt_tokens_details: { cached_tokens: 0 } });
});

test('chat completion, streaming with usage', async () => {
  const stream = await client.chat.completions.create({
    model: 'fake-model', messages: [{ role: 'user', content: 'one two three' }], stream: true,
    stream_options: { include_usage: true },
  });
  let content = '';
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c) continue;
    content += c.delta.content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(content, 'one two three');
  assert.equal(finish, 'stop');
  assert.equal(usage.completion_tokens, 4);
  assert.equal(chunks, 6);  // role, 3 tokens, finish, usage
});

test('chat stop strings and max_tokens', async () => {
  const r = await client.chat.completions.create({
    model: 'fake-model', messages: [{ role: 'user', content: 'emit:first line\nsecond line' }], stop: ['\n'],
  });
  assert.equal(r.choices[0].message.content, 'first line');
  const l = await client.chat.completions.create({ model: 'fake-model', messages: [{ role: 'user', content: 'a b c d' }], max_completion_tokens: 2 });
  assert.equal(l.choices[0].message.content, 'a b');
  assert.equal(l.choices[0].finish_reason, 'length');
});

test('text completions', async () => {
  const r = await client.completions.create({ model: 'fake-model', prompt: 'alpha beta gamma', max_tokens: 2 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].text, 'alpha beta');
  assert.equal(r.choices[0].finish_reason, 'length');
  const s = await client.completions.create({ model: 'fake-model', prompt: 'x y', stream: true });
  let text = '';
  for await (const chunk of s) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, 'x y');
});

const tools = [{
  type: 'function',
  function: { name: 'get_weather', description: 'Weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } },
}];
const toolCallText = 'emit:<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>';

test('tool-call round trip', async () => {
  const messages = [{ role: 'user', content: toolCallText }];
  const r1 = await client.chat.completions.create({ model: 'fake-model', messages, tools });
  assert.equal(r1.choices[0].finish_reason, 'tool_calls');
  const msg = r1.choices[0].message;
  assert.equal(msg.content, null);
  assert.equal(msg.tool_calls.length, 1);
  const call = msg.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.match(call.id, /^call_[0-9a-f]{8}$/);
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });

  messages.push(msg, { role: 'tool', tool_call_id: call.id, content: '18 C and sunny' });
  const r2 = await client.chat.completions.create({ model: 'fake-model', messages, tools });
  assert.equal(r2.choices[0].message.content, 'Tool result: 18 C and sunny');
  assert.equal(r2.choices[0].finish_reason, 'stop');
});

test('tool call, streamed, through the client stream helper', async () => {
  const runner = client.chat.completions.stream({ model: 'fake-model', messages: [{ role: 'user', content: toolCallText }], tools });
  const final = await runner.finalChatCompletion();
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
  const call = final.choices[0].message.tool_calls[0];
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });
});

// The text of a Response's message items (the SDK adds `output_text` to create() results only).
const textOf = (r) => r.output.filter((o) => o.type === 'message').flatMap((o) => o.content).map((c) => c.text).join('');

test('responses.create, plain', async () => {
  const r = await client.responses.create({ model: 'fake-model', instructions: 'sys', input: 'hello from node' });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.equal(r.status, 'completed');
  assert.equal(r.model, 'fake-model');
  assert.equal(r.output_text, 'hello from node');  // the client's own concatenation of output_text parts
  assert.equal(r.output.length, 1);
  assert.equal(r.output[0].type, 'message');
  assert.deepEqual(r.output[0].content, [{ type: 'output_text', text: 'hello from node', annotations: [], logprobs: [] }]);
  // "system: sys\nuser: hello from node\nassistant:" = 7 fake tokens; 3 words + EOS.
  assert.equal(r.usage.input_tokens, 7);
  assert.equal(r.usage.output_tokens, 4);
  assert.equal(r.usage.total_tokens, 11);
  const l = await client.responses.create({ model: 'fake-model', input: 'a b c d', max_output_tokens: 2 });
  assert.equal(l.status, 'incomplete');
  assert.equal(l.incomplete_details.reason, 'max_output_tokens');
  assert.equal(l.output_text, 'a b');
});

test('responses.create, streamed: raw events and the stream helper', async () => {
  const stream = await client.responses.create({ model: 'fake-model', input: 'one two three', stream: true });
  const types = [];
  let text = '';
  let seq = 0;
  for await (const e of stream) {
    types.push(e.type);
    assert.equal(e.sequence_number, seq++);
    if (e.type === 'response.output_text.delta') text += e.delta;
  }
  assert.equal(text, 'one two three');
  assert.deepEqual(types, ['response.created', 'response.in_progress', 'response.output_item.added',
    'response.content_part.added', 'response.output_text.delta', 'response.output_text.delta',
    'response.output_text.delta', 'response.output_text.done', 'response.content_part.done',
    'response.output_item.done', 'response.completed']);
  const helper = client.responses.stream({ model: 'fake-model', input: 'four five' });
  const final = await helper.finalResponse();
  assert.equal(final.status, 'completed');
  assert.equal(textOf(final), 'four five');
});

test('responses: function call round trip, plain and streamed', async () => {
  const rtools = [{ type: 'function', name: 'get_weather', description: 'Weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
  const r1 = await client.responses.create({ model: 'fake-model', input: toolCallText, tools: rtools });
  assert.equal(r1.output.length, 1);
  const call = r1.output[0];
  assert.equal(call.type, 'function_call');
  assert.match(call.call_id, /^call_/);
  assert.equal(call.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.arguments), { city: 'Paris' });
  const r2 = await client.responses.create({
    model: 'fake-model', tools: rtools,
    input: [{ role: 'user', content: toolCallText }, call, { type: 'function_call_output', call_id: call.call_id, output: '18 C' }],
  });
  assert.equal(r2.output_text, 'Tool result: 18 C');
  const final = await client.responses.stream({ model: 'fake-model', input: toolCallText, tools: rtools }).finalResponse();
  assert.equal(final.output[0].type, 'function_call');
  assert.deepEqual(JSON.parse(final.output[0].arguments), { city: 'Paris' });
});

test('responses: unsupported fields and unknown models are errors', async () => {
  await assert.rejects(client.responses.create({ model: 'fake-model', input: 'x', previous_response_id: 'resp_1' }),
    (err) => err instanceof OpenAI.BadRequestError && err.param === 'previous_response_id');
  await assert.rejects(client.responses.create({ model: 'gpt-5', input: 'x' }),
    (err) => err instanceof OpenAI.NotFoundError && err.code === 'model_not_found' && err.param === 'model');
  await assert.rejects(client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x' }] }),
    (err) => err instanceof OpenAI.NotFoundError && err.code === 'model_not_found');
});

test('bad temperature surfaces as BadRequestError (400)'
, async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'fake-model', messages: [{ role: 'user', content: 'x' }], temperature: 5 }),
    (err) => {
      assert.ok(err instanceof OpenAI.BadRequestError, `got ${err.constructor.name}`);
      assert.equal(err.status, 400);
      assert.equal(err.param, 'temperature');
      assert.match(err.message, /temperature/);
      return true;
    });
});

test('n choices: plain, streamed through the stream helper, and too many', async () => {
  const messages = [{ role: 'user', content: 'one two' }];
  const r = await client.chat.completions.create({ model: 'fake-model', messages, n: 2 });
  assert.deepEqual(r.choices.map((c) => [c.index, c.message.content, c.finish_reason]), [[0, 'one two', 'stop'], [1, 'one two', 'stop']]);
  // "user: one two\nassistant:" = 4 fake tokens once; 2 words + EOS per choice.
  assert.equal(r.usage.prompt_tokens, 4);
  assert.equal(r.usage.completion_tokens, 6);
  // The client's stream helper accumulates chunks by choice index.
  const runner = client.chat.completions.stream({ model: 'fake-model', messages, n: 3 });
  const final = await runner.finalChatCompletion();
  assert.deepEqual(final.choices.map((c) => [c.index, c.message.content, c.finish_reason]),
    [[0, 'one two', 'stop'], [1, 'one two', 'stop'], [2, 'one two', 'stop']]);
  const c = await client.completions.create({ model: 'fake-model', prompt: 'x y', n: 2 });
  assert.deepEqual(c.choices.map((x) => [x.index, x.text]), [[0, 'x y'], [1, 'x y']]);
  await assert.rejects(
    client.chat.completions.create({ model: 'fake-model', messages, n: 1000 }),
    (err) => err instanceof OpenAI.BadRequestError && err.param === 'n');
});

test('unknown routes are rejected', async () => {
  await assert.rejects(client.embeddings.create({ model: 'fake-model', input: 'x' }), (err) => err instanceof OpenAI.NotFoundError);
});

test('API key is enforced when set', async () => {
  const keyed = await startServer(['--api-key', 'k123']);
  try {
    const bad = new OpenAI({ baseURL: keyed.url + '/v1', apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(bad.models.list(), (err) => err instanceof OpenAI.AuthenticationError && err.status === 401);
    const good = new OpenAI({ baseURL: keyed.url + '/v1', apiKey: 'k123', maxRetries: 0 });
    assert.equal((await good.models.list()).data[0].id, 'fake-model');
  } finally {
    assert.equal((await keyed.stop()).code, 0);
  }
});

describe('real engine on a tiny model', () => {
  let real;
  let rc;
  const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Tell me about the sky.' }];

  before(async () => {
    real = await startServer(['--model', tinyModelWithTemplate('llama_mha'), '--device', 'cpu']);
    rc = new OpenAI({ baseURL: real.url + '/v1', apiKey: 'unused', maxRetries: 0 });
  });
  after(async () => {
    const { code } = await real.stop();
    assert.equal(code, 0, 'hearth serve --model exits 0 on SIGTERM');
  });

  test('models.list names the model folder', async () => {
    const page = await rc.models.list();
    assert.equal(page.data[0].id, 'llama_mha');
    assert.equal(page.data[0].context_window, 256);
  });

  test('chat, greedy: streamed content equals the non-streamed one', async () => {
    const r = await rc.chat.completions.create({ model: 'llama_mha', messages, max_tokens: 24, temperature: 0 });
    const text = r.choices[0].message.content;
    assert.equal(typeof text, 'string');
    assert.ok(text.length > 0);
    assert.ok(['length', 'stop'].includes(r.choices[0].finish_reason));
    assert.ok(r.usage.prompt_tokens > 10, `prompt_tokens ${r.usage.prompt_tokens}`);
    assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 25);
    const stream = await rc.chat.completions.create({
      model: 'llama_mha', messages, max_tokens: 24, temperature: 0, stream: true, stream_options: { include_usage: true },
    });
    let streamed = '';
    let usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      streamed += chunk.choices[0]?.delta?.content ?? '';
    }
    assert.equal(streamed, text);
    // Same counts; the second, identical prompt is served from the prompt cache (all but the
    // last prompt token, which must run to give logits).
    const { prompt_tokens_details: cachedStream, ...countsStream } = usage;
    const { prompt_tokens_details: cachedFirst, ...countsFirst } = r.usage;
    assert.deepEqual(countsStream, countsFirst);
    assert.equal(cachedFirst.cached_tokens, 0);
    assert.equal(cachedStream.cached_tokens, r.usage.prompt_tokens - 1);
  });

  test('chat, same seed samples the same text', async () => {
    const req = { model: 'llama_mha', messages, max_tokens: 16, temperature: 1.0, seed: 7 };
    const a = await rc.chat.completions.create(req);
    const b = await rc.chat.completions.create(req);
    assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  });

  test('completions, streamed and not', async () => {
    const r = await rc.completions.create({ model: 'llama_mha', prompt: 'hello world', max_tokens: 12, temperature: 0 });
    assert.equal(r.object, 'text_completion');
    assert.ok(r.choices[0].text.length > 0);
    const s = await rc.completions.create({ model: 'llama_mha', prompt: 'hello world', max_tokens: 12, temperature: 0, stream: true });
    let text = '';
    for await (const chunk of s) text += chunk.choices[0]?.text ?? '';
    assert.equal(text, r.choices[0].text);
  });

  test('responses, greedy: streamed text equals the plain one', async () => {
    const req = { model: 'llama_mha', instructions: 'Be brief.', input: 'Tell me about the sky.', max_output_tokens: 12, temperature: 0 };
    const r = await rc.responses.create(req);
    assert.ok(['completed', 'incomplete'].includes(r.status));
    assert.ok(r.output_text.length > 0);
    const final = await rc.responses.stream(req).finalResponse();
    assert.equal(textOf(final), r.output_text);
  });

  test('adapters: list is empty, an unknown one is a 400', async () => {
    const r = await fetch(real.url + '/v1/adapters');
    assert.deepEqual((await r.json()).adapters, []);
    await assert.rejects(
      rc.chat.completions.create({ model: 'llama_mha', messages, max_tokens: 4, adapter: 'ghost' }),
      (err) => err instanceof OpenAI.BadRequestError && /ghost/.test(err.message));
  });
});
