// Paged decode attention: one query token per request against its cached K/V, read in place
// from the blocks (no gather copy).
//
// A work item is one request (or, for long contexts with few requests, one partition of its
// context). It walks the context in chunks of 16 tokens and, within a chunk, every KV head in
// turn: with the cache laid out [num_blocks, kv_heads, block_size, head_dim] that reads each
// block's K (then V) front to back, and each K/V row serves the g = Hq / Hkv query heads that
// share it. Scores are fp32 with an exact (max-subtracted) softmax; partitions keep partial
// (max, sum, P.V) that are merged afterwards.
#include <algorithm>
#include <limits>
#include <vector>

#include "attention_chunks.h"
#include "common.h"
#include "ops.h"

namespace octavo_cpu {
namespace {

// s <- exp(s - max(s)) in place; *m = max(s), *l = sum of the new s. Lane arrays instead of
// one running max/sum, so that g++ vectorises both reductions.
void softmax_numerators(float* s, int64_t n, float* m, float* l) {
  constexpr int W = 16;
  float lanes[W];
  for (int i = 0; i < W; ++i) lanes[i] = s[0];
  int64_t t = 0;
  for (; t + W <= n; t += W) {
    for (int i = 0; i < W; ++i) lanes[i] = s[t + i] > lanes[i] ? s[t + i] : lanes[i];
  }
  float mx = s[0];
  for (; t < n; ++t) mx = s[t] > mx ? s[t] : mx;
  for (int i = 0; i < W; ++i) mx = lanes[i] > mx ? lanes[i] : mx;
  for (int i = 0; i < W; ++i) lanes[i] = 0.0f;
  for (t = 0; t + W <= n; t += W) {
    for (int i = 0; i < W; ++i) {
      s[t + i] = fast_exp(s[t + i] - mx);
      lanes[i] += s[t + i];
    }
  }
  float sum = 0.0f;
  for (; t < n; ++t) {
    s[t] = fast_exp(s[t] - mx);
    sum += s[t];
  }
  for (int i = 0; i < W; ++i) sum += lanes[i];
  *m = mx;
  *l = sum;
}

template <typename T>
struct Decode {
  const T* q;
  int64_t q_stride_t, q_stride_h;
  const T* cache_k;
  const T* cache_v;
  const int32_t* block_tables;
  int64_t bt_stride;
  const int32_t* seq_lens;
  int64_t kv_heads, group, head_dim, block_size;
  float scale;

  int64_t heads() const { return kv_heads * group; }

  // Unnormalised attention of request b over context [lo, hi), for every query head j:
  // acc[j] = sum_t exp(s_t - m[j]) v_t, m[j] = max_t s_t, l[j] = sum_t exp(s_t - m[j]).
  // Scratch: qf heads * head_dim floats, scores heads * (hi - lo), rows hi - lo.
  template <int NC>
  void run(int64_t b, int64_t lo, int64_t hi, float* qf, float* scores, int64_t* rows,
           float* acc, float* m, float* l) const {
    const int64_t d = head_dim, g = group, hq = heads(), n = hi - lo;
    std::fill(acc, acc + hq * d, 0.0f);
    if (n <= 0) {
      std::fill(m, m + hq, -std::numeric_limits<float>::infinity());
      std::fill(l, l + hq, 0.0f);
      return;
    }
    for (int64_t j = 0; j < hq; ++j) {
      const T* qj = q + b * q_stride_t + j * q_stride_h;
      for (int64_t i = 0; i < d; ++i) qf[j * d + i] = to_f(qj[i]) * scale;
    }
    const int32_t* table = block_tables + b * bt_stride;
    for (int64_t t = 0; t < n; ++t) {  // offset of each token's row in KV head 0
      const int64_t pos = lo + t;
      rows[t] = (table[pos / block_size] * kv_heads * block_size + pos % block_size) * d;
    }
    const int64_t head_stride = block_size * d;
    using C = Chunks<T, NC>;
    const bool simd = C::simd(d);
    for (int64_t t0 = 0; t0 < n; t0 += kChunk) {
      const int64_t cnt = std::min(kChunk, n - t0);
      for (int64_t h = 0; h < kv_heads; ++h) {
        C::scores(simd, qf + h * g * d, cache_k + h * head_stride, rows + t0, cnt, g, d,
                  scores + h * g * n + t0, n);
      }
    }
    for (int64_t j = 0; j < hq; ++j) softmax_numerators(scores + j * n, n, m + j, l + j);
    for (int64_t t0 = 0; t0 < n; t0 += kChunk) {
      const int64_t cnt = std::min(kChunk, n - t0);
      for (int64_t h = 0; h < kv_heads; ++h) {
        C::values(simd, scores + h * g * n + t0, cache_v + h * head_stride, rows + t0, cnt, g,
                  d, n, acc + h * g * d);
      }
    }
  }
};

// Context partitions per request: enough work items for every thread when there are few
// requests, each partition at least kMinPartition tokens. At 256 a batch-1 decode left every
// thread but one idle below 512 tokens of context (Qwen2.5-Coder-1.5B, 2 threads: attention
// ~5% of the step, all of it on one thread); a partition's own cost is converting its query
// and merging heads x head_dim partial sums, small beside two chunks of K and V.
constexpr int64_t kMinPartition = 2 * kChunk;

int64_t num_partitions(int64_t batch, int64_t max_len) {
  const int64_t want = (4 * at::get_num_threads() + batch - 1) / batch;
  return std::max<int64_t>(1, std::min(want, max_len / kMinPartition));
}

template <typename T>
void store_normalised(T* out, const float* acc, const float* l, int64_t heads, int64_t d) {
  for (int64_t j = 0; j < heads; ++j) {
    const float inv = l[j] > 0.0f ? 1.0f / l[j] : 0.0f;
    for (int64_t i = 0; i < d; ++i) out[j * d + i] = from_f<T>(acc[j * d + i] * inv);
  }
}

// Merges the partitions' (acc, m, l) of one request into its output rows.
template <typename T>
void merge_partitions(T* out, const float* partial, int64_t parts, int64_t heads, int64_t d,
                      float* merged) {
  const int64_t size = heads * (d + 2);
  for (int64_t j = 0; j < heads; ++j) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t p = 0; p < parts; ++p) mx = std::max(mx, partial[p * size + heads * d + j]);
    std::fill(merged, merged + d, 0.0f);
    float sum = 0.0f;
    for (int64_t p = 0; p < parts; ++p) {
      const float* part = partial + p * size;
      const float lp = part[heads * d + heads + j];
      if (lp == 0.0f) continue;
      const float w = fast_exp(part[heads * d + j] - mx);
      sum += w * lp;
      for (int64_t i = 0; i < d; ++i) merged[i] += w * part[j * d + i];
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int64_t i = 0; i < d; ++i) out[j * d + i] = from_f<T>(merged[i] * inv);
  }
}

template <typename T, int NC>
void decode_attention(const Decode<T>& dec, int64_t batch, int64_t max_len, T* out) {
  const int64_t hq = dec.heads(), d = dec.head_dim, bs = dec.block_size;
  int64_t parts = num_partitions(batch, max_len);
  int64_t part_len = (max_len + parts - 1) / parts;
  part_len = std::max<int64_t>(1, (part_len + bs - 1) / bs * bs);
  parts = std::max<int64_t>(1, (max_len + part_len - 1) / part_len);
  // Per partition: acc [heads, d], m [heads], l [heads].
  const int64_t partial_size = hq * (d + 2);
  std::vector<float> partial(parts > 1 ? batch * parts * partial_size : 0);

  // Contiguous runs of work items of about equal context length, one per thread.
  const int64_t items = batch * parts;
  auto item_len = [&](int64_t w) {
    const int64_t len = dec.seq_lens[w / parts], lo = std::min(len, (w % parts) * part_len);
    return std::min(len, lo + part_len) - lo;
  };
  std::vector<int64_t> cum(items + 1, 0);
  for (int64_t w = 0; w < items; ++w) cum[w + 1] = cum[w] + item_len(w) + 16;
  const int64_t runs = std::min<int64_t>(items, at::get_num_threads());
  auto run_start = [&](int64_t r) {
    return std::lower_bound(cum.begin(), cum.end(), cum[items] * r / runs) - cum.begin();
  };
  at::parallel_for(0, runs, 1, [&](int64_t run_begin, int64_t run_end) {
    const int64_t begin = run_start(run_begin), end = run_start(run_end);
    std::vector<float> buf(hq * d + hq * part_len + partial_size);
    std::vector<int64_t> rows(part_len);
    float* qf = buf.data();
    float* scores = qf + hq * d;
    float* own = scores + hq * part_len;  // acc, m, l of an unsplit request
    for (int64_t w = begin; w < end; ++w) {
      const int64_t b = w / parts, p = w % parts;
      const int64_t len = dec.seq_lens[b];
      const int64_t lo = std::min(len, p * part_len), hi = std::min(len, lo + part_len);
      float* dst = parts > 1 ? partial.data() + w * partial_size : own;
      dec.template run<NC>(b, lo, hi, qf, scores, rows.data(), dst, dst + hq * d,
                           dst + hq * d + hq);
      if (parts == 1) store_normalised(out + b * hq * d, own, own + hq * d + hq, hq, d);
    }
  });
  if (parts == 1) return;
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> merged(d);
    for (int64_t b = begin; b < end; ++b) {
      merge_partitions(out + b * hq * d, partial.data() + b * parts * partial_size, parts, hq,
                       d, merged.data());
    }
  });
}

}  // namespace

at::Tensor paged_decode_attention(const at::Tensor& q, const std::optional<at::Tensor>& k,
                                  const std::optional<at::Tensor>& v, at::Tensor& kv_cache,
                                  const std::optional<at::Tensor>& slot_mapping,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                  double scale) {
  check_kv_cache(kv_cache);
  check_cpu(q, "q");
  check_cpu(block_tables, "block_tables");
  check_cpu(seq_lens, "seq_lens");
  const int64_t num_blocks = kv_cache.size(1), hkv = kv_cache.size(2);
  const int64_t bs = kv_cache.size(3), d = kv_cache.size(4);
  TORCH_CHECK(q.dim() == 3 && q.size(2) == d && q.stride(2) == 1 && q.size(1) % hkv == 0,
              "paged_decode_attention: q must be [batch, heads, head_dim] (contiguous last "
              "dim, heads a multiple of the cache's kv heads)");
  TORCH_CHECK(q.scalar_type() == kv_cache.scalar_type(), "q dtype != kv_cache dtype");
  const int64_t batch = q.size(0);
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.scalar_type() == at::kInt &&
                  block_tables.stride(1) == 1 && block_tables.size(0) == batch,
              "block_tables must be int32 [batch, max_blocks] with a contiguous last dim");
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.scalar_type() == at::kInt &&
                  seq_lens.stride(0) == 1 && seq_lens.size(0) == batch,
              "seq_lens must be contiguous int32 [batch]");
  TORCH_CHECK(k.has_value() == v.has_value() && k.has_value() == slot_mapping.has_value(),
              "paged_decode_attention: pass k, v and slot_mapping together");
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int64_t max_blocks = block_tables.size(1);
  int64_t max_len = 0;
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(lens[b] >= 0 && lens[b] <= max_blocks * bs, "seq_lens[", b, "] = ", lens[b],
                " does not fit the block table");
    for (int64_t i = 0; i < (lens[b] + bs - 1) / bs; ++i) {
      const int32_t id = tables[b * block_tables.stride(0) + i];
      TORCH_CHECK(id >= 0 && id < num_blocks, "block id ", id, " out of range");
    }
    max_len = std::max<int64_t>(max_len, lens[b]);
  }
  at::Tensor out = at::empty({batch, q.size(1), d}, q.options());
  OCTAVO_DISPATCH(q.scalar_type(), "paged_decode_attention", [&] {
    if (k.has_value()) {
      TORCH_CHECK(slot_mapping->dim() == 1 && slot_mapping->scalar_type() == at::kLong &&
                      slot_mapping->stride(0) == 1 && slot_mapping->size(0) == batch,
                  "slot_mapping must be contiguous int64 [batch]");
      check_new_kv(*k, kv_cache, batch, "k");
      check_new_kv(*v, kv_cache, batch, "v");
      const int64_t* slots = slot_mapping->data_ptr<int64_t>();
      for (int64_t b = 0; b < batch; ++b) {
        TORCH_CHECK(slots[b] < num_blocks * bs, "slot ", slots[b], " out of range");
      }
      KVWriter<scalar_t>(*k, *v, kv_cache).store_all(slots, batch);
    }
    if (batch == 0 || max_len == 0) {
      out.zero_();
      return;
    }
    const scalar_t* cache = kv_cache.data_ptr<scalar_t>();
    Decode<scalar_t> dec{q.data_ptr<scalar_t>(), q.stride(0), q.stride(1), cache,
                         cache + kv_cache.stride(0), tables, block_tables.stride(0), lens,
                         hkv, q.size(1) / hkv, d, bs, static_cast<float>(scale)};
    scalar_t* o = out.data_ptr<scalar_t>();
    switch (d) {
      case 64:
        return decode_attention<scalar_t, 4>(dec, batch, max_len, o);
      case 128:
        return decode_attention<scalar_t, 8>(dec, batch, max_len, o);
      default:
        return decode_attention<scalar_t, 0>(dec, batch, max_len, o);
    }
  });
  return out;
}

}  // namespace octavo_cpu
