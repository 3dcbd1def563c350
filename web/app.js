// Hearth web chat: keeps the conversation in memory, streams replies from /v1/chat/completions
// over SSE (fetch + ReadableStream), and renders all model text with textContent only.
'use strict';

const $ = (id) => document.getElementById(id);
const state = { messages: [], controller: null };

const settings = {
  system: $('system'), temperature: $('temperature'), maxTokens: $('max-tokens'),
  apiKey: $('api-key'), adapter: $('adapter'),
};
settings.apiKey.value = localStorage.getItem('hearth.apiKey') || '';
settings.system.value = localStorage.getItem('hearth.system') || '';
settings.apiKey.addEventListener('change', () => localStorage.setItem('hearth.apiKey', settings.apiKey.value));
settings.system.addEventListener('change', () => localStorage.setItem('hearth.system', settings.system.value));
settings.temperature.addEventListener('input', () => { $('temperature-value').textContent = settings.temperature.value; });

function headers() {
  const h = { 'Content-Type': 'application/json' };
  if (settings.apiKey.value) h.Authorization = 'Bearer ' + settings.apiKey.value;
  return h;
}

function setStatus(text) { $('status').textContent = text; }

// Appends a message bubble; returns the element whose textContent receives the text.
function addBubble(role, text) {
  const div = document.createElement('div');
  div.className = 'msg ' + role;
  const label = document.createElement('span');
  label.className = 'role';
  label.textContent = role;
  const body = document.createElement('span');
  body.className = 'body';
  body.textContent = text || '';
  div.append(label, body);
  $('messages').append(div);
  div.scrollIntoView({ block: 'end' });
  return { div, body };
}

async function loadModel() {
  try {
    const r = await fetch('/v1/models', { headers: headers() });
    const j = await r.json();
    if (!r.ok) throw new Error(j.error ? j.error.message : r.statusText);
    const m = j.data[0];
    $('model').textContent = m.id + (m.context_window ? ` · context ${m.context_window}` : '');
  } catch (e) {
    $('model').textContent = 'model unavailable: ' + e.message;
  }
}

// LoRA adapters: fill the picker from GET /v1/adapters (refreshed whenever it is opened, since
// adapters can be mounted while the page is open); the choice is sent as `adapter`.
async function loadAdapters() {
  try {
    const r = await fetch('/v1/adapters', { headers: headers() });
    if (!r.ok) return;
    const j = await r.json();
    const chosen = settings.adapter.value;
    for (const o of [...settings.adapter.options]) if (o.value !== '' && o.value !== 'none') o.remove();
    for (const a of j.adapters || []) {
      const o = document.createElement('option');
      o.value = a.id;
      o.textContent = `${a.id} (rank ${a.rank})`;
      settings.adapter.append(o);
    }
    if ([...settings.adapter.options].some((o) => o.value === chosen)) settings.adapter.value = chosen;
    settings.adapter.disabled = false;
  } catch (_) { /* no adapter support */ }
}
settings.adapter.addEventListener('focus', loadAdapters);

// Reads an SSE body and calls onEvent(parsedJson) per "data:" event until [DONE].
async function readSse(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    let sep;
    while ((sep = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, sep);
      buf = buf.slice(sep + 2);
      for (const line of block.split('\n')) {
        if (!line.startsWith('data:')) continue;
        const data = line.slice(5).trim();
        if (data === '[DONE]') return;
        onEvent(JSON.parse(data));
      }
    }
  }
}

async function send(text) {
  state.messages.push({ role: 'user', content: text });
  addBubble('user', text);
  const reply = addBubble('assistant', '');
  const body = {
    messages: [
      ...(settings.system.value.trim() ? [{ role: 'system', content: settings.system.value }] : []),
      ...state.messages,
    ],
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number(settings.temperature.value),
  };
  const maxTokens = parseInt(settings.maxTokens.value, 10);
  if (maxTokens > 0) body.max_tokens = maxTokens;
  if (settings.adapter.value) body.adapter = settings.adapter.value;

  state.controller = new AbortController();
  $('send').disabled = true;
  $('stop').disabled = false;
  setStatus('generating…');
  let content = '';
  const toolCalls = [];
  let finish = null;
  let usage = null;
  const started = performance.now();
  try {
    const r = await fetch('/v1/chat/completions', {
      method: 'POST', headers: headers(), body: JSON.stringify(body), signal: state.controller.signal,
    });
    if (!r.ok) {
      const j = await r.json().catch(() => ({}));
      throw new Error(j.error ? j.error.message : `HTTP ${r.status}`);
    }
    await readSse(r, (ev) => {
      if (ev.error) throw new Error(ev.error.message);
      if (ev.usage) usage = ev.usage;
      const choice = ev.choices && ev.choices[0];
      if (!choice) return;
      const d = choice.delta || {};
      if (d.content) {
        content += d.content;
        reply.body.textContent = content;
        reply.div.scrollIntoView({ block: 'end' });
      }
      for (const tc of d.tool_calls || []) {
        toolCalls.push(tc);
        const t = document.createElement('span');
        t.className = 'tool';
        t.textContent = `tool call: ${tc.function.name}(${tc.function.arguments})`;
        reply.div.append(t);
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    });
    const secs = (performance.now() - started) / 1000;
    setStatus(`finish: ${finish || '?'}` + (usage ? ` · ${usage.completion_tokens} tokens in ${secs.toFixed(2)} s` : ''));
  } catch (e) {
    if (e.name === 'AbortError') {
      setStatus('stopped');
    } else {
      reply.div.classList.add('error');
      reply.body.textContent = (content ? content + '\n' : '') + 'Error: ' + e.message;
      setStatus('error');
    }
  } finally {
    const msg = { role: 'assistant', content };
    if (toolCalls.length) msg.tool_calls = toolCalls.map(({ id, type, function: f }) => ({ id, type, function: f }));
    if (content || toolCalls.length) state.messages.push(msg);
    state.controller = null;
    $('send').disabled = false;
    $('stop').disabled = true;
  }
}

$('composer').addEventListener('submit', (e) => {
  e.preventDefault();
  const text = $('input').value.trim();
  if (!text || state.controller) return;
  $('input').value = '';
  send(text);
});
$('input').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey) {
    e.preventDefault();
    $('composer').requestSubmit();
  }
});
$('stop').addEventListener('click', () => { if (state.controller) state.controller.abort(); });
$('clear').addEventListener('click', () => {
  if (state.controller) state.controller.abort();
  state.messages = [];
  $('messages').replaceChildren();
  setStatus('');
});

loadModel();
loadAdapters();
