#!/usr/bin/env python3
"""Continuous-batching load benchmark, the Python twin of bench/batching_load.mjs for machines
without Node (the GPU machine): for each client count C, C concurrent streaming clients each send R
completions (greedy, max_tokens T; the count comes from usage) to one `hearth serve` on loopback.
Prints one JSON line per C: aggregate generated tok/s, TTFT and latency p50/p99, failures, the
server's RSS before/after. Loopback only, bounded (R requests per client).

TTFT is measured at the first streamed chunk that carries a token. The server sends no chunk for a
token whose text is empty (a special token, or bytes held back until a UTF-8 character is whole)
unless logprobs were asked: then every token comes in a chunk of its own with its logprobs entry,
text or not. So each request asks for logprobs=0 (the sampled token's logprob, no alternatives: one
value read per token) and TTFT stops at the first chunk with text or a logprobs token; with
random-weight models the first tokens often decode to empty text, and a text-based TTFT would then
be the whole latency. Same in bench/batching_load.mjs. `--no-logprobs` leaves them out (what most
clients send: the server's cheapest path) — only for a model whose every token decodes to text
(e.g. a random model with a real tokenizer and its vocabulary), or TTFT means nothing.

  python3 bench/batching_load.py --model DIR [--bin build/hearth] [--clients 1,8,32] [--requests 4]
                                 [--tokens 64] [--device cpu] [--max-num-seqs 32]
                                 [--no-logprobs] [--server-args "--no-cuda-graph-warmup ..."]
"""
import argparse
import http.client
import json
import re
import subprocess
import threading
import time
from urllib.parse import urlparse


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024


def pct(xs, p):
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))]


def carries_token(choice):
    """Whether a streamed completions choice holds a generated token: text, or a logprobs entry."""
    return bool(choice.get("text")) or bool((choice.get("logprobs") or {}).get("tokens"))


def one(url, i, max_tokens, logprobs=True):
    """One streamed completion (stdlib http.client: it undoes the chunked encoding)."""
    t0 = time.perf_counter()
    body = {"prompt": f"Request {i}: the story of a small town by the sea,", "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if logprobs:
        body["logprobs"] = 0
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
        res = conn.getresponse()
        if res.status != 200:
            raise RuntimeError(f"status {res.status}")
        ttft, tokens = None, 0
        while True:
            line = res.readline()
            if not line:
                break
            line = line.decode().rstrip("\r\n")
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            j = json.loads(line[6:])
            if "error" in j:
                raise RuntimeError(j["error"]["message"])
            if ttft is None and j.get("choices") and carries_token(j["choices"][0]):
                ttft = time.perf_counter() - t0
            if j.get("usage"):
                tokens = j["usage"]["completion_tokens"]
    finally:
        conn.close()
    now = time.perf_counter()
    return {"ttft": (ttft if ttft is not None else now - t0) * 1e3, "latency": (now - t0) * 1e3, "tokens": tokens}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--bin", default="build/hearth")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--max-num-seqs", default="32")
    ap.add_argument("--no-logprobs", action="store_true", help="requests without logprobs (see above)")
    ap.add_argument("--server-args", default="", help="extra `hearth serve` flags, split on spaces")
    a = ap.parse_args()
    cmd = [a.bin, "serve", "--model", a.model, "--device", a.device, "--port", "0", "--max-num-seqs",
           a.max_num_seqs, "--max-queue", "1024", "--prompt-cache-bytes", "0"]
    if a.dtype:
        cmd += ["--dtype", a.dtype]
    cmd += a.server_args.split()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    url = None
    while url is None:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"batching_load: the server exited ({proc.wait()})")
        m = re.search(r"http://[\d.]+:\d+", line)
        url = m.group(0) if m else None
    try:
        one(url, -1, a.tokens, not a.no_logprobs)  # warmup
        for C in [int(c) for c in a.clients.split(",")]:
            rss0 = rss_mib(proc.pid)
            results, failures, lock = [], [0], threading.Lock()

            def worker(c):
                for r in range(a.requests):
                    try:
                        out = one(url, c * 1000 + r, a.tokens, not a.no_logprobs)
                        with lock:
                            results.append(out)
                    except Exception:  # counted, the run goes on
                        with lock:
                            failures[0] += 1

            t0 = time.perf_counter()
            threads = [threading.Thread(target=worker, args=(c,)) for c in range(C)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            secs = time.perf_counter() - t0
            toks = sum(r["tokens"] for r in results)
            print(json.dumps({
                "clients": C, "requests": len(results), "failures": failures[0],
                "aggregate_tok_s": round(toks / secs, 1),
                "ttft_ms_p50": round(pct([r["ttft"] for r in results], 0.5), 1),
                "ttft_ms_p99": round(pct([r["ttft"] for r in results], 0.99), 1),
                "latency_ms_p50": round(pct([r["latency"] for r in results], 0.5), 1),
                "latency_ms_p99": round(pct([r["latency"] for r in results], 0.99), 1),
                "rss_mib_before": round(rss0, 1), "rss_mib_after": round(rss_mib(proc.pid), 1)}), flush=True)
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
