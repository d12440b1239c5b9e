// RMSNorm's forward in one pass per row (trainer/models/norm.py): y = w * (x * r), r = 1 / sqrt(mean(x^2) + eps).
//
// transformers' module runs it as six tensor ops (pow, mean, add, rsqrt and two products): three full passes that
// write a hidden-sized tensor each and a fourth that reads one back, each with its dispatch. Here each row's sum of
// squares is taken in float32 lanes while the row is in cache, then the row is written once; r is returned for the
// backward (norm.py's closed form). Every forward of a policy and its frozen models runs it, with or without a
// graph, so a reference at the policy's weights still scores bitwise as the policy does.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "vec8.h"

// x (..., H) float32, w (H,) float32. Returns (y, r): y like x (contiguous), r (..., 1).
std::vector<at::Tensor> forward(const at::Tensor& x, const at::Tensor& w, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && x.device().is_cpu() &&
              w.device().is_cpu(), "rms_norm: float32 CPU tensors only");
  TORCH_CHECK(x.dim() >= 1 && w.dim() == 1 && w.size(0) == x.size(-1), "rms_norm: a weight per feature");
  const auto xc = x.contiguous();
  const auto wc = w.contiguous();
  const int64_t H = xc.size(-1), rows = H ? xc.numel() / H : 0;
  auto y = at::empty_like(xc);
  auto rs = xc.sizes().vec();
  rs.back() = 1;
  auto r = at::empty(rs, xc.options());
  const float *X = xc.data_ptr<float>(), *W = wc.data_ptr<float>();
  float *Y = y.data_ptr<float>(), *Rr = r.data_ptr<float>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(H, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* xi = X + i * H;
      float* yi = Y + i * H;
      v8f a0{}, a1{}, a2{}, a3{};  // four sums: the adds' latency, not one chain
      int64_t j = 0;
      for (; j + 32 <= H; j += 32) {
        const v8f x0 = load(xi + j), x1 = load(xi + j + 8), x2 = load(xi + j + 16), x3 = load(xi + j + 24);
        a0 += x0 * x0;
        a1 += x1 * x1;
        a2 += x2 * x2;
        a3 += x3 * x3;
      }
      for (; j + 8 <= H; j += 8) {
        const v8f x0 = load(xi + j);
        a0 += x0 * x0;
      }
      if (j < H) {
        const v8f x0 = load_tail(xi + j, H - j);
        a0 += x0 * x0;
      }
      const v8f a = (a0 + a1) + (a2 + a3);
      float ss = 0.f;
      for (int c = 0; c < 8; ++c) ss += a[c];
      const float ri = 1.0f / std::sqrt(ss / static_cast<float>(H) + e);
      Rr[i] = ri;
      const v8f rv = splat(ri);
      for (j = 0; j + 8 <= H; j += 8) store(yi + j, load(W + j) * (load(xi + j) * rv));
      for (; j < H; ++j) yi[j] = W[j] * (xi[j] * ri);
    }
  });
  return {y, r};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "RMSNorm's forward: (w * x * r, r)");
}
