"""The sampler's worst case, run inside the KV cache's memory profile
(``ModelRunner.profile_peak_memory``).

Every row of a full batch asks for penalties (a penalty row each, in a pool of its own,
freed after), top-k, top-p, min-p and the most logprobs allowed, so the sampler's temporaries
(the float32 copy, the sort of top-p, log-softmax) and the penalty rows count in the peak
the KV cache is sized after: a full batch of hostile requests then finds its memory. On CUDA
it also compiles the penalties kernel, the one-pass draw's variants and the logprob
statistics' before the first request needs them.
"""

from __future__ import annotations

import torch

from octavo import envs
from octavo.kernels.triton_available import HAS_TRITON
from octavo.sample.logits_processors import RowCache, RowContext
from octavo.sample.metadata import SamplingMetadata
from octavo.sample.penalty_rows import PenaltyRows
from octavo.sample.sampler import stats_kernel
from octavo.sampling_params import SamplingParams


def sample_worst_case(sampler, logits: torch.Tensor, max_logprobs: int) -> None:
    """Sample ``logits`` [rows, V] with ``sampler`` as the costliest batch could ask
    (``max_logprobs`` -1: the whole vocabulary)."""
    rows, vocab = logits.shape
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, min_p=0.01,
                            repetition_penalty=1.1, frequency_penalty=0.1,
                            presence_penalty=0.1)
    prompt = list(range(min(vocab, 8)))
    contexts = [RowContext.over(r, params, prompt + [r % vocab], len(prompt),
                                cache=RowCache()) for r in range(rows)]
    dev = logits.device
    full = torch.ones(rows, dtype=torch.float32, device=dev)
    meta = SamplingMetadata(
        False, full, torch.full((rows,), 50, dtype=torch.long, device=dev), full * 0.9,
        full * 0.01, {}, vocab if max_logprobs == -1 else max_logprobs, contexts,
        torch.Generator(device=dev).manual_seed(0),  # the engine's stream untouched
        penalties=PenaltyRows(rows))
    sampler(logits, meta)
    if logits.is_cuda and HAS_TRITON and envs.sample_kernel():
        # The one-pass draw's variants a run can reach (Triton specializes on whether the
        # vocabulary is split over programs: small batches are, full ones may not be; on
        # the logits as computed and on float32 processed ones; with and without rows of
        # their own seed), compiled now, not as a stall of the step that first needs one
        # (~0.2-0.3 s each on an H100).
        from octavo.kernels.sample_race import race_sample

        base = torch.zeros(1, dtype=torch.int64, device=dev)
        seeds = torch.zeros(rows, dtype=torch.int64, device=dev)
        for x in (logits, logits.float()):
            for b in sorted({1, rows}):
                race_sample(x[:b], full[:b], base)
                race_sample(x[:b], full[:b], base, seeds[:b])
    if stats_kernel(logits):
        # The logprob statistics' variants too (the raw logits' dtype and float32; the
        # vocabulary split or not).
        from octavo.kernels.logprob_stats import logprob_stats

        tokens = torch.zeros(rows, dtype=torch.int64, device=dev)
        for x in (logits, logits.float()):
            for b in sorted({1, rows}):
                logprob_stats(x[:b], tokens[:b])
