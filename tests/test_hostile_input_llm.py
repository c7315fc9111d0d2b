"""Hostile input to the offline API: every integer field out of range, every id field out of
the vocabulary, every count huge, every text field undecodable, wrong types. Each is a
ValueError (InvalidRequestError) naming the field, raised before anything is queued; the
engine keeps generating and every KV block stays in the pool."""

from __future__ import annotations

import pytest

from octavo.entrypoints.llm import LLM
from octavo.errors import InvalidRequestError
from octavo.sampling_params import SamplingParams

HUGE = [2**63, 2**64 + 1, -(2**63) - 1, 10**30]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(max_model_len=256, max_num_seqs=16)


@pytest.fixture(scope="module")
def vocab(llm) -> int:
    return llm.llm_engine.config.model_config.hf_config.vocab_size


def _refused(llm, field, prompt="hi", priority=None, **params):
    with pytest.raises(InvalidRequestError) as info:
        llm.generate(prompt, SamplingParams(**params), use_tqdm=False,
                     priority=priority)
    assert info.value.param == field, (info.value.param, str(info.value))
    assert field.split("[")[0] in str(info.value)
    return info.value


def _still_serves(llm):
    engine = llm.llm_engine
    pool = engine.scheduler.kv.pool
    assert pool.num_free_blocks == pool.num_blocks and not engine.states
    out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=3),
                       use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) >= 1


@pytest.mark.parametrize("value", HUGE)
@pytest.mark.parametrize("field", ["n", "best_of", "top_k", "seed", "max_tokens", "min_tokens",
                                   "logprobs", "prompt_logprobs", "truncate_prompt_tokens"])
def test_out_of_range_integers(llm, field, value):
    if field == "seed" and 0 <= value < 2**64:  # vLLM's seed range is any 64-bit value
        value = 2**64
    extra = {"temperature": 0.5} if field == "top_k" else {}
    if field == "best_of" and value < 0:
        return  # best_of < n is refused as such, below
    _refused(llm, field, **{field: value}, **extra)


def test_out_of_range_priority(llm):
    for value in HUGE + [True, "1"]:
        _refused(llm, "priority", priority=[value])
    _still_serves(llm)


@pytest.mark.parametrize("field", ["stop_token_ids", "allowed_token_ids"])
@pytest.mark.parametrize("value", [2**63, 10**30, -1])
def test_out_of_range_ids_in_lists(llm, field, value):
    _refused(llm, field, **{field: [1, value]})


@pytest.mark.parametrize("key", [2**63, "99999999999999999999999", -1, "x"])
def test_out_of_range_logit_bias_keys(llm, key):
    _refused(llm, "logit_bias", logit_bias={key: 1.0})


def test_logit_bias_values(llm):
    _refused(llm, "logit_bias", logit_bias={5: float("inf")})
    _refused(llm, "logit_bias", logit_bias={5: "high"})
    _refused(llm, "logit_bias", logit_bias={5: 10**400})
    _refused(llm, "logit_bias", logit_bias={5: 1e39})


@pytest.mark.parametrize("field,value", [
    ("temperature", 1e300), ("temperature", 10**400), ("repetition_penalty", 1e300),
    ("top_p", 10**400), ("length_penalty", float("nan")), ("min_p", -1e300)])
def test_out_of_range_floats(llm, field, value):
    # 1e300 would become inf in the float32 sampling buffers mid-step.
    _refused(llm, field, **{field: value})


def test_out_of_vocabulary_ids_in_every_id_field(llm, vocab):
    for field in ("stop_token_ids", "allowed_token_ids"):
        _refused(llm, field, **{field: [vocab]})
    _refused(llm, "logit_bias", logit_bias={vocab: 1.0})
    # The request: min_tokens masks the stop ids, which used to index past the
    # vocabulary mid-step and kill the engine.
    _refused(llm, "stop_token_ids", min_tokens=1, stop_token_ids=[vocab])
    for ids in ([vocab], [1, -1], [1, 2**63], [True, 2], [1.0, 2]):
        with pytest.raises(InvalidRequestError) as info:
            llm.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=2),
                         use_tqdm=False)
        assert info.value.param == "prompt_token_ids"
    _still_serves(llm)


@pytest.mark.parametrize("field,value", [
    ("n", 10**6), ("best_of", 10**6), ("logprobs", 10**6), ("prompt_logprobs", 100000),
    ("logprobs", -1), ("prompt_logprobs", -1), ("n", 17), ("logprobs", 21)])
def test_huge_counts(llm, field, value):
    err = _refused(llm, field, **{field: value})
    assert "max_n" in str(err) or "max_logprobs" in str(err)


def test_counts_at_the_caps_run(llm):
    outs = llm.generate("Hi", SamplingParams(n=16, max_tokens=2, logprobs=20,
                                             prompt_logprobs=None), use_tqdm=False)
    assert len(outs[0].outputs) == 16
    assert all(len(c.logprobs[0]) >= 20 for c in outs[0].outputs)
    _still_serves(llm)


def test_huge_max_tokens_is_clamped_offline(llm):
    out = llm.generate({"prompt_token_ids": [5] * 250},
                       SamplingParams(max_tokens=2**62, temperature=0, ignore_eos=True),
                       use_tqdm=False)[0]
    assert out.outputs[0].finish_reason == "length"
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 256


@pytest.mark.parametrize("bad", ["\ud800", "ok \udfff tail", "\udc80" * 3])
def test_undecodable_text_in_every_text_field(llm, bad):
    _refused(llm, "prompt", prompt=bad)
    _refused(llm, "prompt", prompt={"prompt": bad})
    _refused(llm, "prompt", prompt={"prompt": bad, "prompt_token_ids": [1, 2]})
    _refused(llm, "stop", stop=[bad])
    _refused(llm, "stop", stop=bad)
    _refused(llm, "bad_words", bad_words=[bad])
    _still_serves(llm)


@pytest.mark.parametrize("field,value", [
    ("n", True), ("top_k", False), ("seed", True), ("max_tokens", "16"), ("max_tokens", 2.0),
    ("temperature", "hot"), ("temperature", True), ("ignore_eos", "yes"), ("ignore_eos", 1),
    ("stop_token_ids", [True]), ("stop_token_ids", "1,2"), ("allowed_token_ids", [1.5]),
    ("stop", [1]), ("bad_words", {"a": 1}), ("logprobs", 1.0), ("logits_processors", "f"),
    ("logits_processors", [3])])
def test_wrong_types(llm, field, value):
    _refused(llm, field, **{field: value})


def test_prompt_too_long_names_the_prompt(llm):
    err = _refused(llm, "prompt", prompt={"prompt_token_ids": [5] * 300})
    assert "max_model_len=256" in str(err)
    _still_serves(llm)


def test_bad_prompt_in_a_batch_queues_nothing(llm):
    with pytest.raises(InvalidRequestError, match="prompt 1"):
        llm.generate(["fine", "\ud800", "fine too"], SamplingParams(max_tokens=2),
                     use_tqdm=False)
    _still_serves(llm)


def test_requests_of_one_group_share_a_group_id(llm):
    """A server's list of prompts is one group for the scheduler's share of the batch."""
    engine = llm.llm_engine
    engine.add_request("g-0", "hi", SamplingParams(max_tokens=1), group_id="g")
    engine.add_request("g-1", "hi", SamplingParams(max_tokens=1, n=2), group_id="g")
    engine.add_request("solo", "hi", SamplingParams(max_tokens=1))
    groups = {rid: r.group_id for rid, r in engine.scheduler.requests.items()}
    engine.abort_request(["g-0", "g-1", "solo"])
    assert groups["g-0"] == "g" and groups["solo"] == "solo"
    assert {g for rid, g in groups.items() if rid.startswith("g-1")} == {"g"}
    _still_serves(llm)


@pytest.mark.parametrize("kwargs, field", [
    ({"prompts": None}, "prompts"), ({"prompts": 5}, "prompts"),
    ({"prompts": b"hi"}, "prompts"),
    # A string or a dict would have been iterated into characters or keys: "got 6
    # sampling_params for 1 prompts" (found by fuzzing the offline API).
    ({"prompts": "hi", "sampling_params": "greedy"}, "sampling_params"),
    ({"prompts": "hi", "sampling_params": {"max_tokens": 2}}, "sampling_params"),
    ({"prompts": ["a", "b"], "sampling_params": [SamplingParams()]}, "sampling_params"),
    ({"prompts": "hi", "priority": 1}, "priority"),
    ({"prompts": ["a", "b"], "priority": [1]}, "priority"),
])
def test_generate_arguments_of_the_wrong_shape(llm, kwargs, field):
    with pytest.raises(InvalidRequestError) as info:
        llm.generate(**kwargs, use_tqdm=False)
    assert info.value.param == field and field in str(info.value)
    _still_serves(llm)


@pytest.mark.parametrize("messages,what", [
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user", "content": {"text": "hi"}}], "messages[0].content"),
    ([{"role": "user", "content": ["hi"]}], "messages[0].content"),
    ([{"role": "user", "content": "hi"}, {"role": 7, "content": "x"}], "messages[1].role"),
    ([{"role": "user", "content": "hi"}, "not a message"], "messages[1]"),
    ([[]], "messages is empty"),  # one conversation, empty
])
def test_chat_messages_of_the_wrong_type(llm, messages, what):
    """LLM.chat's messages: a content that is not text, None or a list of parts, a role that
    is not a string, a message that is not a dict: an InvalidRequestError naming the message
    (``content=5`` reached the template, which raised a bare TypeError)."""
    with pytest.raises(InvalidRequestError) as info:
        llm.chat(messages, use_tqdm=False)
    assert info.value.param == "messages" and what in str(info.value)
    _still_serves(llm)
