"""prompt_logprobs are computed a slice of positions at a time (``PROMPT_LOGPROBS_BYTES`` of
float32 logits), so a long prompt asking for them cannot take a whole chunk's logits (4 GiB
at 8,192 positions of a 128k vocabulary) the start-up memory profile never saw. The result
must not depend on the slicing, nor on chunked prefill cutting the prompt."""

from __future__ import annotations

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.worker import logprobs
from tests.tiny_models import make_checkpoint

PROMPT = [1] + [(7 * i + 3) % 250 + 2 for i in range(45)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_checkpoint("llama", str(tmp_path_factory.mktemp("plp")))


def _prompt_logprobs(tiny, **engine_kw):
    llm = LLM(model=tiny, dtype="float32", skip_tokenizer_init=True, max_model_len=128,
              **engine_kw)
    vocab = llm.llm_engine.config.model_config.hf_config.vocab_size
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=3, detokenize=False)
    out = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0]
    return vocab, out.prompt_logprobs


def test_slices_give_the_same_prompt_logprobs(tiny, monkeypatch):
    vocab, whole = _prompt_logprobs(tiny)
    assert whole[0] is None and len(whole) == len(PROMPT)
    monkeypatch.setattr(logprobs, "PROMPT_LOGPROBS_BYTES", 4 * vocab * 4)  # 4 rows
    shapes = []
    log_softmax = torch.log_softmax
    monkeypatch.setattr(torch, "log_softmax",
                        lambda x, dim: (shapes.append(x.shape[0]), log_softmax(x, dim=dim))[1])
    _, sliced = _prompt_logprobs(tiny)
    assert shapes == [4] * 11 + [1]  # 45 positions predict a next prompt token
    _, chunked = _prompt_logprobs(tiny, enable_chunked_prefill=True, max_num_batched_tokens=16)
    for got in (sliced, chunked):
        assert len(got) == len(whole)
        for a, b in zip(whole[1:], got[1:]):
            assert a.keys() == b.keys()
            for t in a:
                assert a[t].rank == b[t].rank
                assert a[t].logprob == pytest.approx(b[t].logprob, abs=1e-5)
