"""The FP8 GEMV's ROPE store (``fp8_gemv_qkv_rope``: a qkv projection whose store applies the
NeoX rotary embedding and writes k / v into the paged cache) against the unfused path it
replaces (``fp8_gemv``, then ``rotary_embedding(..., kv_store=...)``), bit for bit, and
against a float32 reference; small shapes through the Triton interpreter on the CPU."""

from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("triton")

from octavo.attention.backend import KVStore  # noqa: E402
from octavo.kernels.fp8_gemv import fp8_gemv, fp8_gemv_qkv_rope, fp8_gemv_ref  # noqa: E402
from octavo.kernels.rotary import rotary_embedding, rotary_embedding_ref  # noqa: E402
from octavo.layers.rotary import RotaryEmbedding  # noqa: E402

FP8 = torch.float8_e4m3fn
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CONVERSIONS = [True, pytest.param(False, marks=pytest.mark.gpu)]
FILL = 7.0  # what the cache holds where nothing was stored
BLOCKS, BLOCK_SIZE = 4, 4


def _case(m, hq, hkv, d, k, dtype, cache_dtype=None, seed=0):
    """x [m, k], an fp8 [q | k | v] weight with a scale per row, a real rotary table (long
    enough for large angles), positions, and a [K/V, blocks, block_size, Hkv, D] cache."""
    g = torch.Generator().manual_seed(seed)
    n = (hq + 2 * hkv) * d
    weight = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(FP8)
    scale = torch.rand(n, generator=g) * 0.01 + 1e-4
    x = torch.randn(m, k, generator=g).to(dtype)
    table = RotaryEmbedding(d, 4096, 10000.0).cos_sin_cache
    pos = torch.tensor([3000, 17][:m])
    cache = torch.full((2, BLOCKS, BLOCK_SIZE, hkv, d), FILL, dtype=cache_dtype or dtype)
    return [t.to(DEVICE) for t in (x, weight, scale, table, pos, cache)]


def _unfused(x, weight, scale, table, pos, cache, slots, hq, hkv, d, tuning):
    """The path the fused store replaces: [q | k | v] stored by the plain GEMV (one K split,
    the same tile), then the rotary kernel that also stores k / v."""
    m = x.shape[0]
    qkv = fp8_gemv(x, weight, scale, split_k=1, **tuning)
    q = qkv[:, : hq * d].view(m, hq, d)
    k = qkv[:, hq * d: (hq + hkv) * d].view(m, hkv, d)
    v = qkv[:, (hq + hkv) * d:].view(m, hkv, d)
    rotary_embedding(pos, q, k, table, d, kv_store=KVStore(v, cache[0], cache[1], slots))
    return qkv[:, : hq * d]


SLOTS = {1: [[5], [-1]], 2: [[5, 14], [9, -1], [-1, 0]]}


@pytest.mark.parametrize("bits", CONVERSIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,slots", [(m, s) for m in (1, 2) for s in SLOTS[m]])
@pytest.mark.parametrize("hq,hkv,d,k,tuning", [
    (4, 2, 16, 64, {}),                                        # the plan's tile
    (4, 2, 32, 96, {"block_n": 16, "block_k": 32}),            # 3 K steps: the loop's tail
    (4, 2, 16, 64, {"block_n": 64, "block_k": 16}),            # a tile over q, k and v heads
    (2, 1, 24, 48, {"block_n": 8, "block_k": 16}),             # D / 2 = 12: tiles across heads
])
def test_fused_is_the_gemv_then_the_rotary(hq, hkv, d, k, tuning, m, slots, dtype, bits):
    """q and the cache (slot -1: nothing stored) are, bit for bit, those of the plain GEMV
    followed by the rotary kernel that stores k / v, for GQA heads and positions whose
    angles are large."""
    if not bits and DEVICE.type != "cuda":
        pytest.skip("the hardware cvt is inline assembly: GPU only")
    x, weight, scale, table, pos, cache = _case(m, hq, hkv, d, k, dtype)
    slots = torch.tensor(slots, device=DEVICE)
    tuning = dict(tuning, bits=bits)
    plain_cache = cache.clone()
    plain_q = _unfused(x, weight, scale, table, pos, plain_cache, slots, hq, hkv, d, tuning)
    q = fp8_gemv_qkv_rope(x, weight, scale, pos, table, hq, hkv, d,
                          KVStore(None, cache[0], cache[1], slots), **tuning)
    assert q.shape == (m, hq * d) and q.dtype == dtype
    assert torch.equal(q, plain_q)
    assert torch.equal(cache, plain_cache)
    stored = int((slots >= 0).sum())
    assert int((cache != FILL).any(-1).any(-1).sum()) == 2 * stored  # K and V of each slot


def test_fused_into_an_fp8_cache():
    """A float8 e4m3 cache (kv_cache_dtype="fp8"): k and v cast as the rotary kernel's
    store casts them."""
    x, weight, scale, table, pos, cache = _case(2, 4, 2, 16, 64, torch.bfloat16,
                                                cache_dtype=FP8)
    slots = torch.tensor([3, 12], device=DEVICE)
    plain_cache = cache.clone()
    plain_q = _unfused(x, weight, scale, table, pos, plain_cache, slots, 4, 2, 16, {})
    q = fp8_gemv_qkv_rope(x, weight, scale, pos, table, 4, 2, 16,
                          KVStore(None, cache[0], cache[1], slots))
    assert torch.equal(q, plain_q)
    assert torch.equal(cache.view(torch.uint8), plain_cache.view(torch.uint8))
    assert int((cache.float() != FILL).any(-1).any(-1).sum()) == 4


def _rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp(min=1e-12)).item()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2.0**-7)])
def test_fused_against_float32_reference(dtype, tol):
    """q and the stored k / v against float32 torch: the projection, the rotation of its q
    and k halves, the two slots' rows of the cache."""
    hq, hkv, d = 4, 2, 32
    x, weight, scale, table, pos, cache = _case(2, hq, hkv, d, 64, dtype, seed=1)
    slots = torch.tensor([6, 1], device=DEVICE)
    q = fp8_gemv_qkv_rope(x, weight, scale, pos, table, hq, hkv, d,
                          KVStore(None, cache[0], cache[1], slots))
    ref = fp8_gemv_ref(x.float(), weight, scale)
    rq = ref[:, : hq * d].clone()
    rk = ref[:, hq * d: (hq + hkv) * d].clone()
    rotary_embedding_ref(pos, rq, rk, table, d)
    rv = ref[:, (hq + hkv) * d:]
    assert _rel_err(q, rq) < tol
    flat = cache.view(2, BLOCKS * BLOCK_SIZE, hkv * d)
    assert _rel_err(flat[0, slots], rk) < tol
    assert _rel_err(flat[1, slots], rv) < tol
    assert _rel_err(q[:, :d], ref[:, :d]) > 0.1  # position 3000 does rotate


def test_refuses_what_it_does_not_support():
    """None, nothing written, for: a partial rotary table, a cache dtype that is neither
    x's nor e4m3, 3 rows, a weight that is not [q | k | v] of the given heads, positions or
    slots not one per row."""
    hq, hkv, d = 4, 2, 16
    x, weight, scale, table, pos, cache = _case(2, hq, hkv, d, 64, torch.bfloat16)
    slots = torch.tensor([1, 2], device=DEVICE)

    def call(x=x, weight=weight, scale=scale, table=table, pos=pos, kc=cache[0], vc=cache[1],
             slots=slots, hkv=hkv):
        return fp8_gemv_qkv_rope(x, weight, scale, pos, table, hq, hkv, d,
                                 KVStore(None, kc, vc, slots))

    half16 = cache.to(torch.float16)
    assert call(table=table[:, : d // 2].contiguous()) is None
    assert call(kc=half16[0], vc=half16[1]) is None
    assert call(x=torch.cat([x, x[:1]]), pos=torch.cat([pos, pos[:1]]),
                slots=torch.cat([slots, slots[:1]])) is None
    assert call(hkv=1) is None
    assert call(pos=pos[:1]) is None
    assert call(slots=slots[:1]) is None
    assert bool((cache == FILL).all())
    assert call() is not None  # and the case itself runs
    assert not bool((cache == FILL).all())


def _layer(hq, hkv, d):
    return types.SimpleNamespace(num_heads=hq, num_kv_heads=hkv, head_dim=d, fp8_gemv=True,
                                 output_partition_sizes=[hq * d, hkv * d, hkv * d])


def test_linear_method_conditions(monkeypatch):
    """``fp8_linear.qkv_rope_gemv`` (the FP8 methods' apply_qkv_rope): the fused q only
    under OCTAVO_FUSED_QKV_ROPE (on by default), without a bias, where the one-row GEMV runs (here forced:
    it applies on CUDA only) and not the CUDA float8 kernel; the same q as the kernel's."""
    from octavo.quantization import fp8_linear

    hq, hkv, d = 4, 2, 16
    x, weight, scale, table, pos, cache = _case(1, hq, hkv, d, 64, torch.bfloat16)
    slots = torch.tensor([2], device=DEVICE)
    store = KVStore(None, cache[0], cache[1], slots)
    layer = _layer(hq, hkv, d)
    monkeypatch.setattr(fp8_linear, "gemv_applies", lambda layer, x2: True)
    monkeypatch.setattr(fp8_linear, "cuda_mma_takes", lambda *a: False)

    def call(bias=None):
        return fp8_linear.qkv_rope_gemv(layer, x, weight, scale, bias, pos, table, store)

    monkeypatch.setenv("OCTAVO_FUSED_QKV_ROPE", "0")
    assert call() is None
    monkeypatch.delenv("OCTAVO_FUSED_QKV_ROPE", raising=False)  # on by default
    assert call(bias=torch.zeros(weight.shape[0], device=DEVICE)) is None
    monkeypatch.setattr(fp8_linear, "cuda_mma_takes", lambda *a: True)
    assert call() is None
    monkeypatch.setattr(fp8_linear, "cuda_mma_takes", lambda *a: False)
    assert bool((cache == FILL).all())
    q = call()
    expect = fp8_gemv_qkv_rope(x, weight, scale, pos, table, hq, hkv, d,
                               KVStore(None, cache[0].clone(), cache[1].clone(), slots))
    assert torch.equal(q, expect)


def test_methods_with_a_rotating_store_say_so():
    """Every registered linear method that overrides ``apply_qkv_rope`` declares
    ``has_qkv_rope`` (the attention builds its KV store only for those), and no other does."""
    import importlib
    import pkgutil

    import octavo.quantization as pkg
    from octavo.quantization.base import LinearMethod

    for info in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{pkg.__name__}.{info.name}")
    seen, stack = [], [LinearMethod]
    while stack:
        cls = stack.pop()
        seen.append(cls)
        stack.extend(cls.__subclasses__())
    overriding = {c for c in seen if c.apply_qkv_rope is not LinearMethod.apply_qkv_rope}
    assert len(overriding) >= 2  # both FP8 methods
    for cls in seen:
        assert cls.has_qkv_rope == (cls in overriding), cls
