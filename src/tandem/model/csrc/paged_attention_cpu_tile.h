// The arithmetic of paged_attention_cpu.cpp: one tile of query rows against one chunk of
// keys (scores, online softmax, values), written with GCC vector extensions of the build
// host's register width: 16 floats with AVX-512, 8 with AVX/AVX2, 4 otherwise. (Vectors
// wider than the registers are lowered through the stack: an AVX2 build of 16-float
// vectors ran 20x slower.)
//
// Query rows lie across the lanes, S[j][row]: a key element broadcast against a vector
// of (transposed) queries, no horizontal sums, d FMAs per key for up to kLanes rows. Each
// lane's arithmetic is its own, so a row's result does not depend on the rows beside it.
// The scores' and the values' multiply-adds are FMAs written out (fma()): those loops have
// several instantiations (8 keys or 1 a step, R rows or 1 a step) that the compiler's own
// contraction fused differently, so a row's rounding changed with the rows and keys it
// shared a call with.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace paged_attention_cpu {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif
constexpr int64_t kKeyChunk = 32;  // keys per online-softmax step
constexpr int kKeysPerStep = 8;    // wide scores: one accumulator per key, 8 FMA chains
static_assert(kKeyChunk % kLanes == 0);

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

typedef float vfloat __attribute__((vector_size(kLanes * 4)));
typedef int32_t vint __attribute__((vector_size(kLanes * 4)));
typedef float vfloat_u __attribute__((vector_size(kLanes * 4), aligned(4), may_alias));
typedef int32_t vint_u __attribute__((vector_size(kLanes * 4), aligned(4), may_alias));

inline vfloat load(const float* p) { return *reinterpret_cast<const vfloat_u*>(p); }
inline vint load(const int32_t* p) { return *reinterpret_cast<const vint_u*>(p); }
inline void store(float* p, vfloat v) { *reinterpret_cast<vfloat_u*>(p) = v; }
inline vfloat splat(float x) { return vfloat{} + x; }
inline vfloat vmax(vfloat a, vfloat b) { return a > b ? a : b; }

// a * b + c rounded once (x86 FMA, AArch64); elsewhere as the compiler makes it.
inline vfloat fma(vfloat a, vfloat b, vfloat c) {
#if defined(__AVX512F__)
  return reinterpret_cast<vfloat>(_mm512_fmadd_ps(reinterpret_cast<__m512>(a), reinterpret_cast<__m512>(b),
                                                  reinterpret_cast<__m512>(c)));
#elif defined(__FMA__)
  return reinterpret_cast<vfloat>(_mm256_fmadd_ps(reinterpret_cast<__m256>(a), reinterpret_cast<__m256>(b),
                                                  reinterpret_cast<__m256>(c)));
#elif defined(__aarch64__)
  return reinterpret_cast<vfloat>(vfmaq_f32(reinterpret_cast<float32x4_t>(c), reinterpret_cast<float32x4_t>(a),
                                            reinterpret_cast<float32x4_t>(b)));
#else
  return a * b + c;
#endif
}

// e^x for x <= 0 (x = -inf gives 0): Cephes' expf, relative error about 1e-7. Below
// -87 the result (< 1.7e-38, beside a row maximum of e^0 = 1) is flushed to 0.
inline vfloat exp_nonpositive(vfloat x) {
  const vfloat lo = splat(-87.0f);
  const vint underflow = x < lo;
  x = underflow ? lo : x;
  const vfloat magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const vfloat n = (x * 1.44269504088896341f + magic) - magic;
  const vfloat r = x - n * 0.693359375f + n * 2.12194440e-4f;
  vfloat p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const vint two_n = (__builtin_convertvector(n, vint) + 127) << 23;
  const vfloat e = p * reinterpret_cast<const vfloat&>(two_n);
  return underflow ? splat(0.0f) : e;
}

// The running state of a tile's rows, and where its scores go.
struct TileState {
  int64_t rows, width;  // rows, and rows rounded up to whole vectors
  const int32_t* pos;   // [width] the position of each row (padding repeats the last)
  int64_t min_pos;      // the first row's position: later keys need masking
  float *s, *mx, *l, *alpha;
};

// ---- wide layout: S[j][row] ----

// S[j][lane] for J keys (q pre-scaled and transposed: qt[c][lane]).
template <int J>
inline void wide_score_step(const float* qt, int64_t width, int64_t d, const float* const* krow, float* s) {
  vfloat acc[J] = {};
#pragma GCC unroll 4
  for (int64_t c = 0; c < d; ++c) {
    const vfloat q = load(qt + c * width);
    for (int j = 0; j < J; ++j) acc[j] = fma(q, splat(krow[j][c]), acc[j]);
  }
  for (int j = 0; j < J; ++j) store(s + j * width, acc[j]);
}

inline void wide_scores(const float* qt, int64_t d, const float* const* krow, int64_t nj, const TileState& t) {
  for (int64_t lb = 0; lb < t.width; lb += kLanes) {
    int64_t j = 0;
    for (; j + kKeysPerStep <= nj; j += kKeysPerStep)
      wide_score_step<kKeysPerStep>(qt + lb, t.width, d, krow + j, t.s + j * t.width + lb);
    for (; j < nj; ++j) wide_score_step<1>(qt + lb, t.width, d, krow + j, t.s + j * t.width + lb);
  }
}

inline void wide_softmax(int64_t key0, int64_t nj, const TileState& t) {
  const int64_t width = t.width;
  float* s = t.s;
  if (key0 + nj - 1 > t.min_pos)  // some keys lie past some rows' positions
    for (int64_t j = 0; j < nj; ++j)
      for (int64_t lb = 0; lb < width; lb += kLanes) {
        const vint past = load(t.pos + lb) < static_cast<int32_t>(key0 + j);
        store(s + j * width + lb, past ? splat(kNegInf) : load(s + j * width + lb));
      }
  for (int64_t lb = 0; lb < width; lb += kLanes) {
    vfloat m = load(s + lb);
    for (int64_t j = 1; j < nj; ++j) m = vmax(m, load(s + j * width + lb));
    const vfloat old = load(t.mx + lb);
    const vfloat now = vmax(old, m);
    // a row with every key masked so far keeps max -inf: subtract 0 instead (no inf - inf)
    const vfloat ref = now == splat(kNegInf) ? splat(0.0f) : now;
    vfloat sum{};
    for (int64_t j = 0; j < nj; ++j) {
      const vfloat e = exp_nonpositive(load(s + j * width + lb) - ref);
      store(s + j * width + lb, e);
      sum += e;
    }
    const vfloat alpha = exp_nonpositive(old - ref);
    store(t.alpha + lb, alpha);
    store(t.l + lb, load(t.l + lb) * alpha + sum);
    store(t.mx + lb, now);
  }
}

// ---- values: acc[row] = acc[row] * alpha[row] + sum_j p(j, row) v_j ----

// R rows at once share each load of a value row, over the C vectors of columns from c0;
// p(j, i) = p[j * pj + i * pi].
template <int D, int R, int C>
inline void value_step(const float* const* vrow, int64_t nj, const float* p, int64_t pj, int64_t pi,
                       const float* alpha, float* acc, int c0) {
  vfloat r[R][C];
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < C; ++v) r[i][v] = load(acc + i * D + (c0 + v) * kLanes) * alpha[i];
  for (int64_t j = 0; j < nj; ++j) {
    const float* vj = vrow[j] + c0 * kLanes;
    for (int v = 0; v < C; ++v) {
      const vfloat x = load(vj + v * kLanes);
      for (int i = 0; i < R; ++i) r[i][v] = fma(x, splat(p[j * pj + i * pi]), r[i][v]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < C; ++v) store(acc + i * D + (c0 + v) * kLanes, r[i][v]);
}

template <int D>
inline void tile_values(const float* const* vrow, int64_t nj, int64_t d, const TileState& t, float* acc) {
  const int64_t pj = t.width, pi = 1;
  if constexpr (D > 0) {
    // 8 FMA chains in flight, 8 vectors of accumulators: C column vectors of R rows
    constexpr int V = D / kLanes, C = V > 8 ? 8 : V, R = C >= 8 ? 1 : 8 / C;
    static_assert(D % kLanes == 0 && V % C == 0);
    for (int c0 = 0; c0 < V; c0 += C) {
      int64_t mm = 0;
      for (; mm + R <= t.rows; mm += R)
        value_step<D, R, C>(vrow, nj, t.s + mm * pi, pj, pi, t.alpha + mm, acc + mm * D, c0);
      for (; mm < t.rows; ++mm) value_step<D, 1, C>(vrow, nj, t.s + mm * pi, pj, pi, t.alpha + mm, acc + mm * D, c0);
    }
  } else {
    for (int64_t mm = 0; mm < t.rows; ++mm) {
      float* a = acc + mm * d;
      const float al = t.alpha[mm];
      for (int64_t c = 0; c < d; ++c) a[c] *= al;
      for (int64_t j = 0; j < nj; ++j) {
        const float w = t.s[j * pj + mm * pi];
        const float* vj = vrow[j];
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) a[c] += w * vj[c];
      }
    }
  }
}

}  // namespace paged_attention_cpu
