"""Sampling draws from the right distribution, and logprobs match transformers.

The distribution tests feed the Sampler fixed logits over a tiny vocabulary and compare
the empirical counts with the filtered, renormalised target by a chi-square test; each one
would fail if its filter (temperature / top-k / top-p / min-p) were wrong or missing.
"""

from __future__ import annotations

import random

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.sample.metadata import SamplingMetadata
from octavo.sample.sampler import Sampler
from tests.tiny_models import make_checkpoint

LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0])
N = 20000
CHI2_CRIT_0999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}


def _draw(temperature=1.0, top_k=None, top_p=None, min_p=None, seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    b = N
    meta = SamplingMetadata(
        all_greedy=False,
        temperature=torch.full((b,), temperature),
        top_k=None if top_k is None else torch.full((b,), top_k, dtype=torch.int64),
        top_p=None if top_p is None else torch.full((b,), top_p),
        min_p=None if min_p is None else torch.full((b,), min_p),
        generators={}, max_num_logprobs=None, generator=gen)
    out = Sampler()(LOGITS.repeat(b, 1), meta)
    return torch.bincount(out.sampled, minlength=len(LOGITS))


def _target(temperature=1.0, keep=None) -> torch.Tensor:
    p = torch.softmax(LOGITS / temperature, dim=-1)
    if keep is not None:
        mask = torch.zeros_like(p, dtype=torch.bool)
        mask[keep] = True
        p = torch.where(mask, p, torch.zeros_like(p))
        p = p / p.sum()
    return p


def _reference_keep(t: float, k: int | None, p: float) -> list[int]:
    """Tokens kept by top-k then top-p, written out longhand (independent of the Sampler)."""
    order = sorted(range(len(LOGITS)), key=lambda i: -LOGITS[i].item())[: k or len(LOGITS)]
    probs = torch.softmax(LOGITS[order] / t, dim=-1).tolist()
    kept, mass = [], 0.0
    for idx, prob in zip(order, probs):
        if mass >= p:
            break
        kept.append(idx)
        mass += prob
    return sorted(kept)


def _chi_square_ok(counts: torch.Tensor, p: torch.Tensor) -> bool:
    support = p > 0
    assert counts[~support].sum() == 0, f"drew tokens outside the support: {counts}"
    expected = p[support] * counts.sum()
    stat = ((counts[support] - expected) ** 2 / expected).sum().item()
    dof = int(support.sum()) - 1
    return dof == 0 or stat < CHI2_CRIT_0999[dof]


@pytest.mark.parametrize("case", [
    dict(kw=dict(temperature=1.0), keep=None, t=1.0),
    dict(kw=dict(temperature=0.5), keep=None, t=0.5),
    dict(kw=dict(temperature=2.0), keep=None, t=2.0),
    dict(kw=dict(top_k=3), keep=[0, 1, 2], t=1.0),
    # softmax mass 0.40, 0.24, 0.15 ...: the mass before token 2 is 0.65 >= 0.6, so top_p=0.6
    # keeps tokens 0 and 1.
    dict(kw=dict(top_p=0.6), keep=[0, 1], t=1.0),
    # min_p=0.2: keep tokens with p >= 0.2 * p_max, i.e. logit >= 2 + ln(0.2) = 0.39.
    dict(kw=dict(min_p=0.2), keep=[0, 1, 2, 3], t=1.0),
    dict(kw=dict(temperature=0.7, top_k=5, top_p=0.9), keep=None, t=0.7),
])
def test_sampling_distribution(case):
    keep = case["keep"]
    if keep is None and "top_p" in case["kw"]:
        keep = _reference_keep(case["t"], case["kw"].get("top_k"), case["kw"]["top_p"])
        # top-k first, then the nucleus over the renormalised top-k: 0.525, 0.257, 0.126
        # reach 0.908 before token 3, so token 3 is dropped.
        assert keep == [0, 1, 2]
    counts = _draw(**case["kw"])
    assert _chi_square_ok(counts, _target(case["t"], keep)), counts


def test_chi_square_detects_a_missing_filter():
    """The test has power: unfiltered draws fail the top-k target."""
    counts = _draw(temperature=1.0)
    with pytest.raises(AssertionError):
        assert _chi_square_ok(counts, _target(1.0, [0, 1, 2]))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_checkpoint("qwen2", str(tmp_path_factory.mktemp("qwen2-lp")))


def test_logprobs_match_transformers(tiny):
    from transformers import AutoModelForCausalLM

    llm = LLM(model=tiny, dtype="float32", skip_tokenizer_init=True)
    rng = random.Random(5)
    prompt = [rng.randrange(3, 512) for _ in range(20)]
    out = llm.generate({"prompt_token_ids": prompt},
                       SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True,
                                      logprobs=5), use_tqdm=False)[0].outputs[0]
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        ref = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    cumulative = 0.0
    for i, (tok, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        row = ref[len(prompt) - 1 + i]
        assert entry[tok].logprob == pytest.approx(row[tok].item(), abs=1e-4)
        assert entry[tok].rank == 1  # greedy picks the top token
        top_vals, top_ids = row.topk(5)
        for v, t in zip(top_vals.tolist(), top_ids.tolist()):
            assert entry[t].logprob == pytest.approx(v, abs=1e-4)
        cumulative += row[tok].item()
    assert out.cumulative_logprob == pytest.approx(cumulative, abs=1e-3)


@pytest.mark.parametrize("chunk", [None, 8])
def test_prompt_logprobs_match_transformers(tiny, chunk):
    """prompt_logprobs, also when the prompt is prefilled in 8-token chunks."""
    from transformers import AutoModelForCausalLM

    kwargs = {} if chunk is None else dict(max_num_batched_tokens=chunk)
    llm = LLM(model=tiny, dtype="float32", skip_tokenizer_init=True, **kwargs)
    rng = random.Random(6)
    prompt = [rng.randrange(3, 512) for _ in range(21)]
    out = llm.generate({"prompt_token_ids": prompt},
                       SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True,
                                      prompt_logprobs=3), use_tqdm=False)[0]
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([prompt])).logits[0].float(), dim=-1)
    plp = out.prompt_logprobs
    assert len(plp) == len(prompt) and plp[0] is None
    for j in range(1, len(prompt)):
        row, tok = ref[j - 1], prompt[j]
        assert plp[j][tok].logprob == pytest.approx(row[tok].item(), abs=1e-4)
        assert plp[j][tok].rank == int((row > row[tok]).sum()) + 1
        for v, t in zip(*row.topk(3)):
            assert plp[j][int(t)].logprob == pytest.approx(v.item(), abs=1e-4)
