// Attention over a paged KV cache on the CPU, for decode and verify forwards: n sequences
// of k rows each (k small), keys and values read where they lie in the block pool.
//
// Semantics are those of tandem/model/paged_attention.py (paged_attention_reference).
//
// Work: one item per (sequence, kv head, row tile). The g*k query rows that share a kv
// head form the row tile (64 rows at most), so every key and value row is read once per
// (sequence, kv head) and used for all of them. Keys come in chunks of 32 from position 0,
// with an online (flash-attention) softmax per chunk; paged_attention_cpu_tile.h holds
// that arithmetic. Items are handed to threads one at a time (sequences differ in length).
//
// A row's output is bitwise the same whatever other rows share the call: a verify's k
// rows and k one-row decodes agree exactly, which keeps greedy speculation exact on
// targets whose other parts are row-exact too (the int8 ones of model/quant). So query
// rows lie across vector lanes, each lane's arithmetic its own, and no context is split
// across threads (a split and its merge round differently).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <type_traits>
#include <vector>

#include "paged_attention_cpu_tile.h"

namespace {

using namespace paged_attention_cpu;

constexpr int64_t kTileRows = 64;  // query rows per work item at most
// Less work than this (keys x query-row lanes summed over items; about 10 us on one thread)
// runs on the calling thread: waking a second one costs a few microseconds.
constexpr int64_t kMinParallelWork = 8192;

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }
inline float to_float(c10::Half x) { return static_cast<float>(x); }

// The op's sizes and how its work is cut into items.
struct Plan {
  int64_t n, k, hq, hkv, g, d, bs, max_blocks;
  int64_t tile_rows;  // query rows per tile: a multiple of kLanes, or all g*k rows
  int64_t tiles;      // row tiles per (sequence, kv head)
  int64_t workers;    // threads to use
  float scale;
  int64_t items() const { return n * hkv * tiles; }
  int64_t width() const { return (tile_rows + kLanes - 1) / kLanes * kLanes; }
};

template <typename T>
struct Operands {
  const T* q;
  const T* k_cache;
  const T* v_cache;
  const int32_t* tables;
  const int32_t* start;
  T* out;
};

// One thread's buffers, sized for the widest tile.
struct Scratch {
  std::unique_ptr<float[]> buf;  // not zero-filled: every use writes before it reads
  std::vector<int32_t> pos;
  float *qt, *acc, *s, *kt, *vt, *mx, *l, *alpha;
  std::vector<const float*> krow, vrow;
  explicit Scratch(const Plan& p) : pos(p.width()), krow(kKeyChunk), vrow(kKeyChunk) {
    const int64_t w = p.width(), d = p.d;
    const int64_t sizes[] = {d * w, w * d, kKeyChunk * w, kKeyChunk * d, kKeyChunk * d, w, w, w};
    int64_t total = 0;
    for (int64_t s : sizes) total += (s + 15) / 16 * 16;
    buf.reset(new float[total + 16]);
    float* at = buf.get() + (16 - reinterpret_cast<uintptr_t>(buf.get()) / 4 % 16) % 16;  // 64-byte aligned
    float** dst[] = {&qt, &acc, &s, &kt, &vt, &mx, &l, &alpha};
    for (int i = 0; i < 8; ++i) {
      *dst[i] = at;
      at += (sizes[i] + 15) / 16 * 16;
    }
  }
};

template <typename T>
const float* key_row(const T* row, int64_t d, float* tile) {
  if constexpr (std::is_same_v<T, float>) {
    return row;
  } else {
    for (int64_t c = 0; c < d; ++c) tile[c] = to_float(row[c]);
    return tile;
  }
}

template <typename T, int D>
void attend_item(const Plan& p, const Operands<T>& o, int64_t item, Scratch& w) {
  const int64_t d = D > 0 ? D : p.d;
  const int64_t tile_index = item % p.tiles;
  const int64_t head = item / p.tiles % p.hkv;
  const int64_t seq = item / (p.tiles * p.hkv);
  const int64_t m0 = tile_index * p.tile_rows;
  const int64_t rows = std::min(p.tile_rows, p.g * p.k - m0);
  const int64_t width = (rows + kLanes - 1) / kLanes * kLanes;
  const int64_t start = o.start[seq];
  // Rows are ordered m = r * g + gi (row r of query head head * g + gi): a tile's last row
  // sits at the latest position, and its keys are all the tile reads.
  const int64_t keys = start + (m0 + rows - 1) / p.g + 1;
  const int64_t key_begin = 0, key_end = keys;
  const TileState t{rows, width, w.pos.data(), start + m0 / p.g, w.s, w.mx, w.l, w.alpha};
  // queries pre-scaled and transposed (qt[c][lane])
  for (int64_t mm = 0; mm < width; ++mm) {
    const int64_t m = m0 + std::min(mm, rows - 1);  // padding lanes repeat the last row's position
    w.pos[mm] = static_cast<int32_t>(start + m / p.g);
    w.mx[mm] = kNegInf;
    w.l[mm] = 0.0f;
    const T* qr = o.q + ((seq * p.k + m / p.g) * p.hq + head * p.g + m % p.g) * d;
    for (int64_t c = 0; c < d; ++c) {
      w.qt[c * width + mm] = mm < rows ? to_float(qr[c]) * p.scale : 0.0f;
    }
  }
  std::fill(w.acc, w.acc + rows * d, 0.0f);
  const int32_t* table = o.tables + seq * p.max_blocks;
  // f(j, pointer to the kv head's rows of key key0 + j, how many consecutive keys lie there)
  auto for_runs = [&](int64_t key0, int64_t nj, auto&& f) {
    for (int64_t j = 0; j < nj;) {
      const int64_t key = key0 + j, off = key % p.bs, run = std::min(p.bs - off, nj - j);
      f(j, ((table[key / p.bs] * p.hkv + head) * p.bs + off) * d, run);
      j += run;
    }
  };
  for (int64_t key0 = key_begin; key0 < key_end; key0 += kKeyChunk) {
    const int64_t nj = std::min(kKeyChunk, key_end - key0);
    for_runs(key0, nj, [&](int64_t j, int64_t at, int64_t run) {
      for (int64_t r = 0; r < run; ++r) {
        w.krow[j + r] = key_row(o.k_cache + at + r * d, d, w.kt + (j + r) * d);
        w.vrow[j + r] = key_row(o.v_cache + at + r * d, d, w.vt + (j + r) * d);
      }
    });
    // The next chunk's rows requested now: its blocks lie anywhere, where the hardware
    // prefetcher would only catch up some lines into each.
    for_runs(key0 + nj, std::min(kKeyChunk, key_end - key0 - nj), [&](int64_t, int64_t at, int64_t run) {
      const char* kr = reinterpret_cast<const char*>(o.k_cache + at);
      const char* vr = reinterpret_cast<const char*>(o.v_cache + at);
      for (int64_t line = 0; line < run * d * static_cast<int64_t>(sizeof(T)); line += 64) {
        __builtin_prefetch(kr + line);
        __builtin_prefetch(vr + line);
      }
    });
    wide_scores(w.qt, d, w.krow.data(), nj, t);
    wide_softmax(key0, nj, t);
    tile_values<D>(w.vrow.data(), nj, d, t, w.acc);
  }
  for (int64_t mm = 0; mm < rows; ++mm) {
    const int64_t m = m0 + mm;
    T* out = o.out + ((seq * p.k + m / p.g) * p.hq + head * p.g + m % p.g) * d;
    const float inv = 1.0f / w.l[mm];
    for (int64_t c = 0; c < d; ++c) out[c] = static_cast<T>(w.acc[mm * d + c] * inv);
  }
}

// Items handed out one at a time (an atomic counter): sequences of unequal length balance.
template <typename T, int D>
void run(const Plan& p, const Operands<T>& o) {
  std::atomic<int64_t> next{0};
  const int64_t items = p.items();
  at::parallel_for(0, p.workers, 1, [&](int64_t begin, int64_t end) {
    Scratch w(p);
    for (int64_t it = next.fetch_add(1); it < items; it = next.fetch_add(1)) attend_item<T, D>(p, o, it, w);
  });
}

void check_inputs(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                  const at::Tensor& block_tables, const at::Tensor& start_pos) {
  TORCH_CHECK(q.dim() == 4, "paged_attention: q must be [n, k, hq, d], got ", q.sizes());
  TORCH_CHECK(k_cache.dim() == 4, "paged_attention: k_cache must be [num_blocks, hkv, block_size, d], got ",
              k_cache.sizes());
  TORCH_CHECK(k_cache.size(2) > 0, "paged_attention: the block size must be at least 1");
  TORCH_CHECK(v_cache.sizes() == k_cache.sizes(), "paged_attention: v_cache ", v_cache.sizes(),
              " differs from k_cache ", k_cache.sizes());
  TORCH_CHECK(k_cache.size(3) == q.size(3), "paged_attention: head dim of q (", q.size(3), ") and cache (",
              k_cache.size(3), ") differ");
  TORCH_CHECK(k_cache.size(1) > 0 && q.size(2) % k_cache.size(1) == 0, "paged_attention: ", q.size(2),
              " query heads are no multiple of ", k_cache.size(1), " kv heads");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type(),
              "paged_attention: q, k_cache and v_cache must share a dtype");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf,
              "paged_attention: dtype ", q.scalar_type(), " is not supported (float32, bfloat16, float16)");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == q.size(0) &&
                  block_tables.scalar_type() == at::kInt,
              "paged_attention: block_tables must be int32 [n, max_blocks], got ", block_tables.scalar_type(), " ",
              block_tables.sizes());
  TORCH_CHECK(start_pos.dim() == 1 && start_pos.size(0) == q.size(0) && start_pos.scalar_type() == at::kInt,
              "paged_attention: start_pos must be int32 [n], got ", start_pos.scalar_type(), " ", start_pos.sizes());
  for (const at::Tensor* t : {&q, &k_cache, &v_cache, &block_tables, &start_pos}) {
    TORCH_CHECK(t->device().is_cpu(), "paged_attention (CPU kernel): every tensor must be on the CPU");
    TORCH_CHECK(t->is_contiguous(), "paged_attention (CPU kernel): every tensor must be contiguous");
  }
  // The blocks that will be read, and only those, must exist.
  const int64_t n = q.size(0), k = q.size(1), bs = k_cache.size(2), max_blocks = block_tables.size(1);
  const int64_t num_blocks = k_cache.size(0);
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* start = start_pos.data_ptr<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(start[i] >= 0, "paged_attention: start_pos[", i, "] = ", start[i], " is negative");
    const int64_t used = (start[i] + k + bs - 1) / bs;
    TORCH_CHECK(used <= max_blocks, "paged_attention: sequence ", i, " needs ", used, " blocks; its table has ",
                max_blocks);
    for (int64_t b = 0; b < used; ++b) {
      const int32_t id = tables[i * max_blocks + b];
      TORCH_CHECK(id >= 0 && id < num_blocks, "paged_attention: block_tables[", i, ", ", b, "] = ", id,
                  " is outside the pool of ", num_blocks, " blocks");
    }
  }
}

Plan make_plan(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& block_tables,
               const at::Tensor& start_pos) {
  Plan p{};
  p.n = q.size(0), p.k = q.size(1), p.hq = q.size(2), p.d = q.size(3);
  p.hkv = k_cache.size(1), p.bs = k_cache.size(2), p.max_blocks = block_tables.size(1);
  p.g = p.hq / p.hkv;
  p.scale = 1.0f / std::sqrt(static_cast<float>(p.d));
  const int64_t rows = p.g * p.k;
  p.tiles = (rows + kTileRows - 1) / kTileRows;
  p.tile_rows = p.tiles == 1 ? rows : (rows + p.tiles - 1) / p.tiles;
  if (p.tiles > 1) p.tile_rows = (p.tile_rows + kLanes - 1) / kLanes * kLanes;
  p.tiles = (rows + p.tile_rows - 1) / p.tile_rows;
  const int32_t* start = start_pos.data_ptr<int32_t>();
  int64_t work = 0;
  for (int64_t i = 0; i < p.n; ++i) work += (start[i] + p.k) * p.hkv * p.tiles * p.width();
  p.workers = std::min<int64_t>(work < kMinParallelWork ? 1 : at::get_num_threads(), p.items());
  return p;
}

template <typename T>
void dispatch_head_dim(const Plan& p, const Operands<T>& o) {
  if (p.d == 64) return run<T, 64>(p, o);
  if (p.d == 128) return run<T, 128>(p, o);
  run<T, 0>(p, o);
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables, const at::Tensor& start_pos) {
  check_inputs(q, k_cache, v_cache, block_tables, start_pos);
  at::Tensor out = at::empty(q.sizes(), q.options());
  if (q.numel() == 0) return out;
  const Plan p = make_plan(q, k_cache, block_tables, start_pos);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    Operands<T> o{q.data_ptr<T>(), k_cache.data_ptr<T>(), v_cache.data_ptr<T>(), block_tables.data_ptr<int32_t>(),
                  start_pos.data_ptr<int32_t>(), out.data_ptr<T>()};
    dispatch_head_dim(p, o);
  };
  if (q.scalar_type() == at::kFloat) launch(float{});
  else if (q.scalar_type() == at::kBFloat16) launch(c10::BFloat16{});
  else launch(c10::Half{});
  return out;
}

}  // namespace

TORCH_LIBRARY(tandem_paged_attention, m) {
  m.def("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor start_pos) -> Tensor",
        &paged_attention);
}
