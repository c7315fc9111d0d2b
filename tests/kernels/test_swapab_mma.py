"""The CUDA C++ 4-bit swap-AB GEMM (octavo/kernels/swapab_mma.py, cuda/swapab_mma.cu): the
launch plan and the nvcc build on any machine with nvcc; against the float64 reference on the
GPU (every batch size 1-16, group sizes, split and unsplit tiles, PDL, graph replays)."""

from __future__ import annotations

import pytest
import torch

from octavo.kernels import cuda_module, swapab_mma
from octavo.kernels.swapab_mma import plan, supports
from tests.kernels import cuda_checks

NAMES = [f"swapab_mma_{t}_{sc}_w{b}_m{m}_s{s}" for t in ("bf16", "f16")
         for sc in ("bf16", "f16") for b in (4, 8) for m in (8, 16) for s in (1, 2, 4)]


@pytest.mark.parametrize("k,n,group", [(4096, 28672, 128), (4096, 4096, 128),
                                       (14336, 4096, 128), (4096, 6144, 128), (256, 256, 32),
                                       (192, 512, 64), (4096, 4096, 4096), (128, 256, 128)])
@pytest.mark.parametrize("sms,per_sm", [(132, 16), (132, 8), (4, 16)])
def test_plan_covers_k_once_in_whole_chunks_of_one_group(k, n, group, sms, per_sm):
    p = plan(k, n, group, sms, per_sm)
    assert group % p.chunk == 0 and p.k_per_warp % p.chunk == 0
    assert 1 <= p.warps <= swapab_mma.MAX_WARPS
    covered = p.warps * p.splits * p.k_per_warp
    assert covered >= k
    assert (p.splits - 1) * p.warps * p.k_per_warp < k  # no CTA of idle warps only
    tiles = n // 64
    assert tiles * p.warps * p.splits <= max(per_sm * sms, tiles) * 2


def test_plan_fills_the_gpu_with_k_splits_where_there_are_few_tiles():
    o_proj = plan(4096, 4096, 128, 132)  # 64 tiles: about 6 warps per SM in all
    assert 132 * 5 <= o_proj.warps * o_proj.splits * 64 <= 132 * 8 and o_proj.splits > 1
    gate_up = plan(4096, 28672, 128, 132)  # 448 tiles: a few warps each, one CTA
    assert gate_up.splits == 1


def test_supports():
    assert supports(1, 4096, 4096, 128, 4, torch.bfloat16)
    assert supports(16, 4096, 6144, 32, 4, torch.float16)
    assert not supports(17, 4096, 4096, 128, 4, torch.bfloat16)  # batch
    assert supports(1, 4096, 4224, 128, 8, torch.bfloat16)  # 8-bit tiles: 128 columns
    assert not supports(1, 4096, 4096, 128, 3, torch.bfloat16)  # bits
    assert not supports(1, 4096, 4096, 128, 4, torch.float32)  # dtype
    assert not supports(1, 4096, 4224, 128, 4, torch.bfloat16)  # N % 256 (4-bit)
    assert not supports(1, 4096, 4096, 16, 4, torch.bfloat16)  # group % 32


def test_available_where_built_unless_turned_off(monkeypatch):
    cuda_checks.check_switch(monkeypatch, swapab_mma, "OCTAVO_CUDA_KERNELS", default=True)


@pytest.mark.skipif(cuda_module.nvcc_path() is None, reason="no nvcc on this machine")
def test_the_source_builds_for_hopper_without_spills(tmp_path, monkeypatch):
    spills = cuda_checks.build_once(swapab_mma.SOURCE, NAMES, tmp_path, monkeypatch)
    # The batch-8 kernels (up to 8 rows: the decode path) spill nothing; the 16-row ones at
    # most a word or two (ptxas chose 128 registers for one, 4 bytes spilled).
    for name, spilled in spills.items():
        assert spilled <= (0 if "_m8_" in name else 8), (name, spilled)


def test_a_source_that_does_not_compile_names_nvcc_s_error(tmp_path, monkeypatch):
    if cuda_module.nvcc_path() is None:
        pytest.skip("no nvcc on this machine")
    monkeypatch.setenv("OCTAVO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cuda_module, "SOURCE_DIR", tmp_path)
    (tmp_path / "broken.cu").write_text("extern \"C\" __global__ void k() { undefined_x; }\n")
    with pytest.raises(cuda_module.CudaError, match="(?s)nvcc failed on broken.cu.*undefined_x"):
        cuda_module.build("broken.cu", "sm_90")


# --- on the GPU ---------------------------------------------------------------------------

def _case(m, k, n, group, dtype, seed=0, bits=4, scale_dtype=None):
    from octavo.kernels.w4a16_swapab import pack_swapab

    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 2**bits, (k, n), generator=g)
    scales = torch.rand(k // group, n, generator=g) * 0.02 + 0.001
    zeros = torch.randint(0, 2**bits + 1, (k // group, n), generator=g).float()
    x = torch.randn(m, k, generator=g)
    xs, ss, zs = x.to(dtype), scales.to(scale_dtype or dtype), zeros.to(scale_dtype or dtype)
    ref = xs.double() @ ((q.double() - zs.double().repeat_interleave(group, 0))
                         * ss.double().repeat_interleave(group, 0))
    return (xs.cuda(), pack_swapab(q, bits).cuda(), ss.cuda(), zs.cuda(), ref)


def _rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm()).item()


gpu = pytest.mark.skipif(not torch.cuda.is_available()
                         or cuda_module.module(swapab_mma.SOURCE, torch.device("cuda")) is None,
                         reason="needs an NVIDIA GPU and nvcc")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 2, 3, 7, 8, 9, 15, 16])
@pytest.mark.parametrize("k,n,group", [(256, 256, 32), (512, 768, 64), (1024, 512, 128),
                                       (4096, 4096, 128), (768, 1024, 256)])
def test_matches_the_float64_reference_gpu(bits, dtype, m, k, n, group):
    x, qw, s, z, ref = _case(m, k, n, group, dtype, bits=bits)
    out = swapab_mma.swapab_mma(x, qw, s, z, group, bits)
    assert out.dtype == dtype and out.shape == (m, n)
    assert torch.isfinite(out).all()
    # The output's own rounding (bf16: 2**-9) dominates; a wrong nibble, column or group
    # gives errors of order 1.
    assert _rel(out, ref) < (8e-3 if dtype == torch.bfloat16 else 2e-3)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("per_sm,most_warps,steps", [(1, 1, 1), (4, 2, 2), (64, 8, 4),
                                                     (16, 3, None), (200, 8, 1)])
@pytest.mark.parametrize("bits", [4, 8])
def test_every_split_and_cta_shape_gives_the_same_answer_gpu(per_sm, most_warps, steps, bits):
    """Plans from one warp per tile to K split over several CTAs (the last-ticket sum),
    with idle warps in the last CTA."""
    x, qw, s, z, ref = _case(5, 2048, 1024, 128, torch.bfloat16, seed=1, bits=bits)
    out = swapab_mma.swapab_mma(x, qw, s, z, 128, bits, warps_per_sm=per_sm, steps=steps,
                                most_warps=most_warps)
    assert _rel(out, ref) < 8e-3
    from octavo.kernels import split_k

    torch.cuda.synchronize()
    assert not split_k.counters(x.device, 1).any()  # every ticket counter back at zero


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype,scale_dtype", [(torch.bfloat16, torch.float16),
                                               (torch.float16, torch.bfloat16)])
@pytest.mark.parametrize("bits", [4, 8])
def test_scales_in_the_other_16_bit_dtype_read_as_stored_gpu(dtype, scale_dtype, bits):
    """GPTQ keeps float16 scales under a bf16 model: read as they are (no conversion per
    call, no bf16 rounding of an fp16 scale)."""
    x, qw, s, z, ref = _case(3, 1024, 512, 128, dtype, bits=bits, scale_dtype=scale_dtype)
    assert s.dtype == scale_dtype
    out = swapab_mma.swapab_mma(x, qw, s, z, 128, bits)
    assert out.dtype == dtype and _rel(out, ref) < 8e-3


@pytest.mark.gpu
@gpu
def test_strided_rows_and_graph_replays_gpu():
    from tests.quantization.gemm_checks import check_graph_replays

    x, qw, s, z, _ = _case(4, 4096, 4096, 128, torch.bfloat16, seed=2)
    wide = torch.randn(4, 4096 + 64, device="cuda", dtype=torch.bfloat16)
    view = wide[:, 64:]  # row stride 4160: 16-byte aligned rows, not contiguous
    ref_w = swapab_mma.swapab_mma(view.contiguous(), qw, s, z, 128)
    assert torch.equal(swapab_mma.swapab_mma(view, qw, s, z, 128), ref_w)

    def ref(xx):
        from octavo.kernels.w4a16_swapab import dequantize_swapab

        return (xx.float() @ dequantize_swapab(qw, s, z, 128, 4, torch.float32))

    check_graph_replays(lambda xx: swapab_mma.swapab_mma(xx, qw, s, z, 128), ref, x)


def _liven(model) -> None:
    """Dummy weights (+-1e-3) give near-uniform logits, under which any kernel passes: the
    same seeded, larger scales, embeddings and LM head in both engines (the layouts differ,
    the [K / group, N] scales do not)."""
    g = torch.Generator(device="cuda").manual_seed(1)
    for _name, mod in sorted(model.named_modules(), key=lambda nm: nm[0]):
        if getattr(mod, "scales_kernel", None) is not None:
            mod.scales_kernel.uniform_(0.01, 0.03, generator=g)
    for name, p in sorted(model.named_parameters()):
        if "embed_tokens" in name:
            p.data.normal_(0.0, 1.0, generator=g)
        elif "lm_head" in name:
            p.data.normal_(0.0, 0.05, generator=g)


@pytest.mark.gpu
@gpu
def test_engine_decode_through_the_kernel_matches_the_triton_kernels_gpu(tmp_path, monkeypatch):
    """A bf16 GPTQ 4-bit Llama (dummy weights, every projection 256-column aligned) decodes
    through the CUDA kernel (calls counted) with the logprobs of the Triton kernels' engine
    (OCTAVO_CUDA_KERNELS=0), step by step while the two agree on the token."""
    import json

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
              "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
              "num_key_value_heads": 4, "vocab_size": 2048, "max_position_embeddings": 512,
              "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 64,
                                      "desc_act": False, "sym": True}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    calls = cuda_checks.count_rows(monkeypatch, swapab_mma, "swapab_mma")

    monkeypatch.setenv("OCTAVO_INT_WEIGHT_LAYOUT", "swapab")  # layers below the size rule's

    def run(cuda: bool):
        monkeypatch.setenv("OCTAVO_CUDA_KERNELS", "1" if cuda else "0")
        return cuda_checks.greedy_decode(tmp_path, _liven)

    triton_out = run(False)
    assert not calls
    cuda_out = run(True)
    assert calls and max(calls) <= len(cuda_checks.PROMPTS)  # the decode steps' batches
    for (t_ids, _), (c_ids, _) in zip(triton_out, cuda_out):
        assert c_ids[0] == t_ids[0]  # the prefill's token (not this kernel)
    compared = cuda_checks.compare_decodes(triton_out, cuda_out, first=1)
    assert compared >= 3 * len(cuda_checks.PROMPTS)
