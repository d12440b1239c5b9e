// The gated MLP's activation, silu(g) * u, and its backward, each one pass (trainer/models/mlp.py).
//
// Written with torch's ops, a Llama MLP's activation is silu (a pass with an exponential) then a product (a second
// pass); autograd keeps g, silu(g) and u, and its backward is three more passes: the product's two gradients and
// silu's backward with its exponential again. Here the forward reads g and u once and writes h; the backward reads
// the output's gradient, g and u once and writes both gradients. With e = exp(-g), s = 1 / (1 + e):
//     h = g s u        dh/du = g s        dh/dg = u s (1 + g e s)      (e s = 1 - s, without the cancellation)
// The exponential is vec8.h's: 0 below -88 and inf from 88.37, so s is exactly 1 or 0 beyond, and e s is taken as
// its limit, 1, where e is inf (not inf * 0).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "vec8.h"

static inline v8f silu_times(v8f x, v8f u) { return x / (1.0f + vexp(-x)) * u; }

// (dL/dg, dL/du) of silu(x) * u from d = dL/dh
static inline void grads(v8f x, v8f u, v8f d, v8f& dg, v8f& du) {
  const v8f ex = vexp(-x), s = 1.0f / (1.0f + ex);
  const v8f es = ex < splat(INFINITY) ? ex * s : splat(1.0f);
  du = d * (x * s);
  dg = d * u * s * (1.0f + x * es);
}

constexpr int64_t GRAIN = 1 << 14;  // elements a thread takes at least: 64 KB of each operand

static void check(const at::Tensor& t, const at::Tensor& like, const char* what) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.device().is_cpu() && t.is_contiguous() && t.sizes() == like.sizes(),
              "swiglu: ", what, " must be a contiguous float32 CPU tensor of the gate's shape");
}

at::Tensor forward(const at::Tensor& g, const at::Tensor& u) {
  check(g, g, "the gate");
  check(u, g, "the up projection");
  auto h = at::empty_like(g);
  const float *G = g.data_ptr<float>(), *U = u.data_ptr<float>();
  float* Hp = h.data_ptr<float>();
  at::parallel_for(0, g.numel(), GRAIN, [&](int64_t b, int64_t e) {
    int64_t i = b;
    for (; i + 8 <= e; i += 8) store(Hp + i, silu_times(load(G + i), load(U + i)));
    if (i < e) store_tail(Hp + i, silu_times(load_tail(G + i, e - i), load_tail(U + i, e - i)), e - i);
  });
  return h;
}

// (dL/dg, dL/du) from dL/dh
std::vector<at::Tensor> backward(const at::Tensor& gh, const at::Tensor& g, const at::Tensor& u) {
  check(g, g, "the gate");
  check(u, g, "the up projection");
  check(gh, g, "the output's gradient");
  auto dg = at::empty_like(g), du = at::empty_like(g);
  const float *GH = gh.data_ptr<float>(), *G = g.data_ptr<float>(), *U = u.data_ptr<float>();
  float *DG = dg.data_ptr<float>(), *DU = du.data_ptr<float>();
  at::parallel_for(0, g.numel(), GRAIN, [&](int64_t b, int64_t e) {
    v8f dg, du;
    int64_t i = b;
    for (; i + 8 <= e; i += 8) {
      grads(load(G + i), load(U + i), load(GH + i), dg, du);
      store(DG + i, dg);
      store(DU + i, du);
    }
    if (i < e) {
      grads(load_tail(G + i, e - i), load_tail(U + i, e - i), load_tail(GH + i, e - i), dg, du);
      store_tail(DG + i, dg, e - i);
      store_tail(DU + i, du, e - i);
    }
  });
  return {dg, du};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "silu(g) * u");
  m.def("backward", &backward, "(dL/dg, dL/du) of silu(g) * u from dL/dh");
}
