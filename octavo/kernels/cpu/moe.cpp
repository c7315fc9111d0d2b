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
  at::Tensor out = at::zeros({1, hidden}, x.options().dtype(at::kFloat));
  for (int64_t j = 0; j < k; ++j) {
    const at::Tensor* p = params.data() + 6 * j;
    const at::Tensor act = silu_and_mul(gguf_linear(x, p[0], p[1], p[2], hidden, isa));
    TORCH_CHECK(act.size(1) == inter, "gguf_moe_token: expert ", j, " has ", act.size(1),
                " intermediate features, expected ", inter);
    out.add_(gguf_linear(act, p[3], p[4], p[5], inter, isa).to(at::kFloat), weights[j]);
  }
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

}  // namespace octavo_cpu
