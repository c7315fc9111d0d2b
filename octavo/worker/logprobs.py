"""A step's logprobs on their way back to the engine: the sampled tokens' (from the sampler)
and the prompt's (computed here from the prefill chunk's hidden states, a slice of positions
at a time). Their values are copied to the host in stream order (pinned memory on CUDA) at
the step's launch and read as lists only once the step's copies are done (``StepHandle``'s
finish): reading device tensors at launch waited for the device, so a request asking for
logprobs made the engine synchronous."""

from __future__ import annotations

import torch

from octavo.sample.sampler import SamplerOutput, token_logprobs
from octavo.sample.upload import to_device

# Float32 logits a prompt_logprobs slice may hold at once (its log-softmax doubles it).
PROMPT_LOGPROBS_BYTES = 256 * 2**20
_SAMPLED_FIELDS = ("sampled_logprobs", "sampled_ranks", "topk_ids", "topk_logprobs")


def to_host(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` copied to pinned host memory in stream order (CUDA), or as it is (CPU)."""
    if t is None or not t.is_cuda:
        return t
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)


def sampled_to_host(out: SamplerOutput) -> None:
    """Replace ``out``'s logprob tensors by their host copies (queued now, with the tokens'):
    the step's result then reads host memory (a .tolist() of the device tensors would wait
    for the next step's forward too)."""
    for field in _SAMPLED_FIELDS:
        setattr(out, field, to_host(getattr(out, field)))


def sampled_logprobs(states, out: SamplerOutput):
    """request id -> (logprob, rank, top ids, top logprobs) of the sampled token, for the
    requests of ``states`` (the step's sampling rows) that asked; None when none did."""
    if out.sampled_logprobs is None:
        return None
    lps = out.sampled_logprobs.tolist()
    ranks = out.sampled_ranks.tolist()
    top_ids = out.topk_ids.tolist() if out.topk_ids is not None else None
    top_lps = out.topk_logprobs.tolist() if out.topk_logprobs is not None else None
    result = {}
    for i, st in enumerate(states):
        k = st.sampling_params.logprobs
        if k is None:
            continue
        if top_ids and k:
            ids, vals = top_ids[i], top_lps[i]
            if k != -1 and k < len(ids):
                ids, vals = ids[:k], vals[:k]
            result[st.req_id] = (lps[i], ranks[i], ids, vals)
        else:
            result[st.req_id] = (lps[i], ranks[i], (), ())
    return result


def prompt_logprobs(model, vocab: int, states, num_new, num_computed, hidden, qsl):
    """For requests asking prompt_logprobs: the logprob (and rank, and top-k) of each prompt
    token given the tokens before it, over this step's prefill chunk, as host copies in
    flight (``resolve_prompt_logprobs`` reads them); None when no request asked."""
    result = None
    for i, st in enumerate(states):
        k = st.sampling_params.prompt_logprobs
        if k is None:
            continue
        nc = num_computed[i]
        end = min(nc + num_new[i], st.num_prompt_tokens - 1)  # position p predicts p+1
        if end <= nc:
            continue
        start = int(qsl[i])
        targets = st.token_ids[nc + 1: end + 1]
        k = vocab if k == -1 else k
        # A slice of rows at a time: a whole chunk's float32 logits (8,192 positions of a
        # 128k vocabulary: 4 GiB, twice with the log-softmax) is memory the start-up profile
        # never saw, so one request could push the device out of memory.
        rows = max(1, PROMPT_LOGPROBS_BYTES // (4 * vocab))
        parts = []
        for a in range(0, end - nc, rows):
            b = min(a + rows, end - nc)
            logits = model.compute_logits(hidden[start + a: start + b])
            tgt = to_device(targets[a:b], logits.device, torch.long)
            parts.append(tuple(to_host(t) for t in token_logprobs(logits, tgt, k)))
            del logits
        result = result or {}
        result[st.req_id] = (nc, targets, k > 0, parts)
    return result


def resolve_prompt_logprobs(raw):
    """``prompt_logprobs``' host copies as the engine's lists (their copies are done): request
    id -> (first position, targets, token logprobs, ranks, top ids or None, top logprobs or
    None)."""
    if raw is None:
        return None
    out = {}
    for rid, (nc, targets, with_top, parts) in raw.items():
        tok_lps, ranks = [], []
        top_ids: list | None = [] if with_top else None
        top_lps: list | None = [] if with_top else None
        for lp, rank, ids, vals in parts:
            tok_lps += lp.tolist()
            ranks += rank.tolist()
            if with_top:
                top_ids += ids.tolist()
                top_lps += vals.tolist()
        out[rid] = (nc, targets, tok_lps, ranks, top_ids, top_lps)
    return out
