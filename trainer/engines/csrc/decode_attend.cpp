// One decode step's whole attention for float32 sample rows whose prompts' keys are held once per group
// (trainer/engines/kv.py, SharedPromptLayer.attend): each query over its prompt's keys and its own, one softmax.
//
// attend's other path takes the prompt part in torch's flash kernel (a group's rows x query heads as one block of
// queries) and then each row's own keys and the merge by log-sum-exps in decode_merge.cpp. At decode's shapes the
// flash call is mostly its fixed cost per block: the bundled tiny model's step (256 rows, 4 heads, ~10 prompt keys
// and 1-12 own ones, head size 32) spent ~0.53 ms a layer in the two. Here each (row, key/value head) reads its
// group's prompt keys (a group's rows run one after another, so those stay in cache) and its own, scores them into
// one row (padding's bias -inf), takes the exponentials eight at a time (vec8.h's) from the row's highest score, and
// sums the weighted values in float32 lanes: one softmax over all keys, no merge.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "vec8.h"

static inline float hsum(v8f v) {  // a tree: three dependent adds, not eight
  const v8f a = v + __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
  const v8f b = a + __builtin_shufflevector(a, a, 2, 3, 0, 1, 6, 7, 4, 5);
  return b[0] + b[1];
}

// One query's softmax over n = P + t keys into o (D = 8 NV floats): the query and the output's sums in registers.
// s: scratch for n scores, rounded up to 8.
template <int NV>
static void one_query(const float* qv, const float* pkb, int64_t pks, const float* pvb, int64_t pvs, const float* bb,
                      int64_t P, const float* kb, int64_t ks, const float* vb, int64_t vs, int64_t t, float sc,
                      float* s, float* o) {
  v8f qa[NV], acc[NV];
  for (int c = 0; c < NV; ++c) qa[c] = load(qv + 8 * c);
  const int64_t n = P + t;
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    const float* kj = j < P ? pkb + j * pks : kb + (j - P) * ks;
    v8f d = qa[0] * load(kj);
    for (int c = 1; c < NV; ++c) d += qa[c] * load(kj + 8 * c);
    s[j] = hsum(d) * sc + (j < P ? bb[j] : 0.f);
    m = std::max(m, s[j]);
  }
  const v8f mv = splat(m);
  v8f lsum{};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {  // exp(-inf - m) comes out 0: a padding key weighs nothing
    const v8f e = vexp(load(s + j) - mv);
    store(s + j, e);
    lsum += e;
  }
  if (j < n) {
    const v8f e = vexp(load_tail(s + j, n - j, -INFINITY) - mv);
    store_tail(s + j, e, n - j);
    lsum += e;
  }
  for (int c = 0; c < NV; ++c) acc[c] = v8f{};
  for (int64_t jj = 0; jj < n; ++jj) {
    const float* vj = jj < P ? pvb + jj * pvs : vb + (jj - P) * vs;
    const v8f e = splat(s[jj]);
    for (int c = 0; c < NV; ++c) acc[c] += e * load(vj + 8 * c);
  }
  const v8f inv = splat(1.0f / hsum(lsum));
  for (int c = 0; c < NV; ++c) store(o + 8 * c, acc[c] * inv);
}

// Any other head size: the same steps, the sums in memory
static void one_query_any(const float* qv, const float* pkb, int64_t pks, const float* pvb, int64_t pvs,
                          const float* bb, int64_t P, const float* kb, int64_t ks, const float* vb, int64_t vs,
                          int64_t t, int64_t D, float sc, float* s, float* o) {
  const int64_t n = P + t;
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    const float* kj = j < P ? pkb + j * pks : kb + (j - P) * ks;
    float d = 0.f;
    for (int64_t x = 0; x < D; ++x) d += qv[x] * kj[x];
    s[j] = d * sc + (j < P ? bb[j] : 0.f);
    m = std::max(m, s[j]);
  }
  float l = 0.f;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = s[j] == -INFINITY ? 0.f : std::exp(s[j] - m);
    l += s[j];
  }
  std::fill(o, o + D, 0.f);
  for (int64_t j = 0; j < n; ++j) {
    const float* vj = j < P ? pvb + j * pvs : vb + (j - P) * vs;
    for (int64_t x = 0; x < D; ++x) o[x] += s[j] * vj[x];
  }
  for (int64_t x = 0; x < D; ++x) o[x] /= l;
}

// q (rows, H, grp, D) float32; pk, pv (G, H, P, D) and k, v (rows, H, t, D): any strides but the last; bias (G, P)
// contiguous, 0 on a prompt's tokens and -inf on its padding; group (rows,) int64, each row's prompt. Returns
// (rows, H, grp, D), contiguous.
at::Tensor decode_attend(const at::Tensor& q, const at::Tensor& pk, const at::Tensor& pv, const at::Tensor& bias,
                         const at::Tensor& group, const at::Tensor& k, const at::Tensor& v, double scale) {
  TORCH_CHECK(q.dim() == 4 && pk.dim() == 4 && pv.dim() == 4 && k.dim() == 4 && v.dim() == 4 && bias.dim() == 2 &&
              group.dim() == 1, "decode_attend: ranks");
  for (const at::Tensor* t : {&q, &pk, &pv, &bias, &k, &v})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->device().is_cpu(), "decode_attend: float32 CPU tensors only");
  TORCH_CHECK(group.scalar_type() == at::kLong && group.device().is_cpu(), "decode_attend: int64 groups");
  const int64_t rows = q.size(0), H = q.size(1), grp = q.size(2), D = q.size(3);
  const int64_t G = pk.size(0), P = pk.size(2), t = k.size(2);
  TORCH_CHECK(pk.size(1) == H && pk.size(3) == D && pv.sizes() == pk.sizes(), "decode_attend: prompt key/value shapes");
  TORCH_CHECK(k.size(0) == rows && k.size(1) == H && k.size(3) == D && v.sizes() == k.sizes(),
              "decode_attend: own key/value shapes");
  TORCH_CHECK(bias.size(0) == G && bias.size(1) == P && bias.is_contiguous(), "decode_attend: bias (groups, keys)");
  TORCH_CHECK(group.numel() == rows, "decode_attend: one group per row");
  TORCH_CHECK(pk.stride(3) == 1 && pv.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1,
              "decode_attend: last dim contiguous");
  TORCH_CHECK(P + t > 0, "decode_attend: no keys");
  auto gc = group.contiguous();
  const int64_t* GR = gc.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) TORCH_CHECK(GR[r] >= 0 && GR[r] < G, "decode_attend: a group out of range");
  auto qc = q.contiguous();
  auto out = at::empty(qc.sizes(), qc.options());
  const float *Q = qc.data_ptr<float>(), *PK = pk.data_ptr<float>(), *PV = pv.data_ptr<float>();
  const float *K = k.data_ptr<float>(), *V = v.data_ptr<float>(), *B = bias.data_ptr<float>();
  float* O = out.data_ptr<float>();
  const auto pks = pk.strides(), pvs = pv.strides(), ks = k.strides(), vs = v.strides();
  const float sc = static_cast<float>(scale);
  const int64_t n = P + t;
  at::parallel_for(0, rows * H, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> s(((n + 7) / 8) * 8);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = i / H, h = i % H, gi = GR[r];
      if (i + 1 < end) {  // the next pair's own keys and values: the cache's rows are cold between layers
        const int64_t r2 = (i + 1) / H, h2 = (i + 1) % H;
        const char *k2 = reinterpret_cast<const char*>(K + r2 * ks[0] + h2 * ks[1]);
        const char *v2 = reinterpret_cast<const char*>(V + r2 * vs[0] + h2 * vs[1]);
        for (int64_t b = 0; b < t * ks[2] * 4; b += 64) __builtin_prefetch(k2 + b);
        for (int64_t b = 0; b < t * vs[2] * 4; b += 64) __builtin_prefetch(v2 + b);
      }
      const float *pkb = PK + gi * pks[0] + h * pks[1], *pvb = PV + gi * pvs[0] + h * pvs[1];
      const float *kb = K + r * ks[0] + h * ks[1], *vb = V + r * vs[0] + h * vs[1], *bb = B + gi * P;
      for (int64_t g = 0; g < grp; ++g) {
        const float* qv = Q + ((r * H + h) * grp + g) * D;
        float* o = O + ((r * H + h) * grp + g) * D;
        switch (D) {
          case 32:
            one_query<4>(qv, pkb, pks[2], pvb, pvs[2], bb, P, kb, ks[2], vb, vs[2], t, sc, s.data(), o);
            break;
          case 64:
            one_query<8>(qv, pkb, pks[2], pvb, pvs[2], bb, P, kb, ks[2], vb, vs[2], t, sc, s.data(), o);
            break;
          case 128:
            one_query<16>(qv, pkb, pks[2], pvb, pvs[2], bb, P, kb, ks[2], vb, vs[2], t, sc, s.data(), o);
            break;
          default:
            one_query_any(qv, pkb, pks[2], pvb, pvs[2], bb, P, kb, ks[2], vb, vs[2], t, D, sc, s.data(), o);
        }
      }
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attend", &decode_attend, "a decode step's attention over shared prompt keys and each row's own");
}
