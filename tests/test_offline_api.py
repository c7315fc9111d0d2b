"""The offline ``LLM`` API as a vLLM user meets it: input forms, output fields, validation errors
that leave the engine usable, seeds, stop conditions, and the progress bar.

Most tests use a tiny random llama checkpoint with token-id prompts (fast, no tokenizer). The
text-level behaviour (stop strings, special tokens, EOS) uses the real default model; its
generations are batched into two module-scoped runs because every engine step on this CPU
costs a good fraction of a second.
"""

from __future__ import annotations

import random

import pytest

from octavo import LLM, SamplingParams
from tests.tiny_models import COMMON, copy_with_eos, make_checkpoint

VOCAB = COMMON["vocab_size"]
MAX_LEN = 64


def _ids(outs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outs]


def _rand_prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(n)]


PROMPTS = [_rand_prompt(n, seed=n) for n in (1, 5, 17, 9)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


# --------------------------------------------------------------------------- tiny model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return make_checkpoint("llama", str(tmp_path_factory.mktemp("llama_api")))


@pytest.fixture(scope="module")
def tiny(tiny_dir) -> LLM:
    return LLM(model=tiny_dir, dtype="float32", skip_tokenizer_init=True, max_model_len=MAX_LEN)


@pytest.fixture(scope="module")
def baseline(tiny) -> list[list[int]]:
    """Greedy tokens for PROMPTS from a fresh engine, before any test has hit it with errors."""
    return _ids(tiny.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, use_tqdm=False))


def _still_works(llm: LLM, baseline: list[list[int]]) -> None:
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, use_tqdm=False)
    assert _ids(outs) == baseline
    assert not llm.llm_engine.has_unfinished_requests()


# ----------------------------------------------------------------- invalid SamplingParams

BAD_PARAMS = [
    (dict(temperature=-1), r"temperature.*-1"),
    (dict(temperature=float("nan")), r"temperature.*nan"),
    (dict(top_p=0), r"top_p.*0"),
    (dict(top_p=1.5), r"top_p.*1\.5"),
    (dict(top_k=-2), r"top_k.*-2"),
    (dict(min_p=2.0), r"min_p.*2"),
    (dict(max_tokens=0), r"max_tokens.*0"),
    (dict(max_tokens=-5), r"max_tokens.*-5"),
    (dict(n=0), r"\bn\b.*0"),
    (dict(min_tokens=-1), r"min_tokens.*-1"),
    (dict(min_tokens=10, max_tokens=5), r"min_tokens.*max_tokens=5.*10"),
    (dict(seed="abc"), r"seed.*abc"),
    (dict(stop=[""]), r"stop.*empty"),
    (dict(stop_token_ids=[-3]), r"stop_token_ids.*-3"),
    (dict(logprobs=-2), r"logprobs.*-2"),
    (dict(presence_penalty=3.0), r"presence_penalty.*3"),
]


@pytest.mark.parametrize("kwargs,pattern", BAD_PARAMS, ids=[str(k) for k, _ in BAD_PARAMS])
def test_invalid_sampling_params(tiny, baseline, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        tiny.generate([{"prompt_token_ids": PROMPTS[0]}], SamplingParams(**kwargs),
                      use_tqdm=False)
    _still_works(tiny, baseline)


# -------------------------------------------------------------------- invalid prompts

def _too_long():
    return {"prompt_token_ids": _rand_prompt(MAX_LEN + 6, seed=1)}


BAD_REQUESTS = {
    "empty_text": (lambda: "", None, r"prompt is empty"),
    "empty_token_list": (lambda: [[]], None, r"prompt_token_ids is empty"),
    "empty_token_dict": (lambda: {"prompt_token_ids": []}, None, r"prompt_token_ids is empty"),
    "too_long": (_too_long, None, rf"{MAX_LEN + 6}.*max_model_len={MAX_LEN}"),
    "token_id_too_big": (lambda: [[5, VOCAB, 7]], None, rf"{VOCAB}.*\[0, {VOCAB}\)"),
    "token_id_negative": (lambda: [[5, -1]], None, r"-1"),
    "token_id_not_int": (lambda: [[5, "x"]], None, r"'x'"),
    "dict_without_ids": (lambda: {"tokens": [1, 2]}, None, r"prompt_token_ids.*tokens"),
    "text_without_tokenizer": (lambda: "hello", None, r"tokenizer"),
    "unsupported_prompt_logprobs_n": (lambda: [[5, 6]], SamplingParams(n=2, prompt_logprobs=1),
                                      r"prompt_logprobs with n > 1"),
    "unsupported_beam_option": (lambda: [[5, 6]], SamplingParams(
        use_beam_search=True, temperature=0.0, presence_penalty=0.5),
        r"presence_penalty=0.5 is not supported with use_beam_search"),
    "stop_without_tokenizer": (lambda: [[5, 6]], SamplingParams(stop=["x"]), r"stop"),
    "params_count": (lambda: [[5], [6], [7]], [SamplingParams()] * 2,
                     r"2 sampling_params for 3 prompts"),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_request_then_recovers(tiny, baseline, case):
    make_prompt, params, pattern = BAD_REQUESTS[case]
    with pytest.raises(ValueError, match=pattern):
        tiny.generate(make_prompt(), params, use_tqdm=False)
    assert not tiny.llm_engine.has_unfinished_requests()
    _still_works(tiny, baseline)


@pytest.mark.parametrize("bad_index", [0, 2, 4])
def test_one_bad_prompt_fails_the_whole_batch(tiny, baseline, bad_index):
    batch = [{"prompt_token_ids": p} for p in PROMPTS]
    batch.insert(bad_index, {"prompt_token_ids": [3, VOCAB + 10]})
    with pytest.raises(ValueError, match=rf"prompt {bad_index}:.*{VOCAB + 10}"):
        tiny.generate(batch, GREEDY, use_tqdm=False)
    # Nothing from the failed batch may be left queued (the autouse fixture checks the blocks).
    assert not tiny.llm_engine.has_unfinished_requests()
    assert not tiny.llm_engine.states
    _still_works(tiny, baseline)


def test_one_bad_sampling_params_fails_the_whole_batch(tiny, baseline):
    params = [GREEDY, GREEDY, SamplingParams(n=2, prompt_logprobs=1), GREEDY]
    with pytest.raises(ValueError, match=r"prompt 2:.*prompt_logprobs=1"):
        tiny.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    assert not tiny.llm_engine.has_unfinished_requests()
    _still_works(tiny, baseline)


def test_prompt_at_max_model_len_gets_one_token(tiny):
    out = tiny.generate([_rand_prompt(MAX_LEN, seed=3)], SamplingParams(max_tokens=10),
                        use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 1
    assert out.outputs[0].finish_reason == "length"


def test_truncate_prompt_tokens(tiny):
    long = _rand_prompt(MAX_LEN + 6, seed=1)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    expected = _ids(tiny.generate([long[-20:]], params, use_tqdm=False))[0]
    out = tiny.generate([long], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True,
                                               truncate_prompt_tokens=20), use_tqdm=False)[0]
    assert list(out.prompt_token_ids) == long[-20:]
    assert list(out.outputs[0].token_ids) == expected
    out = tiny.generate([long], SamplingParams(max_tokens=4, truncate_prompt_tokens=-1),
                        use_tqdm=False)[0]
    assert list(out.prompt_token_ids) == long[-MAX_LEN:]
    with pytest.raises(ValueError, match=rf"truncate_prompt_tokens=100.*max_model_len={MAX_LEN}"):
        tiny.generate([long], SamplingParams(truncate_prompt_tokens=100), use_tqdm=False)


def test_generation_capped_at_max_model_len(tiny):
    prompt = _rand_prompt(MAX_LEN - 5, seed=4)
    out = tiny.generate([prompt], SamplingParams(max_tokens=50, ignore_eos=True),
                        use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 5
    assert out.outputs[0].finish_reason == "length"


# ------------------------------------------------------------------ constructor errors


@pytest.mark.parametrize("path", ["/nonexistent/path", "/nonexistent/model.gguf"])
def test_missing_model_path(path):
    with pytest.raises(ValueError, match=path):
        LLM(model=path)


def test_unknown_constructor_argument(tiny_dir):
    with pytest.raises(ValueError, match="max_modle_len"):
        LLM(model=tiny_dir, max_modle_len=64)


def test_max_model_len_beyond_model_limit(tiny_dir):
    limit = COMMON["max_position_embeddings"]
    with pytest.raises(ValueError, match=rf"max_model_len=100000.*{limit}"):
        LLM(model=tiny_dir, skip_tokenizer_init=True, max_model_len=100000)


# ------------------------------------------------------------- input forms and outputs


def test_accepted_prompt_forms_agree(tiny, baseline):
    p = PROMPTS[2]
    as_list = tiny.generate(p, GREEDY, use_tqdm=False)  # one token-id list
    as_dict = tiny.generate({"prompt_token_ids": p}, GREEDY, use_tqdm=False)
    as_list_of_lists = tiny.generate([p, PROMPTS[0]], GREEDY, use_tqdm=False)
    as_list_of_dicts = tiny.generate([{"prompt_token_ids": p}], [GREEDY], use_tqdm=False)
    assert len(as_list) == len(as_dict) == len(as_list_of_dicts) == 1
    assert len(as_list_of_lists) == 2
    for outs in (as_list, as_dict, as_list_of_lists, as_list_of_dicts):
        assert list(outs[0].prompt_token_ids) == p
        assert list(outs[0].outputs[0].token_ids) == baseline[2]
    assert list(as_list_of_lists[1].outputs[0].token_ids) == baseline[0]
    assert tiny.generate([], GREEDY, use_tqdm=False) == []


def test_offline_batches_are_not_capped_like_server_requests(tiny):
    """The servers' request limits (request_limits.py) are theirs: a user's offline batch
    may hold more prompts, and its params more stop token ids, than one HTTP request."""
    from octavo.entrypoints.request_limits import MAX_PROMPTS, MAX_STOP_TOKEN_IDS

    prompts = [[3 + i % (VOCAB - 3)] for i in range(MAX_PROMPTS + 1)]
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True,
                            stop_token_ids=[VOCAB - 1] * (MAX_STOP_TOKEN_IDS + 1))
    outs = tiny.generate(prompts, params, use_tqdm=False)
    assert len(outs) == MAX_PROMPTS + 1
    assert all(len(o.outputs[0].token_ids) == 1 for o in outs)


def test_output_order_and_per_prompt_params(tiny, baseline):
    # The first prompt runs longest and the last shortest: they finish in reverse order.
    lengths = [12, 9, 5, 1]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    outs = tiny.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    assert [list(o.prompt_token_ids) for o in outs] == PROMPTS
    for out, n, full in zip(outs, lengths, baseline):
        assert list(out.outputs[0].token_ids) == full[:n]  # greedy: a prefix of the long run
        assert out.outputs[0].finish_reason == "length"


def test_request_output_fields(tiny, baseline):
    outs = tiny.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, use_tqdm=False)
    assert len({o.request_id for o in outs}) == len(outs)
    for out, prompt, expected in zip(outs, PROMPTS, baseline):
        assert isinstance(out.request_id, str)
        assert out.prompt is None  # token ids in, no tokenizer: no prompt text
        assert list(out.prompt_token_ids) == prompt
        assert out.prompt_logprobs is None
        assert out.finished is True
        # Earlier tests ran the same prompts: their full blocks may come from the prefix cache.
        assert out.num_cached_tokens % 16 == 0 and out.num_cached_tokens < len(prompt)
        assert len(out.outputs) == 1
        c = out.outputs[0]
        assert c.index == 0
        assert c.text == ""  # skip_tokenizer_init: no detokenization
        assert list(c.token_ids) == expected and len(expected) == GREEDY.max_tokens
        assert all(isinstance(t, int) and 0 <= t < VOCAB for t in c.token_ids)
        assert c.finish_reason == "length"
        assert c.stop_reason is None
        assert c.finished()
        assert c.logprobs is None and c.cumulative_logprob is None


def test_default_sampling_params(tiny):
    out = tiny.generate([PROMPTS[1]], use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) <= SamplingParams().max_tokens


def test_request_ids_never_repeat(tiny):
    first = tiny.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
    second = tiny.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
    ids = [o.request_id for o in first + second]
    assert len(set(ids)) == 4


def test_caller_params_not_mutated(tiny):
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    before = repr(params)
    tiny.generate([PROMPTS[0], PROMPTS[1]], params, use_tqdm=False)
    assert repr(params) == before


# ------------------------------------------------------------------------------ seeds

SEED_PROMPT = PROMPTS[2]


def _seeded(seed: int | None, temperature: float = 0.8) -> SamplingParams:
    return SamplingParams(temperature=temperature, seed=seed, max_tokens=20, ignore_eos=True)


def test_seed_is_batch_invariant_and_reproducible(tiny):
    alone = _ids(tiny.generate([SEED_PROMPT], _seeded(123), use_tqdm=False))[0]
    again = _ids(tiny.generate([SEED_PROMPT], _seeded(123), use_tqdm=False))[0]
    assert alone == again

    others = [_rand_prompt(3 + 4 * i, seed=100 + i) for i in range(8)]
    other_params = [_seeded(None, 1.0) if i % 2 else _seeded(1000 + i, 1.2) for i in range(8)]
    prompts = others[:4] + [SEED_PROMPT] + others[4:]
    params = other_params[:4] + [_seeded(123)] + other_params[4:]
    in_batch = _ids(tiny.generate(prompts, params, use_tqdm=False))
    assert in_batch[4] == alone
    assert len({tuple(t) for t in in_batch}) == len(in_batch)  # the others really sampled

    other_seed = _ids(tiny.generate([SEED_PROMPT], _seeded(124), use_tqdm=False))[0]
    assert other_seed != alone
    greedy = _ids(tiny.generate([SEED_PROMPT], _seeded(None, 0.0), use_tqdm=False))[0]
    assert greedy != alone  # the tiny model is close to uniform: sampling really samples


def test_seed_invariant_under_chunked_prefill(tiny_dir, tiny):
    """The same holds when the batch is prefilled in small chunks next to running decodes."""
    expected = _ids(tiny.generate([SEED_PROMPT], _seeded(7), use_tqdm=False))[0]
    small = LLM(model=tiny_dir, dtype="float32", skip_tokenizer_init=True,
                max_model_len=MAX_LEN, max_num_batched_tokens=8, max_num_seqs=3)
    prompts = [_rand_prompt(20, seed=50 + i) for i in range(4)] + [SEED_PROMPT]
    params = [_seeded(None)] * 4 + [_seeded(7)]
    assert _ids(small.generate(prompts, params, use_tqdm=False))[4] == expected


# -------------------------------------------------------------------- stop conditions


def test_max_tokens_honoured(tiny, baseline):
    for n in (1, 2, 7):
        out = tiny.generate([PROMPTS[3]], SamplingParams(temperature=0.0, max_tokens=n,
                                                         ignore_eos=True), use_tqdm=False)[0]
        assert list(out.outputs[0].token_ids) == baseline[3][:n]
        assert out.outputs[0].finish_reason == "length"
        assert out.outputs[0].stop_reason is None


def _first_new_token(tokens: list[int], start: int = 2) -> int:
    """Index of the first token at or after ``start`` that does not occur before it."""
    for k in range(start, len(tokens)):
        if tokens[k] not in tokens[:k]:
            return k
    pytest.fail(f"greedy output {tokens} has no fresh token to stop on")


def test_stop_token_ids(tiny, baseline):
    full = baseline[1]
    k = _first_new_token(full)
    params = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[full[k], VOCAB - 1])
    out = tiny.generate([PROMPTS[1]], params, use_tqdm=False)[0].outputs[0]
    assert list(out.token_ids) == full[:k + 1]
    assert out.finish_reason == "stop"
    assert out.stop_reason == full[k]
    # stop_token_ids apply with ignore_eos too (ignore_eos concerns only EOS).
    params = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[full[k]],
                            ignore_eos=True)
    out = tiny.generate([PROMPTS[1]], params, use_tqdm=False)[0].outputs[0]
    assert list(out.token_ids) == full[:k + 1] and out.stop_reason == full[k]


def test_min_tokens_masks_stop_token_ids(tiny, baseline):
    """While fewer than min_tokens are out, stop tokens must not even be sampled (vLLM masks
    them in the logits), not merely be ignored as stop conditions."""
    full = baseline[1]
    k = _first_new_token(full)
    stop = full[k]
    params = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop],
                            min_tokens=k + 3)
    out = tiny.generate([PROMPTS[1]], params, use_tqdm=False)[0].outputs[0]
    tokens = list(out.token_ids)
    assert tokens[:k] == full[:k]
    assert len(tokens) >= k + 3
    assert stop not in tokens[:k + 3], f"stop token {stop} sampled within min_tokens: {tokens}"


@pytest.fixture(scope="module")
def eos_setup(tiny_dir, baseline, tmp_path_factory):
    """A copy of the tiny checkpoint whose EOS id is a token greedy decoding reaches at k."""
    full = baseline[0]
    k = _first_new_token(full)
    folder = copy_with_eos(tiny_dir, str(tmp_path_factory.mktemp("llama_eos")), full[k])
    llm = LLM(model=folder, dtype="float32", skip_tokenizer_init=True, max_model_len=MAX_LEN)
    assert llm.llm_engine.config.model_config.eos_token_ids == (full[k],)
    return llm, full, k


def test_eos_stops_unless_ignored(eos_setup):
    llm, full, k = eos_setup
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=12),
                       use_tqdm=False)[0].outputs[0]
    assert list(out.token_ids) == full[:k + 1]  # EOS is the last token returned
    assert out.finish_reason == "stop"
    assert out.stop_reason is None  # EOS, not a stop token or string

    out = llm.generate([PROMPTS[0]], GREEDY, use_tqdm=False)[0].outputs[0]  # ignore_eos
    assert list(out.token_ids) == full
    assert out.finish_reason == "length"


def test_min_tokens_suppresses_eos(eos_setup):
    """EOS must be masked out of sampling until min_tokens tokens exist."""
    llm, full, k = eos_setup
    eos = full[k]
    params = SamplingParams(temperature=0.0, max_tokens=12, min_tokens=k + 3)
    out = llm.generate([PROMPTS[0]], params, use_tqdm=False)[0].outputs[0]
    tokens = list(out.token_ids)
    assert tokens[:k] == full[:k]
    assert len(tokens) >= k + 3
    assert eos not in tokens[:k + 3], f"EOS {eos} sampled within min_tokens={k + 3}: {tokens}"


def test_min_tokens_does_not_change_later_stopping(eos_setup):
    llm, full, k = eos_setup
    # min_tokens below the natural EOS position changes nothing.
    params = SamplingParams(temperature=0.0, max_tokens=12, min_tokens=k)
    out = llm.generate([PROMPTS[0]], params, use_tqdm=False)[0].outputs[0]
    assert list(out.token_ids) == full[:k + 1]
    assert out.finish_reason == "stop"


# ------------------------------------------------------------------------ progress bar


def test_tqdm_progress_bar(tiny, capfd):
    tiny.generate(PROMPTS, GREEDY, use_tqdm=True)
    err = capfd.readouterr().err
    assert "Processed prompts" in err
    assert f"{len(PROMPTS)}/{len(PROMPTS)}" in err
    tiny.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert "Processed prompts" not in capfd.readouterr().err


# ------------------------------------------------------------ the real default model
# Greedy on "What is the capital of France?" gives "The capital of France is Paris." then EOS
# (<|im_end|>, id 2) and, with ignore_eos, more chat-template special tokens.

FRANCE = "What is the capital of France?"
PLAIN = "The capital of France is"
N = 12


@pytest.fixture(scope="module")
def smol() -> LLM:
    return LLM()


@pytest.fixture(scope="module")
def chat_prompt(smol) -> str:
    tok = smol.get_tokenizer()
    return tok.apply_chat_template([{"role": "user", "content": FRANCE}], tokenize=False,
                                   add_generation_prompt=True)


@pytest.fixture(scope="module")
def smol_base(smol, chat_prompt):
    """Greedy, past EOS, special tokens kept in the text."""
    params = SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True,
                            skip_special_tokens=False)
    chat, plain = smol.generate([chat_prompt, PLAIN], params, use_tqdm=False)
    tokens = list(chat.outputs[0].token_ids)
    assert 2 in tokens[:N - 2], f"expected an early EOS in {chat.outputs[0].text!r}"
    return chat, plain


STOP_WORD_TOKEN = 3  # index of a plain word token (" France") in the chat answer

VARIANTS = {
    "eos": dict(skip_special_tokens=False),
    "skip_special": dict(ignore_eos=True),
    "stop_str": dict(stop=["Paris"]),
    "stop_str_inclusive": dict(stop=["Paris"], include_stop_str_in_output=True),
    "stop_str_across_tokens": dict(stop=["ance is"], include_stop_str_in_output=True),
    "stop_str_earliest": dict(stop=["zzz", "Paris", "of"]),
    "min_tokens": dict(min_tokens=10),
    # "of" ends token 2, inside min_tokens: only the later "is" may stop the request.
    "stop_str_min_tokens": dict(stop=["of", "is"], min_tokens=3),
    # " Paris" is token 5: the stop string and max_tokens end the request on the same token.
    "stop_str_on_last_token": dict(stop=["Paris"], max_tokens=6),
}


@pytest.fixture(scope="module")
def smol_variants(smol, chat_prompt, smol_base):
    """One batched run of the chat prompt under every variant above (each step costs)."""
    base = list(smol_base[0].outputs[0].token_ids)
    variants = dict(VARIANTS, stop_token=dict(stop_token_ids=[base[STOP_WORD_TOKEN]]))
    names = sorted(variants)
    params = [SamplingParams(**{"temperature": 0.0, "max_tokens": N, **variants[n]})
              for n in names]
    outs = smol.generate([chat_prompt] * len(names), params, use_tqdm=False)
    return dict(zip(names, outs))


def test_text_prompt_fields(smol, smol_base, chat_prompt):
    tok = smol.get_tokenizer()
    for out, prompt in zip(smol_base, (chat_prompt, PLAIN)):
        assert out.prompt == prompt
        assert list(out.prompt_token_ids) == tok.encode(prompt)
        c = out.outputs[0]
        assert len(c.token_ids) == N
        assert c.text == tok.decode(c.token_ids, skip_special_tokens=False)
        assert c.finish_reason == "length" and c.stop_reason is None
    assert smol_base[0].outputs[0].text.startswith("The capital of France is Paris.<|im_end|>")
    assert smol_base[1].outputs[0].text.startswith(" Paris")


def test_single_string_prompt(smol, smol_base):
    outs = smol.generate(PLAIN, SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)
    assert len(outs) == 1 and outs[0].prompt == PLAIN
    assert list(outs[0].outputs[0].token_ids) == list(smol_base[1].outputs[0].token_ids)[:3]


def test_eos_ends_text_without_its_token_text(smol_base, smol_variants):
    base = list(smol_base[0].outputs[0].token_ids)
    e = base.index(2)
    c = smol_variants["eos"].outputs[0]
    assert list(c.token_ids) == base[:e + 1]
    assert c.finish_reason == "stop" and c.stop_reason is None
    # As in vLLM, the EOS that ended the request is not part of the text, even when special
    # tokens are kept.
    assert c.text == "The capital of France is Paris."


def test_skip_special_tokens(smol, smol_base, smol_variants):
    tok = smol.get_tokenizer()
    base = smol_base[0].outputs[0]
    assert "<|im_end|>" in base.text and "<|im_start|>" in base.text
    c = smol_variants["skip_special"].outputs[0]
    assert list(c.token_ids) == list(base.token_ids)
    assert "<|im_" not in c.text
    assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)


def _stop_expectations(smol, smol_base, stop: str, include: bool):
    tok = smol.get_tokenizer()
    base = list(smol_base[0].outputs[0].token_ids)
    text = tok.decode(base, skip_special_tokens=True)
    idx = text.index(stop)
    # Generation ends with the first token whose text completes the stop string.
    m = next(m for m in range(1, len(base) + 1)
             if stop in tok.decode(base[:m], skip_special_tokens=True))
    return base[:m], text[:idx + len(stop) if include else idx]


@pytest.mark.parametrize("name,stop,include", [
    ("stop_str", "Paris", False),
    ("stop_str_inclusive", "Paris", True),
    ("stop_str_across_tokens", "ance is", True),
    ("stop_str_earliest", "of", False),
])
def test_stop_strings(smol, smol_base, smol_variants, name, stop, include):
    tokens, text = _stop_expectations(smol, smol_base, stop, include)
    c = smol_variants[name].outputs[0]
    assert c.text == text
    assert c.finish_reason == "stop"
    assert c.stop_reason == stop
    assert list(c.token_ids) == tokens


def test_stop_strings_wait_for_min_tokens(smol, smol_base, smol_variants):
    tokens, text = _stop_expectations(smol, smol_base, "is", False)
    c = smol_variants["stop_str_min_tokens"].outputs[0]
    assert text == "The capital of France "
    assert c.text == text
    assert c.stop_reason == "is" and c.finish_reason == "stop"
    assert list(c.token_ids) == tokens


def test_stop_string_wins_over_length_on_the_same_token(smol, smol_base, smol_variants):
    tokens, text = _stop_expectations(smol, smol_base, "Paris", False)
    assert len(tokens) == VARIANTS["stop_str_on_last_token"]["max_tokens"]
    c = smol_variants["stop_str_on_last_token"].outputs[0]
    assert list(c.token_ids) == tokens
    assert c.text == text
    assert c.finish_reason == "stop" and c.stop_reason == "Paris"


def test_stop_token_id_text(smol, smol_base, smol_variants):
    tok = smol.get_tokenizer()
    base = list(smol_base[0].outputs[0].token_ids)
    c = smol_variants["stop_token"].outputs[0]
    assert list(c.token_ids) == base[:STOP_WORD_TOKEN + 1]
    assert c.finish_reason == "stop" and c.stop_reason == base[STOP_WORD_TOKEN]
    # As in vLLM, the stop token's text is not part of the output text.
    assert c.text == tok.decode(base[:STOP_WORD_TOKEN])


def test_min_tokens_suppresses_eos_real_model(smol_base, smol_variants):
    base = list(smol_base[0].outputs[0].token_ids)
    e = base.index(2)
    assert e < 10
    tokens = list(smol_variants["min_tokens"].outputs[0].token_ids)
    assert tokens[:e] == base[:e]
    assert len(tokens) >= 10
    assert 2 not in tokens[:10], f"EOS sampled within min_tokens=10: {tokens}"


def test_bad_text_prompt_then_recovers(smol, smol_base):
    params = SamplingParams(temperature=0.0, max_tokens=3)
    with pytest.raises(ValueError, match=r"prompt 1: prompt is empty"):
        smol.generate([PLAIN, "", PLAIN], params, use_tqdm=False)
    with pytest.raises(ValueError, match=r"temperature"):
        smol.generate(PLAIN, SamplingParams(temperature=-0.5), use_tqdm=False)
    assert not smol.llm_engine.has_unfinished_requests()
    out = smol.generate(PLAIN, params, use_tqdm=False)[0]
    assert list(out.outputs[0].token_ids) == list(smol_base[1].outputs[0].token_ids)[:3]
