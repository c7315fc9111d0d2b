// Stores new K/V rows into the paged cache [2, num_blocks, kv_heads, block_size, head_dim].
#include "common.h"
#include "ops.h"

namespace octavo_cpu {

void check_kv_cache(const at::Tensor& kv_cache) {
  check_cpu(kv_cache, "kv_cache");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(),
              "kv_cache must be contiguous [2, num_blocks, kv_heads, block_size, head_dim]");
}

void check_new_kv(const at::Tensor& x, const at::Tensor& kv_cache, int64_t tokens,
                  const char* what) {
  check_cpu(x, what);
  TORCH_CHECK(x.dim() == 3 && x.size(0) >= tokens && x.size(1) == kv_cache.size(2) &&
                  x.size(2) == kv_cache.size(4) && x.stride(2) == 1,
              what, " must be [tokens, kv_heads, head_dim] with a contiguous last dim");
  TORCH_CHECK(x.scalar_type() == kv_cache.scalar_type(), what, " dtype != kv_cache dtype");
}

void reshape_and_cache(const at::Tensor& k, const at::Tensor& v, at::Tensor& kv_cache,
                       const at::Tensor& slot_mapping) {
  check_kv_cache(kv_cache);
  check_cpu(slot_mapping, "slot_mapping");
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.scalar_type() == at::kLong &&
                  slot_mapping.stride(0) == 1,
              "slot_mapping must be contiguous int64 [tokens]");
  const int64_t tokens = slot_mapping.size(0);
  check_new_kv(k, kv_cache, tokens, "k");
  check_new_kv(v, kv_cache, tokens, "v");
  const int64_t heads = kv_cache.size(2), block_size = kv_cache.size(3);
  const int64_t num_slots = kv_cache.size(1) * block_size;
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(slots[t] < num_slots, "reshape_and_cache: slot ", slots[t], " out of range");
  }
  OCTAVO_DISPATCH(kv_cache.scalar_type(), "reshape_and_cache", [&] {
    KVWriter<scalar_t>(k, v, kv_cache).store_all(slots, tokens);
  });
}

}  // namespace octavo_cpu
