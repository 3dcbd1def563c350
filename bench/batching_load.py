#!/usr/bin/env python3
"""Continuous-batching load benchmark, the Python twin of bench/batching_load.mjs for machines
without Node (the GPU machine): for each client count C, C concurrent streaming clients each send R
completions (greedy, max_tokens T; the count comes from usage) to one `hearth serve` on loopback.
Prints one JSON line per C and round (--rounds: each C run again on the same server): aggregate
generated tok/s, TTFT and latency p50/p99 (and TTFT mean), the server's own TTFT from /metrics,
failures, the server's RSS before/after, the clients' CPU share. Loopback only, bounded (R
requests per client). Standard library only.

The clients must not be what is measured: at GPU rates (32-128 streams, 10,000-25,000 chunks/s) a
thread per client with http.client (this script before) spent its time under the GIL parsing
chunks, and a request's first chunk waited for the others' parsing. So each client is a coroutine
with a minimal HTTP/1.1 client (StreamedCompletion): a chunk's time is taken when the event loop
reads it, and after the first token a chunk costs a list append (its bytes are parsed at the end).
The clients run in --client-procs processes (default one per 16 clients, at most a quarter of the
cores), started together; client_cpu_pct is the busiest one's CPU share over the run: near 100 %,
the client limits the measurement. TTFT and latency run from the request's write on an open
connection (connection setup is not timed) to the read of the first token chunk / the last chunk.

The server's view: `GET /metrics` before and after each C; from the differences of the
hearth_time_to_first_token_seconds buckets, server_ttft_ms_p50 / _p99 are the upper bound of the
bucket holding that quantile (the k-th smallest, k as for the client's percentiles: a bound, not an
estimate; the buckets are vLLM's: 1, 5, 10, 20, 40, 60, 80, 100, 250, 500 ms, ...; null past the
last) and server_ttft_ms_mean is exact (_sum / _count). The server times from the request's arrival
(its body read) to when its HTTP thread takes the first token with text from the engine, before
writing it; so client minus server is the client, the loopback and the server's HTTP work.
server_queue_ms_p50 / _p99 / _mean read hearth_request_queue_time_seconds the same way: arrival to
admission into the running batch (the prompt built, a seat taken), so server TTFT minus it is the
prefill and the first step.

TTFT is measured at the first streamed chunk that carries a token. The server sends no chunk for a
token whose text is empty (a special token, or bytes held back until a UTF-8 character is whole)
unless logprobs were asked: then every token comes in a chunk of its own with its logprobs entry,
text or not. So each request asks for logprobs=0 (the sampled token's logprob, no alternatives: one
value read per token) and TTFT stops at the first chunk with text or a logprobs token; with
random-weight models the first tokens often decode to empty text, and a text-based TTFT would then
be the whole latency (the server's histogram waits for text: it means nothing there). Same in
bench/batching_load.mjs. `--no-logprobs` leaves them out (what most clients send: the server's
cheapest path) — only for a model whose every token decodes to text (e.g. a random model with a
real tokenizer and its vocabulary), or TTFT means nothing.
bench/fake_stream_server.py stands in for the server to measure what the clients add.

  python3 bench/batching_load.py --model DIR [--bin build/hearth] [--clients 1,8,32] [--requests 4]
                                 [--tokens 64] [--device cpu] [--max-num-seqs 32] [--client-procs N]
                                 [--no-logprobs] [--ignore-eos] [--rounds N] [--server-args "--no-cuda-graph-warmup ..."]
"""
import argparse
import asyncio
import gc
import http.client
import json
import math
import multiprocessing
import os
import re
import subprocess
import time
from urllib.parse import urlparse


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024


def pct(xs, p):
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(p * len(s)))], 1) if s else None


def carries_token(choice):
    """Whether a streamed completions choice holds a generated token: text, or a logprobs entry."""
    return bool(choice.get("text")) or bool((choice.get("logprobs") or {}).get("tokens"))


class StreamedCompletion(asyncio.Protocol):
    """One streamed completion over its own loopback connection: a minimal HTTP/1.1 client (POST,
    status line and headers, `Transfer-Encoding: chunked` undone, SSE `data:` lines split) whose
    data_received takes the arrival time first, so a chunk's time is when the event loop read it.
    Until the first token every read is parsed (each `data:` line as JSON); after it the bytes are
    only kept until the last chunk (`0\\r\\n\\r\\n`) arrives and parsed then, once (the usage, an error),
    so the client's work per streamed chunk is a list append and a look at its last bytes."""

    END = b"\r\n0\r\n\r\n"  # a chunk's CRLF, then the zero-size last chunk (sizes have no leading 0)

    def __init__(self, request, done):
        self.request, self.t0, self.done = request, None, done
        self.buf, self.sse, self.tail, self.rest = b"", b"", b"", []
        self.state, self.left = "head", 0
        self.ttft, self.tokens = None, 0
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport
        self.t0 = time.perf_counter()  # TTFT and latency run from the request's write
        transport.write(self.request)

    def data_received(self, data):
        now = time.perf_counter()
        self.tail = (self.tail + data)[-len(self.END):]
        if self.ttft is None:
            self.consume(data, now)
        else:
            self.rest.append(data)
            if self.tail == self.END:
                self.consume(b"".join(self.rest), now)

    def connection_lost(self, exc):
        if self.rest and not self.done.done():
            self.consume(b"".join(self.rest), time.perf_counter())  # an error said before the end?
        self.finish(exc or RuntimeError("connection closed before the response ended"))

    def finish(self, error=None, now=None):
        if self.done.done():
            return
        if error is None:
            self.done.set_result({"ttft": (self.ttft if self.ttft is not None else now - self.t0) * 1e3,
                                  "latency": (now - self.t0) * 1e3, "tokens": self.tokens})
        else:
            self.done.set_exception(error if isinstance(error, BaseException) else RuntimeError(error))
        if self.transport is not None:
            self.transport.close()

    def consume(self, data, now):
        """Parses `data` on from where the last call stopped (one pass: positions, no copies of the rest)."""
        self.rest = []
        buf, pos = self.buf + data, 0
        try:
            while True:
                if self.state == "head":
                    i = buf.find(b"\r\n\r\n", pos)
                    if i < 0:
                        break
                    head = buf[pos:i].decode("latin-1").split("\r\n")
                    pos = i + 4
                    status = int(head[0].split(" ", 2)[1])
                    if status != 200:  # the server's one-line reason is in the body: show it
                        body = buf[pos:].decode("utf-8", "replace").strip()
                        raise RuntimeError(f"status {status}: {body[-300:]}")
                    fields = {k.strip().lower(): v.strip().lower() for k, _, v in (h.partition(":") for h in head[1:])}
                    if "chunked" not in fields.get("transfer-encoding", ""):
                        raise RuntimeError("a streamed answer without Transfer-Encoding: chunked")
                    self.state = "size"
                elif self.state == "size":
                    i = buf.find(b"\r\n", pos)
                    if i < 0:
                        break
                    size = int(buf[pos:i].split(b";")[0], 16)
                    pos = i + 2
                    if size == 0:  # the last chunk (trailers, if any, are not read)
                        return self.finish(now=now)
                    self.state, self.left = "data", size
                elif self.state == "data":
                    if pos >= len(buf):
                        break
                    end = min(len(buf), pos + self.left)
                    self.events(buf[pos:end], now)
                    self.left -= end - pos
                    pos = end
                    if self.left == 0:
                        self.state = "crlf"
                else:  # the CRLF after a chunk's data
                    if len(buf) - pos < 2:
                        break
                    pos += 2
                    self.state = "size"
            self.buf = buf[pos:]
        except Exception as e:  # noqa: BLE001 -- a malformed or failed answer fails this request only
            self.finish(e)

    def events(self, data, now):
        lines = (self.sse + data).split(b"\n")
        self.sse = lines.pop()  # an unfinished line
        for line in lines:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            if self.ttft is not None and b'"usage":null' in line:
                continue  # a token after the first: nothing to read in it
            j = json.loads(line[6:])
            if "error" in j:
                raise RuntimeError(j["error"]["message"])
            if self.ttft is None and j.get("choices") and carries_token(j["choices"][0]):
                self.ttft = now - self.t0
            if j.get("usage"):
                self.tokens = j["usage"]["completion_tokens"]


# Fields every request body also carries (--ignore-eos); set in main() before the client processes
# fork, so they inherit it.
EXTRA_BODY = {}


async def one(url, i, max_tokens, logprobs=True):
    """One streamed completion (StreamedCompletion): its TTFT, latency (ms) and generated tokens."""
    body = {"prompt": f"Request {i}: the story of a small town by the sea,", "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if logprobs:
        body["logprobs"] = 0
    body.update(EXTRA_BODY)
    u = urlparse(url)
    data = json.dumps(body).encode()
    request = (f"POST /v1/completions HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
               "Connection: close\r\n\r\n").encode() + data
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    transport, _ = await loop.create_connection(lambda: StreamedCompletion(request, done), u.hostname, u.port)
    try:
        return await asyncio.wait_for(done, 600)
    finally:
        transport.close()


def ttft_histogram(url, name="hearth_time_to_first_token_seconds"):
    """The server's TTFT histogram from GET /metrics: ({upper bound in s: cumulative count}, sum, count)."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    buckets, total, count = {}, 0.0, 0
    for line in text.splitlines():
        if m := re.match(name + r'_bucket\{le="([^"]+)"\} (\S+)$', line):
            buckets[float(m.group(1))] = float(m.group(2))  # float("+Inf") is inf
        elif line.startswith(name + "_sum "):
            total = float(line.split()[1])
        elif line.startswith(name + "_count "):
            count = int(float(line.split()[1]))
    return buckets, total, count


def server_ttft(before, after, key="server_ttft_ms"):
    """Server-side TTFT p50 / p99 / mean (ms) of the requests between two ttft_histogram() scrapes
    (or, with another histogram's scrapes and key, its quantiles: the queue time)."""
    (b0, s0, c0), (b1, s1, c1) = before, after
    n = c1 - c0
    if n <= 0:
        return {f"{key}_p50": None, f"{key}_p99": None, f"{key}_mean": None}

    def quantile(p):
        k = min(n, int(p * n) + 1)  # the k-th smallest, as pct() picks it
        for le in sorted(b1):
            if b1[le] - b0.get(le, 0) >= k:
                return None if le == float("inf") else round(le * 1e3, 1)
        return None

    return {f"{key}_p50": quantile(0.5), f"{key}_p99": quantile(0.99), f"{key}_mean": round((s1 - s0) / n * 1e3, 1)}


# Arrival to admission into the running batch (before the prefill): TTFT minus this is the prefill
# and the first step.
QUEUE = "hearth_request_queue_time_seconds"


async def load(url, clients, requests, max_tokens, logprobs):
    """Concurrent clients (their ids), each sending `requests` completions one after another."""
    results, failures = [], 0

    async def client(c):
        nonlocal failures
        for r in range(requests):
            try:
                results.append(await one(url, c * 1000 + r, max_tokens, logprobs))
            except Exception:  # noqa: BLE001 -- counted, the run goes on
                failures += 1

    await asyncio.gather(*(client(c) for c in clients))
    return results, failures


def client_process(conn, url, clients, requests, max_tokens, logprobs):
    """A client process: says it is ready, runs its clients when told to go, sends back
    (results, failures, CPU seconds it spent). No garbage collector pause inside the run."""
    gc.collect()
    gc.disable()
    conn.send("ready")
    conn.recv()
    cpu0 = time.process_time()
    results, failures = asyncio.run(load(url, clients, requests, max_tokens, logprobs))
    conn.send((results, failures, time.process_time() - cpu0))
    conn.close()


def run_clients(url, count, procs, requests, max_tokens, logprobs):
    """`count` clients spread over `procs` processes, all started at once: (results, failures,
    seconds from the start to the last answer, the busiest process's CPU share in %)."""
    ctx = multiprocessing.get_context("fork")
    pipes, workers = [], []
    for k in range(procs):
        mine, theirs = ctx.Pipe()
        w = ctx.Process(target=client_process,
                        args=(theirs, url, range(k, count, procs), requests, max_tokens, logprobs))
        w.start()
        pipes.append(mine)
        workers.append(w)
    for p in pipes:
        assert p.recv() == "ready"
    t0 = time.perf_counter()
    for p in pipes:
        p.send("go")
    results, failures, cpu = [], 0, 0.0
    for w, p in zip(workers, pipes):
        r, f, c = p.recv()
        results += r
        failures += f
        cpu = max(cpu, c)
    secs = time.perf_counter() - t0
    for w in workers:
        w.join()
    return results, failures, secs, 100 * cpu / secs


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
    ap.add_argument("--ignore-eos", action="store_true",
                    help="send vLLM's ignore_eos: every request generates its --tokens (a model that ends its "
                         "answers early otherwise measures prompts and admission more than decoding)")
    ap.add_argument("--server-args", default="", help="extra `hearth serve` flags, split on spaces")
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs of each client count, one after another on the same server (the first "
                         "meets shapes the server has not run yet; later ones show it warm)")
    ap.add_argument("--client-procs", type=int, default=0,
                    help="client processes (default: one per 16 clients, at most a quarter of the cores)")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {a.rounds}")
    try:
        client_counts = [int(c) for c in a.clients.split(",")]
    except ValueError:
        ap.error(f"--clients must be positive integers separated by commas, got {a.clients!r}")
    for name, value in (("--clients", min(client_counts)), ("--requests", a.requests), ("--tokens", a.tokens)):
        if value < 1:
            ap.error(f"{name} must be at least 1, got {value}")
    if a.client_procs < 0:
        ap.error(f"--client-procs must be 0 (automatic) or more, got {a.client_procs}")
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
        if a.ignore_eos:
            EXTRA_BODY["ignore_eos"] = True
        asyncio.run(one(url, -1, a.tokens, not a.no_logprobs))  # warmup
        for C, rnd in [(c, r) for c in client_counts for r in range(1, a.rounds + 1)]:
            rss0 = rss_mib(proc.pid)
            hist0 = ttft_histogram(url)
            queue0 = ttft_histogram(url, QUEUE)
            procs = a.client_procs or min(math.ceil(C / 16), max(1, (os.cpu_count() or 1) // 4))
            results, failures, secs, cpu_pct = run_clients(url, C, min(procs, C), a.requests, a.tokens,
                                                           not a.no_logprobs)
            toks = sum(r["tokens"] for r in results)
            print(json.dumps({
                "clients": C, "round": rnd, "requests": len(results), "failures": failures,
                "aggregate_tok_s": round(toks / secs, 1),
                "tokens_per_request": round(toks / len(results), 1) if results else None,
                "ttft_ms_p50": pct([r["ttft"] for r in results], 0.5),
                "ttft_ms_p99": pct([r["ttft"] for r in results], 0.99),
                "ttft_ms_mean": round(sum(r["ttft"] for r in results) / len(results), 1) if results else None,
                "latency_ms_p50": pct([r["latency"] for r in results], 0.5),
                "latency_ms_p99": pct([r["latency"] for r in results], 0.99),
                **server_ttft(hist0, ttft_histogram(url)),
                **server_ttft(queue0, ttft_histogram(url, QUEUE), "server_queue_ms"),
                "client_procs": min(procs, C), "client_cpu_pct": round(cpu_pct, 1),
                "rss_mib_before": round(rss0, 1), "rss_mib_after": round(rss_mib(proc.pid), 1)}), flush=True)
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
