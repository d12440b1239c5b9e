// log p(target), the entropy and their gradient over a float32 vocabulary, one pass over each row per direction
// (trainer/logprobs.py).
//
// torch's ops walk a row of logits once per op: the forward's log-sum-exp, log-softmax, its exp, the product and
// the sum are seven passes and three exponentials per logit; the backward's subtraction, exp, adds and products
// five more passes: on SmolLM2 (49,152 logits a row, 304 rows) 121 ms of a ~3.5 s update at one thread (AMD Zen 3).
// Here the forward reads a row twice (its maximum, then the exponentials' sums) and the backward once, each
// exponential computed in registers: 35 ms (bench/RESULTS.md, "Session 71").
//
// The exponential is vec8.h's (~0.7 float32 roundings at most): the log-sum-exp and entropy come out within the
// same few roundings of the float64 result as torch's own (tests/test_logprobs.py). Sums run in eight-wide float32
// lanes over blocks of 64 logits, added in float64 between blocks.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "vec8.h"

typedef double v4d __attribute__((vector_size(32)));

// f(v, j) over the row's n values from z: full vectors, then the tail filled with `fill`
template <typename F>
static inline void each(const float* z, int64_t n, float fill, F&& f) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) f(load(z + j), j);
  if (j < n) f(load_tail(z + j, n - j, fill), j);
}

// z / temperature as the product z * it, rounded to float32 before any use: GCC contracts a product and the add
// after it into one FMA (-ffp-contract=fast), and z * it - m unrounded is not the same number in the max, the sums
// and the backward (a row of one logit at temperature 0.7 got log p = -4e-7); the empty asm makes it a value
static inline v8f scaled(v8f z, float it) {
  v8f y = z * it;
  asm("" : "+x"(y));
  return y;
}

// a float32 block sum added into float64 lanes
static inline void widen_add(v4d& lo, v4d& hi, v8f v) {
  lo += __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3), v4d);
  hi += __builtin_convertvector(__builtin_shufflevector(v, v, 4, 5, 6, 7), v4d);
}

static inline double hsum(v4d lo, v4d hi) {
  const v4d v = lo + hi;
  return (v[0] + v[1]) + (v[2] + v[3]);
}

// logits summed in float32 lanes (8 a lane) before float64 lanes take the block's sums. Float32 lanes over whole
// rows put ~130 small terms a lane onto the row's largest (1037 logits): p off by ~6 roundings, 3x torch's pairwise
// sums
constexpr int64_t BLOCK = 64;
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// one row z (V logits, scaled by it = 1 / temperature): its log-sum-exp as two parts (m, log s), log p(target)
// and, with `entropy`, H. The parts stay apart: z - m - log s rounds where the row's probability is large far less
// than z - lse, with lse rounded at its own larger scale (SmolLM2's: ~12 -> 1e-6 off, 2x torch's own error)
template <bool entropy>
static void row_forward(const float* z, int64_t V, float it, int64_t target, float* lse, float* logp, float* ent) {
  v8f mv = splat(NEG_INF);
  each(z, V, NEG_INF, [&](v8f v, int64_t) {
    const v8f x = scaled(v, it);
    mv = x > mv ? x : mv;
  });
  float m = NEG_INF;
  for (int l = 0; l < 8; ++l) m = std::max(m, mv[l]);
  v4d s0{}, s1{}, w0{}, w1{};
  for (int64_t b = 0; b < V; b += BLOCK) {
    const int64_t e = std::min(V, b + BLOCK);
    v8f sv{}, wv{};
    each(z + b, e - b, NEG_INF, [&](v8f v, int64_t) {
      const v8f d = scaled(v, it) - m;  // the tail's fill: exp(-inf) = 0, and 0 * -inf is kept out below
      const v8f p = vexp(d);
      sv += p;
      if constexpr (entropy) wv += d > splat(NEG_INF) ? p * d : v8f{};
    });
    widen_add(s0, s1, sv);
    if constexpr (entropy) widen_add(w0, w1, wv);
  }
  const double s = hsum(s0, s1), w = hsum(w0, w1);
  const double ls = std::log(s);  // lse = m + log s;  H = lse - sum p z = log s - sum p (z - m)
  lse[0] = m;
  lse[1] = static_cast<float>(ls);
  *logp = static_cast<float>(static_cast<double>(scaled(splat(z[target]), it)[0]) - m - ls);
  if constexpr (entropy) *ent = static_cast<float>(ls - w / s);
}

// x (n, V) float32 logits, contiguous; targets (n) int64. Returns log p (n), the entropy (n, or empty) and the
// log-sum-exp's parts (n, 2): the row's maximum and log sum exp(z - max), for the backward.
std::vector<at::Tensor> forward(const at::Tensor& x, const at::Tensor& targets, double temperature, bool entropy) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "vocab_softmax.forward: contiguous float32 CPU logits (n, V)");
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == x.size(0) && targets.scalar_type() == at::kLong &&
              targets.is_contiguous(), "vocab_softmax.forward: int64 targets (n)");
  const int64_t n = x.size(0), V = x.size(1);
  auto logp = at::empty({n}, x.options()), lse = at::empty({n, 2}, x.options());
  auto ent = entropy ? at::empty({n}, x.options()) : at::empty({0}, x.options());
  const float* X = x.data_ptr<float>();
  const int64_t* T = targets.data_ptr<int64_t>();
  float *L = lse.data_ptr<float>(), *P = logp.data_ptr<float>(), *E = ent.data_ptr<float>();
  const float it = static_cast<float>(1.0 / temperature);
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(T[i] >= 0 && T[i] < V, "vocab_softmax.forward: target out of range");
  at::parallel_for(0, n, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (entropy) row_forward<true>(X + i * V, V, it, T[i], L + 2 * i, P + i, E + i);
      else row_forward<false>(X + i * V, V, it, T[i], L + 2 * i, P + i, nullptr);
    }
  });
  return {logp, ent, lse};
}

// d/dz of  g_logp * log p(target) + g_ent * H  per row:  (onehot(target) - p) g_logp - p (log p + H) g_ent,
// then / temperature for the raw logits. g_ent may be empty (no entropy gradient). Returns (n, V).
at::Tensor backward(const at::Tensor& x, const at::Tensor& targets, const at::Tensor& lse, const at::Tensor& ent,
                    const at::Tensor& g_logp, const at::Tensor& g_ent, double temperature) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "vocab_softmax.backward: contiguous float32 CPU logits (n, V)");
  const int64_t n = x.size(0), V = x.size(1);
  const bool with_ent = g_ent.numel() > 0;
  for (const auto* t : {&lse, &g_logp}) TORCH_CHECK(t->size(0) == n && t->scalar_type() == at::kFloat &&
                                                    t->is_contiguous(), "vocab_softmax.backward: float32 rows");
  TORCH_CHECK(lse.dim() == 2 && lse.size(1) == 2 && g_logp.dim() == 1, "vocab_softmax.backward: lse (n, 2), g (n)");
  if (with_ent) TORCH_CHECK(g_ent.numel() == n && ent.numel() == n && g_ent.is_contiguous() && ent.is_contiguous() &&
                            g_ent.scalar_type() == at::kFloat && ent.scalar_type() == at::kFloat,
                            "vocab_softmax.backward: (n) float32 entropies and their gradient");
  auto out = at::empty_like(x);
  const float* X = x.data_ptr<float>();
  const int64_t* T = targets.data_ptr<int64_t>();
  const float *L = lse.data_ptr<float>(), *GL = g_logp.data_ptr<float>();
  const float* E = with_ent ? ent.data_ptr<float>() : nullptr;
  const float* GE = with_ent ? g_ent.data_ptr<float>() : nullptr;
  float* O = out.data_ptr<float>();
  const float it = static_cast<float>(1.0 / temperature);
  at::parallel_for(0, n, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float* z = X + i * V;
      float* o = O + i * V;
      const float m = L[2 * i], ls = L[2 * i + 1], a = GL[i] * it, c = with_ent ? GE[i] * it : 0.f, h = with_ent ? E[i] : 0.f;
      each(z, V, 0.f, [&](v8f v, int64_t j) {
        const v8f lp = (scaled(v, it) - m) - ls;
        const v8f p = vexp(lp);
        v8f g = with_ent ? -(p * ((lp + h) * c + a)) : -(p * a);
        g = lp > splat(NEG_INF) ? g : v8f{};  // a -inf logit (a masked token): p = 0, its gradient 0, not 0 * -inf
        if (V - j >= 8) store(o + j, g);
        else store_tail(o + j, g, V - j);
      });
      o[T[i]] += a;
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "log p(target), entropy and log-sum-exp of float32 logit rows");
  m.def("backward", &backward, "the logits' gradient of g_logp * log p(target) + g_ent * entropy");
}
