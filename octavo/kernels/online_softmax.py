"""The online-softmax step every paged-attention kernel takes per K/V tile (the per-request
launch's ``_attn_kv_loop`` and stream-K's walk): one source, so the kernels round alike."""

from __future__ import annotations

from octavo.kernels.triton_utils import tl, triton


@triton.jit
def softmax_step(s, m_i, l_i):
    """Scores ``s`` [BLOCK_M, BLOCK_N] (log2 scale) into the running max ``m_i`` and sum
    ``l_i``: (p, alpha, m_new, l_new), with ``alpha`` the rescale of the running state."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_new = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_new


@triton.jit
def pv_dot(p, v, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr):
    """``p @ v`` with p rounded to v's dtype as the MMA takes it; UPCAST_DOT: the same
    rounding of p, an fp32 dot (Triton's CPU interpreter mis-computes bf16 dots)."""
    if UPCAST_DOT:
        pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32))
    else:
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return pv
