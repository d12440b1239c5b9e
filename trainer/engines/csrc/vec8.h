// Eight float32 lanes in GCC's vector extensions (no intrinsics: one source builds for AVX2 and AVX-512), and the
// exponential our kernels share (vocab_softmax.cpp, swiglu.cpp, decode_attend.cpp, segment_attend.cpp).
// trainer/engines/native.py puts this header's digest in each build's name, so a change here rebuilds the kernels
// that include it.
#pragma once

#include <cstdint>
#include <cstring>

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8f splat(float x) { return v8f{} + x; }

// exp(x) lane by lane: Cephes' single-precision polynomial (range reduction by ln 2 in two parts, degree 6), at most
// ~0.7 float32 roundings from exp in float64 (torch's: 0.53). Below -88 (-inf too) the exponent's bits come out 0,
// exp 0 (float32's smallest normal is e^-87.34); from 88.37 (+inf too) they are all 1, exp inf (torch's from 88.72)
static inline v8f vexp(v8f x) {
  v8f xc = x < splat(-88.0f) ? splat(-88.0f) : x;
  xc = xc > splat(89.0f) ? splat(89.0f) : xc;
  const v8f n = (xc * 1.44269504088896341f + 12582912.f) - 12582912.f;  // round(x / ln 2), 2^23 + 2^22's trick
  v8f r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  v8f y = splat(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const v8i scale = (__builtin_convertvector(n, v8i) + 127) << 23;  // 2^n as a float's bits; n = -127: 0
  return y * reinterpret_cast<const v8f&>(scale);
}

// full vectors in the loops; a range's last < 8 values by the tail's own path, the other lanes `fill`
static inline v8f load(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

static inline void store(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }

static inline v8f load_tail(const float* p, int64_t left, float fill = 0.f) {
  v8f v = splat(fill);
  for (int64_t l = 0; l < left; ++l) v[l] = p[l];
  return v;
}

static inline void store_tail(float* p, v8f v, int64_t left) {
  for (int64_t l = 0; l < left; ++l) p[l] = v[l];
}
