// A decode step through a stack of Llama-style decoder layers whose linear layers are all
// GGUF-quantized: the same kernels the Python model calls (fused add + RMSNorm, gguf_linear,
// rotary, paged attention with the K/V store, SiLU-and-mul), in the same order, one call for the
// whole stack. At batch 1 the model is ~30 layers x ~12 small ops, and Python module calls,
// argument checks and tensor views cost ~60 us a layer: on the 2-core machine that was about
// a fifth of a 135M-parameter model's step.
#include "ops.h"

namespace octavo_cpu {

namespace {

constexpr int64_t kParamsPerLayer = 14;

at::Tensor linear(const at::Tensor& x, const at::Tensor* p, int64_t k, int64_t isa,
                  int64_t dense_min_rows) {
  if (x.size(0) < dense_min_rows) return gguf_linear(x, p[0], p[1], p[2], k, isa);
  return gguf_linear_dense(x, p[0], p[1], p[2], k);
}

}  // namespace

std::vector<at::Tensor> gguf_decoder_layers(
    const at::Tensor& hidden, const at::Tensor& positions, const std::vector<at::Tensor>& params,
    const std::vector<int64_t>& in_features, std::vector<at::Tensor> kv_caches,
    const at::Tensor& slot_mapping, const at::Tensor& block_tables, const at::Tensor& seq_lens,
    const at::Tensor& cos_sin_cache, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
    double scale, double eps, int64_t isa, int64_t dense_min_rows) {
  const int64_t layers = static_cast<int64_t>(kv_caches.size());
  TORCH_CHECK(static_cast<int64_t>(params.size()) == layers * kParamsPerLayer &&
                  static_cast<int64_t>(in_features.size()) == layers * 4,
              "gguf_decoder_layers: 14 tensors and 4 in_features per layer");
  TORCH_CHECK(hidden.dim() == 2 && hidden.is_contiguous(), "hidden must be a contiguous [T, H]");
  const int64_t t = hidden.size(0);
  const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  at::Tensor x = hidden;
  at::Tensor residual;
  for (int64_t l = 0; l < layers; ++l) {
    const at::Tensor* p = params.data() + l * kParamsPerLayer;
    const int64_t* k = in_features.data() + l * 4;
    // p: input norm, qkv (q, s, m), o (q, s, m), post-attention norm, gate_up (q, s, m),
    // down (q, s, m).
    if (l == 0) {
      residual = x;
      x = rms_norm(x, p[0], eps);
    } else {
      fused_add_rms_norm(x, residual, p[0], eps);
    }
    const at::Tensor qkv = linear(x, p + 1, k[0], isa, dense_min_rows);
    at::Tensor q = qkv.narrow(1, 0, q_size).view({t, num_heads, head_dim});
    at::Tensor kk = qkv.narrow(1, q_size, kv_size).view({t, num_kv_heads, head_dim});
    const at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({t, num_kv_heads, head_dim});
    rotary_embedding(positions, q, kk, cos_sin_cache, head_dim);
    const at::Tensor o = paged_decode_attention(q, kk, v, kv_caches[l], slot_mapping,
                                                block_tables, seq_lens, scale);
    x = linear(o.view({t, q_size}), p + 4, k[1], isa, dense_min_rows);
    fused_add_rms_norm(x, residual, p[7], eps);
    const at::Tensor act = silu_and_mul(linear(x, p + 8, k[2], isa, dense_min_rows));
    x = linear(act, p + 11, k[3], isa, dense_min_rows);
  }
  return {x, residual};
}

}  // namespace octavo_cpu
