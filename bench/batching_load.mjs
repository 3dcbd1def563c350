#!/usr/bin/env node
// Continuous-batching load benchmark (issue 12): for each client count C, C concurrent streaming
// clients each send R completions (greedy, max_tokens T, ignore EOS not needed: the count comes from
// usage) to one `hearth serve` on loopback. Prints, per C: aggregate generated tok/s, TTFT and
// request latency p50/p99, failures, and the server's RSS before/after. Loopback only, bounded.
// Usage: node bench/batching_load.mjs --model DIR [--bin build/hearth] [--clients 1,8,32]
//        [--requests 4] [--tokens 64] [--device cpu] [--max-num-seqs 32]
//        [--server-args "--no-cuda-graph-warmup ..."] (extra `hearth serve` flags, space-separated)
// TTFT is measured at the first streamed chunk that carries a token. The server sends no chunk for a
// token whose text is empty (a special token, or bytes held back until a UTF-8 character is whole)
// unless logprobs were asked: then every token comes in a chunk of its own with its logprobs entry.
// So each request asks for logprobs=0 (the sampled token's logprob only: one value per token) and
// TTFT stops at the first chunk with text or a logprobs token; with random-weight models the first
// tokens often decode to empty text, and a text-based TTFT would be the whole latency. Same in
// bench/batching_load.py.
import { spawn } from 'node:child_process';
import fs from 'node:fs';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1]]);
  return acc;
}, []));
if (!args.model) { console.error('batching_load: --model DIR is required'); process.exit(2); }
const bin = args.bin ?? new URL('../build/hearth', import.meta.url).pathname;
const counts = (args.clients ?? '1,8,32').split(',').map(Number);
const perClient = Number(args.requests ?? 4);
const maxTokens = Number(args.tokens ?? 64);

const rssKiB = (pid) => Number(fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1]);
const pct = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor(p * s.length))]; };

async function start() {
  const proc = spawn(bin, ['serve', '--model', args.model, '--device', args.device ?? 'cpu', '--port', '0',
    '--max-num-seqs', args['max-num-seqs'] ?? '32', '--max-queue', '1024', '--prompt-cache-bytes', '0',
    ...(args['server-args'] ?? '').split(' ').filter(Boolean)],
    { stdio: ['ignore', 'pipe', 'inherit'] });
  const url = await new Promise((resolve, reject) => {
    let buf = '';
    proc.stdout.on('data', (d) => {
      buf += d;
      const m = buf.match(/http:\/\/[\d.]+:\d+/);
      if (m) resolve(m[0]);
    });
    proc.on('exit', (c) => reject(new Error(`server exited ${c}`)));
  });
  return { proc, url };
}

// Whether a streamed completions choice holds a generated token: text, or a logprobs entry.
const carriesToken = (choice) => Boolean(choice?.text) || Boolean(choice?.logprobs?.tokens?.length);

async function one(url, i) {
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: `Request ${i}: the story of a small town by the sea,`, max_tokens: maxTokens,
      temperature: 0, stream: true, stream_options: { include_usage: true }, logprobs: 0 }),
  });
  if (res.status !== 200) throw new Error(`status ${res.status}`);
  let ttft = null, tokens = 0, buf = '';
  const dec = new TextDecoder();
  for await (const chunk of res.body) {
    buf += dec.decode(chunk, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k); buf = buf.slice(k + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (j.error) throw new Error(j.error.message);
      if (ttft === null && carriesToken(j.choices?.[0])) ttft = performance.now() - t0;
      if (j.usage) tokens = j.usage.completion_tokens;
    }
  }
  return { ttft: ttft ?? performance.now() - t0, latency: performance.now() - t0, tokens };
}

const { proc, url } = await start();
try {
  await one(url, -1);  // warmup
  for (const C of counts) {
    const rss0 = rssKiB(proc.pid);
    const results = [];
    let failures = 0;
    const t0 = performance.now();
    await Promise.all(Array.from({ length: C }, async (_, c) => {
      for (let r = 0; r < perClient; ++r) {
        try { results.push(await one(url, c * 1000 + r)); } catch (e) { failures++; }
      }
    }));
    const secs = (performance.now() - t0) / 1000;
    const toks = results.reduce((a, r) => a + r.tokens, 0);
    console.log(JSON.stringify({
      clients: C, requests: results.length, failures, aggregate_tok_s: +(toks / secs).toFixed(1),
      ttft_ms_p50: +pct(results.map((r) => r.ttft), 0.5).toFixed(1), ttft_ms_p99: +pct(results.map((r) => r.ttft), 0.99).toFixed(1),
      latency_ms_p50: +pct(results.map((r) => r.latency), 0.5).toFixed(1), latency_ms_p99: +pct(results.map((r) => r.latency), 0.99).toFixed(1),
      rss_mib_before: +(rss0 / 1024).toFixed(1), rss_mib_after: +(rssKiB(proc.pid) / 1024).toFixed(1),
    }));
  }
} finally {
  proc.kill('SIGTERM');
}
