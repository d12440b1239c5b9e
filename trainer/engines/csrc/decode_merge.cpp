// One decode step's attention over each sample row's own keys, merged with the attention its query already has over
// its prompt's shared keys (trainer/engines/kv.py, SharedPromptLayer.attend).
//
// A row's own part is a handful of keys (one per token it has sampled), and there are rows x heads of them: torch's
// flash kernel pays a fixed cost per (row, head) that dwarfs the work (tiny model: 1,024 of them over 1-12 keys), and
// merging its output with the prompt part's by their log-sum-exps is ~10 more passes. Here each (row, head) query
// reads its own keys and values once and merges as it goes: scores scaled after the dot product, exponentials from
// the larger of the prompt part's log-sum-exp and the row's highest score, sums and weighted values in the input's
// type (float32 or float64), as the flash kernel accumulates. Built on first use (trainer/engines/native.py).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

template <typename T>
static void merge(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o1,
                  const at::Tensor& l1, double scale, at::Tensor& out) {
  const int64_t rows = q.size(0), H = q.size(1), grp = q.size(2), D = q.size(3), t = k.size(2);
  const T* Q = q.data_ptr<T>();
  const T* K = k.data_ptr<T>();
  const T* V = v.data_ptr<T>();
  const T* O1 = o1.data_ptr<T>();
  const T* L1 = l1.data_ptr<T>();
  T* O = out.data_ptr<T>();
  const auto ks = k.strides(), vs = v.strides(), os = o1.strides(), ls = l1.strides();
  const T sc = static_cast<T>(scale);
  at::parallel_for(0, rows * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> s(std::max<int64_t>(t, 1));
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = i / H, h = i % H;
      const T* kb = K + r * ks[0] + h * ks[1];
      const T* vb = V + r * vs[0] + h * vs[1];
      for (int64_t g = 0; g < grp; ++g) {
        const T* qv = Q + ((r * H + h) * grp + g) * D;
        const T lse1 = L1[r * ls[0] + h * ls[1] + g * ls[2]];  // log-sum-exp of the prompt part's scores
        T m = lse1;
        for (int64_t j = 0; j < t; ++j) {
          const T* kj = kb + j * ks[2];
          T d = 0;
#pragma omp simd reduction(+ : d)
          for (int64_t x = 0; x < D; ++x) d += qv[x] * kj[x];
          s[j] = d * sc;
          m = std::max(m, s[j]);
        }
        // the prompt part's output o1 is its values weighted by exp(score - lse1): as one term of weight exp(lse1)
        const T w1 = std::exp(lse1 - m);
        T l = w1;
        T* o = O + ((r * H + h) * grp + g) * D;
        const T* a = O1 + r * os[0] + h * os[1] + g * os[2];
#pragma omp simd
        for (int64_t x = 0; x < D; ++x) o[x] = w1 * a[x];
        for (int64_t j = 0; j < t; ++j) {
          const T e = std::exp(s[j] - m);
          l += e;
          const T* vj = vb + j * vs[2];
#pragma omp simd
          for (int64_t x = 0; x < D; ++x) o[x] += e * vj[x];
        }
        const T inv = T(1) / l;
#pragma omp simd
        for (int64_t x = 0; x < D; ++x) o[x] *= inv;
      }
    }
  });
}

// q (rows, H, grp, D); k, v (rows, H, t, D), any strides but the last; o1 (rows, H, grp, D) and l1 (rows, H, grp):
// the prompt part's output and log-sum-exp. Returns (rows, H, grp, D), contiguous.
at::Tensor own_keys_merge(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o1,
                          const at::Tensor& l1, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && o1.dim() == 4 && l1.dim() == 3, "own_keys_merge: ranks");
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu() && o1.device().is_cpu() &&
              l1.device().is_cpu(), "own_keys_merge: CPU tensors only");
  const auto dt = q.scalar_type();
  TORCH_CHECK(k.scalar_type() == dt && v.scalar_type() == dt && o1.scalar_type() == dt && l1.scalar_type() == dt,
              "own_keys_merge: one dtype");
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3) && v.sizes() == k.sizes(),
              "own_keys_merge: key/value shapes");
  TORCH_CHECK(o1.sizes() == q.sizes() && l1.size(0) == q.size(0) && l1.size(1) == q.size(1) && l1.size(2) == q.size(2),
              "own_keys_merge: partial result shapes");
  TORCH_CHECK(k.stride(3) == 1 && v.stride(3) == 1 && o1.stride(3) == 1, "own_keys_merge: last dim contiguous");
  auto qc = q.contiguous();
  auto out = at::empty(qc.sizes(), qc.options());
  AT_DISPATCH_FLOATING_TYPES(dt, "own_keys_merge", [&] { merge<scalar_t>(qc, k, v, o1, l1, scale, out); });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("own_keys_merge", &own_keys_merge, "a decode step's attention over each row's own keys, merged");
}
