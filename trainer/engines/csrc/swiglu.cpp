// The gated MLP's activation, silu(g) * u, and its backward, each one pass (trainer/models/mlp.py).
//
// Written with torch's ops, a Llama MLP's activation is silu (a pass with an exponential) then a product (a second
// pass); autograd keeps g, silu(g) and u, and its backward is three more passes: the product's two gradients and
// silu's backward with its exponential again. Here the forward reads g and u once and writes h; the backward reads
// the output's gradient, g and u once and writes both gradients. With e = exp(-g), s = 1 / (1 + e):
//     h = g s u        dh/du = g s        dh/dg = u s (1 + g e s)      (e s = 1 - s, without the cancellation)
// The exponential is vocab_softmax.cpp's Cephes polynomial, here over any g: 0 below -88 and inf from about 88.4
// (where torch's is inf from 88.72), so s is exactly 1 or 0 beyond and e s is taken as its limit, 1, where e is
// inf (not inf * 0). GCC's vector extensions, one source for AVX2 and AVX-512.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8f splat(float x) { return v8f{} + x; }

static inline v8f vexp(v8f x) {
  v8f xc = x < splat(-88.0f) ? splat(-88.0f) : x;  // -88: the exponent's bits 0, exp 0
  xc = xc > splat(89.0f) ? splat(89.0f) : xc;       // 89: the exponent's bits all 1, exp inf
  const v8f n = (xc * 1.44269504088896341f + 12582912.f) - 12582912.f;
  v8f r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  v8f y = splat(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const v8i scale = (__builtin_convertvector(n, v8i) + 127) << 23;
  return y * reinterpret_cast<const v8f&>(scale);
}

// full vectors in the loops, a range's last < 8 elements by their own path: one vector to and from memory each
static inline v8f load(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

static inline void store(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }

static inline v8f load_tail(const float* p, int64_t left) {
  v8f v{};
  for (int64_t l = 0; l < left; ++l) v[l] = p[l];
  return v;
}

static inline void store_tail(float* p, v8f v, int64_t left) {
  for (int64_t l = 0; l < left; ++l) p[l] = v[l];
}

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
