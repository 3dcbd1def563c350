#!/usr/bin/env bash
# The GPU machine's check, in one call (see docs/benchmarks.md): build against the machine's
# PyTorch (CUDA), run the whole test suite, then the CUDA bf16 parity test against fresh
# transformers references, then (with --bench) the real-shape benchmarks. Logs go to $OUT (or
# ./gpu-out). Usage: tools/gpu_check.sh [--tests] [--parity] [--bench] [--bench-train] [--profile] [--prefill] [--gemv] [--decode8b]
# The call's tree is limited to 64 MiB: carry .devdeps (tools/device_deps.sh) and leave
# models/starter out of the tree for the call (its tests, Starter* and EnumMask, then fail there).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="${OUT:-$root/gpu-out}"; mkdir -p "$out"
export PYTHONUNBUFFERED=1
"$root/tools/device_build.sh" > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
export LD_LIBRARY_PATH="/tmp/hearth-deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
b="$root/build-cuda"
for step in "$@"; do
  case "$step" in
    --tests)
      # Two threads per test, eight at a time: with every test taking all 16 cores the suite ran past
      # a call's 10 minutes (2026-12-02: 108 of 151 suites in 330 s). Without models/starter in the
      # tree (the 64 MiB limit) its tests are left out.
      ex=(); [[ -f "$root/models/starter/model.safetensors" ]] || ex=(-E 'Starter|EnumMask|ScriptsRun')
      (cd "$b" && OMP_NUM_THREADS=2 ctest -j 8 --output-on-failure --timeout 600 "${ex[@]}") > "$out/tests.log" 2>&1
      grep -E "tests passed|tests failed|Failed|\*\*\*" "$out/tests.log" | tail -15 ;;
    --parity)
      g=/tmp/cuda-goldens; rm -rf "$g"
      python3 "$root/tools/gen_cuda_goldens.py" --out "$g" --steps 100 "$root"/tests/golden/models/* > "$out/cuda_goldens.log" 2>&1 \
        || tail -20 "$out/cuda_goldens.log"
      HEARTH_CUDA_GOLDENS="$g" "$b/hearth_tests" --gtest_filter='CudaParity*' > "$out/cuda_parity.log" 2>&1
      grep -E "\[cuda-parity\]|OK|FAILED" "$out/cuda_parity.log" | head -60 ;;
    --bench)
      m=/tmp/l1b
      [[ -d $m ]] || python3 "$root/tools/make_random_model.py" --shape llama-3.2-1b --out $m --mlx-q4 > "$out/make_model.log" 2>&1 \
        || tail -20 "$out/make_model.log"
      for n in ${HEARTH_BENCH_PROMPTS:-512 4096}; do
        args="--prompt-tokens $n --gen-tokens 128"
        echo "== transformers sdpa bf16 $args"; python3 "$root/tools/bench_transformers.py" --model $m $args 2>/dev/null | tail -1
        echo "== hearth bf16 $args"; "$b/hearth" bench --model $m --device cuda --dtype bfloat16 $args 2>&1 | tail -6
        echo "== hearth mlx4 $args"; "$b/hearth" bench --model $m-mlx4 --device cuda --dtype bfloat16 $args 2>&1 | tail -6
      done 2>&1 | tee "$out/bench.log" ;;
    --profile)  # one graph decode step of the 1B shape, kernel by kernel (issue 11's profile)
      m=/tmp/l1b
      [[ -d $m ]] || python3 "$root/tools/make_random_model.py" --shape llama-3.2-1b --out $m > "$out/make_model.log" 2>&1
      ncu --graph-profiling node --clock-control none --metrics gpu__time_duration.sum --export /tmp/prof --force-overwrite \
        "$b/hearth" bench --model $m --device cuda --dtype bfloat16 --prompt-tokens 32 --gen-tokens 3 --runs 1 > "$out/ncu_run.log" 2>&1
      ncu --import /tmp/prof.ncu-rep --csv --page raw > "$out/prof.csv" && python3 "$root/tools/ncu_step_summary.py" "$out/prof.csv" | tee "$out/profile.txt" ;;
    --decode8b)  # issue 11's 8B decode: bf16 and MLX 4-bit, 512 + 64 greedy tokens
      m=/tmp/l8b
      [[ -d $m-mlx4 ]] || python3 "$root/tools/make_random_model.py" --shape llama-3.1-8b --out $m --mlx-q4 > "$out/make_l8b.log" 2>&1
      {
        for v in "$m" "$m-mlx4"; do
          echo "== hearth $v 512 + 64"
          "$b/hearth" bench --model "$v" --prompt-tokens 512 --gen-tokens 64 2>&1 | grep -E "decode|TTFT"
        done
        for r in 8192 32768; do  # the norm in the affine GEMV's prologue past 4,096 rows (q/k/v 6,144; gate/up 28,672)
          echo "== hearth $m-mlx4 512 + 64, HEARTH_GEMV_NORM_MAX_ROWS=$r"
          HEARTH_GEMV_NORM_MAX_ROWS=$r "$b/hearth" bench --model "$m-mlx4" --prompt-tokens 512 --gen-tokens 64 2>&1 | grep -E "decode|TTFT"
        done
      } 2>&1 | tee "$out/decode8b.log" ;;
    --gemv)  # the decode GEMV micro-benchmarks (dense bf16 on the 1B shape; MLX 4-bit on the 1B and 8B shapes)
      for n in gemv_bench gemv_affine_bench; do
        nvcc -std=c++17 -O3 -arch=sm_90 -cudart static -I "$root/src/kernels" "$root/bench/$n.cu" -o "/tmp/$n" > "$out/$n.build.log" 2>&1 \
          || { tail -20 "$out/$n.build.log"; continue; }
        HEARTH_PDL=1 "/tmp/$n" 20 | tee "$out/$n.txt"
      done ;;
    --prefill)  # issue 11's 8B prefill at 4K: Hearth (mlx-lm's 2,048-token chunks, one chunk) and its peers
      m=/tmp/l8b
      [[ -d $m ]] || python3 "$root/tools/make_random_model.py" --shape llama-3.1-8b --out $m > "$out/make_l8b.log" 2>&1
      {
        echo "== peers (transformers, plain PyTorch)"; python3 "$root/tools/bench_prefill_ref.py" --model $m 2>/dev/null | tail -1
        for step in 2048 4096; do
          echo "== hearth --prefill-step-size $step"
          "$b/hearth" bench --model $m --prompt-tokens 4096 --gen-tokens 1 --runs 3 --prefill-step-size $step 2>&1 | grep -E "prefill|TTFT"
          # cuDNN's attention for the prompt's square causal chunk (2x flash from 2K tokens; it plans each
          # new shape for ~60 ms, which the median of 3 runs leaves out: what bucketed lengths would give)
          echo "== hearth --prefill-step-size $step, HEARTH_SDPA_CUDNN=1"
          HEARTH_SDPA_CUDNN=1 "$b/hearth" bench --model $m --prompt-tokens 4096 --gen-tokens 1 --runs 3 --prefill-step-size $step 2>&1 | grep -E "prefill|TTFT"
        done
      } 2>&1 | tee "$out/prefill.log" ;;
    --bench-train)  # issue 4's table: LoRA SFT memory/speed vs sequence length, Hearth vs transformers+peft
      for shape in ${HEARTH_TRAIN_SHAPES:-llama-3.2-1b llama-3.1-8b}; do
        m=/tmp/$shape
        [[ -d $m ]] || python3 "$root/tools/make_random_model.py" --shape $shape --out $m > "$out/make_$shape.log" 2>&1
        lens=${HEARTH_TRAIN_LENS:-2048 8192 16384 32768 65536}
        echo "== $shape: hearth"; "$b/hearth" bench-train --model $m --seq-lens $lens --segment-sizes 0 4 1
        echo "== $shape: transformers + peft"; python3 "$root/tools/bench_train_transformers.py" --model $m --seq-lens $lens
      done 2>&1 | tee "$out/bench_train.log" ;;
  esac
done
