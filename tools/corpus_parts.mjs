// Helpers shared by the starter v2 data builders (issue 13): a seeded PRNG, the starter's chat
// template as a plain-text renderer, Markdown split into paragraphs, and synthetic copy rows.
// Pure functions, no file writes: tools/build_corpus.mjs and tools/build_tour_guide.mjs use them.

/** mulberry32, seeded by a 32-bit integer: next() in [0, 1), int(lo, hi) inclusive, pick(xs),
 *  chance(p), shuffle(xs) (in place, returns xs). Same seed → same sequence. */
export function makeRng(s) {
  let a = s >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const r = { next };
  r.int = (lo, hi) => lo + Math.floor(next() * (hi - lo + 1));
  r.pick = (xs) => xs[Math.floor(next() * xs.length)];
  r.chance = (p) => next() < p;
  r.shuffle = (xs) => {
    for (let i = xs.length - 1; i > 0; --i) {
      const j = Math.floor(next() * (i + 1));
      [xs[i], xs[j]] = [xs[j], xs[i]];
    }
    return xs;
  };
  return r;
}

/** A conversation rendered as models/starter's chat template renders it (tokenizer_config.json:
 *  system `<<SYS>>\n{c}\n<</SYS>>\n\n`, user `[INST] {c} [/INST]`, assistant ` {c}</s>`), minus the
 *  template's leading `<s>` and the last assistant's `</s>`: `hearth train` adds BOS and EOS around
 *  a text row, so BOS + row + EOS has the template's tokens. Throws naming `where` on a role other
 *  than system/user/assistant, a non-string content, or a conversation not ending with an answer. */
export function renderChat(messages, where) {
  if (!Array.isArray(messages) || !messages.length) throw new Error(`${where}: "messages" must be a non-empty array`);
  let out = '';
  for (const m of messages) {
    if (typeof m?.content !== 'string') throw new Error(`${where}: a message's "content" is not a string`);
    if (m.role === 'system') out += `<<SYS>>\n${m.content}\n<</SYS>>\n\n`;
    else if (m.role === 'user') out += `[INST] ${m.content} [/INST]`;
    else if (m.role === 'assistant') out += ` ${m.content}</s>`;
    else throw new Error(`${where}: role "${m.role}" (only system, user and assistant)`);
  }
  if (messages[messages.length - 1].role !== 'assistant') throw new Error(`${where}: the last message is not the assistant's`);
  return out.slice(0, -'</s>'.length);
}

/** Markdown → paragraphs: split at blank lines outside ``` fences (a fenced block stays whole with
 *  its paragraph); a paragraph that is only a heading is joined to the one after it. */
export function docParagraphs(md) {
  const paras = [];
  let cur = [], fence = false;
  for (const line of md.split('\n')) {
    if (/^\s*```/.test(line)) fence = !fence;
    if (!fence && line.trim() === '') {
      if (cur.length) paras.push(cur.join('\n'));
      cur = [];
    } else cur.push(line);
  }
  if (cur.length) paras.push(cur.join('\n'));
  const out = [];
  let heading = '';
  for (const p of paras) {
    if (/^#+ /.test(p) && !p.includes('\n')) { heading += p + '\n\n'; continue; }
    out.push(heading + p);
    heading = '';
  }
  if (heading) out.push(heading.trim());
  return out;
}

/** The forms a synthetic copy row takes: S is the text, xs its sentences. */
export const COPY_FORMS = [
  (S) => `${S}\n\n${S}`,
  (S) => `Text: ${S}\nCopy: ${S}`,
  (S) => `Input: ${S}\nOutput: ${S}`,
  (S) => `${S}\n---\n${S}`,
  (S) => `Repeat this: ${S}\n${S}`,
  (S, xs) => `${S}\n\n${JSON.stringify(xs)}`,
];

/** One synthetic copy row: 2-8 sentences drawn at random from `pool` (with replacement, in random
 *  order, so the text is new and only copying predicts its second occurrence), joined by a space,
 *  written in one of COPY_FORMS. */
export function syntheticCopyRow(pool, r) {
  const n = r.int(2, 8);
  const xs = Array.from({ length: n }, () => r.pick(pool));
  return r.pick(COPY_FORMS)(xs.join(' '), xs);
}
