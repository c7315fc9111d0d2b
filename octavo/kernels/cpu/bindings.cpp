// Python bindings of Octavo's CPU ops (built by octavo/kernels/cpu/__init__.py).
#include <torch/extension.h>

#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace octavo_cpu;
  m.def("rms_norm", &rms_norm, "RMSNorm over the last dim (returns a new tensor)");
  m.def("fused_add_rms_norm", &fused_add_rms_norm,
        "In place: residual += x; x = rms_norm(residual)");
  m.def("silu_and_mul", &silu_and_mul, "silu(x[..., :d]) * x[..., d:]");
  m.def("rotary_embedding", &rotary_embedding, "NeoX rotary embedding, in place on q and k");
  m.def("reshape_and_cache", &reshape_and_cache, "Store K/V rows at slots (-1: skip)");
  m.def("paged_decode_attention", &paged_decode_attention,
        "One-token-per-request attention over the paged cache; stores k/v first if given");
  m.def("gguf_linear", &gguf_linear,
        "x [M, K] @ dequant(qweight)^T with int16 activations per 32-block -> [M, N]");
  m.def("gguf_linear_dense", &gguf_linear_dense,
        "x [M, K] @ dequant(qweight)^T in float32, the weight dequantized 64 rows at a time");
  m.def("gguf_dequantize", &gguf_dequantize, "The float32 [N, K] of a quantized weight");
  m.def("gguf_dequantize_rows", &gguf_dequantize_rows,
        "Rows ids of the float32 weight, [len(ids), K]: a quantized embedding's lookup");
  pybind11::class_<TensorList>(m, "TensorList")
      .def(pybind11::init([](std::vector<at::Tensor> t) { return TensorList{std::move(t)}; }))
      .def("__len__", [](const TensorList& l) { return l.tensors.size(); });
  m.def("gguf_decoder_layers", &gguf_decoder_layers,
        "A decode step through Llama-style decoder layers with GGUF linear layers -> "
        "(x, residual) before the final norm");
  m.def("gguf_moe_token", &gguf_moe_token,
        "One token's GGUF-quantized experts, weighted by the router and summed");
  m.def("argmax_rows", &argmax_rows, "torch.argmax(logits, dim=-1) of float32 [rows, n] logits");
  m.def("quant_isas", &quant_isas, "Instruction sets of gguf_linear built here (1 scalar, "
        "2 AVX2, 3 AVX-512 VNNI)");
}
