#!/usr/bin/env node
// llama.cpp's CPU speed on a GGUF file, measured like `hearth bench` (random prompt ids, one warmup,
// median of runs): prefill tok/s of --prompt-tokens ids and greedy decode tok/s of --gen-tokens
// tokens, through node-llama-cpp's prebuilt CPU build (the peer of issue 11's CPU rows). With
// --ids "1 2 3" it prints the greedy continuation ids of that prompt instead (a correctness check of
// a converted file against `hearth generate`). Not a server benchmark. Installed and run by
// bench/llama_cpp_peer.sh. Prints one JSON line.
//
//   node bench/llama_cpp_peer.mjs --model FILE.gguf [--threads 2 --prompt-tokens 128 --gen-tokens 64 --runs 3]
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const a = { threads: 2, "prompt-tokens": 128, "gen-tokens": 64, runs: 3 };
for (let i = 2; i < process.argv.length; i += 2) a[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];
if (!a.model) {
  console.error("llama_cpp_peer: --model FILE.gguf is required");
  process.exit(1);
}
const P = Number(a["prompt-tokens"]), G = Number(a["gen-tokens"]), runs = Number(a.runs), threads = Number(a.threads);

const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, maxThreads: threads });
const model = await llama.loadModel({ modelPath: a.model, gpuLayers: 0 });
const ctx = await model.createContext({ contextSize: P + G + 64, batchSize: Math.max(P, 8), threads: { ideal: threads, min: threads } });
const seq = ctx.getSequence();
const vocab = model.fileInfo.metadata.llama?.vocab_size ?? 32000;

async function generate(prompt, n) {
  // evaluate() prefills the prompt, then yields one greedy token per step (fed back by the library).
  const out = [];
  const t0 = performance.now();
  let t1 = 0;
  for await (const tok of seq.evaluate(prompt, { temperature: 0, yieldEogToken: true })) {
    if (out.length === 0) t1 = performance.now();
    out.push(tok);
    if (out.length >= n) break;
  }
  const t2 = performance.now();
  return { out, prefill_s: (t1 - t0) / 1000, decode_s: (t2 - t1) / 1000 };
}

if (a.ids) {
  const prompt = a.ids.trim().split(/\s+/).map(Number);
  const { out } = await generate(prompt, G);
  console.log(JSON.stringify({ ids: out }));
} else {
  let seed = 12345;
  const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
  const prompt = () => Array.from({ length: P }, () => 3 + Math.floor(rand() * (vocab - 3)));
  const prefill = [], decode = [];
  for (let r = 0; r <= runs; ++r) {
    await seq.clearHistory();
    const g = await generate(prompt(), G + 1);  // the first token ends the prefill; G decode steps follow
    if (r === 0) continue;  // warmup
    prefill.push(P / g.prefill_s);
    decode.push((g.out.length - 1) / g.decode_s);
  }
  const median = (v) => v.sort((x, y) => x - y)[Math.floor(v.length / 2)];
  console.log(JSON.stringify({ peer: "llama.cpp (node-llama-cpp prebuilt CPU)", threads, prompt_tokens: P, gen_tokens: G, prefill_tok_s: median(prefill), decode_tok_s: median(decode) }));
}
await ctx.dispose();
await model.dispose();
