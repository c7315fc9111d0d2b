// Declarations of the CPU ops bound in bindings.cpp, and the paged-cache store they share.
#pragma once

#include <optional>
#include <vector>

#include "common.h"

namespace octavo_cpu {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
void fused_add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight,
                        double eps);
at::Tensor silu_and_mul(const at::Tensor& x);
void rotary_embedding(const at::Tensor& positions, at::Tensor& q, at::Tensor& k,
                      const at::Tensor& cos_sin_cache, int64_t head_dim);
void reshape_and_cache(const at::Tensor& k, const at::Tensor& v, at::Tensor& kv_cache,
                       const at::Tensor& slot_mapping);
at::Tensor paged_decode_attention(const at::Tensor& q, const std::optional<at::Tensor>& k,
                                  const std::optional<at::Tensor>& v, at::Tensor& kv_cache,
                                  const std::optional<at::Tensor>& slot_mapping,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                  double scale);

// Quantized linear (quant_gemm.cpp): weights w = d * u + m per 32 (or 16) inputs, int16
// activations per 32-block.
// isa: 0 best built, 1 scalar, 2 AVX2, 3 AVX-512 VNNI.
at::Tensor gguf_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                       const at::Tensor& mins, int64_t in_features, int64_t isa);
at::Tensor gguf_dequantize(const at::Tensor& qweight, const at::Tensor& scales,
                           const at::Tensor& mins, int64_t in_features);
// Rows ids [T] of it as float32 [T, K]: a quantized token embedding's lookup.
at::Tensor gguf_dequantize_rows(const at::Tensor& qweight, const at::Tensor& scales,
                                const at::Tensor& mins, const at::Tensor& ids,
                                int64_t in_features);
// Float32 product through the dequantized weight, 64 rows at a time (never the whole weight):
// exact, and faster than the integer kernels from about 16 activation rows on.
at::Tensor gguf_linear_dense(const at::Tensor& x, const at::Tensor& qweight,
                             const at::Tensor& scales, const at::Tensor& mins,
                             int64_t in_features);
std::vector<int64_t> quant_isas();

// One token's GGUF experts, weighted and summed (moe.cpp): params are 6 per expert (gate/up
// q, s, m; down q, s, m).
at::Tensor gguf_moe_token(const at::Tensor& x, const std::vector<at::Tensor>& params,
                          const std::vector<double>& weights, int64_t hidden, int64_t inter,
                          int64_t isa);

// torch.argmax(logits, dim=-1) for float32 [rows, n] logits (argmax.cpp): greedy sampling.
at::Tensor argmax_rows(const at::Tensor& logits);

// A decode step through Llama-style decoder layers with GGUF linear layers (decoder.cpp):
// returns (x, residual) after the last layer, before the final norm.
// Tensors held on the C++ side across calls: a Python list is converted tensor by tensor at
// every call, ~0.5 ms a decode step for a mixture of experts' 4,600 expert tensors.
struct TensorList {
  std::vector<at::Tensor> tensors;
};

std::vector<at::Tensor> gguf_decoder_layers(
    const at::Tensor& hidden, const at::Tensor& positions, const TensorList& params,
    const std::vector<int64_t>& in_features, const std::vector<int64_t>& segments,
    std::vector<at::Tensor> kv_caches,
    const at::Tensor& slot_mapping, const at::Tensor& block_tables, const at::Tensor& seq_lens,
    const at::Tensor& cos_sin_cache, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
    double scale, double eps, int64_t isa, int64_t dense_min_rows,
    const std::vector<int64_t>& layer_kinds, const std::vector<int64_t>& moe_shape);

void check_kv_cache(const at::Tensor& kv_cache);
void check_new_kv(const at::Tensor& x, const at::Tensor& kv_cache, int64_t tokens,
                  const char* what);

// Writes new K/V rows [tokens, heads, head_dim] (strided views) into the paged cache.
template <typename T>
struct KVWriter {
  const T* k;
  const T* v;
  int64_t k_stride_t, k_stride_h, v_stride_t, v_stride_h;
  T* cache_k;
  T* cache_v;
  int64_t heads, block_size, head_dim;

  KVWriter(const at::Tensor& k_, const at::Tensor& v_, at::Tensor& kv_cache)
      : k(k_.data_ptr<T>()), v(v_.data_ptr<T>()),
        k_stride_t(k_.stride(0)), k_stride_h(k_.stride(1)),
        v_stride_t(v_.stride(0)), v_stride_h(v_.stride(1)),
        cache_k(kv_cache.data_ptr<T>()), cache_v(cache_k + kv_cache.stride(0)),
        heads(kv_cache.size(2)), block_size(kv_cache.size(3)), head_dim(kv_cache.size(4)) {}

  // Head h of token t to cache slot `slot` (negative: nothing).
  void store(int64_t t, int64_t h, int64_t slot) const {
    if (slot < 0) return;
    const int64_t row = ((slot / block_size) * heads + h) * block_size + slot % block_size;
    std::memcpy(cache_k + row * head_dim, k + t * k_stride_t + h * k_stride_h,
                head_dim * sizeof(T));
    std::memcpy(cache_v + row * head_dim, v + t * v_stride_t + h * v_stride_h,
                head_dim * sizeof(T));
  }

  // Tokens [0, tokens) at `slots`, in parallel for prefills.
  void store_all(const int64_t* slots, int64_t tokens) const {
    at::parallel_for(0, tokens, row_grain(2 * heads * head_dim), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        for (int64_t h = 0; h < heads; ++h) store(t, h, slots[t]);
      }
    });
  }
};

}  // namespace octavo_cpu
