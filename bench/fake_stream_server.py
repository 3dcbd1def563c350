#!/usr/bin/env python3
"""A stand-in for `hearth serve` that streams at GPU-like rates on any machine, to measure what a
load client adds to TTFT (bench/batching_load.py's self-check): every --step-ms it "admits" every
request that arrived (its headers and first token chunk go out at once) and sends one token chunk
to every running stream, like the engine's batched step, with no model behind it. It answers
`POST /v1/completions` (stream, max_tokens, usage) with chunks shaped like Hearth's (text +
logprobs), and `GET /metrics` with hearth_time_to_first_token_seconds (Hearth's buckets), timed
from the request's arrival (its body read) to its first token chunk's write, as Hearth times it.
--log FILE writes one JSON line per request at exit: its id (from the prompt's "Request N:"), its
server TTFT, and the CLOCK_MONOTONIC times (time.perf_counter) of its arrival and first chunk write.

  python3 bench/batching_load.py --model x --bin bench/fake_stream_server.py --clients 1,32,128 \\
      --server-args "--step-ms 3.5 --log /tmp/fake.jsonl"
(Accepts and ignores `serve` and the load script's other flags.)
"""
import argparse
import asyncio
import json
import re
import signal
import time

BOUNDS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
          80.0, 160.0, 640.0, 2560.0]  # src/server/metrics.cpp's TTFT buckets


class Server:
    def __init__(self, step_s):
        self.step_s = step_s
        self.waiting, self.running = [], []
        self.counts, self.inf, self.total, self.n = [0] * len(BOUNDS), 0, 0.0, 0
        self.log = []

    def observe(self, s):
        for i, b in enumerate(BOUNDS):
            if s <= b:
                self.counts[i] += 1
                break
        else:
            self.inf += 1
        self.total += s
        self.n += 1

    def metrics(self):
        name, out, cum = "hearth_time_to_first_token_seconds", [], 0
        out.append(f"# TYPE {name} histogram")
        for b, c in zip(BOUNDS, self.counts):
            cum += c
            out.append(f'{name}_bucket{{le="{b:g}"}} {cum}')
        out.append(f'{name}_bucket{{le="+Inf"}} {cum + self.inf}')
        out.append(f"{name}_sum {self.total}")
        out.append(f"{name}_count {self.n}")
        return "\n".join(out) + "\n"

    async def handle(self, reader, writer):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            fields = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
            body = await reader.readexactly(int(fields.get("content-length", "0")))
            if method == "GET" and path == "/metrics":
                text = self.metrics().encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n"
                             b"Connection: close\r\n\r\n" % len(text) + text)
                await writer.drain()
                return
            req = json.loads(body)
            m = re.search(r"Request (-?\d+):", req.get("prompt", ""))
            done = asyncio.get_running_loop().create_future()
            self.waiting.append({"w": writer, "arrived": time.perf_counter(), "id": int(m.group(1)) if m else None,
                                 "left": int(req.get("max_tokens", 16)), "sent": 0, "done": done})
            await done
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @staticmethod
    def chunk(writer, obj):
        text = obj if isinstance(obj, bytes) else json.dumps(obj, separators=(",", ":")).encode()
        data = b"data: " + text + b"\n\n"
        writer.write(b"%x\r\n" % len(data) + data + b"\r\n")

    def token(self, s):
        logprobs = {"tokens": [" tok"], "token_logprobs": [-0.5], "top_logprobs": [{}], "text_offset": [4 * s["sent"]]}
        self.chunk(s["w"], {"id": "cmpl-fake", "object": "text_completion", "model": "fake", "choices": [
            {"index": 0, "text": " tok", "logprobs": logprobs, "finish_reason": None}], "usage": None})
        s["sent"] += 1
        s["left"] -= 1

    def step(self):
        for s in self.waiting:  # admitted: headers and the first token at once
            s["w"].write(b"HTTP/1.1 200 OK\r\nCache-Control: no-cache\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            self.token(s)
            t = time.perf_counter()
            self.observe(t - s["arrived"])
            self.log.append({"id": s["id"], "server_ttft_ms": (t - s["arrived"]) * 1e3, "arrived": s["arrived"],
                             "first_write": t})
        for s in self.running:
            if s["w"].is_closing():
                s["left"] = 0
            else:
                self.token(s)
        self.running += self.waiting
        self.waiting = []
        still = []
        for s in self.running:
            if s["left"] > 0:
                still.append(s)
                continue
            if not s["w"].is_closing():
                self.chunk(s["w"], {"id": "cmpl-fake", "object": "text_completion", "model": "fake", "choices": [
                    {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}], "usage": None})
                self.chunk(s["w"], {"id": "cmpl-fake", "object": "text_completion", "model": "fake", "choices": [],
                                    "usage": {"prompt_tokens": 12, "completion_tokens": s["sent"],
                                              "total_tokens": 12 + s["sent"]}})
                self.chunk(s["w"], b"[DONE]")
                s["w"].write(b"0\r\n\r\n")
            s["done"].set_result(None)
        self.running = still

    async def ticker(self):
        loop = asyncio.get_running_loop()
        nxt = loop.time()
        while True:
            self.step()
            nxt = max(nxt + self.step_s, loop.time())  # a late step is not made up for
            await asyncio.sleep(nxt - loop.time())


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("verb", nargs="?")
    ap.add_argument("--step-ms", type=float, default=3.5)
    ap.add_argument("--log", default=None)
    a, _ = ap.parse_known_args()
    srv = Server(a.step_ms / 1e3)
    server = await asyncio.start_server(srv.handle, "127.0.0.1", 0, backlog=1024)
    print(f"fake_stream_server: serving on http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    tick = asyncio.create_task(srv.ticker())
    await stop.wait()
    tick.cancel()
    if a.log:
        with open(a.log, "w") as f:
            for r in srv.log:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
