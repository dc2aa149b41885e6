// Vectorized, multithreaded CPU kernels for MLX: softmax over the last axis, exact (erf) GELU and
// dropout, each with its gradient (softmax and GELU: a second primitive; dropout: itself, on the cotangent), and
// attention's per-head products on the projections' layout (HeadProduct, near the end).
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
#include <optional>
#include <cstdlib>
#include <dlfcn.h>
#include <thread>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/variant.h>

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

// Runs body(begin, end) over [0, n) in up to max_threads() chunks of at least `grain` items;
// the calling thread takes the first chunk.
template <class F>
void parallel_for(int64_t n, int64_t grain, F body) {
  int64_t chunks = std::min<int64_t>(max_threads(), std::max<int64_t>(1, n / std::max<int64_t>(grain, 1)));
  if (chunks <= 1) {
    body(int64_t(0), n);
    return;
  }
  int64_t step = (n + chunks - 1) / chunks;
  std::vector<std::thread> workers;
  workers.reserve(chunks - 1);
  for (int64_t c = 1; c < chunks; ++c) {
    int64_t begin = c * step, end = std::min(n, begin + step);
    if (begin < end) workers.emplace_back(body, begin, end);
  }
  body(int64_t(0), std::min(n, step));
  for (auto& w : workers) w.join();
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

// The output's buffer, and the stream's command encoder told what a kernel reads and writes.
auto& output_encoder(Stream stream, const std::vector<array>& inputs, array& out) {
  out.set_data(allocator::malloc(out.nbytes()));
  auto& encoder = cpu::get_command_encoder(stream);
  for (auto& a : inputs) encoder.set_input_array(a);
  encoder.set_output_array(out);
  return encoder;
}

class FastCpuKernel : public UnaryPrimitive {
 public:
  FastCpuKernel(Stream stream, Kernel kind, float scale) : UnaryPrimitive(stream), kind_(kind), scale_(scale) {}

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

  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("kbert CPU kernels run on the CPU only");
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
  auto stream = to_stream(s);
  if (stream.device != Device::cpu) throw std::invalid_argument("kbert CPU kernels need a CPU stream");
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


// Attention's per-head products on the (batch, sequence, heads, head_dim) layout that the projections give, without
// MLX's copies into (batch, heads, sequence, head_dim): each head's rows are read (and written) in place through the
// BLAS's leading dimension (heads * head_dim). The BLAS is the cblas_sgemm in the global scope, the one libmlx's
// matmuls bound (models/blas.py); without one these primitives are not offered (has_head_products()).
//   Scores(a, b):    a (B, M, H, D), b (B, N, H, D) -> (B, H, M, N), a_h b_h^T
//   Context(p, v):   p (B, H, M, N), v (B, N, H, D) -> (B, M, H, D), p_h v_h
//   ContextT(p, v):  p (B, H, N, M), v (B, N, H, D) -> (B, M, H, D), p_h^T v_h
// The three are closed under the vector-Jacobian product (see vjp below).
using sgemm_fn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                          int);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

sgemm_fn global_sgemm() {
  static sgemm_fn fn = (sgemm_fn)dlsym(RTLD_DEFAULT, "cblas_sgemm");
  return fn;
}

enum class Head { Scores, Context, ContextT };

array head_product(Head kind, array a, array b, StreamOrDevice s);

class HeadProduct : public UnaryPrimitive {
 public:
  HeadProduct(Stream stream, Head kind) : UnaryPrimitive(stream), kind_(kind) {}

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    auto& encoder = output_encoder(stream(), inputs, out);
    const float* a = inputs[0].data<float>();
    const float* b = inputs[1].data<float>();
    float* o = out.data<float>();
    sgemm_fn sgemm = global_sgemm();
    Head kind = kind_;
    int batch = inputs[0].shape(0);
    if (kind == Head::Scores) {
      int m = inputs[0].shape(1), heads = inputs[0].shape(2), d = inputs[0].shape(3), n = inputs[1].shape(1);
      int ld = heads * d;
      encoder.dispatch([=]() {
        parallel_for(int64_t(batch) * heads, 1, [&](int64_t begin, int64_t end) {
          for (int64_t t = begin; t < end; ++t) {
            int64_t i = t / heads, h = t % heads;
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
            sgemm(kRowMajor, transposed ? kTrans : kNoTrans, kNoTrans, m, d, n, 1.0f, a + t * rows * cols, cols,
                  b + i * n * ld + h * d, ld, 0.0f, o + i * m * ld + h * d, ld);
          }
        });
      });
    }
  }

  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error("kbert CPU kernels run on the CPU only");
  }

  std::vector<array> vjp(const std::vector<array>& primals, const std::vector<array>& cotangents,
                         const std::vector<int>& argnums, const std::vector<array>&) override {
    const array &a = primals[0], &b = primals[1], &g = cotangents[0];
    std::vector<array> grads;
    for (int arg : argnums) {
      switch (kind_) {
        case Head::Scores:  // C = A B^T: dA = dC B, dB = dC^T A
          grads.push_back(arg == 0 ? head_product(Head::Context, g, b, stream())
                                   : head_product(Head::ContextT, g, a, stream()));
          break;
        case Head::Context:  // O = P V: dP = dO V^T, dV = P^T dO
          grads.push_back(arg == 0 ? head_product(Head::Scores, g, b, stream())
                                   : head_product(Head::ContextT, a, g, stream()));
          break;
        case Head::ContextT:  // O = P^T V: dP = V dO^T, dV = P dO
          grads.push_back(arg == 0 ? head_product(Head::Scores, b, g, stream())
                                   : head_product(Head::Context, a, g, stream()));
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
    return kind_ == static_cast<const HeadProduct&>(other).kind_;
  }

 private:
  Head kind_;
};

array head_product(Head kind, array a, array b, StreamOrDevice s) {
  auto stream = to_stream(s);
  if (stream.device != Device::cpu) throw std::invalid_argument("kbert CPU kernels need a CPU stream");
  if (!global_sgemm()) throw std::invalid_argument("kbert head products: no cblas_sgemm in the global scope");
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
  return array(shape, float32, std::make_shared<HeadProduct>(stream, kind), std::move(inputs));
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
  m.def("head_scores", [](const array& q, const array& k, StreamOrDevice s) {
    return head_product(Head::Scores, q, k, s);
  }, "q"_a, "k"_a, nb::kw_only(), "stream"_a = nb::none(),
     "q (B, M, H, D), k (B, N, H, D) -> (B, H, M, N): each head's q k^T, read in place.");
  m.def("head_context", [](const array& p, const array& v, StreamOrDevice s) {
    return head_product(Head::Context, p, v, s);
  }, "p"_a, "v"_a, nb::kw_only(), "stream"_a = nb::none(),
     "p (B, H, M, N), v (B, N, H, D) -> (B, M, H, D): each head's p v, written in place.");
  m.def("gelu_grad", [](const array& x, const array& dy, StreamOrDevice s) {
    return make(Kernel::GeluGrad, {x, dy}, 1.0f, s);
  }, "x"_a, "dy"_a, nb::kw_only(), "stream"_a = nb::none());
}
