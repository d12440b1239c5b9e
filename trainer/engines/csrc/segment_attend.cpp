// The packed row's attention (trainer/models/segments.py), float32, forward and backward: each prompt causally over
// itself, each completion over its prompt's keys and causally over its own, read where they sit in the row.
//
// The torch path lays the row out twice for torch's kernels: the prompts as (prompts, longest) blocks, and every
// completion as a (rows, longest) block over a gathered copy of its prompt's keys and values, with a boolean mask;
// then it concatenates the two outputs and gathers them back into the row's order. At SmolLM2's critic forward
// (4 prompts of ~60 tokens, 32 completions of up to 24, 9 query heads over 3 key/value heads, head size 64) that
// took ~5.6 ms a layer, of which ~2.4 ms the masked flash call and the rest the copies and its fixed cost.
//
// Here the keys are transposed once per call into a (head size, rows) block per key/value head. Each (unit, key/value
// head) (a unit: one prompt or one completion, ``units`` below) then, for each query head of the group and each tile
// of R query positions, scores its prompt's keys and its own visible ones from that block (two spans of columns,
// each rounded up to 16 keys) with the tile's sums in registers, takes one softmax per query (vec8.h's exp, masked
// keys -inf) and sums the weighted values, writing each output row in place: no copy of any query or output, and a
// prompt's keys transposed once for all its samples.
//
// The backward keeps the unit's probabilities P and score gradients dS for every head of the group (a few hundred
// rows), writes dq per tile, then sums dK = dS^T Q and dV = P^T dO a block of keys at a time with the block's sums in
// registers over every query that sees it: the rows come out in the gradients' own layout.
//
// Every loop that writes a register array's sums has constant bounds: GCC keeps an array indexed at run time in
// memory and stores each sum back on every FMA (perf on Zen 4: the backward's key blocks ran at half speed so).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
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
// a vector loaded into a register of its own: GCC otherwise folds the load into each FMA that reads it (an FMA with
// a memory operand), and a tile's 4 rows then load each key 4 times, more loads than FMAs. The load as an asm output
// cannot be folded. AVX2's v16f is two registers: a plain load there.
static inline v16f load16_reg(const float* p) {
#ifdef __AVX512F__
  v16f v;
  asm("vmovups %1, %0" : "=v"(v) : "m"(*reinterpret_cast<const v16f*>(p)));
  return v;
#else
  return load16(p);
#endif
}

// A score tile is R query positions x KW * 16 keys: 8 independent sums (an FMA's latency is 4 cycles, two issue a
// cycle), zmm on AVX-512, ymm halves of 4 v16f on AVX2. A segment's last 16 keys (when not a whole tile) take a
// tile of 16: keys are rounded up to 16, not to a tile, so a completion of 5 tokens computes 11 masked scores, not 27.
constexpr int R = 4;
#ifdef __AVX512F__
constexpr int KW = 2;
constexpr int kAccRegs = 16;  // v16f sums of a weighted sum of rows, with room for the row's loads and a broadcast
#else
constexpr int KW = 1;
constexpr int kAccRegs = 8;   // on AVX2 each v16f is two of its 16 ymm registers
#endif
constexpr int KT = 16 * KW;  // keys per score tile

static inline int64_t up16(int64_t x) { return (x + 15) / 16 * 16; }

// query rows summed at once where each output row has NV v16f sums (the weighted sums of values, dq)
template <int NV>
constexpr int rows_at_once() { return R * NV <= kAccRegs ? R : 2 * NV <= kAccRegs ? 2 : 1; }

struct Unit {
  int64_t q0, nq, p0, np;  // queries (and own keys) rows q0.., prefix keys rows p0..
};

// Every row's key (or value) of each key/value head transposed once per call: out is (Hkv, D, N), column r of
// head g's block row r's vector; columns n..N-1 zero (a segment rounded up to 16 reads at most 15 past the row's end).
// A completion's unit then scores its prompt's keys in place instead of copying them for each of its samples.
// A block of 16 rows is transposed in a buffer that stays in cache, then written out 16 floats (a cache line) per
// row of out: storing each element straight to out put every store of a row on another page, D pages per row
// (the tiny model's update, head size 32 over ~2,000 rows: the two transposes were ~a quarter of the backward).
static void transpose_rows(const float* K, int64_t ks0, int64_t ks1, int64_t n, int64_t Hkv, int64_t D, int64_t N,
                           float* out) {
  const int64_t blocks = N / 16;  // N is a multiple of 16 (Layout)
  at::parallel_for(0, Hkv * blocks, 1, [&](int64_t begin, int64_t end) {
    float tmp[128 * 16];  // (D, 16): D <= 128 (check_layout)
    for (int64_t w = begin; w < end; ++w) {
      const int64_t g = w / blocks, r0 = w % blocks * 16;
      for (int64_t i = 0; i < 16; ++i) {
        const int64_t r = r0 + i;
        if (r < n) {
          const float* kr = K + r * ks0 + g * ks1;
          for (int64_t d = 0; d < D; ++d) tmp[d * 16 + i] = kr[d];
        } else {
          for (int64_t d = 0; d < D; ++d) tmp[d * 16 + i] = 0.f;
        }
      }
      float* o = out + g * D * N + r0;
      for (int64_t d = 0; d < D; ++d) std::memcpy(o + d * N, tmp + d * 16, 16 * sizeof(float));
    }
  });
}

// s[i][j] = sc * <rows[i], column j of kt> for j < 16 * W (R rows; s's rows ls apart; kt's rows N apart)
template <int D, int W>
static inline void tile(const float* const* rows, const float* kt, int64_t N, float sc, float* s, int64_t ls) {
  v16f acc[R][W] = {};
  for (int d = 0; d < D; ++d) {
    v16f kv[W];
    for (int w = 0; w < W; ++w) kv[w] = load16_reg(kt + d * N + 16 * w);
    for (int i = 0; i < R; ++i) {
      const v16f qv = splat16(rows[i][d]);
      for (int w = 0; w < W; ++w) acc[i][w] += qv * kv[w];
    }
  }
  for (int i = 0; i < R; ++i)
    for (int w = 0; w < W; ++w) store16(s + i * ls + 16 * w, acc[i][w] * sc);
}

// the same over len columns (a multiple of 16): whole tiles, then a last tile of 16
template <int D>
static void products(const float* const* rows, const float* kt, int64_t N, int64_t len, float sc, float* s,
                     int64_t ls) {
  int64_t j = 0;
  for (; j + KT <= len; j += KT) tile<D, KW>(rows, kt + j, N, sc, s + j, ls);
  if (j < len) tile<D, 1>(rows, kt + j, N, sc, s + j, ls);
}

// The keys one query tile of a unit sees, as columns of a score row: its prompt's np keys (columns 0..np-1; np..pw-1
// masked), then its own first `own` keys from column pw (pw: np rounded up to 16; own rounded up to 16 past it).
struct Span {
  int64_t pw, own, width;
};

// the scores (scaled) of a tile's R rows over a span: prompt columns from kt's column p0, own from q0
template <int D>
static inline void span_products(const float* const* rows, const float* kt, int64_t N, const Unit& u, const Span& sp,
                                 float sc, float* s, int64_t ls) {
  if (u.np) products<D>(rows, kt + u.p0, N, sp.pw, sc, s, ls);
  products<D>(rows, kt + u.q0, N, sp.width - sp.pw, sc, s + sp.pw, ls);
}

// -inf where row i (the tile's query t0 + i) sees no key: the prompt's padding and its own keys past itself
static inline void mask_row(float* si, const Unit& u, const Span& sp, int64_t t0, int64_t i) {
  for (int64_t j = u.np; j < sp.pw; ++j) si[j] = -INFINITY;
  for (int64_t j = sp.pw + t0 + i + 1; j < sp.width; ++j) si[j] = -INFINITY;
}

// acc[i] += sum over the span's visible keys j of w[i][j] * rows' row j (X: the rows of V or K, at the head; xs0 their
// stride): the prompt's np rows from p0, then own rows from q0; PR rows of w at once (ls apart)
template <int NV, int PR>
static inline void weigh_rows(const float* w, int64_t ls, const float* X, int64_t xs0, const Unit& u, const Span& sp,
                              v16f (&acc)[PR][NV]) {
  auto add = [&](const float* xj, int64_t col) {
    v16f xv[NV];
    for (int c = 0; c < NV; ++c) xv[c] = load16_reg(xj + 16 * c);
    for (int i = 0; i < PR; ++i) {
      const v16f e = splat16(w[i * ls + col]);
      for (int c = 0; c < NV; ++c) acc[i][c] += e * xv[c];
    }
  };
  for (int64_t j = 0; j < u.np; ++j) add(X + (u.p0 + j) * xs0, j);
  for (int64_t j = 0; j < sp.own; ++j) add(X + (u.q0 + j) * xs0, sp.pw + j);
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

static inline Span span_of(const Unit& u, int64_t t0, int64_t r) {
  const int64_t pw = up16(u.np), own = t0 + r;
  return Span{pw, own, pw + up16(own)};
}

// One unit's queries of heads h0..h0+grp-1 over its key/value head (K, V, kt already at it; kt (D, N)). s: scratch
// of R x ls. lse (rows, H) when not null: each query's log-sum-exp of its scaled scores, for the backward.
template <int NV>
static void unit_attend(const float* Q, int64_t qs0, int64_t qs1, const float* kt, int64_t N, const float* V,
                        int64_t vs0, const Unit& u, int64_t h0, int64_t grp, float sc, float* s, int64_t ls, float* O,
                        int64_t os0, int64_t os1, float* lse, int64_t H) {
  constexpr int D = 16 * NV, PR = rows_at_once<NV>();
  for (int64_t h = h0; h < h0 + grp; ++h) {
    for (int64_t t0 = 0; t0 < u.nq; t0 += R) {
      const int64_t r = std::min<int64_t>(R, u.nq - t0);
      const Span sp = span_of(u, t0, r);
      const float* qr[R];
      for (int i = 0; i < R; ++i) qr[i] = Q + (u.q0 + t0 + std::min<int64_t>(i, r - 1)) * qs0 + h * qs1;
      span_products<D>(qr, kt, N, u, sp, sc, s, ls);
      float inv[R];
      for (int i = 0; i < r; ++i) {  // one softmax per query over its visible keys; the rest weigh exp(-inf) = 0
        float* si = s + i * ls;
        mask_row(si, u, sp, t0, i);
        const float m = lane_max(si, sp.width);
        const v8f mv = splat(m);
        v8f lsum{};
        for (int64_t j = 0; j < sp.width; j += 8) {
          const v8f e = vexp(load(si + j) - mv);
          store(si + j, e);
          lsum += e;
        }
        float l = 0.f;
        for (int c = 0; c < 8; ++c) l += lsum[c];
        inv[i] = 1.0f / l;
        if (lse) lse[(u.q0 + t0 + i) * H + h] = m + std::log(l);
      }
      for (int i = r; i < R; ++i) std::fill(s + i * ls, s + i * ls + sp.width, 0.f);  // missing rows weigh nothing
      for (int i0 = 0; i0 < r; i0 += PR) {
        v16f acc[PR][NV] = {};
        weigh_rows<NV, PR>(s + i0 * ls, ls, V, vs0, u, sp, acc);
        for (int b = 0; b < PR; ++b) {  // constant bounds, as in key_block
          if (i0 + b >= r) break;
          float* o = O + (u.q0 + t0 + i0 + b) * os0 + h * os1;
          const v16f iv = splat16(inv[i0 + b]);
          for (int c = 0; c < NV; ++c) store16(o + 16 * c, acc[b][c] * iv);
        }
      }
    }
  }
}

// out's rows b < nb (stride apart) = sum over the unit's query rows (each head's hh < grp, positions t from t_lo) of
// w[row][col + b] * x(hh, t): a block of KB keys' gradients, in registers over every query that sees them (w: P or
// dS, the unit's rows hh * nq + t, ls apart; x: the rows of dO or Q). The sums are this function's own: an array
// passed in by reference stays in memory, a store and a load around every FMA.
template <int NV, int KB, class Rows>
static inline void key_block(const float* w, int64_t ls, const Unit& u, int64_t grp, int64_t col, int64_t t_lo,
                             Rows x, float* out, int64_t stride, int64_t nb) {
  v16f acc[KB][NV] = {};
  for (int64_t hh = 0; hh < grp; ++hh)
    for (int64_t t = t_lo; t < u.nq; ++t) {
      const float* wi = w + (hh * u.nq + t) * ls + col;
      const float* xi = x(hh, t);
      v16f xv[NV];
      for (int c = 0; c < NV; ++c) xv[c] = load16_reg(xi + 16 * c);
      for (int b = 0; b < KB; ++b) {
        const v16f e = splat16(wi[b]);
        for (int c = 0; c < NV; ++c) acc[b][c] += e * xv[c];
      }
    }
  for (int b = 0; b < KB; ++b)  // constant bounds: a sum indexed at run time would put the array in memory
    if (b < nb)
      for (int c = 0; c < NV; ++c) store16(out + b * stride + 16 * c, acc[b][c]);
}

// The backward of one unit over its key/value head: dq of its queries (written), and the gradients of its keys and
// values summed over the group's heads: its own keys' rows written into dK, dV (rows ks apart), its prompt's into sh
// (np rows of keys', then np of values', D apart). G: dO of the unit's rows; O the forward's output; lse its
// log-sum-exps; kt, vt (D, N) the keys and values transposed (at the head). P, dS: scratch of (grp * nq + R) x ls:
// the unit's probabilities and score gradients, every head's, row hh * nq + t.
template <int NV>
static void unit_backward(const float* Q, int64_t qs0, int64_t qs1, const float* K, int64_t ks0, const float* kt,
                          const float* vt, int64_t N, const float* O, const float* G, const float* lse, const Unit& u,
                          int64_t h0, int64_t grp, int64_t H, float sc, float* P, float* dS, int64_t ls, float* dK,
                          float* dV, int64_t dks, float* sh, float* dQ) {
  constexpr int D = 16 * NV, PR = rows_at_once<NV>(), KB = rows_at_once<NV>();
  const Span whole = span_of(u, 0, u.nq);
  for (int64_t h = h0; h < h0 + grp; ++h) {
    for (int64_t t0 = 0; t0 < u.nq; t0 += R) {
      const int64_t r = std::min<int64_t>(R, u.nq - t0), row0 = (h - h0) * u.nq + t0;
      const Span sp = span_of(u, t0, r);
      float* s = P + row0 * ls;
      float* ds = dS + row0 * ls;
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
      // a tile's rows past r are the next tile's (or the scratch's last R): written over later, weighing nothing now
      span_products<D>(qr, kt, N, u, sp, sc, s, ls);     // scores
      span_products<D>(gr, vt, N, u, sp, 1.0f, ds, ls);  // dO . v_j
      for (int i = 0; i < R; ++i) {
        float* si = s + i * ls;
        float* di = ds + i * ls;
        if (i >= r) {
          std::fill(si, si + sp.width, 0.f);
          std::fill(di, di + sp.width, 0.f);
          continue;
        }
        mask_row(si, u, sp, t0, i);
        const v8f lv = splat(lse[(u.q0 + t0 + i) * H + h]), dv = splat(delta[i]);
        for (int64_t j = 0; j < sp.width; j += 8) {
          const v8f p = vexp(load(si + j) - lv);
          store(si + j, p);                                // P
          store(di + j, p * (load(di + j) - dv) * sc);     // dS, with the scores' scale
        }
        std::fill(si + sp.width, si + whole.width, 0.f);  // the keys past the tile's: no weight
        std::fill(di + sp.width, di + whole.width, 0.f);
      }
      for (int64_t i0 = 0; i0 < r; i0 += PR) {  // dq_i = sum_j dS_ij k_j
        v16f acc[PR][NV] = {};
        weigh_rows<NV, PR>(ds + i0 * ls, ls, K, ks0, u, sp, acc);
        for (int b = 0; b < PR; ++b) {
          if (i0 + b >= r) break;
          float* dq = dQ + ((u.q0 + t0 + i0 + b) * H + h) * D;
          for (int c = 0; c < NV; ++c) store16(dq + 16 * c, acc[b][c]);
        }
      }
    }
  }
  // dk_j = sum_i dS_ij q_i, dv_j = sum_i P_ij dO_i over every head's queries, KB keys at a time
  auto qrow = [&](int64_t hh, int64_t t) { return Q + (u.q0 + t) * qs0 + (h0 + hh) * qs1; };
  auto grow = [&](int64_t hh, int64_t t) { return G + ((u.q0 + t) * H + h0 + hh) * D; };
  for (int64_t j0 = 0; j0 < u.np; j0 += KB) {  // the prompt's keys: every query sees them
    key_block<NV, KB>(dS, ls, u, grp, j0, 0, qrow, sh + j0 * D, D, u.np - j0);
    key_block<NV, KB>(P, ls, u, grp, j0, 0, grow, sh + (u.np + j0) * D, D, u.np - j0);
  }
  for (int64_t j0 = 0; j0 < u.nq; j0 += KB) {  // its own keys: the queries from j0 on
    key_block<NV, KB>(dS, ls, u, grp, whole.pw + j0, j0, qrow, dK + (u.q0 + j0) * dks, dks, u.nq - j0);
    key_block<NV, KB>(P, ls, u, grp, whole.pw + j0, j0, grow, dV + (u.q0 + j0) * dks, dks, u.nq - j0);
  }
}

struct Layout {
  std::vector<Unit> U;
  int64_t n, H, D, Hkv;
  int64_t N;   // columns of the transposed keys: n rounded up to 16, and 16 more
  int64_t ls;  // a score row's length: the widest span, and a tile more
  int64_t maxq;  // the most queries of a unit
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
  int64_t widest = 0;
  a.maxq = 0;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t* x = uc.data_ptr<int64_t>() + 4 * i;
    a.U[i] = Unit{x[0], x[1], x[2], x[3]};
    TORCH_CHECK(x[0] >= 0 && x[1] >= 0 && x[0] + x[1] <= a.n && x[2] >= 0 && x[3] >= 0 && x[2] + x[3] <= a.n,
                "segment_attend: a unit out of the row");
    for (int64_t r = x[0]; r < x[0] + x[1]; ++r) {
      TORCH_CHECK(!seen[r], "segment_attend: a row in two units");
      seen[r] = 1;
    }
    widest = std::max(widest, span_of(a.U[i], 0, x[1]).width);
    a.maxq = std::max(a.maxq, x[1]);
  }
  TORCH_CHECK(std::all_of(seen.begin(), seen.end(), [](uint8_t b) { return b; }), "segment_attend: a row in no unit");
  a.N = up16(a.n) + 16;
  a.ls = widest + KT;
  return a;
}

static at::Tensor transposed(const at::Tensor& k, const Layout& a) {
  auto t = at::empty({a.Hkv, a.D, a.N}, k.options());
  transpose_rows(k.data_ptr<float>(), k.stride(0), k.stride(1), a.n, a.Hkv, a.D, a.N, t.data_ptr<float>());
  return t;
}

// Returns (out (n, H, D) contiguous, lse (n, H): each query's log-sum-exp, empty unless with_lse).
std::vector<at::Tensor> forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& units, double scale, bool with_lse) {
  const Layout a = check_layout(q, k, v, units);
  const int64_t n = a.n, H = a.H, D = a.D, Hkv = a.Hkv, N = a.N, ls = a.ls, m = a.U.size();
  auto out = at::empty({n, H, D}, q.options());
  auto lse = with_lse ? at::empty({n, H}, q.options()) : at::empty({0}, q.options());
  const at::Tensor kt = transposed(k, a);
  const float *Q = q.data_ptr<float>(), *KT_ = kt.data_ptr<float>(), *V = v.data_ptr<float>();
  float *O = out.data_ptr<float>(), *LSE = with_lse ? lse.data_ptr<float>() : nullptr;
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), vs0 = v.stride(0), vs1 = v.stride(1), grp = H / Hkv;
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, m * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(R * ls + 16);
    for (int64_t w = begin; w < end; ++w) {
      const Unit& u = a.U[w / Hkv];
      const int64_t g = w % Hkv;
      if (u.nq == 0) continue;
      const float *ktg = KT_ + g * D * N, *Vg = V + g * vs1;
#define RLVR_FWD(NV) \
  unit_attend<NV>(Q, qs0, qs1, ktg, N, Vg, vs0, u, g * grp, grp, sc, s.data(), ls, O, H * D, D, LSE, H)
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
  const int64_t n = a.n, H = a.H, D = a.D, Hkv = a.Hkv, N = a.N, ls = a.ls, m = a.U.size();
  for (const at::Tensor* t : {&out, &dout, &lse})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->device().is_cpu() && t->is_contiguous(),
                "segment_attend backward: contiguous float32 CPU output, its gradient and log-sum-exps");
  TORCH_CHECK(out.sizes() == q.sizes() && dout.sizes() == q.sizes() && lse.dim() == 2 && lse.size(0) == n &&
              lse.size(1) == H, "segment_attend backward: shapes");
  auto dq = at::empty({n, H, D}, q.options()), dk = at::empty({n, Hkv, D}, q.options());
  auto dv = at::empty({n, Hkv, D}, q.options());
  const at::Tensor kt = transposed(k, a), vt = transposed(v, a);
  const float *Q = q.data_ptr<float>(), *K = k.data_ptr<float>(), *KT_ = kt.data_ptr<float>();
  const float *VT = vt.data_ptr<float>(), *O = out.data_ptr<float>(), *G = dout.data_ptr<float>();
  const float* LSE = lse.data_ptr<float>();
  float *DQ = dq.data_ptr<float>(), *DK = dk.data_ptr<float>(), *DV = dv.data_ptr<float>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), ks0 = k.stride(0), ks1 = k.stride(1), grp = H / Hkv;
  const float sc = static_cast<float>(scale);
  // each unit's share of the keys before its own (a prompt's), per key/value head: placed after the parallel pass
  std::vector<int64_t> off(m + 1, 0);
  for (int64_t i = 0; i < m; ++i) off[i + 1] = off[i] + (a.U[i].nq ? a.U[i].np : 0) * Hkv * D * 2;
  std::vector<float> shared(off[m]);
  at::parallel_for(0, m * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> p((grp * a.maxq + R) * ls + 16), ds((grp * a.maxq + R) * ls + 16);
    for (int64_t w = begin; w < end; ++w) {
      const int64_t ui = w / Hkv, g = w % Hkv;
      const Unit& u = a.U[ui];
      if (u.nq == 0) continue;
      const float *Kg = K + g * ks1, *ktg = KT_ + g * D * N, *vtg = VT + g * D * N;
      float* sh = shared.data() + off[ui] + g * u.np * D * 2;
#define RLVR_BWD(NV)                                                                                             \
  unit_backward<NV>(Q, qs0, qs1, Kg, ks0, ktg, vtg, N, O, G, LSE, u, g * grp, grp, H, sc, p.data(), ds.data(), ls, \
                    DK + g * D, DV + g * D, Hkv * D, sh, DQ)
      if (D == 32) RLVR_BWD(2);
      else if (D == 64) RLVR_BWD(4);
      else RLVR_BWD(8);
#undef RLVR_BWD
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
