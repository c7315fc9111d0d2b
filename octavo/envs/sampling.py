"""Sampling switches: the one-pass sampling kernel and guided decoding's bitmask."""

from __future__ import annotations

import os

from octavo.envs._parse import _flag


def sample_kernel() -> bool:
    """OCTAVO_SAMPLE_KERNEL (default on): on CUDA, temperature sampling in one Triton pass
    over the logits (octavo/kernels/sample_race.py) when no row needs top-k / top-p / min-p
    or logits processing (logprobs too, with OCTAVO_LOGPROB_KERNEL); off, the torch sampler
    runs every step."""
    return _flag("OCTAVO_SAMPLE_KERNEL", True)


def logprob_kernel() -> bool:
    """OCTAVO_LOGPROB_KERNEL (default on): on CUDA, the sampled tokens' logprobs and ranks
    in one Triton pass over the logits in their own dtype (octavo/kernels/logprob_stats.py),
    the top k from the logits; off, through the float32 log-softmax."""
    return _flag("OCTAVO_LOGPROB_KERNEL", True)


def grammar_mask_kernel() -> bool:
    """OCTAVO_GRAMMAR_MASK_KERNEL (default on): on CUDA, a guided step's token bitmask applied
    to the logits in one Triton launch (octavo/kernels/grammar_mask.py); off, the torch ops."""
    return _flag("OCTAVO_GRAMMAR_MASK_KERNEL", True)


def grammar_fill_threads() -> int | None:
    """OCTAVO_GRAMMAR_FILL_THREADS (default 1: inline on the engine thread): threads xgrammar
    fills a step's bitmask rows with (its pool pays off only for costly grammars)."""
    value = os.environ.get("OCTAVO_GRAMMAR_FILL_THREADS")
    if value is None or not value.strip():
        return None
    threads = int(value)
    if threads < 1:
        raise ValueError(f"OCTAVO_GRAMMAR_FILL_THREADS must be >= 1, got {value!r}")
    return threads
