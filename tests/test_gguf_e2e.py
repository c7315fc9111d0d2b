"""The real default model end to end: SmolLM2-135M-Instruct from its GGUF file, greedy, token for
token against transformers loading the same file in float32."""

from __future__ import annotations

import os

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.default_model import default_model_path

NEW_TOKENS = 32
EOS = 2  # <|im_end|>, from the GGUF metadata
QUESTIONS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain in one paragraph what a KV cache is.",
    "List three prime numbers and say why they are prime.",
    "How do I reverse a list in Python?",
]
HAIKU = "Write a haiku about paging."


def _gguf_path() -> str:
    try:
        return default_model_path()
    except ValueError as e:
        pytest.skip(f"default model not installed: {e}")


@pytest.fixture(scope="module")
def llm() -> LLM:
    _gguf_path()
    # An explicit dtype: the GGUF weights dequantized to float32 (the quantized path is the
    # default only with dtype="auto").
    return LLM(dtype="float32")


def _chat(tok, question: str) -> str:
    return tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                   add_generation_prompt=True)


@pytest.fixture(scope="module")
def octavo_runs(llm):
    """One batched run: the questions (greedy, EOS ignored) and the haiku (default stopping)."""
    tok = llm.get_tokenizer()
    prompts = [_chat(tok, q) for q in QUESTIONS] + [_chat(tok, HAIKU)]
    greedy = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    haiku = SamplingParams(temperature=0.0, max_tokens=256)
    outs = llm.generate(prompts, [greedy] * len(QUESTIONS) + [haiku], use_tqdm=False)
    return outs[:-1], outs[-1]


def test_chat_prompts_tokenized_like_the_template(llm, octavo_runs):
    tok = llm.get_tokenizer()
    outs, _ = octavo_runs
    for out, q in zip(outs, QUESTIONS):
        assert out.prompt == _chat(tok, q)
        assert out.prompt.startswith("<|im_start|>system\n")
        assert out.prompt.endswith("<|im_start|>assistant\n")
        ids = list(out.prompt_token_ids)
        assert ids == tok(out.prompt, add_special_tokens=False)["input_ids"]
        assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")  # special tokens parsed


@pytest.mark.slow  # ~40 s: transformers dequantizes the GGUF, then decodes one prompt at a time
def test_greedy_matches_transformers(octavo_runs):
    from transformers import AutoModelForCausalLM

    path = _gguf_path()
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # like ignore_eos=True: EOS is a plain token
    outs, _ = octavo_runs
    expected = []
    with torch.no_grad():
        for out in outs:
            ids = torch.tensor([list(out.prompt_token_ids)])
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=NEW_TOKENS, pad_token_id=0)
            expected.append(gen[0, ids.shape[1]:].tolist())
    got = [list(o.outputs[0].token_ids) for o in outs]
    for q, g, e in zip(QUESTIONS, got, expected):
        assert len(g) == NEW_TOKENS
        assert g == e, f"{q!r}: octavo {g} != transformers {e}"
    for o in outs:
        assert o.outputs[0].finish_reason == "length"


def test_haiku_stops_at_im_end(llm, octavo_runs):
    _, out = octavo_runs
    c = out.outputs[0]
    assert c.finish_reason == "stop"
    assert c.stop_reason is None  # EOS, not a stop string or an extra stop token
    assert c.token_ids[-1] == EOS
    assert EOS not in c.token_ids[:-1]
    assert 5 < len(c.token_ids) < 256
    assert c.text.strip() and "<|im_end|>" not in c.text
    assert c.text == llm.get_tokenizer().decode(c.token_ids[:-1], skip_special_tokens=True)


def test_seed_tuning_snippet_runs(llm, caplog):
    """The seed's tuning advice, as written, on the default model: penalties and min_p apply,
    length_penalty is accepted with a one-time warning."""
    from octavo import SamplingParams

    params = SamplingParams(temperature=0.7, top_p=0.9, frequency_penalty=0.5,
                            presence_penalty=0.3, min_p=0.05, length_penalty=1.2,
                            max_tokens=24, seed=0)
    with caplog.at_level("WARNING"):
        outs = llm.chat([[{"role": "user", "content": "Name three uses of a paged KV cache."}],
                         [{"role": "user", "content": "Write a haiku about paging."}]],
                        params, use_tqdm=False)
    assert all(o.outputs[0].token_ids and o.outputs[0].text for o in outs)
    warnings = [r for r in caplog.records if "length_penalty" in r.getMessage()]
    assert len(warnings) == 1
