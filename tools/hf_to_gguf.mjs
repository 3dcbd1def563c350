#!/usr/bin/env node
// Writes a llama-family Hugging Face folder (float safetensors) as one GGUF file for llama.cpp: the
// peer side of bench/llama_cpp_peer.sh (issue 11's CPU rows: F32 vs F32, Q8_0 vs MLX 8-bit).
// Tensors in F32, F16 or Q8_0 (llama.cpp's quantize_row_q8_0_ref), llama metadata, and the
// SentencePiece-style vocabulary of a byte-fallback BPE tokenizer.json (llama-2's, the starter's).
// Not a general converter (llama.cpp's convert_hf_to_gguf.py is): no MLX-quantized input (run
// `hearth convert -d` first), no biases, no other tokenizer kinds. Follows the GGUF v3 spec
// (ggml/docs/gguf.md) and convert_hf_to_gguf.py's LlamaModel (q/k row permutation, llama3 rope_freqs).
//
//   node tools/hf_to_gguf.mjs --model DIR --out FILE.gguf [--type f32|f16|q8_0]
import fs from "node:fs";
import path from "node:path";

let tmpPath = null;  // the partial output, removed on any failure
function fail(msg) {
  if (tmpPath) fs.rmSync(tmpPath, { force: true });
  process.stderr.write(`hf_to_gguf: ${msg}\n`);
  process.exit(1);
}
process.on("uncaughtException", (e) => fail(e.message.split("\n")[0]));

const args = { type: "f32" };
for (let i = 2; i < process.argv.length; i += 2) {
  const k = process.argv[i], v = process.argv[i + 1];
  if (!["--model", "--out", "--type"].includes(k) || v === undefined)
    fail(`usage: --model DIR --out FILE.gguf [--type f32|f16|q8_0] (at '${k}')`);
  args[k.slice(2)] = v;
}
if (!args.model || !args.out) fail("--model DIR and --out FILE.gguf are required");
const GGML = { f32: 0, f16: 1, q8_0: 8 };
const FILE_TYPE = { f32: 0, f16: 1, q8_0: 7 };  // llama_ftype: ALL_F32, MOSTLY_F16, MOSTLY_Q8_0
if (!Object.hasOwn(GGML, args.type)) fail(`--type '${args.type}': expected f32, f16 or q8_0`);
if (fs.existsSync(args.out)) fail(`--out ${args.out}: already exists (the converter writes a new file)`);
if (!fs.existsSync(path.dirname(path.resolve(args.out)))) fail(`--out ${args.out}: its folder does not exist`);

const readJson = (p) => {
  try { return JSON.parse(fs.readFileSync(p, "utf8")); } catch (e) { fail(`${p}: ${e.message}`); }
};
const cfg = readJson(path.join(args.model, "config.json"));
if (!["llama", "mistral"].includes(cfg.model_type)) fail(`config.json: model_type '${cfg.model_type}' is not llama`);
if (cfg.quantization || cfg.quantization_config) fail("config.json: an MLX-quantized model; run `hearth convert -d` first");
if (cfg.attention_bias || cfg.mlp_bias) fail("config.json: attention_bias/mlp_bias are not supported here");
const nHead = cfg.num_attention_heads, nKv = cfg.num_key_value_heads ?? nHead, hidden = cfg.hidden_size;
const headDim = cfg.head_dim ?? hidden / nHead;

// ---- safetensors (one file or an index of shards), read tensor by tensor.
const tensors = new Map();  // name -> {file, dtype, shape, begin, end}
{
  const idx = path.join(args.model, "model.safetensors.index.json");
  const files = fs.existsSync(idx) ? [...new Set(Object.values(readJson(idx).weight_map))] : ["model.safetensors"];
  for (const f of files) {
    const file = path.join(args.model, f);
    const fd = fs.openSync(file, "r");
    const len = Buffer.alloc(8);
    fs.readSync(fd, len, 0, 8, 0);
    const n = Number(len.readBigUInt64LE());
    const hb = Buffer.alloc(n);
    fs.readSync(fd, hb, 0, n, 8);
    let header;
    try {
      header = JSON.parse(hb.toString("utf8"));
    } catch (e) {
      fail(`${file}: the safetensors header is not valid JSON`);
    }
    const size = fs.fstatSync(fd).size;
    const width = { F32: 4, BF16: 2, F16: 2 };
    for (const [name, t] of Object.entries(header)) {
      if (name === "__metadata__") continue;
      const begin = 8 + n + t.data_offsets[0], end = 8 + n + t.data_offsets[1];
      if (end > size) fail(`${file}: ${name} ends at byte ${end}, past the file's ${size} bytes (truncated?)`);
      if (width[t.dtype] && end - begin !== width[t.dtype] * t.shape.reduce((a, b) => a * b, 1))
        fail(`${file}: ${name} holds ${end - begin} bytes, its shape [${t.shape}] of ${t.dtype} needs ${width[t.dtype] * t.shape.reduce((a, b) => a * b, 1)}`);
      tensors.set(name, { fd, dtype: t.dtype, shape: t.shape, begin, end });
    }
  }
}
function readF32(name) {
  const t = tensors.get(name);
  if (!t) fail(`${args.model}: tensor ${name} is missing`);
  const bytes = Buffer.alloc(t.end - t.begin);
  fs.readSync(t.fd, bytes, 0, bytes.length, t.begin);
  const n = t.shape.reduce((a, b) => a * b, 1);
  const out = new Float32Array(n);
  if (t.dtype === "F32") {
    for (let i = 0; i < n; ++i) out[i] = bytes.readFloatLE(4 * i);
  } else if (t.dtype === "BF16") {
    const u = new Uint32Array(out.buffer);
    for (let i = 0; i < n; ++i) u[i] = bytes.readUInt16LE(2 * i) << 16;
  } else if (t.dtype === "F16") {
    for (let i = 0; i < n; ++i) out[i] = halfToFloat(bytes.readUInt16LE(2 * i));
  } else {
    fail(`${name}: dtype ${t.dtype} is not a float type`);
  }
  return { data: out, shape: t.shape };
}

// ---- half precision (round to nearest even), as ggml's FP32_TO_FP16.
const f32b = new Float32Array(1), u32b = new Uint32Array(f32b.buffer);
function floatToHalf(v) {
  f32b[0] = v;
  const x = u32b[0], sign = (x >>> 16) & 0x8000, exp = (x >>> 23) & 0xff;
  let m = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (m ? 0x200 : 0);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    m |= 0x800000;
    const shift = 14 - e, mid = 1 << (shift - 1), rem = m & ((1 << shift) - 1);
    let h = m >>> shift;
    if (rem > mid || (rem === mid && (h & 1))) ++h;
    return sign | h;
  }
  let h = (e << 10) | (m >>> 13);
  const rem = m & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && (h & 1))) ++h;
  return sign | h;
}
function halfToFloat(h) {
  const s = h & 0x8000 ? -1 : 1, e = (h >>> 10) & 0x1f, m = h & 0x3ff;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 0x1f) return m ? NaN : s * Infinity;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}

// ---- the tensors to write, in llama.cpp's names; 2-D weights [out, in] become GGUF dims [in, out].
// convert_hf_to_gguf.py LlamaModel.permute: HF's rotate-half q/k rows back to interleaved pairs.
function permute(w, heads) {
  const rows = w.shape[0], cols = w.shape[1], hd = rows / heads, out = new Float32Array(w.data.length);
  if (!Number.isInteger(hd) || hd % 2 !== 0 || hd !== headDim)
    fail(`a q/k projection of ${rows} rows does not split into ${heads} heads of head_dim ${headDim}`);
  for (let h = 0; h < heads; ++h)
    for (let i = 0; i < hd / 2; ++i)
      for (let j = 0; j < 2; ++j)
        out.set(w.data.subarray((h * hd + j * (hd / 2) + i) * cols, (h * hd + j * (hd / 2) + i + 1) * cols), (h * hd + 2 * i + j) * cols);
  return { data: out, shape: w.shape };
}
const plan = [];  // {name, load: () => {data, shape}, quantizable}
const add = (name, load, quantizable = true) => plan.push({ name, load, quantizable });
add("token_embd.weight", () => readF32("model.embed_tokens.weight"));
for (let i = 0; i < cfg.num_hidden_layers; ++i) {
  const p = `model.layers.${i}.`, b = `blk.${i}.`;
  add(b + "attn_norm.weight", () => readF32(p + "input_layernorm.weight"), false);
  add(b + "attn_q.weight", () => permute(readF32(p + "self_attn.q_proj.weight"), nHead));
  add(b + "attn_k.weight", () => permute(readF32(p + "self_attn.k_proj.weight"), nKv));
  add(b + "attn_v.weight", () => readF32(p + "self_attn.v_proj.weight"));
  add(b + "attn_output.weight", () => readF32(p + "self_attn.o_proj.weight"));
  add(b + "ffn_norm.weight", () => readF32(p + "post_attention_layernorm.weight"), false);
  add(b + "ffn_gate.weight", () => readF32(p + "mlp.gate_proj.weight"));
  add(b + "ffn_up.weight", () => readF32(p + "mlp.up_proj.weight"));
  add(b + "ffn_down.weight", () => readF32(p + "mlp.down_proj.weight"));
}
add("output_norm.weight", () => readF32("model.norm.weight"), false);
if (cfg.tie_word_embeddings === false && !tensors.has("lm_head.weight"))
  fail("config.json says tie_word_embeddings: false but lm_head.weight is missing");
if (!cfg.tie_word_embeddings && tensors.has("lm_head.weight")) add("output.weight", () => readF32("lm_head.weight"));
if (cfg.sliding_window) fail(`config.json: sliding_window ${cfg.sliding_window} is not written by this converter`);
const rs = cfg.rope_scaling;
if (rs && (rs.rope_type ?? rs.type) === "llama3") {
  // convert_hf_to_gguf.py LlamaModel.generate_extra_tensors: per-frequency factors.
  const base = cfg.rope_theta ?? 10000, factor = rs.factor ?? 8, lo = rs.low_freq_factor ?? 1, hi = rs.high_freq_factor ?? 4;
  const old = rs.original_max_position_embeddings ?? 8192, loWave = old / lo, hiWave = old / hi;
  const f = new Float32Array(headDim / 2);
  for (let k = 0; k < headDim / 2; ++k) {
    const wave = (2 * Math.PI) / (1 / base ** ((2 * k) / headDim));
    if (wave < hiWave) f[k] = 1;
    else if (wave > loWave) f[k] = factor;
    else {
      const smooth = (old / wave - lo) / (hi - lo);
      f[k] = 1 / ((1 - smooth) / factor + smooth);
    }
  }
  add("rope_freqs.weight", () => ({ data: f, shape: [headDim / 2] }), false);
} else if (rs && (rs.rope_type ?? rs.type) !== "default") {
  fail(`config.json: rope_scaling type '${rs.rope_type ?? rs.type}' is not supported here`);
}

// ---- vocabulary: tokenizer.json's BPE vocab as SentencePiece pieces (convert's LlamaHfVocab).
const tok = readJson(path.join(args.model, "tokenizer.json"));
if (tok.model?.type !== "BPE" || !tok.model.byte_fallback) fail("tokenizer.json: only byte-fallback BPE (llama-2 style) vocabularies are written");
const embedRows = tensors.get("model.embed_tokens.weight").shape[0];
const tokens = new Array(embedRows).fill(null), types = new Int32Array(embedRows).fill(1), scores = new Float32Array(embedRows);
for (const [text, id] of Object.entries(tok.model.vocab)) if (id < embedRows) tokens[id] = text;
const special = new Set((tok.added_tokens ?? []).filter((t) => t.special).map((t) => t.id));
for (const t of tok.added_tokens ?? []) if (t.id < embedRows) tokens[t.id] = t.content;
for (let id = 0; id < embedRows; ++id) {
  scores[id] = -id;  // merge priority by rank: the ids of a BPE vocab follow its merges
  if (tokens[id] === null) { tokens[id] = `[PAD${id}]`; types[id] = 4; continue; }
  if (tokens[id] === tok.model.unk_token) types[id] = 2;
  else if (special.has(id)) types[id] = 3;
  else if (/^<0x[0-9A-F]{2}>$/.test(tokens[id])) types[id] = 6;
}
const gen = fs.existsSync(path.join(args.model, "generation_config.json")) ? readJson(path.join(args.model, "generation_config.json")) : {};
const firstId = (v) => (Array.isArray(v) ? v[0] : v);

// ---- GGUF writer.
const T = { u32: 4, i32: 5, f32: 6, bool: 7, str: 8, arr: 9 };
const chunks = [];
const u32 = (v) => { const b = Buffer.alloc(4); b.writeUInt32LE(v); chunks.push(b); };
const u64 = (v) => { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(v)); chunks.push(b); };
const str = (s) => { const b = Buffer.from(s, "utf8"); u64(b.length); chunks.push(b); };
const kv = [];
const meta = (key, type, value, elem) => kv.push({ key, type, value, elem });
meta("general.architecture", T.str, "llama");
meta("general.name", T.str, path.basename(path.resolve(args.model)));
meta("general.file_type", T.u32, FILE_TYPE[args.type]);
meta("llama.vocab_size", T.u32, embedRows);
meta("llama.context_length", T.u32, cfg.max_position_embeddings ?? 4096);
meta("llama.embedding_length", T.u32, hidden);
meta("llama.block_count", T.u32, cfg.num_hidden_layers);
meta("llama.feed_forward_length", T.u32, cfg.intermediate_size);
meta("llama.rope.dimension_count", T.u32, headDim);
meta("llama.attention.head_count", T.u32, nHead);
meta("llama.attention.head_count_kv", T.u32, nKv);
meta("llama.attention.key_length", T.u32, headDim);
meta("llama.attention.value_length", T.u32, headDim);
meta("llama.attention.layer_norm_rms_epsilon", T.f32, cfg.rms_norm_eps ?? 1e-6);
meta("llama.rope.freq_base", T.f32, cfg.rope_theta ?? 10000);
meta("tokenizer.ggml.model", T.str, "llama");
meta("tokenizer.ggml.tokens", T.arr, tokens, T.str);
meta("tokenizer.ggml.scores", T.arr, scores, T.f32);
meta("tokenizer.ggml.token_type", T.arr, types, T.i32);
const bos = firstId(gen.bos_token_id ?? cfg.bos_token_id), eos = firstId(gen.eos_token_id ?? cfg.eos_token_id);
if (bos !== undefined && bos !== null) meta("tokenizer.ggml.bos_token_id", T.u32, bos);
if (eos !== undefined && eos !== null) meta("tokenizer.ggml.eos_token_id", T.u32, eos);
const unk = tok.model.unk_token !== undefined ? tok.model.vocab[tok.model.unk_token] : undefined;
if (unk !== undefined) meta("tokenizer.ggml.unknown_token_id", T.u32, unk);
meta("tokenizer.ggml.add_bos_token", T.bool, true);

function writeValue(type, v) {
  if (type === T.u32) u32(v);
  else if (type === T.i32) { const b = Buffer.alloc(4); b.writeInt32LE(v); chunks.push(b); }
  else if (type === T.f32) { const b = Buffer.alloc(4); b.writeFloatLE(v); chunks.push(b); }
  else if (type === T.bool) chunks.push(Buffer.from([v ? 1 : 0]));
  else if (type === T.str) str(v);
}
const ALIGN = 32;
const typeOf = (e) => (e.quantizable ? GGML[args.type] : GGML.f32);
function nbytes(type, shape) {
  const n = shape.reduce((a, b) => a * b, 1);
  if (type === GGML.f32) return 4 * n;
  if (type === GGML.f16) return 2 * n;
  return (n / 32) * 34;  // q8_0: blocks of {f16 d; int8 qs[32]}
}
// Shapes come from the headers (rope_freqs from its length) before any data is read.
for (const e of plan) {
  if (e.name === "rope_freqs.weight") e.shape = [headDim / 2];
  else {
    const src = { "token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight" }[e.name];
    const m = /^blk\.(\d+)\.(\w+)\.weight$/.exec(e.name);
    const names = { attn_norm: "input_layernorm", attn_q: "self_attn.q_proj", attn_k: "self_attn.k_proj", attn_v: "self_attn.v_proj", attn_output: "self_attn.o_proj", ffn_norm: "post_attention_layernorm", ffn_gate: "mlp.gate_proj", ffn_up: "mlp.up_proj", ffn_down: "mlp.down_proj" };
    const hf = src ?? `model.layers.${m[1]}.${names[m[2]]}.weight`;
    if (!tensors.has(hf)) fail(`${args.model}: tensor ${hf} is missing`);
    e.shape = tensors.get(hf).shape;
  }
  if (typeOf(e) === GGML.q8_0 && e.shape[e.shape.length - 1] % 32 !== 0) e.quantizable = false;  // rows must be whole blocks
}

u32(0x46554747);  // "GGUF"
u32(3);
u64(plan.length);
u64(kv.length);
for (const { key, type, value, elem } of kv) {
  str(key);
  u32(type);
  if (type === T.arr) {
    u32(elem);
    u64(value.length);
    for (const v of value) writeValue(elem, v);
  } else writeValue(type, value);
}
let offset = 0;
for (const e of plan) {
  str(e.name);
  u32(e.shape.length);
  for (const d of [...e.shape].reverse()) u64(d);  // ne[0] is the innermost (columns)
  u32(typeOf(e));
  u64(offset);
  e.offset = offset;
  offset += Math.ceil(nbytes(typeOf(e), e.shape) / ALIGN) * ALIGN;
}
const tmp = `${args.out}.tmp.${process.pid}`;
tmpPath = tmp;
const out = fs.openSync(tmp, "w");
let pos = 0;
const write = (b) => { fs.writeSync(out, b); pos += b.length; };
for (const c of chunks) write(c);
write(Buffer.alloc((ALIGN - (pos % ALIGN)) % ALIGN));
const dataStart = pos;
for (const e of plan) {
  const { data } = e.load();
  const type = typeOf(e);
  let b;
  if (type === GGML.f32) b = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  else if (type === GGML.f16) {
    b = Buffer.alloc(2 * data.length);
    for (let i = 0; i < data.length; ++i) b.writeUInt16LE(floatToHalf(data[i]), 2 * i);
  } else {
    // ggml-quants.c quantize_row_q8_0_ref: d = amax/127, q = roundf(x/d) (half away from zero).
    b = Buffer.alloc((data.length / 32) * 34);
    for (let blk = 0; blk < data.length / 32; ++blk) {
      let amax = 0;
      for (let j = 0; j < 32; ++j) amax = Math.max(amax, Math.abs(data[blk * 32 + j]));
      const d = Math.fround(amax / 127), id = d ? Math.fround(1 / d) : 0;  // float32, as in C
      b.writeUInt16LE(floatToHalf(d), blk * 34);
      for (let j = 0; j < 32; ++j) {
        const v = Math.fround(data[blk * 32 + j] * id);
        b.writeInt8(Math.sign(v) * Math.round(Math.abs(v)), blk * 34 + 2 + j);
      }
    }
  }
  if (pos - dataStart !== e.offset) fail(`internal: ${e.name} at ${pos - dataStart}, planned ${e.offset}`);
  write(b);
  write(Buffer.alloc((ALIGN - (b.length % ALIGN)) % ALIGN));
}
fs.closeSync(out);
if (fs.existsSync(args.out)) fail(`--out ${args.out}: appeared while converting; not replaced`);
fs.renameSync(tmp, args.out);
tmpPath = null;
console.log(`wrote ${args.out}: ${plan.length} tensors, ${args.type}, ${(pos / 1e6).toFixed(1)} MB`);
