"""A step's host data reaches the device without the host waiting for it: the penalties'
flat indices, logit_bias, allowed ids and bans, copied from pinned memory in stream order
(a pageable copy synchronizes the stream, and the step's overlap with the device is lost)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo import SamplingParams
from octavo.sample.logits_processors import RowCache, RowContext, apply_logits_processors
from octavo.sample.upload import to_device

VOCAB = 1000


@pytest.mark.parametrize("values, dtype, want", [
    ([3, 1, 2], torch.long, torch.long),
    ([0.5, -1.0], torch.float32, torch.float32),
    (np.array([7, 8], dtype=np.int64), None, torch.int64),
    (np.arange(6, dtype=np.int64)[::2], None, torch.int64),  # not contiguous
    (torch.tensor([1, 2], dtype=torch.int32), torch.long, torch.long),
    ([], torch.long, torch.long),
])
def test_to_device_keeps_values_and_dtype(values, dtype, want):
    out = to_device(values, torch.device("cpu"), dtype)
    assert out.dtype == want
    assert out.tolist() == [float(v) if want.is_floating_point else int(v)
                            for v in (values.tolist() if hasattr(values, "tolist") else values)]


def _rows(prompt_len: int, out_len: int, n: int) -> list[RowContext]:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        tokens = rng.integers(0, VOCAB, prompt_len + out_len).tolist()
        params = SamplingParams(repetition_penalty=1.2, frequency_penalty=0.4,
                                presence_penalty=0.3, logit_bias={5: 1.0, 9: -2.0},
                                allowed_token_ids=list(range(0, VOCAB, 2)) if i % 2 else None)
        rows.append(RowContext.over(i, params, tokens, prompt_len, banned=[i, 11],
                                    cache=RowCache()))
    return rows


@pytest.mark.gpu
def test_logits_processing_queues_its_copies_without_a_host_wait():
    """Every kind of processing on a CUDA batch, first step (caches built) and later steps,
    under torch's sync debug mode set to raise: no operation waits for the device. The result
    equals the same processing on the CPU."""
    dev = torch.device("cuda")
    logits = torch.randn(8, VOCAB, generator=torch.Generator().manual_seed(1))
    want = apply_logits_processors(logits.clone(), _rows(50, 20, 8))
    rows = _rows(50, 20, 8)
    gpu = logits.to(dev)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = apply_logits_processors(gpu.clone(), rows)
        again = apply_logits_processors(gpu.clone(), rows)  # the kept caches
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(again.cpu(), want)


def _sample_processed(device: str) -> torch.Tensor:
    """Rows with allowed ids (even tokens) and a logit_bias that makes token 6 win, drawn at
    temperature 1 through the Sampler: on CUDA the race kernel takes the processed logits."""
    from octavo.sample.metadata import SamplingMetadata
    from octavo.sample.sampler import Sampler

    dev = torch.device(device)
    b = 64
    logits = torch.randn(b, VOCAB, generator=torch.Generator().manual_seed(2)).to(dev)
    rows = []
    for i in range(b):
        params = SamplingParams(temperature=1.0, allowed_token_ids=list(range(0, VOCAB, 2)),
                                logit_bias={6: 60.0} if i % 2 else None,
                                repetition_penalty=1.3)
        rows.append(RowContext.over(i, params, [1, 2, 3, 6], 4, cache=RowCache()))
    temp = torch.ones(b, device=dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    meta = SamplingMetadata(False, temp, None, None, None, {}, None, rows, gen)
    return Sampler()(logits, meta).sampled.cpu()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_processed_rows_are_drawn_from_the_processed_logits(device):
    sampled = _sample_processed(device)
    assert (sampled % 2 == 0).all(), sampled  # allowed_token_ids held
    assert (sampled[1::2] == 6).all(), sampled  # the +60 bias won (penalty 1.3 or not)
    assert len(set(sampled[0::2].tolist())) > 4  # the others are still drawn


@pytest.mark.gpu
def test_the_sync_counter_sees_a_pageable_upload_and_not_a_pinned_one():
    """benchmarks/host_syncs.py's counter: a pageable upload is counted, ``to_device``'s
    pinned one is not."""
    import collections

    from benchmarks.host_syncs import counting_syncs

    sites: collections.Counter = collections.Counter()
    with counting_syncs(sites):
        to_device([1, 2, 3], torch.device("cuda"), torch.long)
    assert not sites, sites
    with counting_syncs(sites):
        torch.tensor([1, 2, 3], device="cuda")
    assert sum(sites.values()) >= 1, sites
