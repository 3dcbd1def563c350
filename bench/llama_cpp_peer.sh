#!/usr/bin/env bash
# Hearth's CPU decode/prefill beside llama.cpp's on the same weights and thread count (issue 11's CPU
# rows): F32 vs F32 and Hearth's MLX 8-bit vs llama.cpp's Q8_0. Installs node-llama-cpp (prebuilt
# CPU binaries, into third_party/npm-peer, git-ignored) on first use, dequantizes an MLX model with
# `hearth convert -d`, writes GGUF files with tools/hf_to_gguf.mjs, checks that llama.cpp's greedy
# continuation of a fixed prompt equals Hearth's (F32), then alternates the two programs --runs
# times and prints each one's median. Run it on an idle machine: llama.cpp's worker threads spin,
# so a loaded machine penalises it more than Hearth.
#
#   bench/llama_cpp_peer.sh [--model DIR (default models/starter)] [--threads 2] [--prompt-tokens 128]
#                          [--gen-tokens 64] [--rounds 3] [--bin build/hearth]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=$root/models/starter threads=2 prompt=128 gen=64 rounds=3 bin=$root/build/hearth
while (($#)); do
  case $1 in
    --model) model=$2 ;; --threads) threads=$2 ;; --prompt-tokens) prompt=$2 ;; --gen-tokens) gen=$2 ;;
    --rounds) rounds=$2 ;; --bin) bin=$2 ;;
    *) echo "llama_cpp_peer.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
peer=$root/third_party/npm-peer
if [[ ! -d $peer/node_modules/node-llama-cpp ]]; then
  mkdir -p "$peer"
  echo '{"name":"hearth-bench-peer","private":true,"type":"module"}' > "$peer/package.json"
  (cd "$peer" && npm install --no-audit --no-fund --omit=optional node-llama-cpp@3.22.1 @node-llama-cpp/linux-x64@3.22.1 >&2)
fi
cp "$root/bench/llama_cpp_peer.mjs" "$peer/llama_cpp_peer.mjs"  # resolves node-llama-cpp from there
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=$threads
float=$model
if grep -q '"quantization"' "$model/config.json"; then
  "$bin" convert -d --dtype f32 -m "$model" -o "$work/f32" > /dev/null
  float=$work/f32
  quant=$model
else
  "$bin" convert --dtype f32 -m "$model" -o "$work/f32" > /dev/null
  float=$work/f32
  "$bin" convert -q --q-bits 8 --q-group-size 64 -m "$float" -o "$work/q8" > /dev/null
  quant=$work/q8
fi
node "$root/tools/hf_to_gguf.mjs" --model "$float" --out "$work/f32.gguf" --type f32 >&2
node "$root/tools/hf_to_gguf.mjs" --model "$float" --out "$work/q8_0.gguf" --type q8_0 >&2

# Same weights, same answer: the greedy continuation of a fixed prompt from both (F32), as text.
text="Hearth is a local runtime. To serve a model, run"
ids=$("$bin" tokenize --model "$float" --special "$text" | tr -d '[]' | tr ',' ' ')
theirs=$(node "$peer/llama_cpp_peer.mjs" --model "$work/f32.gguf" --threads "$threads" --ids "$ids" --gen-tokens 16 |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"])')
theirs=$("$bin" tokenize --model "$float" --decode "$theirs")
ours=$("$bin" generate --model "$float" --device cpu --ignore-chat-template --prompt "$text" --max-tokens 16 2>/dev/null)
echo "llama.cpp F32: $theirs"
echo "Hearth F32:    $ours"
[[ "$theirs" == "$ours" ]] && echo "same greedy text" || echo "the greedy texts differ (check the conversion)"

hb() { "$bin" bench --model "$1" --device cpu --prompt-tokens "$prompt" --gen-tokens "$gen" --runs 3 2>/dev/null |
  awk '/^prefill:/{p=$2} /^decode:/{d=$2} END{print p, d}'; }
lc() { node "$peer/llama_cpp_peer.mjs" --model "$1" --threads "$threads" --prompt-tokens "$prompt" --gen-tokens "$gen" --runs 3 |
  python3 -c 'import json,sys; r=json.load(sys.stdin); print(round(r["prefill_tok_s"],1), round(r["decode_tok_s"],1))'; }
declare -A res
for ((r = 1; r <= rounds; ++r)); do
  res[hf32]+="$(hb "$float");" res[lf32]+="$(lc "$work/f32.gguf");"
  res[hq8]+="$(hb "$quant");" res[lq8]+="$(lc "$work/q8_0.gguf");"
done
med() { tr ';' '\n' <<< "$1" | grep . | awk -v c="$2" '{print $c}' | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
echo "model $(basename "$model"), $threads threads, prompt $prompt, $gen new tokens, median of $rounds rounds (each a median of 3 runs)"
printf '%-28s %14s %14s\n' "" "prefill tok/s" "decode tok/s"
for k in hf32:"Hearth F32" lf32:"llama.cpp F32" hq8:"Hearth MLX 8-bit" lq8:"llama.cpp Q8_0"; do
  printf '%-28s %14s %14s\n' "${k#*:}" "$(med "${res[${k%%:*}]}" 1)" "$(med "${res[${k%%:*}]}" 2)"
done
