#!/usr/bin/env python3
"""Trains a model folder on {"text"} rows with transformers + torch, the way `hearth train
--fine-tune-type full` does (rows tokenized with specials + EOS, packed into --max-seq-length
chunks, AdamW with linear warmup then constant lr, token-mean cross-entropy), and prints the
train loss every --report steps plus greedy continuations of --prompt lines.

A diagnostic, not a golden: run the same data through `hearth train` and compare the loss curves
(data order differs, so curves agree in shape and level, not bit for bit). Used to check that the
starter's slow learning of copying (docs/starter.md) is the model's, not Hearth's training loop.
  python3 tools/copy_task_reference.py --make-toy-data DIR   # 20,000 rows "w1 .. w10 | w1 .. w10"
  python3 tools/copy_task_reference.py --model INIT_DIR --data DIR --steps 2000 --batch-size 16 \
      --max-seq-length 256 --lr 1e-3 --warmup 20 [--device cuda] [--prompt TEXT ...]
The session-2 check (docs/starter.md): INIT_DIR = `hearth init-model` of
tests/golden/models/llama_mha/config.json (max_position_embeddings 512) with that folder's
tokenizer; Hearth ran `hearth train --fine-tune-type full --num-layers -1 --max-seq-length 256
--batch-size 16 --learning-rate 1e-3 --lr-schedule constant --warmup 20 --iters 2000` on the same
data.
"""
import argparse
import json
import os
import random



def make_toy_data(out):
    """Rows of 10 random 3-letter words, then " | ", then the same words (seed 0)."""
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"

    def row():
        s = " ".join("".join(rng.choice(letters) for _ in range(3)) for _ in range(10))
        return json.dumps({"text": f"{s} | {s}"}) + "\n"
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "train.jsonl"), "w") as f:
        f.writelines(row() for _ in range(20000))
    with open(os.path.join(out, "valid.jsonl"), "w") as f:
        f.writelines(row() for _ in range(200))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--make-toy-data", metavar="DIR")
    ap.add_argument("--model")
    ap.add_argument("--data")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-seq-length", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--report", type=int, default=100)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompt", action="append", default=[])
    a = ap.parse_args()
    if a.make_toy_data:
        make_toy_data(a.make_toy_data)
        return
    if not a.model or not a.data:
        ap.error("--model and --data are required")
    import torch  # only the training needs these
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    random.seed(0)
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    eos = cfg["eos_token_id"][0] if isinstance(cfg["eos_token_id"], list) else cfg["eos_token_id"]
    stream = []
    for line in open(os.path.join(a.data, "train.jsonl")):
        stream += tok.encode(json.loads(line)["text"], add_special_tokens=True).ids + [eos]
    T = a.max_seq_length
    chunks = [stream[i:i + T] for i in range(0, len(stream) - T + 1, T)]
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32,
                                                 attn_implementation="eager").to(a.device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    order, pos, window = [], 0, []
    for step in range(1, a.steps + 1):
        if pos + a.batch_size > len(order):
            order, pos = random.sample(range(len(chunks)), len(chunks)), 0
        batch = torch.tensor([chunks[i] for i in order[pos:pos + a.batch_size]], device=a.device)
        pos += a.batch_size
        for g in opt.param_groups:
            g["lr"] = a.lr * min(1.0, step / a.warmup) if a.warmup else a.lr
        loss = model(batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        window.append(loss.item())
        if step % a.report == 0:
            print(f"step {step}/{a.steps}  train loss {sum(window) / len(window):.4f}", flush=True)
            window = []
    model.eval()
    with torch.no_grad():
        for p in a.prompt:
            ids = torch.tensor([tok.encode(p, add_special_tokens=True).ids], device=a.device)
            out = model.generate(ids, max_new_tokens=30, do_sample=False)
            print(f"{p!r} -> {tok.decode(out[0, ids.shape[1]:].tolist())!r}")


if __name__ == "__main__":
    main()
