#!/usr/bin/env node
// Builds the starter v2 "tour guide" chat data (issue 13): greetings, identity/limits, Hearth
// how-to, out-of-scope refusals and "repeat after me" copying, from tools/tour_guide_topics.mjs.
//   node tools/build_tour_guide.mjs [--out data/chat] [--seed 13] [--train-rows 30000] [--valid-rows 500]
// Writes OUT/train.jsonl and OUT/valid.jsonl ({"messages": [...]} rows for `hearth train`, mlx-lm's
// chat format) and OUT/heldout.jsonl, the evaluation set read by tools/eval_tour_guide.py:
//   {"id", "category", "topic", "question", "expect": [..], "match": "any"}
// expect is ANY-OF: an answer hits when it contains at least one of the substrings, compared
// case-insensitively (copy rows: the one substring is the text to repeat, verbatim).
// Held-out phrasings: the question TEMPLATES are split, not the rows. About 1 in 5 of the "how do
// I ..." frames, of each topic's verb phrases and whole questions, of the polite prefixes/suffixes,
// of the out-of-scope templates and of the copy frames are held out; train/valid use only the
// others, every held-out question uses at least one held-out template, and no held-out question
// (lowercased, punctuation dropped) equals a train or valid question. Copy texts come from Brown
// "train" documents only (tools/brown.mjs; never chunk-valid/chunk-test), with disjoint sentence
// sets for train, valid and held-out. Not the pretraining mix (tools/build_corpus.mjs renders
// these conversations into it). Deterministic: a seeded PRNG, the same files every run.
import path from 'node:path';
import { loadBrown, writeJsonl } from './brown.mjs';
import { makeRng } from './corpus_parts.mjs';
import { COPY_FRAMES, OOS_EXPECT, OOS_TEMPLATES, OUT_OF_SCOPE, TOPICS } from './tour_guide_topics.mjs';

const args = process.argv.slice(2);
const option = (name, dflt) => {
  const i = args.indexOf(name);
  if (i < 0) return dflt;
  if (i + 1 >= args.length) throw new Error(`${name}: missing value`);
  return args[i + 1];
};
const outDir = option('--out', 'data/chat');
const seed = Number(option('--seed', '13'));
const trainRows = Number(option('--train-rows', '30000'));
const validRows = Number(option('--valid-rows', '500'));
for (const [n, v] of [['--seed', seed], ['--train-rows', trainRows], ['--valid-rows', validRows]])
  if (!Number.isInteger(v) || v < 0) throw new Error(`${n}: expected a non-negative integer, got ${v}`);

/** Splits a template list: index i is held out when i % 5 == 3 (lists of 4+ only). */
function split(list) {
  const train = [], held = [];
  list.forEach((x, i) => (list.length >= 4 && i % 5 === 3 ? held : train).push(x));
  return { train, held };
}

const HOW_FRAMES = split([
  'how do I {v}?', 'how can I {v}?', 'what is the command to {v}?', "what's the command to {v}?", 'I want to {v}.',
  'which command do I use to {v}?', 'can you tell me how to {v}?', 'tell me how to {v}', 'how to {v}', 'explain how to {v}',
  'how do I {v} with hearth?', 'is it possible to {v}?', 'can I {v} with hearth?', 'what is the best way to {v}?', 'show me how to {v}',
  'I need to {v}. what do I run?', 'how would I {v}?', 'what should I run to {v}?', 'how to {v} in hearth?', 'help me {v}',
  "I'd like to {v}.", 'how does one {v}?', 'could you explain how to {v}?', 'what do I type to {v}?', 'give me the command to {v}',
  'is there a way to {v}?', 'i am trying to {v}', 'any idea how to {v}?', "what's the easiest way to {v}?", 'remind me how to {v}',
  'how do you {v} with hearth?', 'where do I start if I want to {v}?', 'what are the steps to {v}?', 'hearth: how do I {v}?', 'can hearth help me {v}?',
]);
const PREFIXES = split(['', 'please, ', 'hi, ', 'hey, ', 'ok so ', 'hello! ', 'quick question: ', 'so ', 'excuse me, ', 'sorry, ', 'um, ', 'question: ']);
const SUFFIXES = split(['', ' please', ' thanks', ' thank you', ' :)', ' thx', ' (hearth)', '?', ' pls', '!']);
const OOS = split(OOS_TEMPLATES);
const COPY = split(COPY_FRAMES);
const SYSTEMS = [
  "You are Hearth's starter model.", 'You are a helpful assistant.', 'You are a helpful assistant. Answer briefly.',
  'Answer in one or two sentences.', 'You are the Hearth tour guide.', 'Be concise.',
  'You are a friendly assistant for the Hearth runtime.', 'You answer questions about Hearth.',
];

const rng = makeRng(seed);

/** Surface noise that is not a template: case, the final "?", a slang word, one adjacent-letter swap. */
function noise(q, r) {
  const x = r.next();
  if (x < 0.2) q = q.toLowerCase();
  else if (x < 0.4) q = q[0].toUpperCase() + q.slice(1);
  if (r.chance(0.1)) q = q.replace(/[?.!]$/, '');
  if (r.chance(0.05)) q = q.replace(/\byou\b/, 'u').replace(/\bwhat's\b/i, 'whats');
  if (r.chance(0.08)) {
    const words = q.split(' ');
    const cand = words.map((w, i) => [w, i]).filter(([w]) => /^[a-z]{5,}$/.test(w));
    if (cand.length) {
      const [w, i] = r.pick(cand);
      const j = r.int(1, w.length - 2);
      words[i] = w.slice(0, j) + w[j + 1] + w[j] + w.slice(j + 2);
      q = words.join(' ');
    }
  }
  return q;
}
const wrap = (q, r, pre, suf) => {
  const p = r.chance(0.5) ? '' : r.pick(pre.length ? pre : ['']);
  const s = r.chance(0.6) ? '' : r.pick(suf.length ? suf : ['']);
  return p + q + s;
};
const normKey = (q) => q.toLowerCase().replace(/[^a-z0-9]+/g, ' ').trim();

/** One question of a topic. held: use at least one held-out template (else only train ones). */
function topicQuestion(t, r, held) {
  const how = split(t.how ?? []), ask = split(t.ask ?? []);
  const pre = held ? [...PREFIXES.train, ...PREFIXES.held] : PREFIXES.train;
  const suf = held ? [...SUFFIXES.train, ...SUFFIXES.held] : SUFFIXES.train;
  const options = [];  // [kind, weight]
  if (!held) {
    if (how.train.length) options.push(['how', 0.6]);
    if (ask.train.length) options.push(['ask', 0.4]);
  } else {
    if (how.train.length || how.held.length) options.push(['how-heldframe', 0.45]);
    if (how.held.length) options.push(['how-heldverb', 0.25]);
    if (ask.held.length) options.push(['ask-held', 0.3]);
  }
  let total = options.reduce((a, [, w]) => a + w, 0), x = r.next() * total, kind = options[0][0];
  for (const [k, w] of options) { if ((x -= w) < 0) { kind = k; break; } }
  let q;
  if (kind === 'how') q = r.pick(HOW_FRAMES.train).replace('{v}', r.pick(how.train));
  else if (kind === 'ask') q = r.pick(ask.train);
  else if (kind === 'how-heldframe') q = r.pick(HOW_FRAMES.held).replace('{v}', r.pick([...how.train, ...how.held]));
  else if (kind === 'how-heldverb') q = r.pick(HOW_FRAMES.train).replace('{v}', r.pick(how.held));
  else q = r.pick(ask.held);
  if (kind.startsWith('ask') && t.category !== 'greeting' && r.chance(0.7)) q += '?';
  if (t.category === 'greeting' && r.chance(0.4)) q += r.pick(['!', '.', '!!', ' :)']);
  return noise(wrap(q, r, pre, suf), r);
}
const oosQuestion = (r, held) => noise(wrap(r.pick(held ? OOS.held : OOS.train)[1](r), r, PREFIXES.train, SUFFIXES.train), r);

// Copy texts: sentences of Brown "train" documents, 4-40 words, disjoint ranges per file; none with
// "??" (a Form C leftover: `about"??`).
const copyPool = [];
for (const d of loadBrown()) {
  if (d.split !== 'train') continue;
  for (const p of d.paragraphs) {
    if (p.headline) continue;
    for (const s of p.sentences) {
      const n = s.split(' ').length;
      if (n >= 4 && n <= 40 && s.length <= 240 && !s.includes('\n') && !s.includes('??')) copyPool.push(s);
    }
  }
}
makeRng(seed + 1).shuffle(copyPool);
// Disjoint ranges of the shuffled pool: held-out and valid take the last 1,000 each, train the rest
// (train uses ~7,500; it would wrap within its own range only).
const L = copyPool.length;
if (L < 10000) throw new Error(`copy sentence pool: only ${L} sentences (expected 36,000+)`);
const copyRange = { train: [0, L - 2000], valid: [L - 2000, L - 1000], held: [L - 1000, L] };
const copyNext = { train: 0, valid: 0, held: 0 };
const copyText = (which) => {
  const [a, b] = copyRange[which];
  return copyPool[a + (copyNext[which]++ % (b - a))];
};
/** [question, the text to repeat]. */
const copyQuestion = (r, which, held) => {
  const x = copyText(which);
  return [r.pick(held ? COPY.held : COPY.train).replace('{x}', () => x), x];
};

const byCat = (c) => TOPICS.filter((t) => t.category === c);
const answerOf = (t, r) => r.pick(t.answers);

/** One single-turn exchange [user, assistant] of a category, train-side templates only. */
function exchange(r, cat, which) {
  if (cat === 'out_of_scope') return [oosQuestion(r, false), OUT_OF_SCOPE];
  if (cat === 'copy') return copyQuestion(r, which, false);
  const t = r.pick(byCat(cat));
  return [topicQuestion(t, r, false), answerOf(t, r)];
}
const MIX = [['howto', 0.42], ['greeting', 0.12], ['identity', 0.1], ['out_of_scope', 0.13], ['copy', 0.23]];
function pickCat(r) {
  let x = r.next();
  for (const [c, w] of MIX) if ((x -= w) < 0) return c;
  return 'howto';
}

/** One conversation row: ~15 % multi-turn (greeting + how-to, maybe thanks), ~20 % with a system prompt. */
function conversation(r, which) {
  const msgs = [];
  if (r.chance(0.2)) msgs.push({ role: 'system', content: r.pick(SYSTEMS) });
  let turns;
  if (r.chance(0.15)) {
    const first = r.chance(0.7) ? 'greeting' : 'identity';
    turns = [exchange(r, first, which), exchange(r, 'howto', which)];
    if (r.chance(0.5)) turns.push(r.chance(0.5) ? exchange(r, 'greeting', which) : exchange(r, pickCat(r), which));
  } else turns = [exchange(r, pickCat(r), which)];
  for (const [u, a] of turns) msgs.push({ role: 'user', content: u }, { role: 'assistant', content: a });
  return { messages: msgs };
}

// Held-out set first (its questions are then kept out of train/valid too).
const hr = makeRng(seed + 2);
const heldout = [];
const heldKeys = new Set();
const addHeld = (category, topic, question, expect) => {
  const k = normKey(question);
  if (heldKeys.has(k)) return false;
  heldKeys.add(k);
  heldout.push({ id: `${category}-${topic}-${heldout.length}`, category, topic, question, expect, match: 'any' });
  return true;
};
const PER_TOPIC = { greeting: 5, identity: 5, howto: 3 };
for (const t of TOPICS) {
  let n = 0, tries = 0;
  while (n < PER_TOPIC[t.category] && tries++ < 200) if (addHeld(t.category, t.id, topicQuestion(t, hr, true), t.expect)) ++n;
}
for (let n = 0, tries = 0; n < 36 && tries < 500; ++tries) if (addHeld('out_of_scope', 'oos', oosQuestion(hr, true), OOS_EXPECT)) ++n;
for (let n = 0; n < 30; ++n) {
  const [q, x] = copyQuestion(hr, 'held', true);
  addHeld('copy', 'copy', q, [x]);
}

const train = [], valid = [];
const seen = new Set();
const rowKey = (row) => row.messages.map((m) => `${m.role}:${normKey(m.content)}`).join('|');
const userKeys = (row) => row.messages.filter((m) => m.role === 'user').map((m) => normKey(m.content));
let dupes = 0, heldClash = 0, validSeen = 0;
// A single-turn valid question that also occurs in train would make validation a memory test.
const trainQ = new Set();
for (const [out, n, which] of [[train, trainRows, 'train'], [valid, validRows, 'valid']]) {
  for (let tries = 0; out.length < n && tries < n * 20; ++tries) {
    const row = conversation(rng, which);
    const uk = userKeys(row);
    if (uk.some((k) => heldKeys.has(k))) { ++heldClash; continue; }
    if (which === 'valid' && uk.every((k) => trainQ.has(k))) { ++validSeen; continue; }
    const k = rowKey(row);
    if (seen.has(k)) { ++dupes; continue; }
    seen.add(k);
    out.push(row);
    if (which === 'train' && uk.length === 1) trainQ.add(uk[0]);
  }
}
const validClean = valid;
writeJsonl(path.join(outDir, 'train.jsonl'), train);
writeJsonl(path.join(outDir, 'valid.jsonl'), validClean);
writeJsonl(path.join(outDir, 'heldout.jsonl'), heldout);
const count = (rows, f) => rows.reduce((m, r) => ((m[f(r)] = (m[f(r)] ?? 0) + 1), m), {});
console.log(JSON.stringify({
  out: outDir, seed,
  rows: { train: train.length, valid: validClean.length, heldout: heldout.length },
  train_turns: count(train, (r) => r.messages.filter((m) => m.role === 'user').length),
  train_with_system: train.filter((r) => r.messages[0].role === 'system').length,
  heldout_categories: count(heldout, (r) => r.category),
  skipped: { duplicates: dupes, heldout_clash: heldClash, valid_seen_in_train: validSeen },
  templates: { how_frames: [HOW_FRAMES.train.length, HOW_FRAMES.held.length], oos: [OOS.train.length, OOS.held.length], copy: [COPY.train.length, COPY.held.length] },
}, null, 1));
