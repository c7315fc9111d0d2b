// A decode step through a stack of Llama-style decoder layers whose linear layers are all
// GGUF-quantized: the same kernels the Python model calls (fused add + RMSNorm, gguf_linear,
// rotary, paged attention with the K/V store, SiLU-and-mul), in the same order, one call for the
// whole stack. At batch 1 the model is ~30 layers x ~12 small ops, and Python module calls,
// argument checks and tensor views cost ~60 us a layer: on the 2-core machine that was about
// a fifth of a 135M-parameter model's step. Qwen2's q/k/v biases, Qwen3's q/k norms and
// mixture-of-experts MLPs with GGUF experts (Qwen3-MoE) run here too.
#include "ops.h"

namespace octavo_cpu {

namespace {

// A linear layer of `segments` (q, s, m) weights whose outputs follow each other (a merged
// q/k/v whose parts have different GGUF formats: one segment a format).
at::Tensor linear(const at::Tensor& x, const at::Tensor* p, int64_t segments, int64_t k,
                  int64_t isa, int64_t dense_min_rows) {
  auto one = [&](const at::Tensor* s) {
    if (x.size(0) < dense_min_rows) return gguf_linear(x, s[0], s[1], s[2], k, isa);
    return gguf_linear_dense(x, s[0], s[1], s[2], k);
  };
  if (segments == 1) return one(p);
  std::vector<at::Tensor> outs;
  for (int64_t i = 0; i < segments; ++i) outs.push_back(one(p + 3 * i));
  return at::cat(outs, 1);
}

// x [T, N] += bias [N] in x's dtype (each sum rounded once, as torch's add_ does): a plain
// loop, where at::add_'s dispatch and iterator setup took ~7 us of a 2,048-wide row.
void add_bias(at::Tensor& x, const at::Tensor& bias) {
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == x.size(1) && bias.is_contiguous() &&
                  bias.scalar_type() == x.scalar_type() && x.is_contiguous(),
              "gguf_decoder_layers: the qkv bias must be a contiguous [", x.size(1),
              "] of x's dtype");
  OCTAVO_DISPATCH(x.scalar_type(), "add_bias", [&] {
    scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* bp = bias.data_ptr<scalar_t>();
    const int64_t n = x.size(1);
    for (int64_t t = 0; t < x.size(0); ++t) {
      for (int64_t i = 0; i < n; ++i) {
        xp[t * n + i] = from_f<scalar_t>(to_f(xp[t * n + i]) + to_f(bp[i]));
      }
    }
  });
}

// A mixture-of-experts MLP (the Python FusedMoE with GGUF experts, moe.cpp): the router's
// softmax in float32, the top k, renormalised where asked, rounded to x's dtype as the
// Python path does; then each token's experts through gguf_moe_token.
at::Tensor moe(const at::Tensor& x, const at::Tensor& router, const at::Tensor* experts,
               int64_t num_experts, int64_t top_k, bool renormalize, int64_t hidden,
               int64_t inter, int64_t isa) {
  const at::Tensor probs = at::linear(x, router).to(at::kFloat).softmax(-1);
  auto [w, ids] = probs.topk(top_k, -1);
  if (renormalize) w = w / w.sum(-1, true);
  w = w.to(x.scalar_type()).to(at::kFloat).contiguous();
  ids = ids.contiguous();
  const int64_t t = x.size(0);
  std::vector<at::Tensor> rows;
  rows.reserve(t);
  std::vector<at::Tensor> params(6 * top_k);
  std::vector<double> weights(top_k);
  for (int64_t i = 0; i < t; ++i) {
    const int64_t* e = ids.data_ptr<int64_t>() + i * top_k;
    const float* wi = w.data_ptr<float>() + i * top_k;
    for (int64_t j = 0; j < top_k; ++j) {
      TORCH_CHECK(e[j] >= 0 && e[j] < num_experts, "router picked expert ", e[j]);
      for (int q = 0; q < 6; ++q) params[6 * j + q] = experts[6 * e[j] + q];
      weights[j] = wi[j];
    }
    rows.push_back(gguf_moe_token(x.narrow(0, i, 1).contiguous(), params, weights, hidden,
                                  inter, isa));
  }
  return t == 1 ? rows[0] : at::cat(rows, 0);
}

}  // namespace

std::vector<at::Tensor> gguf_decoder_layers(
    const at::Tensor& hidden, const at::Tensor& positions, const TensorList& param_list,
    const std::vector<int64_t>& in_features, const std::vector<int64_t>& segments,
    std::vector<at::Tensor> kv_caches,
    const at::Tensor& slot_mapping, const at::Tensor& block_tables, const at::Tensor& seq_lens,
    const at::Tensor& cos_sin_cache, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
    double scale, double eps, int64_t isa, int64_t dense_min_rows,
    const std::vector<int64_t>& layer_kinds, const std::vector<int64_t>& moe_shape) {
  const int64_t layers = static_cast<int64_t>(kv_caches.size());
  TORCH_CHECK(static_cast<int64_t>(layer_kinds.size()) == layers,
              "gguf_decoder_layers: one kind per layer");
  TORCH_CHECK(hidden.dim() == 2 && hidden.is_contiguous(), "hidden must be a contiguous [T, H]");
  TORCH_CHECK(moe_shape.empty() || moe_shape.size() == 4,
              "moe_shape: (experts, top_k, renormalize, intermediate)");
  const std::vector<at::Tensor>& params = param_list.tensors;
  const int64_t t = hidden.size(0);
  const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  at::Tensor x = hidden;
  at::Tensor residual;
  size_t pi = 0, ki = 0;  // cursors into params and in_features
  auto take = [&](size_t n) {
    TORCH_CHECK(pi + n <= params.size(), "gguf_decoder_layers: too few params");
    const at::Tensor* p = params.data() + pi;
    pi += n;
    return p;
  };
  // The next linear layer: its weights' segments, their params and its in_features.
  struct Lin {
    const at::Tensor* p;
    int64_t segments, k;
  };
  auto next_linear = [&]() {
    TORCH_CHECK(ki < in_features.size() && ki < segments.size(),
                "gguf_decoder_layers: too few in_features or segments");
    const int64_t s = segments[ki];
    TORCH_CHECK(s >= 1, "gguf_decoder_layers: a linear layer of ", s, " segments");
    const at::Tensor* p = take(3 * s);
    return Lin{p, s, in_features[ki++]};
  };
  auto run = [&](const at::Tensor& in, const Lin& lin) {
    return linear(in, lin.p, lin.segments, lin.k, isa, dense_min_rows);
  };
  for (int64_t l = 0; l < layers; ++l) {
    // params of a layer: input norm; qkv (q, s, m per segment); [qkv bias]; o (q, s, m ...);
    // [q norm, k norm]; post-attention norm; then gate_up (q, s, m ...), down (q, s, m ...),
    // or the router and every expert's (gate_up q, s, m, down q, s, m). kind: bit 0 q/k
    // norms, bit 1 experts, bit 2 a qkv bias.
    const bool qk_norm = layer_kinds[l] & 1, experts = layer_kinds[l] & 2;
    const bool qkv_bias = layer_kinds[l] & 4;
    const at::Tensor* norm_in = take(1);
    if (l == 0) {
      residual = x;
      x = rms_norm(x, norm_in[0], eps);
    } else {
      fused_add_rms_norm(x, residual, norm_in[0], eps);
    }
    const Lin qkv_proj = next_linear();
    at::Tensor qkv = run(x, qkv_proj);
    if (qkv_bias) add_bias(qkv, take(1)[0]);  // as the Python layer: y + bias in x's dtype
    const Lin o_proj = next_linear();
    at::Tensor q = qkv.narrow(1, 0, q_size).view({t, num_heads, head_dim});
    at::Tensor kk = qkv.narrow(1, q_size, kv_size).view({t, num_kv_heads, head_dim});
    const at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({t, num_kv_heads, head_dim});
    if (qk_norm) {  // Qwen3: per-head RMSNorm of q and k before the rotation
      const at::Tensor* n = take(2);
      q = rms_norm(q, n[0], eps);
      kk = rms_norm(kk, n[1], eps);
    }
    rotary_embedding(positions, q, kk, cos_sin_cache, head_dim);
    const at::Tensor o = paged_decode_attention(q, kk, v, kv_caches[l], slot_mapping,
                                                block_tables, seq_lens, scale);
    x = run(o.view({t, q_size}), o_proj);
    fused_add_rms_norm(x, residual, take(1)[0], eps);
    if (experts) {
      TORCH_CHECK(!moe_shape.empty(), "gguf_decoder_layers: an MoE layer needs moe_shape");
      const int64_t n_exp = moe_shape[0];
      const at::Tensor* router = take(1);
      x = moe(x, router[0], take(6 * n_exp), n_exp, moe_shape[1], moe_shape[2] != 0,
              x.size(1), moe_shape[3], isa);
    } else {
      const Lin gate_up = next_linear();
      const at::Tensor act = silu_and_mul(run(x, gate_up));
      x = run(act, next_linear());
    }
  }
  TORCH_CHECK(pi == params.size() && ki == in_features.size() && ki == segments.size(),
              "gguf_decoder_layers: params, in_features or segments left over");
  return {x, residual};
}

}  // namespace octavo_cpu
