// The rotary embedding of queries and keys in one call (trainer/models/rope.py): x * cos + rotate_half(x) * sin,
// bitwise torch's.
//
// torch runs it as five to seven ops a tensor (the products, a negated half, a concatenated copy, the sum), each
// with its dispatch: at a decode step of a small model that fixed cost is most of it. Here each output element is
// the same two products and one sum in the same order (x1 c - x2 s for the first half, x2 c + x1 s for the
// second: (-a) b is -(a b) and c + (-d) is c - d exactly), with contraction into FMAs off (native.py builds this
// file with -ffp-contract=off), so the bits are torch's.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <vector>

// x (B, H, T, D) float32, any strides but the last; c, s (B, 1, T, D) (strides of 0 broadcast). Into o, like x.
static void rotate(const at::Tensor& x, const at::Tensor& c, const at::Tensor& s, at::Tensor& o) {
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3), h = D / 2;
  const float *X = x.data_ptr<float>(), *C = c.data_ptr<float>(), *S = s.data_ptr<float>();
  float* O = o.data_ptr<float>();
  const auto xs = x.strides(), cs = c.strides(), ss = s.strides(), os = o.strides();
  // positions outer, heads inner: a position's cos/sin row is read once for all its heads, and a layer's
  // projection lays its queries out as (batch, positions, heads, head size), so they stream in memory order
  at::parallel_for(0, B * T * H, std::max<int64_t>(1, 8192 / std::max<int64_t>(D, 1)), [&](int64_t begin, int64_t end) {
    // the chunk's first (row, position, head) by division once, then counted on: three divisions a step were
    // most of the cost at a small head size
    int64_t b = begin / (T * H), t = (begin / H) % T, hh = begin % H;
    for (int64_t i = begin; i < end; ++i) {
      const float* xi = X + b * xs[0] + hh * xs[1] + t * xs[2];
      const float* ci = C + b * cs[0] + t * cs[2];
      const float* si = S + b * ss[0] + t * ss[2];
      float* oi = O + b * os[0] + hh * os[1] + t * os[2];
      for (int64_t j = 0; j < h; ++j) {
        const float p = xi[j] * ci[j], q = xi[j + h] * si[j];
        oi[j] = p - q;
      }
      for (int64_t j = h; j < D; ++j) {
        const float p = xi[j] * ci[j], q = xi[j - h] * si[j];
        oi[j] = p + q;
      }
      if (++hh == H) {
        hh = 0;
        if (++t == T) {
          t = 0;
          ++b;
        }
      }
    }
  });
}

static void check(const at::Tensor& x, const at::Tensor& c, const char* name) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(), "rope: float32 CPU ", name);
  TORCH_CHECK(x.dim() == 4 && x.size(3) % 2 == 0 && x.stride(3) == 1, "rope: ", name,
              " (batch, heads, positions, even head size), its last dim contiguous");
  TORCH_CHECK(c.size(0) == x.size(0) && c.size(1) == 1 && c.size(2) == x.size(2) && c.size(3) == x.size(3),
              "rope: cos/sin (batch, 1, positions, head size) for ", name);
}

// q, k: (B, H, T, D); cos, sin: (B, 1, T, D) float32 (expanded views welcome). Returns the rotated q and k, each
// with its input's layout.
std::vector<at::Tensor> forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.device().is_cpu() &&
              sin.device().is_cpu() && cos.dim() == 4 && sin.sizes() == cos.sizes() && cos.stride(3) == 1 &&
              sin.stride(3) == 1, "rope: float32 CPU cos/sin of one shape, the last dim contiguous");
  check(q, cos, "queries");
  check(k, cos, "keys");
  auto qo = at::empty_like(q), ko = at::empty_like(k);
  TORCH_CHECK(qo.stride(3) == 1 && ko.stride(3) == 1, "rope: an output's last dim not contiguous");
  rotate(q, cos, sin, qo);
  rotate(k, cos, sin, ko);
  return {qo, ko};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "the rotary embedding of queries and keys, bitwise torch's");
}
