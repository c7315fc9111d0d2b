"""The KV cache is sized after a profile that includes the sampler's worst case: a full batch
with penalties, top-k / top-p / min-p and the most logprobs allowed (``profile_sampler``), so
a batch of such requests finds its memory. On the CPU the profile's code runs as it would;
on CUDA its peak is measured."""

from __future__ import annotations

import tempfile

import pytest
import torch

from octavo import LLM
from tests.tiny_models import make_checkpoint


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    folder = make_checkpoint("llama", str(tmp_path_factory.mktemp("sampler_profile")))
    llm = LLM(model=folder, dtype="float32", skip_tokenizer_init=True, max_model_len=64,
              max_num_seqs=8)
    return llm.llm_engine.executor.worker.runner


def test_the_worst_case_runs_every_sampler_path_and_keeps_nothing(runner):
    vocab = runner.config.model_config.hf_config.vocab_size
    pool = runner.penalty_rows
    calls = []
    original = runner.sampler.__class__._logprobs

    def spy(self, raw, sampled, k, out):
        calls.append(k)
        return original(self, raw, sampled, k, out)

    runner.sampler.__class__._logprobs = spy
    try:
        with torch.inference_mode():
            runner.profile_sampler(torch.randn(8, vocab))
    finally:
        runner.sampler.__class__._logprobs = original
    assert calls == [runner.config.model_config.max_logprobs]
    assert runner.penalty_rows is pool  # its own pool, not the runner's
    assert pool is None or pool.capacity == 0


@pytest.mark.gpu
def test_the_profile_peak_includes_the_sampler():
    """On CUDA: the sampler's worst case on a [rows, V] batch allocates at least the float32
    copy and the penalty rows (9 bytes per entry) beyond the logits."""
    folder = make_checkpoint("llama", tempfile.mkdtemp())
    llm = LLM(model=folder, dtype="bfloat16", skip_tokenizer_init=True, max_model_len=64,
              max_num_seqs=64, gpu_memory_utilization=0.3)
    runner = llm.llm_engine.executor.worker.runner
    vocab = runner.config.model_config.hf_config.vocab_size
    logits = torch.randn(64, vocab, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.inference_mode():
        runner.profile_sampler(logits)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - base >= 64 * vocab * 9


@pytest.mark.gpu
def test_after_the_profile_no_draw_compiles_the_race_kernel():
    """Every variant of the one-pass draw (and of the logprob statistics) a run reaches (raw
    and float32 logits, batches split over programs or not, rows with their own seeds) is
    compiled by the profile: a compile inside a step stalls every request of it (0.2-0.3 s
    on an H100)."""
    from benchmarks.common import TritonCompiles
    from octavo.kernels.logprob_stats import logprob_stats
    from octavo.kernels.sample_race import race_sample

    folder = make_checkpoint("llama", tempfile.mkdtemp())
    llm = LLM(model=folder, dtype="bfloat16", skip_tokenizer_init=True, max_model_len=64,
              max_num_seqs=64, gpu_memory_utilization=0.3)
    runner = llm.llm_engine.executor.worker.runner
    vocab = runner.config.model_config.hf_config.vocab_size
    base = torch.zeros(1, dtype=torch.int64, device="cuda")
    with TritonCompiles() as compiles:
        for dtype in (torch.bfloat16, torch.float32):
            for b in (1, 3, 17, 64):
                x = torch.randn(b, vocab, device="cuda", dtype=dtype)
                t = torch.ones(b, device="cuda")
                race_sample(x, t, base)
                race_sample(x, t, base, torch.arange(b, device="cuda"))
                logprob_stats(x, torch.arange(b, device="cuda"))
        torch.cuda.synchronize()
    assert not compiles.events, compiles.events
