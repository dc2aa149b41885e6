// Vectorized, multithreaded CPU kernels for MLX: softmax over the last axis, exact (erf) GELU and
// dropout, each with its gradient (softmax and GELU: a second primitive; dropout: itself, on the cotangent),
// attention's per-head products on the projections' layout (HeadProduct), bf16 products with float32 sums on CPUs
// with AVX512-BF16 (Bf16Gemm) and AdamW's update in one pass (AdamWUpdate).
//
// MLX's own CPU kernels evaluate exp/erf one element at a time on one thread (no SIMD on x86),
// which makes softmax and GELU cost more than the matmuls of a BERT layer on a Linux CPU. These
// kernels are plain loops written so that the compiler vectorizes them (-O3 -march=native
// -fno-trapping-math, built on the user's machine by models/cpu_kernels.py) and split rows over threads. float32,
// row-contiguous, CPU stream only; models/cpu_kernels.py falls back to MLX ops otherwise.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <cstdlib>
#include <dlfcn.h>
#include <thread>
#include <vector>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace nb = nanobind;
using namespace nb::literals;
using namespace mlx::core;

namespace {

// One thread per core, or OMP_NUM_THREADS when set (kbert tune --workers W gives each worker process its
// share of the cores that way, as it does for the BLAS); set_threads() changes it (pipeline/streams.py runs
// one CPU stream per core, each kernel on its own stream's thread).
int default_threads() {
  if (const char* text = std::getenv("OMP_NUM_THREADS")) {
    int wanted = std::atoi(text);
    if (wanted > 0) return std::clamp(wanted, 1, 32);
  }
  unsigned hw = std::thread::hardware_concurrency();
  return (int)std::clamp(hw == 0 ? 1u : hw, 1u, 32u);
}

std::atomic<int> g_threads{default_threads()};

int max_threads() { return g_threads.load(std::memory_order_relaxed); }

thread_local bool t_in_parallel = false;  // inside a parallel_for's body: a nested one runs serially

// Runs body(begin, end) over [0, n) in up to `threads` (default max_threads()) chunks of at least `grain` items;
// the calling thread takes the first chunk.
template <class F>
void parallel_for(int64_t n, int64_t grain, int threads, F body) {
  int64_t chunks = std::min<int64_t>(threads, std::max<int64_t>(1, n / std::max<int64_t>(grain, 1)));
  if (chunks <= 1 || t_in_parallel) {
    body(int64_t(0), n);
    return;
  }
  auto marked = [&body](int64_t begin, int64_t end) {
    t_in_parallel = true;
    body(begin, end);
    t_in_parallel = false;
  };
  int64_t step = (n + chunks - 1) / chunks;
  std::vector<std::thread> workers;
  workers.reserve(chunks - 1);
  for (int64_t c = 1; c < chunks; ++c) {
    int64_t begin = c * step, end = std::min(n, begin + step);
    if (begin < end) workers.emplace_back(marked, begin, end);
  }
  marked(int64_t(0), std::min(n, step));
  for (auto& w : workers) w.join();
}

template <class F>
void parallel_for(int64_t n, int64_t grain, F body) {
  parallel_for(n, grain, max_threads(), body);
}

// exp(x) for float32: Cody-Waite range reduction, degree-6 polynomial, exponent by bit shift.
// Branch-free so that loops over it vectorize; max relative error about 2 ulp; 0 below -87.3.
inline float exp_fast(float x) {
  const float hi = 88.3762626647949f, lo = -87.3365447505531f;
  float xc = std::min(std::max(x, lo), hi);
  // Round to nearest by adding and removing 1.5 * 2^23 (vectorizes, unlike nearbyint).
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  float y = p * scale;
  return x < lo ? 0.0f : y;
}

// float32 erf, rational minimax approximation (Eigen's generic_fast_erf_float), as in
// models/activations.py: max abs error 4e-7.
inline float erf_fast(float x) {
  x = std::min(std::max(x, -4.0f), 4.0f);
  float x2 = x * x;
  float p = x2 * -2.72614225801306e-10f + 2.77068142495902e-08f;
  p = x2 * p - 2.10102402082508e-06f;
  p = x2 * p - 5.69250639462346e-05f;
  p = x2 * p - 7.34990630326855e-04f;
  p = x2 * p - 2.95459980854025e-03f;
  p = x2 * p - 1.60960333262415e-02f;
  float q = x2 * -1.45660718464996e-05f - 2.13374055278905e-04f;
  q = x2 * q - 1.68282697438203e-03f;
  q = x2 * q - 7.37332916720468e-03f;
  q = x2 * q - 1.42647390514189e-02f;
  return x * p / q;
}

constexpr float kSqrtHalf = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr int64_t kElementGrain = 1 << 16;

// Where the mask row of attention-score row `r` starts: the mask is broadcast to the scores' shape
// (stride 0 on broadcast axes) with contiguous rows; leading axes are given outermost first.
struct MaskRows {
  const float* data = nullptr;
  std::vector<int64_t> shape, strides;  // leading axes only (all but the last)

  const float* row(int64_t r) const {
    int64_t offset = 0;
    for (int d = (int)shape.size() - 1; d >= 0; --d) {
      offset += (r % shape[d]) * strides[d];
      r /= shape[d];
    }
    return data + offset;
  }
};

// One row: y = softmax(scale * x + mask). Plain restrict pointers, so that the compiler vectorizes.
void softmax_row(const float* __restrict x, const float* __restrict mask, float scale, float* __restrict y,
                 int64_t n) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < n; ++j) {
    float v = x[j] * scale + (mask ? mask[j] : 0.0f);
    y[j] = v;
    m = std::max(m, v);
  }
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) {
    float e = exp_fast(y[j] - m);
    y[j] = e;
    s += e;
  }
  float inv = 1.0f / s;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] *= inv;
}

// One row of the gradient with respect to the scores: dx = scale * y * (dy - sum(y * dy)).
void softmax_grad_row(const float* __restrict y, const float* __restrict dy, float scale, float* __restrict dx,
                      int64_t n) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int64_t j = 0; j < n; ++j) dot += y[j] * dy[j];
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) dx[j] = scale * y[j] * (dy[j] - dot);
}

int64_t row_grain(int64_t cols) {
  return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(cols, 1));
}

void softmax_rows(const float* x, const MaskRows& mask, float scale, float* y, int64_t rows, int64_t cols) {
  parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      softmax_row(x + r * cols, mask.data ? mask.row(r) : nullptr, scale, y + r * cols, cols);
  });
}

void softmax_grad_rows(const float* y, const float* dy, float scale, float* dx, int64_t rows, int64_t cols) {
  parallel_for(rows, row_grain(cols), [=](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) softmax_grad_row(y + r * cols, dy + r * cols, scale, dx + r * cols, cols);
  });
}

// Loops over plain restrict pointers (not lambda captures), so that the compiler vectorizes them.
void gelu_span(const float* __restrict x, float* __restrict y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + erf_fast(x[i] * kSqrtHalf));
}

void gelu_grad_span(const float* __restrict x, const float* __restrict dy, float* __restrict dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    float cdf = 0.5f * (1.0f + erf_fast(v * kSqrtHalf));
    float pdf = exp_fast(-0.5f * v * v) * kInvSqrt2Pi;
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}

void gelu_values(const float* x, float* y, int64_t n) {
  parallel_for(n, kElementGrain, [=](int64_t i0, int64_t i1) { gelu_span(x + i0, y + i0, i1 - i0); });
}

void gelu_grad_values(const float* x, const float* dy, float* dx, int64_t n) {
  parallel_for(n, kElementGrain, [=](int64_t i0, int64_t i1) { gelu_grad_span(x + i0, dy + i0, dx + i0, i1 - i0); });
}

// Layer normalization without its affine part: y = (x - mean) / sqrt(var + eps) over each row. The gradient
// recomputes the row's statistics from x (one more pass over a row in cache) instead of storing them:
// dx = rstd * (dy - mean(dy) - y * mean(dy * y)).
struct RowStats {
  float mean, rstd;
};

RowStats row_stats(const float* __restrict x, int64_t n, float eps) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) sum += x[j];
  float mean = sum / n, var = 0.0f;
#pragma omp simd reduction(+ : var)
  for (int64_t j = 0; j < n; ++j) var += (x[j] - mean) * (x[j] - mean);
  return {mean, 1.0f / std::sqrt(var / n + eps)};
}

void normalize_row(const float* __restrict x, float* __restrict y, int64_t n, float eps) {
  auto [mean, rstd] = row_stats(x, n, eps);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] = (x[j] - mean) * rstd;
}

void normalize_grad_row(const float* __restrict x, const float* __restrict dy, float* __restrict dx, int64_t n,
                        float eps) {
  auto [mean, rstd] = row_stats(x, n, eps);
  float dy_sum = 0.0f, dy_y = 0.0f;
#pragma omp simd reduction(+ : dy_sum, dy_y)
  for (int64_t j = 0; j < n; ++j) {
    dy_sum += dy[j];
    dy_y += dy[j] * (x[j] - mean) * rstd;
  }
  float a = dy_sum / n, b = dy_y / n;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) dx[j] = rstd * (dy[j] - a - (x[j] - mean) * rstd * b);
}

void normalize_rows(const float* x, float* y, int64_t rows, int64_t cols, float eps) {
  parallel_for(rows, row_grain(cols), [=](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) normalize_row(x + r * cols, y + r * cols, cols, eps);
  });
}

void normalize_grad_rows(const float* x, const float* dy, float* dx, int64_t rows, int64_t cols, float eps) {
  parallel_for(rows, row_grain(cols), [=](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) normalize_grad_row(x + r * cols, dy + r * cols, dx + r * cols, cols, eps);
  });
}

// Dropout's keep decision for element i: a counter-based hash of (i, seed) (two rounds of Wellons' lowbias32),
// so that the backward pass recomputes the forward's mask from the seed instead of storing it, and a loop of
// integer multiplies and shifts vectorizes (MLX's own bernoulli runs threefry one element at a time).
inline uint32_t lowbias32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// y = x / (1 - p) where hash(i, seed) >= p * 2^32, else 0; elements [begin, begin + n) of the array. Within each
// run (at most 2^30 elements) the index's high half is constant, so the inner loop is 32-bit arithmetic, which
// vectorizes at full width with AVX2 too (AVX2 has no 64-bit multiply); the mask is the 64-bit index's.
void dropout_span(const float* __restrict x, float* __restrict y, int64_t begin, int64_t n, uint32_t s0, uint32_t s1,
                  uint32_t threshold, float scale) {
  while (n > 0) {
    uint32_t low = (uint32_t)begin, high = s1 ^ (uint32_t)((uint64_t)begin >> 32);
    int32_t run = (int32_t)std::min<int64_t>({n, (int64_t(1) << 32) - low, int64_t(1) << 30});
#pragma omp simd
    for (int32_t i = 0; i < run; ++i) {
      uint32_t h = lowbias32(lowbias32((low + (uint32_t)i) ^ s0) + high);
      y[i] = h >= threshold ? x[i] * scale : 0.0f;
    }
    x += run, y += run, begin += run, n -= run;
  }
}

void dropout_values(const float* x, float* y, int64_t n, uint32_t s0, uint32_t s1, float p) {
  uint32_t threshold = (uint32_t)std::min(4294967295.0, std::ldexp((double)p, 32));
  float scale = 1.0f / (1.0f - p);
  parallel_for(n, kElementGrain, [=](int64_t i0, int64_t i1) {
    dropout_span(x + i0, y + i0, i0, i1 - i0, s0, s1, threshold, scale);
  });
}

// One primitive class for the kernels; `kind` picks the kernel. Softmax takes (scores[, mask]) and
// computes softmax(scale * scores + mask) over the last axis; its gradient takes (y, dy). Dropout takes (x, seed),
// seed a uint32 array of 2, with `scale` holding the drop probability. Normalize takes (x) and NormalizeGrad (x, dy),
// with `scale` holding epsilon.
enum class Kernel { Softmax, SoftmaxGrad, Gelu, GeluGrad, Dropout, Normalize, NormalizeGrad };

array make(Kernel kind, std::vector<array> inputs, float scale, StreamOrDevice s);

// The outputs' buffers, and the stream's command encoder told what a kernel reads and writes.
auto& outputs_encoder(Stream stream, const std::vector<array>& inputs, std::vector<array>& outputs) {
  for (auto& out : outputs) out.set_data(allocator::malloc(out.nbytes()));
  auto& encoder = cpu::get_command_encoder(stream);
  for (auto& a : inputs) encoder.set_input_array(a);
  for (auto& out : outputs) encoder.set_output_array(out);
  return encoder;
}

auto& output_encoder(Stream stream, const std::vector<array>& inputs, array& out) {
  std::vector<array> outputs{out};  // the same array (a shared handle)
  return outputs_encoder(stream, inputs, outputs);
}

// The stream a kernel runs on, which must be a CPU stream.
Stream cpu_stream(StreamOrDevice s) {
  auto stream = to_stream(s);
  if (stream.device != Device::cpu) throw std::invalid_argument("kbert CPU kernels need a CPU stream");
  return stream;
}

// A one-output primitive of these kernels: it has no GPU implementation.
class CpuPrimitive : public UnaryPrimitive {
 public:
  using UnaryPrimitive::UnaryPrimitive;

  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("kbert CPU kernels run on the CPU only");
  }
};

class FastCpuKernel : public CpuPrimitive {
 public:
  FastCpuKernel(Stream stream, Kernel kind, float scale) : CpuPrimitive(stream), kind_(kind), scale_(scale) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    auto& encoder = output_encoder(stream(), inputs, out);
    const float* a = inputs[0].data<float>();
    const float* b = inputs.size() > 1 && kind_ != Kernel::Dropout ? inputs[1].data<float>() : nullptr;
    float* o = out.data<float>();
    float scale = scale_;
    int64_t n = out.size();
    int64_t cols = out.ndim() ? out.shape(-1) : 1;
    int64_t rows = cols ? n / cols : 0;
    switch (kind_) {
      case Kernel::Softmax: {
        MaskRows mask;
        if (b) {
          mask.data = b;
          for (int d = 0; d + 1 < out.ndim(); ++d) {
            mask.shape.push_back(out.shape(d));
            mask.strides.push_back(inputs[1].strides()[d]);
          }
        }
        encoder.dispatch([=]() { softmax_rows(a, mask, scale, o, rows, cols); });
        break;
      }
      case Kernel::SoftmaxGrad:
        encoder.dispatch([=]() { softmax_grad_rows(a, b, scale, o, rows, cols); });
        break;
      case Kernel::Gelu:
        encoder.dispatch([=]() { gelu_values(a, o, n); });
        break;
      case Kernel::GeluGrad:
        encoder.dispatch([=]() { gelu_grad_values(a, b, o, n); });
        break;
      case Kernel::Normalize:
        encoder.dispatch([=]() { normalize_rows(a, o, rows, cols, scale); });
        break;
      case Kernel::NormalizeGrad:
        encoder.dispatch([=]() { normalize_grad_rows(a, b, o, rows, cols, scale); });
        break;
      case Kernel::Dropout: {
        const uint32_t* seed = inputs[1].data<uint32_t>();
        encoder.dispatch([=]() { dropout_values(a, o, n, seed[0], seed[1], scale); });
        break;
      }
    }
  }

  std::vector<array> vjp(const std::vector<array>& primals, const std::vector<array>& cotangents,
                         const std::vector<int>& argnums, const std::vector<array>& outputs) override {
    std::vector<array> grads;
    for (int arg : argnums) {
      if (arg > 0 && (kind_ == Kernel::Softmax || kind_ == Kernel::Dropout)) {
        grads.push_back(zeros_like(primals[arg], stream()));  // the mask or the seed: a constant
      } else if (kind_ == Kernel::Dropout) {  // the same mask and scale, applied to the cotangent
        grads.push_back(make(Kernel::Dropout, {cotangents[0], primals[1]}, scale_, stream()));
      } else if (kind_ == Kernel::Softmax) {
        grads.push_back(make(Kernel::SoftmaxGrad, {outputs[0], cotangents[0]}, scale_, stream()));
      } else if (kind_ == Kernel::Normalize) {
        grads.push_back(make(Kernel::NormalizeGrad, {primals[0], cotangents[0]}, scale_, stream()));
      } else if (kind_ == Kernel::Gelu) {
        grads.push_back(make(Kernel::GeluGrad, {primals[0], cotangents[0]}, 1.0f, stream()));
      } else {
        throw std::runtime_error("kbert CPU kernels: second derivatives are not implemented");
      }
    }
    return grads;
  }

  std::vector<Shape> output_shapes(const std::vector<array>& inputs) override { return {inputs[0].shape()}; }

  const char* name() const override {
    switch (kind_) {
      case Kernel::Softmax: return "KbertSoftmax";
      case Kernel::SoftmaxGrad: return "KbertSoftmaxGrad";
      case Kernel::Gelu: return "KbertGelu";
      case Kernel::Dropout: return "KbertDropout";
      case Kernel::Normalize: return "KbertNormalize";
      case Kernel::NormalizeGrad: return "KbertNormalizeGrad";
      default: return "KbertGeluGrad";
    }
  }

  bool is_equivalent(const Primitive& other) const override {
    auto& o = static_cast<const FastCpuKernel&>(other);
    return kind_ == o.kind_ && scale_ == o.scale_;
  }

 private:
  Kernel kind_;
  float scale_;
};

array make(Kernel kind, std::vector<array> inputs, float scale, StreamOrDevice s) {
  auto stream = cpu_stream(s);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].dtype() != (kind == Kernel::Dropout && i == 1 ? uint32 : float32))
      throw std::invalid_argument("kbert CPU kernels take float32 arrays (dropout: a uint32 seed of 2)");
  auto shape = inputs[0].shape();
  inputs[0] = contiguous(inputs[0], false, stream);
  if (inputs.size() > 1) {
    if (kind == Kernel::Dropout) {
      if (inputs[1].size() != 2) throw std::invalid_argument("kbert dropout: the seed must hold 2 uint32");
      inputs[1] = contiguous(flatten(inputs[1], stream), false, stream);
    } else if (kind == Kernel::Softmax) {
      // The mask stays small: rows made contiguous, then a broadcast view (stride 0 on broadcast axes).
      if (inputs[1].ndim() == 0 || inputs[1].shape(-1) != shape.back())
        throw std::invalid_argument("kbert softmax: the mask's last axis must match the scores'");
      inputs[1] = broadcast_to(contiguous(inputs[1], false, stream), shape, stream);
    } else {
      if (inputs[1].shape() != shape) throw std::invalid_argument("kbert CPU kernels: shapes differ");
      inputs[1] = contiguous(inputs[1], false, stream);
    }
  }
  return array(shape, float32, std::make_shared<FastCpuKernel>(stream, kind, scale), std::move(inputs));
}


// bf16 products with float32 accumulation on CPUs with AVX512-BF16 (--precision bf16 there, pipeline/precision.py):
// C = op(A) op(B), A and B float32 in memory (float32 master weights, float32 activations), each operand rounded
// to bf16 (nearest even, as MLX's astype) while it is packed, the products summed by vdpbf16ps in float32.
//   NT: a (M, K), b (N, K)[, bias (N)] -> a b^T (+ bias)   (a linear layer's forward: x W^T + b)
//   NN: a (M, K), b (K, N) -> a b     (its input gradient: dy W)
//   TN: a (K, M), b (K, N) -> a^T b   (its weight gradient: dy^T x)
// The three are closed under the vector-Jacobian product. Each output element is summed in one fixed order
// (k blocks of KC, pairs within a block), whatever the number of threads: the bits do not depend on the layout.
// A GotoBLAS-style blocking: B packed per KC slice into NR-column panels of bf16 pairs, A per (MC x KC) block into
// rows of pairs (MR-row panels when A is read transposed); a 12 x 32 tile in 24 zmm accumulators.
enum class Gemm { NT, NN, TN };

#if defined(__AVX512BF16__)
constexpr bool kHasBf16Gemm = true;
constexpr int kMR = 12, kNR = 32, kKC = 768, kMC = 48;

inline uint16_t to_bf16(float f) {  // round to nearest even; a NaN stays a NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

// 16 (lo, hi) bf16 pairs as int32, lo in the low half.
inline __m512i pairs16(__m512 lo, __m512 hi) {
  __m512i l = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(lo));
  __m512i h = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(hi));
  return _mm512_or_si512(l, _mm512_slli_epi32(h, 16));
}

// n int32 from a 64-byte boundary: the packed rows (64-byte multiples apart) then never straddle two cache lines. An
// AMX tile load whose rows do costs about 6 times as much (41.6 against 6.5 cycles, measured here).
inline std::unique_ptr<int32_t, void (*)(void*)> line_buffer(int64_t n) {
  void* memory = std::aligned_alloc(64, (std::max<int64_t>(n, 1) * 4 + 63) / 64 * 64);
  if (!memory) throw std::bad_alloc();
  return {static_cast<int32_t*>(memory), std::free};
}

// A contiguous float32 run x[0, n) as bf16 pairs: out[p] = (x[2p], x[2p + 1]), an odd n padded with 0.
inline void pair_run(const float* x, int n, int32_t* out) {
  int t = 0;
  for (; t + 32 <= n; t += 32)
    _mm512_storeu_si512(out + t / 2, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + t + 16), _mm512_loadu_ps(x + t)));
  if (t < n) {
    int r = n - t;
    __mmask16 m0 = (__mmask16)(r >= 16 ? 0xffff : (1u << r) - 1);
    __mmask16 m1 = (__mmask16)(r > 16 ? (1u << (r - 16)) - 1 : 0);
    alignas(64) int32_t tail[16];
    _mm512_store_si512(tail, (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, x + t + 16),
                                                        _mm512_maskz_loadu_ps(m0, x + t)));
    std::memcpy(out + t / 2, tail, sizeof(int32_t) * ((r + 1) / 2));
  }
}

// 16 x 16 int32 transposed in place: r[i][j] <- r[j][i].
inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane L: t[2i] = r[2i][4L], r[2i+1][4L], r[2i][4L+1], r[2i+1][4L+1]
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // u[4g + c]: lane L holds column 4L + c of rows 4g..4g+3
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g + 0], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g + 0], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // column 4L + c: lane L of u[c], u[4 + c], u[8 + c], u[12 + c]
    __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd);
    __m512i w0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88), w1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
    r[c] = _mm512_shuffle_i32x4(v0, w0, 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(v0, w0, 0xdd);
    r[4 + c] = _mm512_shuffle_i32x4(v1, w1, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(v1, w1, 0xdd);
  }
}

// A (rows x kc) block of X, read as X[r * ld_r + k * ld_k], into panels of R rows: per k pair, R int32 pairs, kpad
// (>= the block's pairs) pairs a panel. Zero padded in rows and k.
template <int R>
void pack_panels(const float* X, int64_t ld_r, int64_t ld_k, int rows, int kc, int kpad, int32_t* out) {
  int kp = (kc + 1) / 2;
  for (int r0 = 0; r0 < rows; r0 += R)
    std::fill_n(out + (int64_t)(r0 / R) * kpad * R + (int64_t)kp * R, (int64_t)(kpad - kp) * R, 0);
  if (ld_k == 1 && R % 16 == 0) {  // rows contiguous along k: 16 rows' 16 pairs at a time, transposed into place
    for (int r0 = 0; r0 < rows; r0 += 16) {
      int32_t* panel = out + (int64_t)(r0 / R) * kpad * R + r0 % R;
      int n = std::min(16, rows - r0);
      for (int p0 = 0; p0 < kp; p0 += 16) {
        int left = std::min(32, kc - 2 * p0);  // float32 values of this row's run
        __mmask16 lo = (__mmask16)(left >= 16 ? 0xffff : (1u << left) - 1);
        __mmask16 hi = (__mmask16)(left >= 32 ? 0xffff : left > 16 ? (1u << (left - 16)) - 1 : 0);
        __m512i v[16];
        for (int r = 0; r < 16; ++r) {
          const float* x = X + (r0 + r) * ld_r + 2 * p0;
          v[r] = r < n ? (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + 16), _mm512_maskz_loadu_ps(lo, x))
                       : _mm512_setzero_si512();
        }
        transpose16(v);
        for (int q = 0; q < std::min(16, kp - p0); ++q) _mm512_storeu_si512(panel + (int64_t)(p0 + q) * R, v[q]);
      }
    }
    return;
  }
  if (ld_k == 1) {  // rows contiguous along k: pair each row's run, then lay its pairs R apart
    std::vector<int32_t> run(kp);
    for (int r0 = 0; r0 < rows; r0 += R) {
      int32_t* panel = out + (int64_t)(r0 / R) * kpad * R;
      for (int r = 0; r < R; ++r) {
        if (r0 + r < rows) pair_run(X + (r0 + r) * ld_r, kc, run.data());
        else std::fill(run.begin(), run.end(), 0);
        for (int p = 0; p < kp; ++p) panel[p * R + r] = run[p];
      }
    }
    return;
  }
  for (int r0 = 0; r0 < rows; r0 += R) {  // rows side by side
    int32_t* panel = out + (int64_t)(r0 / R) * kpad * R;
    int nr = std::min(R, rows - r0);
    for (int p = 0; p < kp; ++p) {
      const float* lo = X + r0 * ld_r + (2 * p) * ld_k;
      const float* hi = lo + ld_k;
      bool has_hi = 2 * p + 1 < kc;
      int32_t* dst = panel + p * R;
      if (ld_r == 1) {  // 16 rows at a time, masked past the block's rows and the panel's end
        for (int r = 0; r < R; r += 16) {
          __mmask16 load = (__mmask16)(nr - r >= 16 ? 0xffff : nr > r ? (1u << (nr - r)) - 1 : 0);
          __mmask16 store = (__mmask16)(R - r >= 16 ? 0xffff : (1u << (R - r)) - 1);
          __m512 l = _mm512_maskz_loadu_ps(load, lo + r);
          __m512 h = has_hi ? _mm512_maskz_loadu_ps(load, hi + r) : _mm512_setzero_ps();
          _mm512_mask_storeu_epi32(dst + r, store, pairs16(l, h));
        }
        continue;
      }
      for (int r = 0; r < R; ++r) {
        float l = r < nr ? lo[r * ld_r] : 0.0f, h = (r < nr && has_hi) ? hi[r * ld_r] : 0.0f;
        dst[r] = (int32_t)((uint32_t)to_bf16(l) | ((uint32_t)to_bf16(h) << 16));
      }
    }
  }
}

// The (mr x nr <= kMR x kNR) tile of C at `c`, = (or += when `add`) A's pairs times a B panel over kp pairs; A's
// pair (i, p) is a[i * sa + p * SP] (rows of pairs: SP 1; panels: sa 1, SP kMR). `bias` (the tile's columns),
// when given, is added where the tile is stored first. Named accumulators: an array of vectors lets the compiler
// split the loop and spill them.
template <int64_t SP>
inline void tile(const int32_t* a, int64_t sa, const int32_t* b, int kp, float* c, int64_t ldc, int mr, int nr,
                 bool add, const float* bias) {
#define KB_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define KB_ZERO(i) __m512 c##i##0 = _mm512_setzero_ps(), c##i##1 = _mm512_setzero_ps();
#define KB_STEP(i)                                                          \
  {                                                                         \
    __m512bh ai = (__m512bh)_mm512_set1_epi32(a[i * sa]);                   \
    c##i##0 = _mm512_dpbf16_ps(c##i##0, b0, ai);                            \
    c##i##1 = _mm512_dpbf16_ps(c##i##1, b1, ai);                            \
  }
#define KB_SAVE(i) _mm512_store_ps(out[i], c##i##0); _mm512_store_ps(out[i] + 16, c##i##1);
  KB_ROWS(KB_ZERO)
  for (int p = 0; p < kp; ++p, a += SP, b += 2 * 16) {
    __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 16);
    KB_ROWS(KB_STEP)
  }
  alignas(64) float out[kMR][kNR];
  KB_ROWS(KB_SAVE)
#undef KB_ROWS
#undef KB_ZERO
#undef KB_STEP
#undef KB_SAVE
  __mmask16 m0 = (__mmask16)(nr >= 16 ? 0xffff : (1u << nr) - 1);
  __mmask16 m1 = (__mmask16)(nr >= 32 ? 0xffff : nr > 16 ? (1u << (nr - 16)) - 1 : 0);
  const float* first = add ? nullptr : bias;  // what the first store adds: the bias, or nothing
  __m512 bias0 = first ? _mm512_maskz_loadu_ps(m0, first) : _mm512_setzero_ps();
  __m512 bias1 = first ? _mm512_maskz_loadu_ps(m1, first + 16) : _mm512_setzero_ps();
  for (int i = 0; i < mr; ++i) {
    float* row = c + i * ldc;
    __m512 v0 = _mm512_load_ps(out[i]), v1 = _mm512_load_ps(out[i] + 16);
    if (add) {
      v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, row));
      v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, row + 16));
    } else if (first) {
      v0 = _mm512_add_ps(v0, bias0);
      v1 = _mm512_add_ps(v1, bias1);
    }
    _mm512_mask_storeu_ps(row, m0, v0);
    _mm512_mask_storeu_ps(row + 16, m1, v1);
  }
}

// A (rows x kc) block of X, read as X[r * ld_r + k * ld_k], as rows of pairs: out[r * kpad + p], rows up to
// rows_pad and pairs up to kpad (>= the block's pairs; a multiple of 16 where X is read transposed) zero.
void pack_rows(const float* X, int64_t ld_r, int64_t ld_k, int rows, int kc, int kpad, int rows_pad, int32_t* out) {
  int kp = (kc + 1) / 2;
  if (ld_k == 1) {
    for (int r = 0; r < rows_pad; ++r) {
      int32_t* row = out + (int64_t)r * kpad;
      if (r < rows) pair_run(X + r * ld_r, kc, row);
      std::fill(row + (r < rows ? kp : 0), row + kpad, 0);
    }
    return;
  }
  if (ld_r == 1) {  // k pairs across 16 rows at a time (as the panels), transposed into the rows
    for (int r0 = 0; r0 < rows_pad; r0 += 16) {
      int n = std::clamp(rows - r0, 0, 16);
      __mmask16 load = (__mmask16)(n == 16 ? 0xffff : (1u << n) - 1);
      for (int p0 = 0; p0 < kpad; p0 += 16) {
        __m512i v[16];
        for (int q = 0; q < 16; ++q) {
          int k = 2 * (p0 + q);
          const float* lo = X + r0 + k * ld_k;
          __m512 l = k < kc ? _mm512_maskz_loadu_ps(load, lo) : _mm512_setzero_ps();
          __m512 h = k + 1 < kc ? _mm512_maskz_loadu_ps(load, lo + ld_k) : _mm512_setzero_ps();
          v[q] = pairs16(l, h);
        }
        transpose16(v);
        for (int r = 0; r < 16; ++r) _mm512_storeu_si512(out + (int64_t)(r0 + r) * kpad + p0, v[r]);
      }
    }
    return;
  }
  for (int r = 0; r < rows_pad; ++r)
    for (int p = 0; p < kpad; ++p) {
      int k = 2 * p;
      float l = r < rows && k < kc ? X[r * ld_r + k * ld_k] : 0.0f;
      float h = r < rows && k + 1 < kc ? X[r * ld_r + (k + 1) * ld_k] : 0.0f;
      out[(int64_t)r * kpad + p] = (int32_t)((uint32_t)to_bf16(l) | ((uint32_t)to_bf16(h) << 16));
    }
}

// C (M x N, row-major, ldc) = A B (+ bias, N values) over K, A read as A[i * lda_i + k * lda_k], B as
// B[k * ldb_k + j * ldb_j], in vdpbf16ps tiles. Per KC slice of K: B's slice packed once (its panels split over the
// threads), then C's rows split over the threads, each packing its A blocks once for all of N.
void dpbf16_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda_i, int64_t lda_k, const float* B,
                 int64_t ldb_k, int64_t ldb_j, float* C, int64_t ldc, const float* bias) {
  int64_t pairs = (std::min<int64_t>(K, kKC) + 1) / 2, panels = (N + kNR - 1) / kNR;
  auto bpack = line_buffer(pairs * panels * kNR);
  bool rows = lda_k == 1;  // A's rows contiguous along k: kept as rows of pairs, no panel transpose
  for (int64_t pc = 0; pc < K; pc += kKC) {
    int kc = (int)std::min<int64_t>(kKC, K - pc), kp = (kc + 1) / 2;
    parallel_for(panels, 4, [&](int64_t p0, int64_t p1) {
      int nc = (int)(std::min(N, p1 * kNR) - p0 * kNR);
      pack_panels<kNR>(B + pc * ldb_k + p0 * kNR * ldb_j, ldb_j, ldb_k, nc, kc, kp, bpack.get() + p0 * kp * kNR);
    });
    parallel_for(M, kMC, [&](int64_t m0, int64_t m1) {
      auto apack = line_buffer(pairs * ((kMC + kMR - 1) / kMR) * kMR);
      for (int64_t ic = m0; ic < m1; ic += kMC) {
        int mc = (int)std::min<int64_t>(kMC, m1 - ic);
        const float* block = A + ic * lda_i + pc * lda_k;
        if (rows) {
          pack_rows(block, lda_i, 1, mc, kc, kp, (mc + kMR - 1) / kMR * kMR, apack.get());
        } else {
          pack_panels<kMR>(block, lda_i, lda_k, mc, kc, kp, apack.get());
        }
        for (int64_t jr = 0; jr < N; jr += kNR) {
          const int32_t* panel = bpack.get() + (jr / kNR) * kp * kNR;
          int nr = (int)std::min<int64_t>(kNR, N - jr);
          const float* tile_bias = bias ? bias + jr : nullptr;
          for (int ir = 0; ir < mc; ir += kMR) {
            float* c = C + (ic + ir) * ldc + jr;
            int mr = std::min(kMR, mc - ir);
            if (rows) tile<1>(apack.get() + (int64_t)ir * kp, kp, panel, kp, c, ldc, mr, nr, pc > 0, tile_bias);
            else
              tile<kMR>(apack.get() + (int64_t)(ir / kMR) * kp * kMR, 1, panel, kp, c, ldc, mr, nr, pc > 0,
                        tile_bias);
          }
        }
      }
    });
  }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
// On CPUs with AMX (Intel Sapphire Rapids and later) the same products in tile instructions: tdpbf16ps sums a
// 16 x 16 float32 block over 16 bf16 pairs at once (8,192 products an instruction; vdpbf16ps does 32). Each output
// element is still summed in one fixed order (KC slices, then 16-pair steps, pairs in the instruction's order),
// whatever the threads; the order differs from vdpbf16ps's, so the bits differ from the other path's
// (pipeline/precision.py records which ran: "amx_bf16").
// Tiles 0-3 hold C's 32 x 32 block as 2 x 2 blocks of 16 x 16, 4-5 A's two 16-row blocks (16 pairs a row), 6-7 a
// B panel's two 16-column halves (16 pair rows). A is packed as rows of pairs, kpad (the slice's pairs rounded up
// to 16, zero padded) apart, rows padded to 32; B as the vdpbf16ps path's panels, kpad pairs each.
constexpr int kAmxMR = 32;  // rows of an A block (of a KC slice), packed once for all of N

// Linux lets a process use the tiles' state only once it asks (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); until then a tile instruction faults. Asked once: where the kernel refuses, the vdpbf16ps
// tiles serve.
bool amx_ready() {
  static const bool ready = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return ready;
}

// A thread's tile shapes: every tile 16 rows of 64 bytes. Loaded by each thread before its tiles (the configuration
// is a thread's state, and other code on the thread, PyTorch's oneDNN in the tests, may load its own).
inline void amx_configure() {
  alignas(64) uint8_t config[64] = {};
  config[0] = 1;  // palette 1
  for (int t = 0; t < 8; ++t) {
    config[16 + 2 * t] = 64;  // bytes a row
    config[48 + t] = 16;      // rows
  }
  _tile_loadconfig(config);
}

// The (mr x nr <= 32 x 32) block of C at `c`, = (or += when `add`) A's 32 rows of pairs at `a` times a B panel,
// over kpad pairs; `bias` (the block's columns) added where the block is stored first. The tiles start from what the
// block adds to (C, the bias, or zero) and sum the products onto it, so each element's order is the same in a whole
// block as in one at C's edge (which goes through a buffer), whatever the threads' split of the rows. A whole
// block's tiles load the bias straight from it (a tile just stored to the stack and loaded stalls the load).
inline void amx_tile(const int32_t* a, const int32_t* b, int kpad, float* c, int64_t ldc, int mr, int nr, bool add,
                     const float* bias) {
  const int64_t a_stride = (int64_t)kpad * 4, b_stride = kNR * 4;
  const bool whole = mr == kAmxMR && nr == kNR;
  alignas(64) float edge[kAmxMR][kNR];
  float* base = c;
  int64_t stride = ldc * 4;
  const __mmask16 m0 = (__mmask16)(nr >= 16 ? 0xffff : (1u << nr) - 1);
  const __mmask16 m1 = (__mmask16)(nr >= 32 ? 0xffff : nr > 16 ? (1u << (nr - 16)) - 1 : 0);
  if (!whole) {
    for (int i = 0; i < kAmxMR; ++i) {
      const float* from = i >= mr ? nullptr : add ? c + i * ldc : bias;
      _mm512_store_ps(edge[i], from ? _mm512_maskz_loadu_ps(m0, from) : _mm512_setzero_ps());
      _mm512_store_ps(edge[i] + 16, from ? _mm512_maskz_loadu_ps(m1, from + 16) : _mm512_setzero_ps());
    }
    base = &edge[0][0];
    stride = b_stride;
  }
  const int64_t ld = stride / 4;
  if (whole && !add && bias) {  // every row of a tile the bias: a stride of 0
    _tile_loadd(0, bias, 0);
    _tile_loadd(1, bias + 16, 0);
    _tile_loadd(2, bias, 0);
    _tile_loadd(3, bias + 16, 0);
  } else if (add || bias) {
    _tile_loadd(0, base, stride);
    _tile_loadd(1, base + 16, stride);
    _tile_loadd(2, base + 16 * ld, stride);
    _tile_loadd(3, base + 16 * ld + 16, stride);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int p = 0; p < kpad; p += 16) {  // each load as late as its first product: the others' products overlap it
    _tile_loadd(4, a + p, a_stride);
    _tile_loadd(6, b + (int64_t)p * kNR, b_stride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, b + (int64_t)p * kNR + 16, b_stride);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, a + 16 * (int64_t)kpad + p, a_stride);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, base, stride);
  _tile_stored(1, base + 16, stride);
  _tile_stored(2, base + 16 * ld, stride);
  _tile_stored(3, base + 16 * ld + 16, stride);
  if (!whole)
    for (int i = 0; i < mr; ++i) {
      _mm512_mask_storeu_ps(c + i * ldc, m0, _mm512_load_ps(edge[i]));
      _mm512_mask_storeu_ps(c + i * ldc + 16, m1, _mm512_load_ps(edge[i] + 16));
    }
}

// dpbf16_gemm's products in AMX tiles, blocked the same way.
void amx_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda_i, int64_t lda_k, const float* B,
              int64_t ldb_k, int64_t ldb_j, float* C, int64_t ldc, const float* bias) {
  int64_t kpad_max = ((std::min<int64_t>(K, kKC) + 1) / 2 + 15) / 16 * 16, panels = (N + kNR - 1) / kNR;
  auto bpack = line_buffer(kpad_max * panels * kNR);
  for (int64_t pc = 0; pc < K; pc += kKC) {
    int kc = (int)std::min<int64_t>(kKC, K - pc), kpad = ((kc + 1) / 2 + 15) / 16 * 16;
    parallel_for(panels, 4, [&](int64_t p0, int64_t p1) {
      int nc = (int)(std::min(N, p1 * kNR) - p0 * kNR);
      pack_panels<kNR>(B + pc * ldb_k + p0 * kNR * ldb_j, ldb_j, ldb_k, nc, kc, kpad,
                       bpack.get() + p0 * kpad * kNR);
    });
    parallel_for(M, kAmxMR, [&](int64_t m0, int64_t m1) {
      amx_configure();
      auto apack = line_buffer(kpad * kAmxMR);
      for (int64_t ic = m0; ic < m1; ic += kAmxMR) {
        int mr = (int)std::min<int64_t>(kAmxMR, m1 - ic);
        pack_rows(A + ic * lda_i + pc * lda_k, lda_i, lda_k, mr, kc, kpad, kAmxMR, apack.get());
        for (int64_t jr = 0; jr < N; jr += kNR)
          amx_tile(apack.get(), bpack.get() + (jr / kNR) * kpad * kNR, kpad, C + ic * ldc + jr, ldc, mr,
                   (int)std::min<int64_t>(kNR, N - jr), pc > 0, bias ? bias + jr : nullptr);
      }
      _tile_release();
    });
  }
}
#else
bool amx_ready() { return false; }
void amx_gemm(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, int64_t, float*,
              int64_t, const float*) {}
#endif

// The instruction set the bf16 products run on here: "amx_bf16", or "avx512_bf16".
const char* bf16_gemm_isa() { return amx_ready() ? "amx_bf16" : "avx512_bf16"; }

// C (M x N, row-major, ldc) = A B (+ bias, N values) over K, A read as A[i * lda_i + k * lda_k], B as
// B[k * ldb_k + j * ldb_j]: operands rounded to bf16, products summed in float32.
void bf16_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda_i, int64_t lda_k, const float* B,
               int64_t ldb_k, int64_t ldb_j, float* C, int64_t ldc, const float* bias) {
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = bias ? bias[j] : 0.0f;
    return;
  }
  if (amx_ready()) amx_gemm(M, N, K, A, lda_i, lda_k, B, ldb_k, ldb_j, C, ldc, bias);
  else dpbf16_gemm(M, N, K, A, lda_i, lda_k, B, ldb_k, ldb_j, C, ldc, bias);
}
#else
constexpr bool kHasBf16Gemm = false;
const char* bf16_gemm_isa() { return ""; }
void bf16_gemm(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, int64_t, float*,
               int64_t, const float*) {
  throw std::runtime_error("kbert's bf16 GEMM needs AVX512-BF16");
}
#endif

// Attention's per-head products on the (batch, sequence, heads, head_dim) layout that the projections give, without
// MLX's copies into (batch, heads, sequence, head_dim): each head's rows are read (and written) in place through the
// BLAS's leading dimension (heads * head_dim). The BLAS is the cblas_sgemm in the global scope, the one libmlx's
// matmuls bound (models/blas.py); without one these primitives are not offered (has_head_products()).
//   Scores(a, b):    a (B, M, H, D), b (B, N, H, D) -> (B, H, M, N), a_h b_h^T
//   Context(p, v):   p (B, H, M, N), v (B, N, H, D) -> (B, M, H, D), p_h v_h
//   ContextT(p, v):  p (B, H, N, M), v (B, N, H, D) -> (B, M, H, D), p_h^T v_h
// The three are closed under the vector-Jacobian product (see vjp below). `bf16`: each product is the bf16 GEMM's.
using sgemm_fn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                          int);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

sgemm_fn global_sgemm() {
  static sgemm_fn fn = (sgemm_fn)dlsym(RTLD_DEFAULT, "cblas_sgemm");
  return fn;
}

enum class Head { Scores, Context, ContextT };

array head_product(Head kind, array a, array b, bool bf16, StreamOrDevice s);

class HeadProduct : public CpuPrimitive {
 public:
  HeadProduct(Stream stream, Head kind, bool bf16) : CpuPrimitive(stream), kind_(kind), bf16_(bf16) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    auto& encoder = output_encoder(stream(), inputs, out);
    const float* a = inputs[0].data<float>();
    const float* b = inputs[1].data<float>();
    float* o = out.data<float>();
    sgemm_fn sgemm = global_sgemm();
    Head kind = kind_;
    bool bf16 = bf16_;
    int batch = inputs[0].shape(0);
    if (kind == Head::Scores) {
      int m = inputs[0].shape(1), heads = inputs[0].shape(2), d = inputs[0].shape(3), n = inputs[1].shape(1);
      int ld = heads * d;
      encoder.dispatch([=]() {
        parallel_for(int64_t(batch) * heads, 1, [&](int64_t begin, int64_t end) {
          for (int64_t t = begin; t < end; ++t) {
            int64_t i = t / heads, h = t % heads;
            if (bf16)
              bf16_gemm(m, n, d, a + i * m * ld + h * d, ld, 1, b + i * n * ld + h * d, 1, ld, o + t * m * n, n,
                        nullptr);
            else
              sgemm(kRowMajor, kNoTrans, kTrans, m, n, d, 1.0f, a + i * m * ld + h * d, ld, b + i * n * ld + h * d,
                    ld, 0.0f, o + t * m * n, n);
          }
        });
      });
    } else {
      bool transposed = kind == Head::ContextT;
      int heads = inputs[0].shape(1), rows = inputs[0].shape(2), cols = inputs[0].shape(3);
      int m = transposed ? cols : rows, n = transposed ? rows : cols, d = inputs[1].shape(3);
      int ld = heads * d;
      encoder.dispatch([=]() {
        parallel_for(int64_t(batch) * heads, 1, [&](int64_t begin, int64_t end) {
          for (int64_t t = begin; t < end; ++t) {
            int64_t i = t / heads, h = t % heads;
            if (bf16)
              bf16_gemm(m, d, n, a + t * rows * cols, transposed ? 1 : cols, transposed ? cols : 1,
                        b + i * n * ld + h * d, ld, 1, o + i * m * ld + h * d, ld, nullptr);
            else
              sgemm(kRowMajor, transposed ? kTrans : kNoTrans, kNoTrans, m, d, n, 1.0f, a + t * rows * cols, cols,
                    b + i * n * ld + h * d, ld, 0.0f, o + i * m * ld + h * d, ld);
          }
        });
      });
    }
  }

  std::vector<array> vjp(const std::vector<array>& primals, const std::vector<array>& cotangents,
                         const std::vector<int>& argnums, const std::vector<array>&) override {
    const array &a = primals[0], &b = primals[1], &g = cotangents[0];
    std::vector<array> grads;
    for (int arg : argnums) {
      switch (kind_) {
        case Head::Scores:  // C = A B^T: dA = dC B, dB = dC^T A
          grads.push_back(arg == 0 ? head_product(Head::Context, g, b, bf16_, stream())
                                   : head_product(Head::ContextT, g, a, bf16_, stream()));
          break;
        case Head::Context:  // O = P V: dP = dO V^T, dV = P^T dO
          grads.push_back(arg == 0 ? head_product(Head::Scores, g, b, bf16_, stream())
                                   : head_product(Head::ContextT, a, g, bf16_, stream()));
          break;
        case Head::ContextT:  // O = P^T V: dP = V dO^T, dV = P dO
          grads.push_back(arg == 0 ? head_product(Head::Scores, b, g, bf16_, stream())
                                   : head_product(Head::Context, a, g, bf16_, stream()));
          break;
      }
    }
    return grads;
  }

  std::vector<Shape> output_shapes(const std::vector<array>& inputs) override {
    const auto &a = inputs[0], &b = inputs[1];
    if (kind_ == Head::Scores) return {{a.shape(0), a.shape(2), a.shape(1), b.shape(1)}};
    int m = kind_ == Head::ContextT ? a.shape(3) : a.shape(2);
    return {{a.shape(0), m, b.shape(2), b.shape(3)}};
  }

  const char* name() const override {
    return kind_ == Head::Scores ? "KbertHeadScores" : kind_ == Head::Context ? "KbertHeadContext"
                                                                              : "KbertHeadContextT";
  }

  bool is_equivalent(const Primitive& other) const override {
    auto& that = static_cast<const HeadProduct&>(other);
    return kind_ == that.kind_ && bf16_ == that.bf16_;
  }

 private:
  Head kind_;
  bool bf16_;
};

array head_product(Head kind, array a, array b, bool bf16, StreamOrDevice s) {
  auto stream = cpu_stream(s);
  if (!global_sgemm()) throw std::invalid_argument("kbert head products: no cblas_sgemm in the global scope");
  if (bf16 && !kHasBf16Gemm) throw std::invalid_argument("kbert's bf16 GEMM was not built: this CPU lacks AVX512-BF16");
  if (a.dtype() != float32 || b.dtype() != float32 || a.ndim() != 4 || b.ndim() != 4)
    throw std::invalid_argument("kbert head products take 4-dimensional float32 arrays");
  bool ok = kind == Head::Scores
                ? a.shape(0) == b.shape(0) && a.shape(2) == b.shape(2) && a.shape(3) == b.shape(3)
                : a.shape(0) == b.shape(0) && a.shape(1) == b.shape(2) &&
                      (kind == Head::ContextT ? a.shape(2) : a.shape(3)) == b.shape(1);
  if (!ok) throw std::invalid_argument("kbert head products: the shapes do not match");
  Shape shape = kind == Head::Scores ? Shape{a.shape(0), a.shape(2), a.shape(1), b.shape(1)}
                                     : Shape{a.shape(0), kind == Head::ContextT ? a.shape(3) : a.shape(2),
                                             b.shape(2), b.shape(3)};
  std::vector<array> inputs = {contiguous(a, false, stream), contiguous(b, false, stream)};
  return array(shape, float32, std::make_shared<HeadProduct>(stream, kind, bf16), std::move(inputs));
}


array bf16_gemm(Gemm kind, array a, array b, StreamOrDevice s, std::optional<array> bias = std::nullopt);

class Bf16Gemm : public CpuPrimitive {
 public:
  Bf16Gemm(Stream stream, Gemm kind) : CpuPrimitive(stream), kind_(kind) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    auto& encoder = output_encoder(stream(), inputs, out);
    const float* a = inputs[0].data<float>();
    const float* b = inputs[1].data<float>();
    const float* bias = inputs.size() > 2 ? inputs[2].data<float>() : nullptr;
    float* c = out.data<float>();
    int64_t m = out.shape(0), n = out.shape(1);
    int64_t k = kind_ == Gemm::TN ? inputs[0].shape(0) : inputs[0].shape(1);
    int64_t lda_i = kind_ == Gemm::TN ? 1 : k, lda_k = kind_ == Gemm::TN ? m : 1;
    int64_t ldb_k = kind_ == Gemm::NT ? 1 : n, ldb_j = kind_ == Gemm::NT ? k : 1;
    encoder.dispatch([=]() { bf16_gemm(m, n, k, a, lda_i, lda_k, b, ldb_k, ldb_j, c, n, bias); });
  }

  std::vector<array> vjp(const std::vector<array>& primals, const std::vector<array>& cotangents,
                         const std::vector<int>& argnums, const std::vector<array>&) override {
    const array &a = primals[0], &b = primals[1], &g = cotangents[0];
    std::vector<array> grads;
    for (int arg : argnums) {
      if (arg == 2) {  // the bias (NT only): the cotangent summed over rows
        grads.push_back(sum(g, 0, false, stream()));
        continue;
      }
      switch (kind_) {
        case Gemm::NT:  // C = A B^T: dA = dC B, dB = dC^T A
          grads.push_back(arg == 0 ? bf16_gemm(Gemm::NN, g, b, stream()) : bf16_gemm(Gemm::TN, g, a, stream()));
          break;
        case Gemm::NN:  // C = A B: dA = dC B^T, dB = A^T dC
          grads.push_back(arg == 0 ? bf16_gemm(Gemm::NT, g, b, stream()) : bf16_gemm(Gemm::TN, a, g, stream()));
          break;
        case Gemm::TN:  // C = A^T B: dA = B dC^T, dB = A dC
          grads.push_back(arg == 0 ? bf16_gemm(Gemm::NT, b, g, stream()) : bf16_gemm(Gemm::NN, a, g, stream()));
          break;
      }
    }
    return grads;
  }

  std::vector<Shape> output_shapes(const std::vector<array>& inputs) override {
    return {gemm_shape(kind_, inputs[0], inputs[1])};
  }

  static Shape gemm_shape(Gemm kind, const array& a, const array& b) {
    switch (kind) {
      case Gemm::NT: return {a.shape(0), b.shape(0)};
      case Gemm::NN: return {a.shape(0), b.shape(1)};
      default: return {a.shape(1), b.shape(1)};
    }
  }

  const char* name() const override {
    return kind_ == Gemm::NT ? "KbertBf16GemmNT" : kind_ == Gemm::NN ? "KbertBf16GemmNN" : "KbertBf16GemmTN";
  }

  bool is_equivalent(const Primitive& other) const override {
    return kind_ == static_cast<const Bf16Gemm&>(other).kind_;
  }

 private:
  Gemm kind_;
};

array bf16_gemm(Gemm kind, array a, array b, StreamOrDevice s, std::optional<array> bias) {
  auto stream = cpu_stream(s);
  if (!kHasBf16Gemm) throw std::invalid_argument("kbert's bf16 GEMM was not built: this CPU lacks AVX512-BF16");
  if (a.dtype() != float32 || b.dtype() != float32 || a.ndim() != 2 || b.ndim() != 2)
    throw std::invalid_argument("kbert's bf16 GEMM takes 2-dimensional float32 arrays");
  int64_t ka = kind == Gemm::TN ? a.shape(0) : a.shape(1), kb = kind == Gemm::NT ? b.shape(1) : b.shape(0);
  if (ka != kb) throw std::invalid_argument("kbert's bf16 GEMM: the inner dimensions differ");
  Shape shape = Bf16Gemm::gemm_shape(kind, a, b);
  std::vector<array> inputs = {contiguous(a, false, stream), contiguous(b, false, stream)};
  if (bias) {
    if (kind != Gemm::NT || bias->dtype() != float32 || bias->ndim() != 1 || bias->shape(0) != shape[1])
      throw std::invalid_argument("kbert's bf16 GEMM: the bias must be float32 of the output's width (NT only)");
    inputs.push_back(contiguous(*bias, false, stream));
  }
  return array(shape, float32, std::make_shared<Bf16Gemm>(stream, kind), std::move(inputs));
}

// AdamW's update of one float32 parameter in one pass (MLX's optim.AdamW without bias correction, op for op:
// the same float32 operations in the same order, no contraction, so the same bits as its eager update):
//   p <- p * decay;  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2;  p <- p - lr m / (sqrt(v) + eps)
// with decay = 1 - lr * weight_decay and lr given as float32 arrays. MLX's eager ops run these as a dozen
// single-threaded passes over the parameter; this is one, over every core (the update runs after a step's shards).
// No fused multiply-adds here (the build's default contracts): MLX's update rounds each product.
__attribute__((optimize("fp-contract=off"))) void adamw_span(
    const float* __restrict p, const float* __restrict g, const float* __restrict m, const float* __restrict v,
    float* __restrict p_out, float* __restrict m_out, float* __restrict v_out, int64_t n, float rate, float keep,
    float b1, float c1, float b2, float c2, float eps) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i];
    float mi = b1 * m[i] + c1 * gi;
    float vi = b2 * v[i] + c2 * (gi * gi);
    m_out[i] = mi;
    v_out[i] = vi;
    p_out[i] = p[i] * keep - rate * mi / (std::sqrt(vi) + eps);
  }
}

class AdamWUpdate : public Primitive {
 public:
  AdamWUpdate(Stream stream, float b1, float c1, float b2, float c2, float eps)
      : Primitive(stream), b1_(b1), c1_(c1), b2_(b2), c2_(c2), eps_(eps) {}

  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override {
    auto& encoder = outputs_encoder(stream(), inputs, outputs);
    const float *p = inputs[0].data<float>(), *g = inputs[1].data<float>(), *m = inputs[2].data<float>(),
                *v = inputs[3].data<float>(), *lr = inputs[4].data<float>(), *decay = inputs[5].data<float>();
    float *p_out = outputs[0].data<float>(), *m_out = outputs[1].data<float>(), *v_out = outputs[2].data<float>();
    float b1 = b1_, c1 = c1_, b2 = b2_, c2 = c2_, eps = eps_;
    int64_t n = inputs[0].size();
    encoder.dispatch([=]() {
      float rate = *lr, keep = *decay;
      parallel_for(n, kElementGrain, default_threads(), [=](int64_t i0, int64_t i1) {
        adamw_span(p + i0, g + i0, m + i0, v + i0, p_out + i0, m_out + i0, v_out + i0, i1 - i0, rate, keep, b1, c1,
                   b2, c2, eps);
      });
    });
  }

  void eval_gpu(const std::vector<array>&, std::vector<array>&) override {
    throw std::runtime_error("kbert CPU kernels run on the CPU only");
  }

  std::vector<Shape> output_shapes(const std::vector<array>& inputs) override {
    return {inputs[0].shape(), inputs[0].shape(), inputs[0].shape()};
  }

  const char* name() const override { return "KbertAdamWUpdate"; }

  bool is_equivalent(const Primitive& other) const override {
    auto& that = static_cast<const AdamWUpdate&>(other);
    return b1_ == that.b1_ && c1_ == that.c1_ && b2_ == that.b2_ && c2_ == that.c2_ && eps_ == that.eps_;
  }

 private:
  float b1_, c1_, b2_, c2_, eps_;
};

std::vector<array> adamw_update(const array& p, const array& g, const array& m, const array& v, const array& lr,
                                const array& decay, float b1, float c1, float b2, float c2, float eps,
                                StreamOrDevice s) {
  auto stream = cpu_stream(s);
  for (const array* a : {&p, &g, &m, &v, &lr, &decay})
    if (a->dtype() != float32) throw std::invalid_argument("kbert's AdamW update takes float32 arrays");
  if (g.shape() != p.shape() || m.shape() != p.shape() || v.shape() != p.shape() || lr.size() != 1 ||
      decay.size() != 1)
    throw std::invalid_argument("kbert's AdamW update: the shapes do not match");
  std::vector<array> inputs;
  for (const array* a : {&p, &g, &m, &v, &lr, &decay}) inputs.push_back(contiguous(*a, false, stream));
  return array::make_arrays({p.shape(), p.shape(), p.shape()}, {float32, float32, float32},
                            std::make_shared<AdamWUpdate>(stream, b1, c1, b2, c2, eps), std::move(inputs));
}

}  // namespace

NB_MODULE(_kbert_cpu_kernels, m) {
  m.doc() = "kbert's vectorized CPU kernels for MLX (softmax over the last axis, erf GELU, dropout)";
  m.def("softmax", [](const array& x, std::optional<array> mask, float scale, StreamOrDevice s) {
    std::vector<array> inputs = {x};
    if (mask) inputs.push_back(*mask);
    return make(Kernel::Softmax, std::move(inputs), scale, s);
  }, "x"_a, "mask"_a = nb::none(), "scale"_a = 1.0f, nb::kw_only(), "stream"_a = nb::none(),
     "softmax(scale * x + mask) over the last axis; the mask broadcasts to x.");
  m.def("softmax_grad", [](const array& y, const array& dy, float scale, StreamOrDevice s) {
    return make(Kernel::SoftmaxGrad, {y, dy}, scale, s);
  }, "y"_a, "dy"_a, "scale"_a = 1.0f, nb::kw_only(), "stream"_a = nb::none());
  m.def("gelu", [](const array& x, StreamOrDevice s) { return make(Kernel::Gelu, {x}, 1.0f, s); },
        "x"_a, nb::kw_only(), "stream"_a = nb::none());
  m.def("dropout", [](const array& x, const array& seed, float p, StreamOrDevice s) {
    if (!(p >= 0.0f && p < 1.0f)) throw std::invalid_argument("kbert dropout: p must be in [0, 1)");
    return make(Kernel::Dropout, {x, seed}, p, s);
  }, "x"_a, "seed"_a, "p"_a, nb::kw_only(), "stream"_a = nb::none(),
     "x / (1 - p) where a hash of (element index, seed) keeps it, else 0; the gradient uses the same mask.");
  m.def("normalize", [](const array& x, float eps, StreamOrDevice s) {
    return make(Kernel::Normalize, {x}, eps, s);
  }, "x"_a, "eps"_a, nb::kw_only(), "stream"_a = nb::none(),
     "(x - mean) / sqrt(var + eps) over the last axis (layer normalization without weight and bias).");
  m.def("set_threads", [](int n) { g_threads.store(std::clamp(n, 1, 32)); }, "n"_a,
        "Threads per kernel call from now on (default: OMP_NUM_THREADS, else one per core).");
  m.def("threads", []() { return max_threads(); });
  m.def("has_head_products", []() { return global_sgemm() != nullptr; },
        "Whether a cblas_sgemm is in the global scope for the head products.");
  m.def("head_scores", [](const array& q, const array& k, bool bf16, StreamOrDevice s) {
    return head_product(Head::Scores, q, k, bf16, s);
  }, "q"_a, "k"_a, nb::kw_only(), "bf16"_a = false, "stream"_a = nb::none(),
     "q (B, M, H, D), k (B, N, H, D) -> (B, H, M, N): each head's q k^T, read in place.");
  m.def("head_context", [](const array& p, const array& v, bool bf16, StreamOrDevice s) {
    return head_product(Head::Context, p, v, bf16, s);
  }, "p"_a, "v"_a, nb::kw_only(), "bf16"_a = false, "stream"_a = nb::none(),
     "p (B, H, M, N), v (B, N, H, D) -> (B, M, H, D): each head's p v, written in place.");
  m.def("bf16_gemm_isa", []() { return std::string(bf16_gemm_isa()); },
        "The instruction set the bf16 GEMM runs on here: \"amx_bf16\", \"avx512_bf16\", or \"\" where it was not "
        "built.");
  m.def("bf16_linear", [](const array& x, const array& w, std::optional<array> bias, StreamOrDevice s) {
    return bf16_gemm(Gemm::NT, x, w, s, bias);
  }, "x"_a, "w"_a, "bias"_a = nb::none(), nb::kw_only(), "stream"_a = nb::none(),
     "x (M, K), w (N, K)[, bias (N)] -> x w^T + bias (M, N): bf16 operands, float32 sums; the gradients the same "
     "products.");
  m.def("adamw_update", [](const array& p, const array& g, const array& m, const array& v, const array& lr,
                           const array& decay, float b1, float c1, float b2, float c2, float eps, StreamOrDevice s) {
    return adamw_update(p, g, m, v, lr, decay, b1, c1, b2, c2, eps, s);
  }, "p"_a, "g"_a, "m"_a, "v"_a, "lr"_a, "decay"_a, "b1"_a, "c1"_a, "b2"_a, "c2"_a, "eps"_a, nb::kw_only(),
     "stream"_a = nb::none(),
     "AdamW's update in one pass: (p * decay - lr m' / (sqrt(v') + eps), m', v'), m' = b1 m + c1 g, "
     "v' = b2 v + c2 g^2.");
  m.def("gelu_grad", [](const array& x, const array& dy, StreamOrDevice s) {
    return make(Kernel::GeluGrad, {x, dy}, 1.0f, s);
  }, "x"_a, "dy"_a, nb::kw_only(), "stream"_a = nb::none());
}
