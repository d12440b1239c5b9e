// The packed row's attention (trainer/models/segments.py) for a forward without a graph, float32: each prompt
// causally over itself, each completion over its prompt's keys and causally over its own, read where they sit in
// the row.
//
// The torch path lays the row out twice for torch's kernels: the prompts as (prompts, longest) blocks, and every
// completion as a (rows, longest) block over a gathered copy of its prompt's keys and values, with a boolean mask;
// then it concatenates the two outputs and gathers them back into the row's order. At SmolLM2's critic forward
// (4 prompts of ~60 tokens, 32 completions of up to 24, 9 query heads over 3 key/value heads, head size 64) that
// took ~5.6 ms a layer, of which ~2.4 ms the masked flash call and the rest the copies and its fixed cost.
//
// Here each (unit, key/value head) (a unit: one prompt or one completion, ``units`` below) transposes its keys
// once into a (head size, keys) block in cache, then for each query head of the group and each tile of R query
// positions scores the visible keys (a tile stops at its last query's causal edge, rounded up to a tile of keys) with the
// tile's sums in registers, takes one softmax per query (vec8.h's exp, masked keys -inf) and sums the weighted
// values, writing each output row in place: no copy of any key, query or output.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "vec8.h"

typedef float v16f __attribute__((vector_size(64)));  // zmm on AVX-512, two ymm on AVX2: GCC splits it

static inline v16f load16(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
static inline void store16(float* p, v16f v) { std::memcpy(p, &v, sizeof v); }
// a broadcast (v16f{} + x would add 0 first: -0 + 0 is +0, so the add stays)
static inline v16f splat16(float x) { return v16f{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }

// A score tile is R query positions x KW * 16 keys: 8 independent sums (an FMA's latency is 4 cycles, two issue a
// cycle), zmm on AVX-512, ymm halves of 4 v16f on AVX2.
constexpr int R = 4;
#ifdef __AVX512F__
constexpr int KW = 2;
constexpr int kAccRegs = 32;
#else
constexpr int KW = 1;
constexpr int kAccRegs = 8;  // v16f sums that fit AVX2's 16 ymm registers with room for the loads
#endif
constexpr int KT = 16 * KW;  // keys per score tile

static inline int64_t up_tile(int64_t x) { return (x + KT - 1) / KT * KT; }

struct Unit {
  int64_t q0, nq, p0, np;  // queries (and own keys) rows q0.., prefix keys rows p0..
};

// A unit's keys (or values) transposed into blk (D x Lp, zero past L): a tile's scores are then FMAs of whole rows
template <int D>
static void transpose_keys(const float* K, int64_t ks0, const Unit& u, int64_t Lp, float* blk) {
  const int64_t L = u.np + u.nq;
  for (int64_t j = 0; j < Lp; ++j) {
    if (j < L) {
      const float* kj = K + (j < u.np ? u.p0 + j : u.q0 + (j - u.np)) * ks0;
      for (int d = 0; d < D; ++d) blk[d * Lp + j] = kj[d];
    } else {
      for (int d = 0; d < D; ++d) blk[d * Lp + j] = 0.f;
    }
  }
}

// s[i][j] = sc * <rows[i], column j of blk> for j < Ltp (R rows; s's rows Lp apart)
template <int D>
static void tile_products(const float* const* rows, const float* blk, int64_t Lp, int64_t Ltp, float sc, float* s) {
  for (int64_t jb = 0; jb < Ltp; jb += KT) {
    v16f acc[R][KW] = {};
    for (int d = 0; d < D; ++d) {
      v16f kv[KW];
      for (int w = 0; w < KW; ++w) kv[w] = load16(blk + d * Lp + jb + 16 * w);
      for (int i = 0; i < R; ++i) {
        const v16f qv = splat16(rows[i][d]);
        for (int w = 0; w < KW; ++w) acc[i][w] += qv * kv[w];
      }
    }
    for (int i = 0; i < R; ++i)
      for (int w = 0; w < KW; ++w) store16(s + i * Lp + jb + 16 * w, acc[i][w] * sc);
  }
}

static inline float lane_max(const float* si, int64_t n) {
  v8f mx = load(si);
  for (int64_t j = 8; j < n; j += 8) {
    const v8f x = load(si + j);
    mx = x > mx ? x : mx;
  }
  float m = mx[0];
  for (int c = 1; c < 8; ++c) m = std::max(m, mx[c]);
  return m;
}

// One unit's queries of heads h0..h0+grp-1 over its key/value head (K, V already at it). kt: scratch of D x Lp,
// s: scratch of R x Lp (Lp: the unit's keys rounded up to a tile). lse (rows, H) when not null: each query's
// log-sum-exp of its scaled scores, for the backward.
template <int NV>
static void unit_attend(const float* Q, int64_t qs0, int64_t qs1, const float* K, int64_t ks0, const float* V,
                        int64_t vs0, const Unit& u, int64_t h0, int64_t grp, float sc, float* kt, float* s, float* O,
                        int64_t os0, int64_t os1, float* lse, int64_t H) {
  constexpr int D = 16 * NV;
  constexpr int PVR = 2 * NV <= kAccRegs ? 2 : 1;  // query rows summed at once in the weighted sum of values
  const int64_t Lp = up_tile(u.np + u.nq);
  auto key_row = [&](int64_t j) { return j < u.np ? u.p0 + j : u.q0 + (j - u.np); };
  transpose_keys<D>(K, ks0, u, Lp, kt);
  for (int64_t h = h0; h < h0 + grp; ++h) {
    for (int64_t t0 = 0; t0 < u.nq; t0 += R) {
      const int64_t r = std::min<int64_t>(R, u.nq - t0), Lt = u.np + t0 + r, Ltp = up_tile(Lt);
      const float* qr[R];
      for (int i = 0; i < R; ++i) qr[i] = Q + (u.q0 + t0 + std::min<int64_t>(i, r - 1)) * qs0 + h * qs1;
      tile_products<D>(qr, kt, Lp, Ltp, sc, s);
      float inv[R];
      for (int i = 0; i < r; ++i) {  // one softmax per query over its visible keys; the rest weigh exp(-inf) = 0
        float* si = s + i * Lp;
        const int64_t vis = u.np + t0 + i + 1;
        for (int64_t j = vis; j < Ltp; ++j) si[j] = -INFINITY;
        const float m = lane_max(si, Ltp);
        const v8f mv = splat(m);
        v8f lsum{};
        for (int64_t j = 0; j < Ltp; j += 8) {
          const v8f e = vexp(load(si + j) - mv);
          store(si + j, e);
          lsum += e;
        }
        float l = 0.f;
        for (int c = 0; c < 8; ++c) l += lsum[c];
        inv[i] = 1.0f / l;
        if (lse) lse[(u.q0 + t0 + i) * H + h] = m + std::log(l);
      }
      for (int i0 = 0; i0 < r; i0 += PVR) {
        const int rr = std::min<int>(PVR, r - i0);
        v16f acc[PVR][NV] = {};
        for (int64_t j = 0; j < Lt; ++j) {
          const float* vj = V + key_row(j) * vs0;
          v16f vv[NV];
          for (int c = 0; c < NV; ++c) vv[c] = load16(vj + 16 * c);
          for (int i = 0; i < PVR; ++i) {
            const v16f e = splat16(s[(i0 + std::min(i, rr - 1)) * Lp + j]);
            for (int c = 0; c < NV; ++c) acc[i][c] += e * vv[c];
          }
        }
        for (int i = 0; i < rr; ++i) {
          float* o = O + (u.q0 + t0 + i0 + i) * os0 + h * os1;
          const v16f iv = splat16(inv[i0 + i]);
          for (int c = 0; c < NV; ++c) store16(o + 16 * c, acc[i][c] * iv);
        }
      }
    }
  }
}

// The backward of one unit over its key/value head: dq of its queries (written), and the gradients of its keys and
// values summed over the group's heads into dkv (2 x L x D scratch: keys', then values'; the caller places them).
// G: dO of the unit's rows; O the forward's output; lse its log-sum-exps; kt, vt, s, ds scratch.
template <int NV>
static void unit_backward(const float* Q, int64_t qs0, int64_t qs1, const float* K, int64_t ks0, const float* V,
                          int64_t vs0, const float* O, const float* G, const float* lse, const Unit& u, int64_t h0,
                          int64_t grp, int64_t H, float sc, float* kt, float* vt, float* s, float* ds, float* dkv,
                          float* dQ) {
  constexpr int D = 16 * NV;
  const int64_t L = u.np + u.nq, Lp = up_tile(L);
  auto key_row = [&](int64_t j) { return j < u.np ? u.p0 + j : u.q0 + (j - u.np); };
  transpose_keys<D>(K, ks0, u, Lp, kt);
  transpose_keys<D>(V, vs0, u, Lp, vt);
  float* dK = dkv;
  float* dV = dkv + L * D;
  std::fill(dkv, dkv + 2 * L * D, 0.f);
  for (int64_t h = h0; h < h0 + grp; ++h) {
    for (int64_t t0 = 0; t0 < u.nq; t0 += R) {
      const int64_t r = std::min<int64_t>(R, u.nq - t0), Lt = u.np + t0 + r, Ltp = up_tile(Lt);
      const float *qr[R], *gr[R];
      float delta[R];
      for (int i = 0; i < R; ++i) {
        const int64_t row = u.q0 + t0 + std::min<int64_t>(i, r - 1);
        qr[i] = Q + row * qs0 + h * qs1;
        gr[i] = G + (row * H + h) * D;
        const float* oi = O + (row * H + h) * D;
        v16f a{};
        for (int c = 0; c < NV; ++c) a += load16(gr[i] + 16 * c) * load16(oi + 16 * c);
        float dl = 0.f;
        for (int c = 0; c < 16; ++c) dl += a[c];
        delta[i] = dl;  // sum_d dO O: the softmax's backward's row term
      }
      tile_products<D>(qr, kt, Lp, Ltp, sc, s);     // scores
      tile_products<D>(gr, vt, Lp, Ltp, 1.0f, ds);  // dO . v_j
      for (int i = 0; i < R; ++i) {
        float* si = s + i * Lp;
        float* di = ds + i * Lp;
        if (i >= r) {  // a tile's missing rows weigh nothing
          std::fill(si, si + Ltp, 0.f);
          std::fill(di, di + Ltp, 0.f);
          continue;
        }
        const int64_t vis = u.np + t0 + i + 1;
        for (int64_t j = vis; j < Ltp; ++j) si[j] = -INFINITY;
        const v8f lv = splat(lse[(u.q0 + t0 + i) * H + h]), dv = splat(delta[i]);
        for (int64_t j = 0; j < Ltp; j += 8) {
          const v8f p = vexp(load(si + j) - lv);
          store(si + j, p);                                // P
          store(di + j, p * (load(di + j) - dv) * sc);     // dS, with the scores' scale
        }
      }
      for (int i = 0; i < r; ++i) {  // dq_i = sum_j dS_ij k_j
        v16f acc[NV] = {};
        for (int64_t j = 0; j < Lt; ++j) {
          const float* kj = K + key_row(j) * ks0;
          const v16f e = splat16(ds[i * Lp + j]);
          for (int c = 0; c < NV; ++c) acc[c] += e * load16(kj + 16 * c);
        }
        float* dq = dQ + ((u.q0 + t0 + i) * H + h) * D;
        for (int c = 0; c < NV; ++c) store16(dq + 16 * c, acc[c]);
      }
      for (int64_t j = 0; j < Lt; ++j) {  // dk_j += sum_i dS_ij q_i, dv_j += sum_i P_ij dO_i
        v16f ak[NV] = {}, av[NV] = {};
        for (int i = 0; i < r; ++i) {
          const v16f e = splat16(ds[i * Lp + j]), p = splat16(s[i * Lp + j]);
          for (int c = 0; c < NV; ++c) {
            ak[c] += e * load16(qr[i] + 16 * c);
            av[c] += p * load16(gr[i] + 16 * c);
          }
        }
        for (int c = 0; c < NV; ++c) {
          store16(dK + j * D + 16 * c, load16(dK + j * D + 16 * c) + ak[c]);
          store16(dV + j * D + 16 * c, load16(dV + j * D + 16 * c) + av[c]);
        }
      }
    }
  }
}

struct Layout {
  std::vector<Unit> U;
  int64_t n, H, D, Hkv, Lp;
};

// q (n, H, D), k and v (n, Hkv, D) float32, any strides but the last; units (m, 4) int64, each (q0, nq, p0, np):
// the queries of rows q0..q0+nq-1 attend to rows p0..p0+np-1 and causally to their own rows from q0. Every row is
// one unit's query exactly once. D 32, 64 or 128; H a multiple of Hkv.
static Layout check_layout(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& units) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && units.dim() == 2 && units.size(1) == 4,
              "segment_attend: ranks");
  for (const at::Tensor* t : {&q, &k, &v})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->device().is_cpu(), "segment_attend: float32 CPU tensors only");
  TORCH_CHECK(units.scalar_type() == at::kLong && units.device().is_cpu(), "segment_attend: int64 units");
  Layout a;
  a.n = q.size(0), a.H = q.size(1), a.D = q.size(2), a.Hkv = k.size(1);
  TORCH_CHECK(k.size(0) == a.n && k.size(2) == a.D && v.sizes() == k.sizes(), "segment_attend: key/value shapes");
  TORCH_CHECK(a.Hkv > 0 && a.H % a.Hkv == 0, "segment_attend: query heads a multiple of key/value heads");
  TORCH_CHECK(a.D == 32 || a.D == 64 || a.D == 128, "segment_attend: head size 32, 64 or 128");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1, "segment_attend: last dim contiguous");
  auto uc = units.contiguous();
  const int64_t m = uc.size(0);
  a.U.resize(m);
  std::vector<uint8_t> seen(a.n, 0);
  int64_t Lmax = 0;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t* x = uc.data_ptr<int64_t>() + 4 * i;
    a.U[i] = Unit{x[0], x[1], x[2], x[3]};
    TORCH_CHECK(x[0] >= 0 && x[1] >= 0 && x[0] + x[1] <= a.n && x[2] >= 0 && x[3] >= 0 && x[2] + x[3] <= a.n,
                "segment_attend: a unit out of the row");
    for (int64_t r = x[0]; r < x[0] + x[1]; ++r) {
      TORCH_CHECK(!seen[r], "segment_attend: a row in two units");
      seen[r] = 1;
    }
    Lmax = std::max(Lmax, x[1] + x[3]);
  }
  TORCH_CHECK(std::all_of(seen.begin(), seen.end(), [](uint8_t b) { return b; }), "segment_attend: a row in no unit");
  a.Lp = up_tile(Lmax);
  return a;
}

// Returns (out (n, H, D) contiguous, lse (n, H): each query's log-sum-exp, empty unless with_lse).
std::vector<at::Tensor> forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& units, double scale, bool with_lse) {
  const Layout a = check_layout(q, k, v, units);
  const int64_t n = a.n, H = a.H, D = a.D, Hkv = a.Hkv, Lp = a.Lp, m = a.U.size();
  auto out = at::empty({n, H, D}, q.options());
  auto lse = with_lse ? at::empty({n, H}, q.options()) : at::empty({0}, q.options());
  const float *Q = q.data_ptr<float>(), *K = k.data_ptr<float>(), *V = v.data_ptr<float>();
  float *O = out.data_ptr<float>(), *LSE = with_lse ? lse.data_ptr<float>() : nullptr;
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), ks0 = k.stride(0), ks1 = k.stride(1);
  const int64_t vs0 = v.stride(0), vs1 = v.stride(1), grp = H / Hkv;
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, m * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> kt(D * Lp + 16), s(R * Lp + 16);
    for (int64_t w = begin; w < end; ++w) {
      const Unit& u = a.U[w / Hkv];
      const int64_t g = w % Hkv;
      if (u.nq == 0) continue;
      const float *Kg = K + g * ks1, *Vg = V + g * vs1;
#define RLVR_FWD(NV) \
  unit_attend<NV>(Q, qs0, qs1, Kg, ks0, Vg, vs0, u, g * grp, grp, sc, kt.data(), s.data(), O, H * D, D, LSE, H)
      if (D == 32) RLVR_FWD(2);
      else if (D == 64) RLVR_FWD(4);
      else RLVR_FWD(8);
#undef RLVR_FWD
    }
  });
  return {out, lse};
}

at::Tensor segment_attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& units,
                          double scale) {
  return forward(q, k, v, units, scale, false)[0];
}

// The gradients of forward's inputs from dout (n, H, D), given its output and log-sum-exps: (dq (n, H, D), dk and
// dv (n, Hkv, D)), contiguous. A key's gradient gathers every unit that reads it: its own unit's, written in the
// parallel pass, then each completion's share of its prompt's keys, added afterwards in the units' order (a key/value
// head to a thread), so the sums do not depend on the thread count.
std::vector<at::Tensor> backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                 const at::Tensor& dout, const at::Tensor& lse, const at::Tensor& units, double scale) {
  const Layout a = check_layout(q, k, v, units);
  const int64_t n = a.n, H = a.H, D = a.D, Hkv = a.Hkv, Lp = a.Lp, m = a.U.size();
  for (const at::Tensor* t : {&out, &dout, &lse})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->device().is_cpu() && t->is_contiguous(),
                "segment_attend backward: contiguous float32 CPU output, its gradient and log-sum-exps");
  TORCH_CHECK(out.sizes() == q.sizes() && dout.sizes() == q.sizes() && lse.dim() == 2 && lse.size(0) == n &&
              lse.size(1) == H, "segment_attend backward: shapes");
  auto dq = at::empty({n, H, D}, q.options()), dk = at::empty({n, Hkv, D}, q.options());
  auto dv = at::empty({n, Hkv, D}, q.options());
  const float *Q = q.data_ptr<float>(), *K = k.data_ptr<float>(), *V = v.data_ptr<float>();
  const float *O = out.data_ptr<float>(), *G = dout.data_ptr<float>(), *LSE = lse.data_ptr<float>();
  float *DQ = dq.data_ptr<float>(), *DK = dk.data_ptr<float>(), *DV = dv.data_ptr<float>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), ks0 = k.stride(0), ks1 = k.stride(1);
  const int64_t vs0 = v.stride(0), vs1 = v.stride(1), grp = H / Hkv;
  const float sc = static_cast<float>(scale);
  // each unit's share of the keys before its own (a prompt's), per key/value head: placed after the parallel pass
  std::vector<int64_t> off(m + 1, 0);
  for (int64_t i = 0; i < m; ++i) off[i + 1] = off[i] + (a.U[i].nq ? a.U[i].np : 0) * Hkv * D * 2;
  std::vector<float> shared(off[m]);
  at::parallel_for(0, m * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> kt(D * Lp + 16), vt(D * Lp + 16), s(R * Lp + 16), ds(R * Lp + 16), dkv(2 * Lp * D);
    for (int64_t w = begin; w < end; ++w) {
      const int64_t ui = w / Hkv, g = w % Hkv;
      const Unit& u = a.U[ui];
      if (u.nq == 0) continue;
      const float *Kg = K + g * ks1, *Vg = V + g * vs1;
#define RLVR_BWD(NV)                                                                                             \
  unit_backward<NV>(Q, qs0, qs1, Kg, ks0, Vg, vs0, O, G, LSE, u, g * grp, grp, H, sc, kt.data(), vt.data(), s.data(), \
                    ds.data(), dkv.data(), DQ)
      if (D == 32) RLVR_BWD(2);
      else if (D == 64) RLVR_BWD(4);
      else RLVR_BWD(8);
#undef RLVR_BWD
      const int64_t L = u.np + u.nq;
      const float *gk = dkv.data(), *gv = dkv.data() + L * D;
      for (int64_t j = 0; j < u.nq; ++j) {  // its own rows: this unit's alone
        std::copy(gk + (u.np + j) * D, gk + (u.np + j + 1) * D, DK + ((u.q0 + j) * Hkv + g) * D);
        std::copy(gv + (u.np + j) * D, gv + (u.np + j + 1) * D, DV + ((u.q0 + j) * Hkv + g) * D);
      }
      float* sh = shared.data() + off[ui] + g * u.np * D * 2;
      std::copy(gk, gk + u.np * D, sh);
      std::copy(gv, gv + u.np * D, sh + u.np * D);
    }
  });
  at::parallel_for(0, Hkv, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g)
      for (int64_t ui = 0; ui < m; ++ui) {
        const Unit& u = a.U[ui];
        if (u.nq == 0 || u.np == 0) continue;
        const float* sh = shared.data() + off[ui] + g * u.np * D * 2;
        for (int64_t j = 0; j < u.np; ++j) {
          float *dkr = DK + ((u.p0 + j) * Hkv + g) * D, *dvr = DV + ((u.p0 + j) * Hkv + g) * D;
          for (int64_t d = 0; d < D; ++d) {
            dkr[d] += sh[j * D + d];
            dvr[d] += sh[u.np * D + j * D + d];
          }
        }
      }
  });
  return {dq, dk, dv};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("segment_attend", &segment_attend, "a packed row's attention: prompts causally, completions over theirs");
  m.def("forward", &forward, "the same, with each query's log-sum-exp for the backward");
  m.def("backward", &backward, "its backward: (dq, dk, dv)");
  m.attr("vector_bits") = KW * 256;  // which branch this build took: 512 (AVX-512's tiles), 256 (AVX2's)
}
