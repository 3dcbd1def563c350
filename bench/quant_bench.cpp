// Micro-benchmark: nn::quantized_matmul (CPU tile kernel) vs quantized_matmul_ref (dequantize whole
// matrix + matmul) vs dense fp32 matmul, for decode (M=1) and prefill-like (M=64) shapes.
// Not a correctness test (tests/nn/quant_test.cpp is). Build with -DHEARTH_BUILD_BENCH=ON.
#include <benchmark/benchmark.h>

#include "nn/quant.h"

namespace {

// args: out, in, M, bits
hearth::nn::QuantizedWeight make_weight(int64_t out, int64_t in, int bits) {
  at::manual_seed(0);
  return hearth::nn::quantize(at::randn({out, in}), hearth::nn::QuantSpec{bits, 64});
}

void set_counters(benchmark::State& st, int64_t out, int64_t in, int64_t M, double weight_bytes) {
  st.counters["GB/s(weights)"] = benchmark::Counter(weight_bytes, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * M * out * in, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void BM_QuantizedMatmul(benchmark::State& st) {
  const int64_t out = st.range(0), in = st.range(1), M = st.range(2);
  const int bits = static_cast<int>(st.range(3));
  auto q = make_weight(out, in, bits);
  at::Tensor x = at::randn({M, in});
  for (auto _ : st) benchmark::DoNotOptimize(hearth::nn::quantized_matmul(x, q));
  set_counters(st, out, in, M, out * in * bits / 8.0 + 2 * 4.0 * out * in / 64);
}

void BM_QuantizedMatmulRef(benchmark::State& st) {
  const int64_t out = st.range(0), in = st.range(1), M = st.range(2);
  const int bits = static_cast<int>(st.range(3));
  auto q = make_weight(out, in, bits);
  at::Tensor x = at::randn({M, in});
  for (auto _ : st) benchmark::DoNotOptimize(hearth::nn::quantized_matmul_ref(x, q));
  set_counters(st, out, in, M, out * in * bits / 8.0 + 2 * 4.0 * out * in / 64);
}

void BM_DenseF32(benchmark::State& st) {
  const int64_t out = st.range(0), in = st.range(1), M = st.range(2);
  at::Tensor w = at::randn({out, in});
  at::Tensor x = at::randn({M, in});
  for (auto _ : st) benchmark::DoNotOptimize(at::matmul(x, w.t()));
  set_counters(st, out, in, M, out * in * 4.0);
}

void shapes(benchmark::internal::Benchmark* b) {
  for (auto [out, in] : {std::pair<int64_t, int64_t>{2048, 2048}, {8192, 2048}, {2048, 8192}})
    for (int64_t M : {1, 64}) b->Args({out, in, M, 4});
  b->Args({8192, 2048, 1, 3});
  b->Args({8192, 2048, 1, 8});
  // Decode of a 23M model's tied lm_head ([1, 384] x [32000, 384]) at 4 and 8 bits.
  b->Args({32000, 384, 1, 4});
  b->Args({32000, 384, 1, 8});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

// The starter's decode step (models/starter: 6 llama layers, hidden 384, MLP 1024, tied 32000-row
// lm_head, MLX 8-bit group 64): every quantized matmul of one batched step of M rows, as
// `hearth bench --batch M` runs them; counters give the step's rows per second of matmul alone.
void BM_StarterStep(benchmark::State& st) {
  const int64_t M = st.range(0);
  const int bits = static_cast<int>(st.range(1));
  struct Shape { int64_t out, in, times; };
  const std::vector<Shape> shapes{{384, 384, 4 * 6}, {1024, 384, 2 * 6}, {384, 1024, 6}, {32000, 384, 1}};
  std::vector<hearth::nn::QuantizedWeight> ws;
  std::vector<at::Tensor> xs;
  for (const Shape& s : shapes) {
    ws.push_back(make_weight(s.out, s.in, bits));
    xs.push_back(at::randn({M, s.in}));
  }
  for (auto _ : st)
    for (size_t i = 0; i < shapes.size(); ++i)
      for (int64_t t = 0; t < shapes[i].times; ++t) benchmark::DoNotOptimize(hearth::nn::quantized_matmul(xs[i], ws[i]));
  st.counters["rows/s"] = benchmark::Counter(static_cast<double>(M), benchmark::Counter::kIsIterationInvariantRate);
}

void starter_rows(benchmark::internal::Benchmark* b) {
  for (int64_t M : {1, 2, 4, 8, 16, 32}) b->Args({M, 8});
  b->Args({1, 4});
  b->Args({8, 4});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

}  // namespace

BENCHMARK(BM_StarterStep)->Apply(starter_rows);
BENCHMARK(BM_QuantizedMatmul)->Apply(shapes);
// One starter matrix (q_proj, up_proj, lm_head) over the batch sizes, for the kernel crossover.
BENCHMARK(BM_QuantizedMatmul)->ArgsProduct({{384}, {384}, {1, 8, 32, 64, 128}, {8}})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_QuantizedMatmul)->ArgsProduct({{32000}, {384}, {1, 8, 32, 64, 128}, {8}})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_QuantizedMatmulRef)->Apply(shapes);
BENCHMARK(BM_DenseF32)->Apply(shapes);
BENCHMARK_MAIN();
