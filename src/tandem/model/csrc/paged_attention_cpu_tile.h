// The arithmetic of paged_attention_cpu.cpp: one tile of query rows against one chunk of
// keys (scores, online softmax, values), written with GCC vector extensions of the build
// host's register width: 16 floats with AVX-512, 8 with AVX/AVX2, 4 otherwise. (Vectors
// wider than the registers are lowered through the stack: an AVX2 build of 16-float
// vectors ran 20x slower.)
//
// Two layouts of a tile's scores, picked by its number of rows:
//  wide (more than kNarrowRows rows): query rows across the lanes, S[j][row]. A key
//    element broadcast against a vector of (transposed) queries: no horizontal sums.
//    Costs d FMAs per key for up to kLanes rows, whatever their number.
//  narrow (decode: g rows): keys across the lanes, S[row][j]. Dot products of a query
//    row with a vector's worth of keys, their lane sums taken together by a shuffle
//    tree. Costs about rows * (d / kLanes + 3) operations per key.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

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
// Narrow layout up to this many rows. One thread, n=32 (d=64) / n=16 (d=128) rows of
// decode over 512 cached tokens, ms:
//   rows            3          6          8          10
//   AVX-512 wide    0.88/0.80  0.98/0.88  1.02/0.96  1.09/1.07
//   AVX-512 narrow  0.52/0.43  0.86/0.77  1.21/0.95  1.46/1.15
//   AVX2 wide       0.98/0.86  1.08/0.99  1.22/1.13  2.05/1.82
//   AVX2 narrow     0.61/0.60  1.09/1.07  1.46/1.39  1.81/1.73
constexpr int64_t kNarrowRows = 6;

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
    for (int j = 0; j < J; ++j) acc[j] += q * krow[j][c];
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

// ---- narrow layout: S[row][j], rows of kKeyChunk ----

// v[j] = the sum of a[j]'s lanes, for kLanes vectors: log2(kLanes) levels of pairwise
// shuffles and adds (15 adds for 16 vectors of 16 lanes, not 16 separate reductions).
template <int H, int... I>
inline vfloat fold_halves(vfloat x, vfloat y, std::integer_sequence<int, I...>) {
  return __builtin_shufflevector(x, y, (I / H * 2 * H + I % H)...) +
         __builtin_shufflevector(x, y, (I / H * 2 * H + H + I % H)...);
}

template <int H>
inline void fold_level(vfloat* a) {
  for (int i = 0; i < 2 * H; i += 2)  // 2H vectors in, H out
    a[i / 2] = fold_halves<H>(a[i], a[i + 1], std::make_integer_sequence<int, kLanes>{});
  if constexpr (H > 1) fold_level<H / 2>(a);
}

template <int D>
inline void narrow_scores(const float* q, const float* const* krow, int64_t nj, const TileState& t) {
  constexpr int V = D / kLanes;
  for (int64_t j0 = 0; j0 < nj; j0 += kLanes) {
    const float* kp[kLanes];
    for (int j = 0; j < kLanes; ++j) kp[j] = krow[std::min<int64_t>(j0 + j, nj - 1)];  // past nj: ignored
    for (int64_t mm = 0; mm < t.rows; ++mm) {
      vfloat qv[V];
      for (int v = 0; v < V; ++v) qv[v] = load(q + mm * D + v * kLanes);
      vfloat a[kLanes];
      for (int j = 0; j < kLanes; ++j) {
        a[j] = qv[0] * load(kp[j]);
        for (int v = 1; v < V; ++v) a[j] += qv[v] * load(kp[j] + v * kLanes);
      }
      fold_level<kLanes / 2>(a);
      store(t.s + mm * kKeyChunk + j0, a[0]);
    }
  }
}

inline void narrow_softmax(int64_t key0, int64_t nj, const TileState& t) {
  vint lane;
  for (int i = 0; i < kLanes; ++i) lane[i] = i;
  for (int64_t mm = 0; mm < t.rows; ++mm) {
    float* s = t.s + mm * kKeyChunk;
    const int32_t seen = static_cast<int32_t>(std::min<int64_t>(nj, t.pos[mm] - key0 + 1));  // keys < seen count
    vfloat v[kKeyChunk / kLanes];
    vfloat m = splat(kNegInf);
    for (int i = 0; i < kKeyChunk / kLanes; ++i) {
      v[i] = lane + i * static_cast<int32_t>(kLanes) < seen ? load(s + i * kLanes) : splat(kNegInf);
      m = vmax(m, v[i]);
    }
    float top = m[0];
    for (int i = 1; i < kLanes; ++i) top = std::max(top, m[i]);
    const float old = t.mx[mm], now = std::max(old, top);
    const float ref = now == kNegInf ? 0.0f : now;  // every key masked so far: no inf - inf
    vfloat sum{};
    for (int i = 0; i < kKeyChunk / kLanes; ++i) {
      const vfloat e = exp_nonpositive(v[i] - ref);
      store(s + i * kLanes, e);
      sum += e;
    }
    float total = 0.0f;
    for (int i = 0; i < kLanes; ++i) total += sum[i];
    const float alpha = old == kNegInf ? 0.0f : std::exp(old - ref);
    t.alpha[mm] = alpha;
    t.l[mm] = t.l[mm] * alpha + total;
    t.mx[mm] = now;
  }
}

// ---- values, either layout: acc[row] = acc[row] * alpha[row] + sum_j p(j, row) v_j ----

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
      for (int i = 0; i < R; ++i) r[i][v] += x * p[j * pj + i * pi];
    }
  }
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < C; ++v) store(acc + i * D + (c0 + v) * kLanes, r[i][v]);
}

template <int D>
inline void tile_values(const float* const* vrow, int64_t nj, int64_t d, bool narrow, const TileState& t,
                        float* acc) {
  const int64_t pj = narrow ? 1 : t.width, pi = narrow ? kKeyChunk : 1;
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
