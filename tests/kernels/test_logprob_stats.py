"""The one-pass logprob statistics (octavo/kernels/logprob_stats.py) against the float32
log-softmax: log Z and the sampled tokens' logprobs close, ranks equal, in every logits dtype,
split and unsplit vocabularies, rows with -inf (masked) logits, ties, and at W1's real shape on
the GPU."""

from __future__ import annotations

import pytest
import torch

from octavo.kernels.logprob_stats import logprob_stats, logprob_stats_ref


def _case(b, v, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(b, v, generator=g) * 3).to(dtype)
    sampled = torch.randint(0, v, (b,), generator=g)
    return x.to(device), sampled.to(device)


def _check(x, sampled, atol=1e-5):
    got = logprob_stats(x, sampled)
    want = logprob_stats_ref(x, sampled)
    torch.testing.assert_close(got[0], want[0], atol=atol, rtol=1e-6)
    torch.testing.assert_close(got[1], want[1], atol=atol, rtol=1e-6)
    assert got[2].dtype == torch.int64 and got[2].tolist() == want[2].tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("b,v", [(3, 37), (5, 1000), (2, 20000)])  # 1, 1, 3 splits
def test_matches_the_log_softmax(device, dtype, b, v):
    x, sampled = _case(b, v, dtype, device)
    _check(x, sampled)


def test_ranks_count_ties_as_not_above(device):
    x = torch.zeros(2, 40, device=device)
    x[0, 5] = x[0, 9] = 2.0  # the sampled token ties another: neither is above the other
    x[1, 3] = 1.0
    sampled = torch.tensor([9, 0], device=device)
    _, token, ranks = logprob_stats(x, sampled)
    assert ranks.tolist() == [1, 2]
    torch.testing.assert_close(token, torch.log_softmax(x, -1)[[0, 1], [9, 0]])


def test_masked_logits_and_a_masked_split(device):
    """-inf logits (a grammar's or a bias's mask) count for nothing, even a whole split's; a
    row of nothing but -inf has log Z = -inf."""
    x, sampled = _case(3, 20000, torch.float32, device, seed=1)  # 3 splits of 8192
    x[0, :12000] = float("-inf")
    sampled[0] = 15000
    x[2] = float("-inf")
    log_z, token, ranks = logprob_stats(x, sampled)
    want = logprob_stats_ref(x[:2], sampled[:2])
    torch.testing.assert_close(log_z[:2], want[0], atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(token[:2], want[1], atol=1e-5, rtol=1e-6)
    assert ranks[:2].tolist() == want[2].tolist()
    assert log_z[2].item() == float("-inf") and ranks[2].item() == 1


def test_strided_rows(device):
    """Rows of a larger tensor (the logits of a step's sampling rows) are read in place."""
    x, sampled = _case(4, 130, torch.float32, device, seed=2)
    wide = torch.zeros(4, 200, device=device)
    wide[:, :130] = x
    _check(wide[:, :130], sampled)


@pytest.mark.gpu
@pytest.mark.parametrize("b", [1, 7, 256])
def test_w1_shape_gpu(b):
    x, sampled = _case(b, 151936, torch.bfloat16, torch.device("cuda"), seed=b)
    _check(x, sampled, atol=2e-5)


def _sampler_case(device, greedy: bool):
    from octavo.sample.metadata import SamplingMetadata

    x, _ = _case(4, 300, torch.bfloat16, device, seed=3)
    temp = torch.zeros(4, device=device) if greedy else torch.full((4,), 0.8, device=device)
    meta = SamplingMetadata(greedy, None if greedy else temp, None, None, None, {}, 5, [],
                            torch.Generator(device=device).manual_seed(0))
    return x, meta


@pytest.mark.parametrize("greedy", [True, False])
def test_the_sampler_takes_the_kernel_without_a_float_copy(device, greedy, monkeypatch):
    """Rows wanting logprobs and no processing: the draw (greedy argmax or the one-pass race)
    and the logprobs come from the raw logits; the same tokens' logprobs, ranks and top 5 as
    the float32 log-softmax path."""
    from octavo.sample import sampler as sampler_mod
    from octavo.sample.sampler import Sampler

    monkeypatch.setattr(sampler_mod, "stats_kernel", lambda logits: True)
    if not greedy:  # the race runs where Triton does (the interpreter here)
        monkeypatch.setattr(Sampler, "_races", staticmethod(
            lambda logits, meta: not meta.all_greedy))
    x, meta = _sampler_case(device, greedy)
    floats = []
    real_float = torch.Tensor.float
    monkeypatch.setattr(torch.Tensor, "float", lambda t: floats.append(t.shape) or real_float(t))
    out = Sampler()(x, meta)
    assert (4, 300) not in floats  # no float32 copy of the logits
    monkeypatch.setattr(torch.Tensor, "float", real_float)
    lp = torch.log_softmax(x.float(), dim=-1)
    if greedy:
        assert out.sampled.tolist() == x.float().argmax(-1).tolist()
    rows = torch.arange(4, device=device)
    torch.testing.assert_close(out.sampled_logprobs, lp[rows, out.sampled], atol=1e-5, rtol=0)
    want_rank = (lp > lp[rows, out.sampled].unsqueeze(1)).sum(-1) + 1
    assert out.sampled_ranks.tolist() == want_rank.tolist()
    vals, ids = lp.topk(5, dim=-1)
    assert out.topk_ids.tolist() == ids.tolist()
    torch.testing.assert_close(out.topk_logprobs, vals, atol=1e-5, rtol=0)


@pytest.mark.gpu
def test_token_logprobs_gpu():
    """The sampled and prompt tokens' logprobs on CUDA (the kernel and the logits' own top k)
    against the float32 log-softmax, bf16 logits of W1's vocabulary."""
    from octavo.sample.sampler import token_logprobs

    x, tokens = _case(33, 151936, torch.bfloat16, torch.device("cuda"), seed=5)
    token_lp, ranks, ids, vals = token_logprobs(x, tokens, 5)
    lp = torch.log_softmax(x.float(), dim=-1)
    rows = torch.arange(33, device="cuda")
    torch.testing.assert_close(token_lp, lp[rows, tokens], atol=2e-5, rtol=0)
    assert ranks.tolist() == ((lp > lp[rows, tokens].unsqueeze(1)).sum(-1) + 1).tolist()
    want_vals, want_ids = lp.topk(5, dim=-1)
    torch.testing.assert_close(vals, want_vals, atol=2e-5, rtol=0)
    assert torch.equal(lp.gather(1, ids), lp.gather(1, want_ids))  # ties may reorder
    assert token_logprobs(x, tokens, 0)[2:] == (None, None)
