#!/usr/bin/env python3
"""Scores the starter's "tour guide" chat (issue 13) on data/chat/heldout.jsonl through a real server.

Starts `HEARTH serve --model DIR --port P`, waits for GET /v1/models, sends each held-out question
as one user message to POST /v1/chat/completions greedily (temperature 0), and prints per category
and in total: the non-empty rate (answer has non-space text) and the expectation-hit rate (the
answer contains at least one of the row's "expect" substrings, case-insensitively: any-of, as
tools/build_tour_guide.mjs writes them). Writes one JSON line per question to --out. The server is
stopped at the end, also on an error or Ctrl-C. Python 3 standard library only (no node, no pip).
Not a trainer and not a unit test.

  python3 tools/eval_tour_guide.py --hearth build/hearth --model models/starter \\
      [--data data/chat/heldout.jsonl] [--port 0] [--device cpu] [--max-tokens 128] \\
      [--adapter none|NAME] [--system TEXT] [--workers 1] [--limit N] [--out tour_eval.jsonl]
--adapter NAME mounts MODEL/adapters/NAME at start (`serve --adapter NAME=PATH`) and sends
"adapter": NAME with each request; the default, none, sends "adapter": "none" (the base model).
"""
import argparse
import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request


def fail(msg):
    print(f"eval_tour_guide: {msg}", file=sys.stderr)
    sys.exit(2)


def load_rows(path):
    """The held-out rows; each needs a string question, a category and a non-empty expect list."""
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    fail(f"{path}:{n}: not valid JSON ({e})")
                if not isinstance(r, dict) or not isinstance(r.get("question"), str):
                    fail(f'{path}:{n}: expected an object with a string "question"')
                exp = r.get("expect")
                if not isinstance(exp, list) or not exp or not all(isinstance(x, str) and x for x in exp):
                    fail(f'{path}:{n}: "expect" must be a non-empty list of non-empty strings')
                if r.get("match", "any") != "any":
                    fail(f'{path}:{n}: "match" {r.get("match")!r} is not supported (only "any")')
                r.setdefault("category", "all")
                r.setdefault("id", str(n))
                rows.append(r)
    except OSError as e:
        fail(f"{path}: cannot read ({e.strerror})")
    if not rows:
        fail(f"{path}: no rows")
    return rows


def hit(answer, expect):
    """Any-of, case-insensitive substring match."""
    a = answer.lower()
    return any(x.lower() in a for x in expect)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url, body=None, timeout=600):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode("utf-8"))


def wait_ready(base, proc, log_path, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            fail(f"the server exited with {proc.returncode} before it was ready:\n{tail(log_path)}")
        try:
            return http(base + "/v1/models", timeout=5)
        except (urllib.error.URLError, ConnectionError, OSError, ValueError):
            time.sleep(0.5)
    fail(f"the server did not answer GET /v1/models within {timeout} s:\n{tail(log_path)}")


def tail(path, n=20):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def stop(proc):
    """SIGINT, then SIGKILL after 10 s, to the server's own process group (it was started in a new
    session, so the group holds only the server)."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hearth", required=True, help="the hearth binary")
    ap.add_argument("--model", required=True, help="model folder to serve")
    ap.add_argument("--data", default="data/chat/heldout.jsonl")
    ap.add_argument("--port", type=int, default=0, help="0: pick a free port")
    ap.add_argument("--device", default=None, help="cpu | cuda (default: the server's)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--adapter", default="none", help='"none" (base model) or an adapter name under MODEL/adapters')
    ap.add_argument("--system", default=None, help="a system message before each question")
    ap.add_argument("--workers", type=int, default=1, help="requests in flight at once (the server batches them)")
    ap.add_argument("--limit", type=int, default=0, help="score only the first N rows (0: all)")
    ap.add_argument("--startup-timeout", type=float, default=300)
    ap.add_argument("--out", default="tour_eval.jsonl", help="per-question jsonl")
    a = ap.parse_args()

    if not os.access(a.hearth, os.X_OK):
        fail(f"--hearth {a.hearth}: not an executable file")
    if not os.path.isfile(os.path.join(a.model, "config.json")):
        fail(f"--model {a.model}: no config.json there")
    if a.max_tokens < 1 or a.workers < 1 or a.limit < 0:
        fail("--max-tokens and --workers must be >= 1, --limit >= 0")
    rows = load_rows(a.data)
    if a.limit:
        rows = rows[: a.limit]
    port = a.port or free_port()
    cmd = [a.hearth, "serve", "--model", a.model, "--port", str(port), "--max-tokens", str(a.max_tokens)]
    if a.device:
        cmd += ["--device", a.device]
    if a.adapter != "none":
        path = os.path.join(a.model, "adapters", a.adapter)
        if not os.path.isdir(path):
            fail(f"--adapter {a.adapter}: no folder {path}")
        cmd += ["--adapter", f"{a.adapter}={path}"]

    log = tempfile.NamedTemporaryFile(prefix="tour_eval_server_", suffix=".log", delete=False)
    proc = None

    def on_signal(signum, _frame):
        stop(proc)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        print("eval_tour_guide: " + " ".join(cmd), file=sys.stderr)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        models = wait_ready(base, proc, log.name, a.startup_timeout)
        model_id = (models.get("data") or [{}])[0].get("id", "")

        def ask(r):
            msgs = ([{"role": "system", "content": a.system}] if a.system else []) + [{"role": "user", "content": r["question"]}]
            body = {"model": model_id, "messages": msgs, "max_tokens": a.max_tokens, "temperature": 0, "adapter": a.adapter}
            try:
                resp = http(base + "/v1/chat/completions", body)
                ch = resp["choices"][0]
                return ch["message"].get("content") or "", ch.get("finish_reason"), None
            except urllib.error.HTTPError as e:
                return "", None, f"HTTP {e.code}: {e.read().decode('utf-8', 'replace')[:200]}"
            except (urllib.error.URLError, OSError, KeyError, IndexError, ValueError) as e:
                return "", None, f"{type(e).__name__}: {e}"

        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(max_workers=a.workers) as pool:
            answers = list(pool.map(ask, rows))
        secs = time.time() - t0
        errors = [e for _, _, e in answers if e]
        if errors and proc.poll() is not None:
            fail(f"the server died during the run:\n{tail(log.name)}")

        stats = {}
        with open(a.out, "w", encoding="utf-8") as f:
            for r, (ans, finish, err) in zip(rows, answers):
                ne = bool(ans.strip())
                h = hit(ans, r["expect"])
                for c in (r["category"], "total"):
                    s = stats.setdefault(c, [0, 0, 0])
                    s[0] += 1
                    s[1] += ne
                    s[2] += h
                rec = {"id": r["id"], "category": r["category"], "question": r["question"], "answer": ans,
                       "expect": r["expect"], "hit": h, "non_empty": ne, "finish_reason": finish}
                if err:
                    rec["error"] = err
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        print(f"{'category':<14}{'n':>5}{'non-empty':>11}{'hit':>9}")
        for c in sorted(k for k in stats if k != "total") + ["total"]:
            n, ne, h = stats[c]
            print(f"{c:<14}{n:>5}{100 * ne / n:>10.1f}%{100 * h / n:>8.1f}%")
        print(f"{len(rows)} questions in {secs:.1f} s; model {a.model}, adapter {a.adapter}; "
              f"{len(errors)} request error(s); rows in {a.out}")
        return 1 if errors else 0
    finally:
        stop(proc)
        log.close()


if __name__ == "__main__":
    sys.exit(main())
