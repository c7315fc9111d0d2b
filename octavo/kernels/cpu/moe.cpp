// One token's routed experts of a mixture-of-experts layer whose experts are GGUF-quantized
// (batch-1 decode): down(silu(gate x) * up x) for each selected expert, weighted and summed,
// in one call. The same kernels the Python loop calls (gguf_linear, silu_and_mul); at batch 1
// a layer is 8 experts x 3 small ops, and their Python calls cost about what the kernels do.
#include "ops.h"

namespace octavo_cpu {

at::Tensor gguf_moe_token(const at::Tensor& x, const std::vector<at::Tensor>& params,
                          const std::vector<double>& weights, int64_t hidden, int64_t inter,
                          int64_t isa) {
  const int64_t k = static_cast<int64_t>(weights.size());
  TORCH_CHECK(static_cast<int64_t>(params.size()) == 6 * k,
              "gguf_moe_token: 6 tensors (gate/up q, s, m; down q, s, m) per expert");
  TORCH_CHECK(x.dim() == 2 && x.size(0) == 1 && x.size(1) == hidden && x.is_contiguous(),
              "x must be a contiguous [1, ", hidden, "]");
  // The experts run side by side, one a thread (each one's kernels then run on that thread
  // alone): a fork and join per layer instead of one per kernel call, which at batch 1 left
  // the other thread waiting through most of the layer's small calls. Their outputs are
  // summed in expert order, as before.
  std::vector<at::Tensor> outs(k);
  at::parallel_for(0, k, 1, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const at::Tensor* p = params.data() + 6 * j;
      const at::Tensor act = silu_and_mul(gguf_linear(x, p[0], p[1], p[2], hidden, isa));
      // (a throw inside the pool is rethrown by parallel_for on the calling thread)
      TORCH_CHECK(act.size(1) == inter, "gguf_moe_token: expert ", j, " has ", act.size(1),
                  " intermediate features, expected ", inter);
      outs[j] = gguf_linear(act, p[3], p[4], p[5], inter, isa);
    }
  });
  // sum_j w_j out_j in float32, in expert order: a plain loop (at::zeros and a conversion and
  // an add_ an expert were ~20 ATen calls a layer).
  at::Tensor out = at::empty({1, hidden}, x.options().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  std::fill(op, op + hidden, 0.0f);
  for (int64_t j = 0; j < k; ++j) {
    const float w = static_cast<float>(weights[j]);
    OCTAVO_DISPATCH(outs[j].scalar_type(), "gguf_moe_token", [&] {
      const scalar_t* yp = outs[j].data_ptr<scalar_t>();
      for (int64_t i = 0; i < hidden; ++i) op[i] += w * to_f(yp[i]);
    });
  }
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

}  // namespace octavo_cpu
