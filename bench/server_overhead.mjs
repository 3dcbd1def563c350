#!/usr/bin/env node
// Server overhead: the same greedy chat request through `hearth serve` (streamed over loopback
// HTTP) and through `hearth generate`, alternately, R rounds each. Reports median decode tok/s and
// time to first token for both, and the overhead in percent. Client-side timing for the server
// (first content chunk, then one chunk per token); the engine's own numbers for generate.
// Usage: node bench/server_overhead.mjs --model DIR [--bin build/hearth] [--rounds 5]
//        [--max-tokens 128] [--prompt TEXT] [--device cpu|cuda] [--raw 1]
// --raw 1: no chat template (POST /v1/completions vs generate --ignore-chat-template), for base
// models that end a chat answer after a few tokens.
import { spawn, spawnSync } from 'node:child_process';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1]]);
  return acc;
}, []));
if (!args.model) throw new Error('--model DIR is required');
const bin = args.bin ?? new URL('../build/hearth', import.meta.url).pathname;
const rounds = Number(args.rounds ?? 5);
const maxTokens = Number(args['max-tokens'] ?? 128);
const prompt = args.prompt ?? 'Tell me about the history of the city.';
const device = args.device ?? 'cpu';
const raw = args.raw === '1';
const median = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];

async function startServer() {
  const proc = spawn(bin, ['serve', '--model', args.model, '--device', device, '--port', '0'],
                     { stdio: ['ignore', 'pipe', 'inherit'] });
  const url = await new Promise((resolve, reject) => {
    let buf = '';
    proc.stdout.on('data', (d) => {
      buf += d;
      const m = buf.match(/http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) resolve(`http://127.0.0.1:${m[1]}`);
    });
    proc.on('exit', (c) => reject(new Error(`server exited ${c}`)));
  });
  return { proc, url };
}

async function viaServer(url) {
  const t0 = performance.now();
  const common = { max_tokens: maxTokens, temperature: 0, stream: true, stream_options: { include_usage: true } };
  const res = await fetch(`${url}/v1/${raw ? 'completions' : 'chat/completions'}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(raw ? { prompt, ...common } : { messages: [{ role: 'user', content: prompt }], ...common }),
  });
  const dec = new TextDecoder();
  let first = 0, last = 0, tokens = 0, buf = '';
  for await (const chunk of res.body) {
    buf += dec.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i); buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (j.usage) tokens = j.usage.completion_tokens;
      if (j.choices?.[0]?.delta?.content || j.choices?.[0]?.text) {
        if (!first) first = performance.now();
        last = performance.now();
      }
    }
  }
  return { ttft: first - t0, tps: (tokens - 1) / ((last - first) / 1000), tokens };
}

function viaGenerate() {
  const r = spawnSync(bin, ['generate', '--model', args.model, '--device', device, '--prompt', prompt,
                            '--max-tokens', String(maxTokens), '--temp', '0', ...(raw ? ['--ignore-chat-template'] : [])],
                     { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`generate failed: ${r.stderr}`);
  const all = r.stdout + r.stderr;  // the statistics go to stderr
  const gen = all.match(/Generation: (\d+) tokens, ([\d.]+) tokens-per-sec/);
  const ttft = all.match(/Time to first token: ([\d.]+) ms/);
  return { ttft: Number(ttft[1]), tps: Number(gen[2]), tokens: Number(gen[1]) };
}

const { proc, url } = await startServer();
const s = [], g = [];
await viaServer(url);  // warm-up
for (let r = 0; r < rounds; ++r) {
  s.push(await viaServer(url));
  g.push(viaGenerate());
}
proc.kill('SIGINT');
const row = (name, a) => `${name.padEnd(10)} ${median(a.map((x) => x.tps)).toFixed(1).padStart(8)} tok/s  ` +
  `TTFT ${median(a.map((x) => x.ttft)).toFixed(1).padStart(7)} ms  (${a[0].tokens} tokens)`;
console.log(row('generate', g));
console.log(row('server', s));
const over = 100 * (1 - median(s.map((x) => x.tps)) / median(g.map((x) => x.tps)));
console.log(`decode overhead ${over.toFixed(2)}%; TTFT difference ${(median(s.map((x) => x.ttft)) - median(g.map((x) => x.ttft))).toFixed(1)} ms`);
