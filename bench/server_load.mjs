#!/usr/bin/env node
// Server overhead / load benchmark: C concurrent clients send N chat requests (half streamed) to
// `hearth serve` on loopback and check every reply. Prints throughput, latency p50/p99, failures,
// and the server's RSS before/after. Not a model benchmark: run it against --fake-engine to measure
// the HTTP + queue + SSE path alone, or with --model DIR (a tiny model with a chat template) to add
// the real engine: replies are then greedy (max_tokens = --words) and checked against a reference
// reply per prompt fetched sequentially before the load.
// Usage: node bench/server_load.mjs [--bin build/hearth] [--clients 32] [--requests 640] [--words 16]
//        [--model DIR] [--url http://127.0.0.1:8080 (use a running server; RSS then needs --pid)]
import { spawn } from 'node:child_process';
import fs from 'node:fs';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1]]);
  return acc;
}, []));
const clients = Number(args.clients ?? 32);
const total = Number(args.requests ?? 640);
const words = Number(args.words ?? 16);
const bin = args.bin ?? new URL('../build/hearth', import.meta.url).pathname;

function rssKiB(pid) {
  const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/);
  return m ? Number(m[1]) : NaN;
}

async function start() {
  if (args.url) return { url: args.url, pid: args.pid ? Number(args.pid) : null, stop: async () => {} };
  const engine = args.model ? ['--model', args.model, '--device', 'cpu'] : ['--fake-engine'];
  const proc = spawn(bin, ['serve', ...engine, '--port', '0'], { stdio: ['ignore', 'pipe', 'inherit'] });
  const url = await new Promise((resolve, reject) => {
    let out = '';
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/on (http:\/\/[\d.]+:\d+)/);
      if (m) resolve(m[1]);
    });
    proc.on('exit', (c) => reject(new Error('server exited ' + c)));
  });
  return {
    url, pid: proc.pid,
    stop: () => new Promise((r) => { proc.once('exit', (code) => r(code)); proc.kill('SIGTERM'); }),
  };
}

function promptText(i) {
  if (args.model) i %= 8;  // real model: 8 prompts, each with a reference reply
  return Array.from({ length: words }, (_, k) => `w${i}_${k}`).join(' ');
}
const references = new Map();  // real model: prompt -> greedy reply

async function one(url, i, stream = i % 2 === 1) {
  const prompt = promptText(i);
  const text = args.model ? references.get(prompt) : prompt;  // the fake engine echoes
  const t0 = performance.now();
  const extra = args.model ? { temperature: 0, max_tokens: words } : {};
  const r = await fetch(url + '/v1/chat/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: prompt }], stream, ...extra }),
  });
  const body = await r.text();
  const ms = performance.now() - t0;
  if (r.status !== 200) return { ok: false, ms, why: `status ${r.status}: ${body.slice(0, 200)}` };
  let got = '';
  if (!stream) {
    got = JSON.parse(body).choices[0].message.content;
  } else {
    const events = body.split('\n\n').filter((e) => e);
    if (events[events.length - 1] !== 'data: [DONE]') return { ok: false, ms, why: 'stream did not end with [DONE]' };
    for (const e of events.slice(0, -1)) {
      if (!e.startsWith('data: ')) return { ok: false, ms, why: 'bad SSE framing' };
      const c = JSON.parse(e.slice(6)).choices[0];
      got += c?.delta?.content ?? '';
    }
  }
  if (text === undefined) return { ok: true, ms, stream, got };
  if (got !== text) return { ok: false, ms, why: `corrupted reply for ${i}: ${got.slice(0, 80)}` };
  return { ok: true, ms, stream };
}

const server = await start();
await fetch(server.url + '/health');
if (args.model) {
  for (let i = 0; i < 8; i++) {
    const ref = await one(server.url, i, false);
    if (!ref.ok || !ref.got) throw new Error('reference request failed: ' + (ref.why ?? 'empty reply'));
    references.set(promptText(i), ref.got);
  }
}
const rssBefore = server.pid ? rssKiB(server.pid) : NaN;
let next = 0;
const results = [];
const t0 = performance.now();
await Promise.all(Array.from({ length: clients }, async () => {
  while (next < total) {
    const i = next++;
    try {
      results.push(await one(server.url, i));
    } catch (e) {
      results.push({ ok: false, ms: 0, why: String(e) });
    }
  }
}));
const wall = (performance.now() - t0) / 1000;
const rssAfter = server.pid ? rssKiB(server.pid) : NaN;
const code = await server.stop();

const lat = results.filter((r) => r.ok).map((r) => r.ms).sort((a, b) => a - b);
const pct = (p) => lat.length ? lat[Math.min(lat.length - 1, Math.floor(p * lat.length))] : NaN;
const failed = results.filter((r) => !r.ok);
console.log(`clients ${clients}, requests ${total} (half streamed), ${words} tokens each, loopback, ` +
  (args.model ? `model ${args.model} (greedy, checked against references)` : 'fake engine'));
console.log(`throughput   ${(total / wall).toFixed(1)} req/s, ${((total * (words + 1)) / wall).toFixed(0)} tok/s (wall ${wall.toFixed(2)} s)`);
console.log(`latency      p50 ${pct(0.5).toFixed(1)} ms, p99 ${pct(0.99).toFixed(1)} ms, max ${lat[lat.length - 1]?.toFixed(1)} ms`);
console.log(`failed       ${failed.length}${failed.length ? ' e.g. ' + failed[0].why : ''}`);
console.log(`server RSS   before ${(rssBefore / 1024).toFixed(1)} MiB, after ${(rssAfter / 1024).toFixed(1)} MiB`);
if (code !== undefined) console.log(`server exit  ${code} (SIGTERM)`);
process.exit(failed.length ? 1 : 0);
