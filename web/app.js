// Hearth web chat: streams replies from /v1/chat/completions over SSE (fetch + ReadableStream),
// keeps the conversation (successful turns only) in localStorage, and renders model text through
// HearthMarkdown (DOM nodes built with textContent; never innerHTML). Not a multi-chat manager.
'use strict';

const $ = (id) => document.getElementById(id);
const kChatKey = 'hearth.chat';

// state.messages: the turns that completed, in the shape they are shown and stored:
// { role, content, reasoning?, tool_calls?, finish? }. Only role/content/tool_calls are sent.
const state = { messages: [], controller: null };

const settings = {
  system: $('system'), temperature: $('temperature'), maxTokens: $('max-tokens'),
  apiKey: $('api-key'), adapter: $('adapter'),
};
settings.apiKey.value = localStorage.getItem('hearth.apiKey') || '';
settings.system.value = localStorage.getItem('hearth.system') || '';
settings.system.addEventListener('change', () => localStorage.setItem('hearth.system', settings.system.value));
settings.temperature.addEventListener('input', () => { $('temperature-value').textContent = settings.temperature.value; });

// A new API key takes effect at once: the model name and the adapter list are fetched again.
let keyTimer = null;
function apiKeyChanged() {
  clearTimeout(keyTimer);
  keyTimer = null;
  localStorage.setItem('hearth.apiKey', settings.apiKey.value);
  loadModel();
  loadAdapters();
}
settings.apiKey.addEventListener('input', () => { clearTimeout(keyTimer); keyTimer = setTimeout(apiKeyChanged, 300); });
settings.apiKey.addEventListener('change', apiKeyChanged);

function headers() {
  const h = { 'Content-Type': 'application/json' };
  if (settings.apiKey.value) h.Authorization = 'Bearer ' + settings.apiKey.value;
  return h;
}

function setStatus(text) { $('status').textContent = text; }

// The server's error message from a failed response ({"error": {"message"}}), else the status.
async function errorMessage(r) {
  const j = await r.json().catch(() => ({}));
  const msg = j && j.error && j.error.message ? j.error.message : `HTTP ${r.status} ${r.statusText}`.trim();
  return r.status === 401 ? msg + ' (enter the API key in the settings)' : msg;
}

// --- conversation storage ---------------------------------------------------------------------

function saveChat() {
  try {
    localStorage.setItem(kChatKey, JSON.stringify({ version: 1, messages: state.messages }));
  } catch (_) { /* storage full or disabled: the chat still works, it just will not survive a reload */ }
}

// Stored turns, checked field by field (storage is not trusted to hold what we wrote).
function loadChat() {
  let stored;
  try { stored = JSON.parse(localStorage.getItem(kChatKey) || 'null'); } catch (_) { return []; }
  if (!stored || !Array.isArray(stored.messages)) return [];
  const out = [];
  for (const m of stored.messages) {
    if (!m || !['user', 'assistant'].includes(m.role) || typeof m.content !== 'string') continue;
    const msg = { role: m.role, content: m.content };
    if (typeof m.reasoning === 'string' && m.reasoning) msg.reasoning = m.reasoning;
    if (typeof m.finish === 'string') msg.finish = m.finish;
    const calls = Array.isArray(m.tool_calls) ? m.tool_calls.filter((tc) => tc && tc.function &&
      typeof tc.function.name === 'string' && typeof tc.function.arguments === 'string') : [];
    if (calls.length) msg.tool_calls = calls.map((tc) => ({ id: String(tc.id || ''), type: 'function',
      function: { name: tc.function.name, arguments: tc.function.arguments } }));
    out.push(msg);
  }
  return out;
}

// What the server gets: user and assistant turns without display-only fields.
function historyForRequest() {
  return state.messages.map((m) => {
    const out = { role: m.role, content: m.content };
    if (m.tool_calls) out.tool_calls = m.tool_calls;
    return out;
  });
}

// --- rendering --------------------------------------------------------------------------------

// A message bubble. Returns setters for its parts; the body of an assistant bubble is Markdown.
function addBubble(role) {
  const div = document.createElement('div');
  div.className = 'msg ' + role;
  const label = document.createElement('span');
  label.className = 'role';
  label.textContent = role;
  const thinking = document.createElement('details');
  thinking.className = 'thinking';
  thinking.hidden = true;
  const summary = document.createElement('summary');
  summary.textContent = 'thinking';
  const thought = document.createElement('div');
  thought.className = 'thinking-body';
  thinking.append(summary, thought);
  const body = document.createElement('div');
  body.className = 'body';
  const tools = document.createElement('div');
  tools.className = 'tools';
  const note = document.createElement('div');
  note.className = 'note';
  note.hidden = true;
  div.append(label, thinking, body, tools, note);
  $('messages').append(div);
  const scroll = () => div.scrollIntoView({ block: 'end' });
  let pendingText = null; // an assistant text waiting for the next frame's render
  scroll();
  return {
    div,
    body,
    // An assistant reply is rendered at most once per frame, from its latest text: rendering
    // on every streamed token re-parsed the whole reply each time (quadratic in its length).
    setContent(text) {
      if (role !== 'assistant') { body.textContent = text; scroll(); return; }
      const scheduled = pendingText !== null;
      pendingText = text;
      if (scheduled) return;
      requestAnimationFrame(() => {
        body.replaceChildren(HearthMarkdown.render(pendingText));
        pendingText = null;
        scroll();
      });
    },
    setReasoning(text, streaming) {
      thinking.hidden = !text;
      summary.textContent = streaming ? 'thinking…' : 'thinking';
      thought.textContent = text;
      scroll();
    },
    setToolCalls(calls) {
      tools.replaceChildren(...calls.map((tc) => {
        const t = document.createElement('span');
        t.className = 'tool';
        t.textContent = `tool call: ${tc.function.name}(${tc.function.arguments})`;
        return t;
      }));
    },
    setNote(text, kind) {
      note.hidden = !text;
      note.textContent = text || '';
      note.className = 'note' + (kind ? ' ' + kind : '');
      scroll();
    },
  };
}

function emptyAnswerNote(msg) {
  const why = `finish reason: ${msg.finish || 'unknown'}`;
  return msg.reasoning ? `The model returned no answer text, only thinking (${why}).`
    : `The model returned no text (${why}).`;
}

function renderMessage(m) {
  const b = addBubble(m.role);
  b.setContent(m.content);
  if (m.role !== 'assistant') return b;
  if (m.reasoning) b.setReasoning(m.reasoning, false);
  if (m.tool_calls) b.setToolCalls(m.tool_calls);
  if (!m.content && !m.tool_calls) b.setNote(emptyAnswerNote(m), 'empty');
  return b;
}

// --- model and adapters -----------------------------------------------------------------------

async function loadModel() {
  try {
    const r = await fetch('/v1/models', { headers: headers() });
    if (!r.ok) throw new Error(await errorMessage(r));
    const j = await r.json();
    const m = j.data[0];
    $('model').textContent = m.id + (m.context_window ? ` · context ${m.context_window}` : '');
  } catch (e) {
    $('model').textContent = 'model unavailable: ' + e.message;
  }
}

// LoRA adapters: fill the picker from GET /v1/adapters (refreshed whenever it is opened, since
// adapters can be mounted while the page is open, and when the API key changes); the choice is
// sent as `adapter`.
async function loadAdapters() {
  try {
    const r = await fetch('/v1/adapters', { headers: headers() });
    if (!r.ok) { settings.adapter.disabled = true; return; }
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
  } catch (_) { settings.adapter.disabled = true; }
}
settings.adapter.addEventListener('focus', loadAdapters);

// --- streaming --------------------------------------------------------------------------------

// Reads an SSE body and calls onEvent(parsedJson) per "data:" event until [DONE]. Resolves true
// when [DONE] arrived, false when the stream ended without it (a cut connection).
async function readSse(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return false;
    buf += decoder.decode(value, { stream: true });
    let sep;
    while ((sep = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, sep);
      buf = buf.slice(sep + 2);
      for (const line of block.split('\n')) {
        if (!line.startsWith('data:')) continue;
        const data = line.slice(5).trim();
        if (data === '[DONE]') return true;
        onEvent(JSON.parse(data));
      }
    }
  }
}

// Merges streamed tool-call deltas (OpenAI: by `index`; later pieces extend the arguments).
function mergeToolCall(calls, tc) {
  const i = Number.isInteger(tc.index) ? tc.index : calls.length;
  const f = tc.function || {};
  if (!calls[i]) calls[i] = { id: tc.id, type: tc.type || 'function', function: { name: f.name || '', arguments: '' } };
  const c = calls[i];
  if (tc.id) c.id = tc.id;
  if (f.name && !c.function.name) c.function.name = f.name;
  if (f.arguments) c.function.arguments += f.arguments;
}

async function send(text) {
  const userBubble = renderMessage({ role: 'user', content: text });
  const reply = addBubble('assistant');
  const body = {
    messages: [
      ...(settings.system.value.trim() ? [{ role: 'system', content: settings.system.value }] : []),
      ...historyForRequest(),
      { role: 'user', content: text },
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
  let reasoning = '';
  const toolCalls = [];
  let finish = null;
  let usage = null;
  const started = performance.now();
  try {
    const r = await fetch('/v1/chat/completions', {
      method: 'POST', headers: headers(), body: JSON.stringify(body), signal: state.controller.signal,
    });
    if (!r.ok) throw new Error(await errorMessage(r));
    const complete = await readSse(r, (ev) => {
      if (ev.error) throw new Error(ev.error.message || 'the server reported an error');
      if (ev.usage) usage = ev.usage;
      const choice = ev.choices && ev.choices[0];
      if (!choice) return;
      const d = choice.delta || {};
      if (d.reasoning_content) {
        reasoning += d.reasoning_content;
        reply.setReasoning(reasoning, true);
      }
      if (d.content) {
        content += d.content;
        reply.setContent(content);
      }
      if (d.tool_calls && d.tool_calls.length) {
        for (const tc of d.tool_calls) mergeToolCall(toolCalls, tc);
        reply.setToolCalls(toolCalls.filter(Boolean));
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    });
    if (!complete) throw new Error('the connection closed before the reply was complete');
    reply.setReasoning(reasoning, false);
    const msg = { role: 'assistant', content, finish: finish || 'unknown' };
    if (reasoning) msg.reasoning = reasoning;
    const calls = toolCalls.filter(Boolean);
    if (calls.length) msg.tool_calls = calls.map(({ id, type, function: f }) => ({ id, type, function: f }));
    if (!content && !calls.length) reply.setNote(emptyAnswerNote(msg), 'empty');
    state.messages.push({ role: 'user', content: text }, msg);
    saveChat();
    const secs = (performance.now() - started) / 1000;
    setStatus(`finish: ${finish || '?'}` + (usage ? ` · ${usage.completion_tokens} tokens in ${secs.toFixed(2)} s` : ''));
  } catch (e) {
    // A failed turn stays on screen, marked, and is not part of the conversation sent next time.
    reply.setReasoning(reasoning, false);
    reply.div.classList.add('error');
    userBubble.div.classList.add('failed');
    const aborted = e.name === 'AbortError';
    const what = aborted ? 'Stopped' : 'Error: ' + (e instanceof TypeError ? 'network error (' + e.message + ')' : e.message);
    reply.setNote(what + ' — this turn is not kept and will not be sent with the next message.', 'error');
    setStatus(aborted ? 'stopped' : 'error');
  } finally {
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
  localStorage.removeItem(kChatKey);
  $('messages').replaceChildren();
  setStatus('');
});

state.messages = loadChat();
for (const m of state.messages) renderMessage(m);
loadModel();
loadAdapters();
