"""Structured outputs (xgrammar): parameter validation, the bitmask op, the grammar cache, and
end to end on the embedded SmolLM2: JSON schema / regex / choice / grammar / json_object,
mixed guided and free batches, n > 1, stop strings, preemption and async scheduling."""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch

from octavo import GuidedDecodingParams, SamplingParams, StructuredOutputsParams
from octavo.errors import InvalidRequestError
from octavo.sample import grammar_mask
from octavo.sample.grammar_mask import GrammarMask, apply_token_bitmask, unpack_bitmask
from octavo.structured_output.backend import GrammarCompileError
from octavo.structured_output.grammar_cache import GrammarCache

xgr = pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"]}
REGEX = r"[0-9]{3}-[a-z]{2,5}"
CHOICES = ["positive", "negative", "neutral"]
GRAMMAR = 'root ::= "yes" | "no" | ("maybe " [0-9] [0-9]?)'


# ------------------------------------------------------------------ parameters
def test_params_accept_each_kind_and_both_names():
    p = SamplingParams(guided_decoding=GuidedDecodingParams(json=json.dumps(PERSON)))
    assert p.structured_outputs is p.guided_decoding
    assert p.structured_outputs.json == PERSON  # JSON text parsed
    assert p.structured_outputs.kind == "json"
    q = SamplingParams(structured_outputs={"regex": REGEX})
    assert isinstance(q.structured_outputs, StructuredOutputsParams)
    assert q.guided_decoding is q.structured_outputs
    assert q.clone().structured_outputs == q.structured_outputs
    assert StructuredOutputsParams(choice=("a", "b")).choice == ["a", "b"]
    assert StructuredOutputsParams(json_object=True).kind == "json_object"
    assert StructuredOutputsParams.from_optional(json=None, regex=None) is None


def test_params_take_a_pydantic_model():
    pydantic = pytest.importorskip("pydantic")

    class Person(pydantic.BaseModel):
        name: str
        age: int

    p = StructuredOutputsParams(json=Person)
    assert p.json["properties"].keys() == {"name", "age"}


@pytest.mark.parametrize("kwargs, param", [
    ({}, "structured_outputs"),
    ({"json": PERSON, "regex": "a"}, "structured_outputs"),
    ({"json_object": False}, "structured_outputs"),
    ({"regex": ""}, "structured_outputs.regex"),
    ({"regex": 5}, "structured_outputs.regex"),
    ({"choice": "ab"}, "structured_outputs.choice"),
    ({"choice": []}, "structured_outputs.choice"),
    ({"choice": ["a", 1]}, "structured_outputs.choice"),
    ({"grammar": "  "}, "structured_outputs.grammar"),
    ({"json": "{not json"}, "structured_outputs.json"),
    ({"json": 3}, "structured_outputs.json"),
    ({"json_object": "yes"}, "structured_outputs.json_object"),
    ({"json": PERSON, "disable_any_whitespace": 1}, "structured_outputs.disable_any_whitespace"),
    ({"json": PERSON, "whitespace_pattern": r"\s"}, "structured_outputs.whitespace_pattern"),
])
def test_params_refuse_bad_values_by_field(kwargs, param):
    with pytest.raises(InvalidRequestError) as e:
        StructuredOutputsParams(**kwargs)
    assert e.value.param == param


def test_sampling_params_refuse_conflicts_and_wrong_types():
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(structured_outputs=StructuredOutputsParams(regex="a"),
                       guided_decoding=GuidedDecodingParams(regex="b"))
    assert e.value.param == "structured_outputs"
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(guided_decoding="json")
    assert e.value.param == "guided_decoding"
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(guided_decoding={"jsn": {}})
    assert e.value.param == "guided_decoding"
    with pytest.raises(InvalidRequestError) as e:
        GuidedDecodingParams(regex="")
    assert e.value.param == "guided_decoding.regex"
    with pytest.raises(InvalidRequestError):
        SamplingParams(use_beam_search=True, temperature=0.0,
                       structured_outputs=StructuredOutputsParams(regex="a"))


def test_sampling_params_module_stays_torch_free():
    import subprocess

    code = ("import sys; import octavo.sampling_params, octavo.structured_output; "
            "assert 'torch' not in sys.modules and 'xgrammar' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------ the bitmask op
@pytest.fixture(params=["xgrammar_cpu_kernel", "torch"])
def mask_path(request, monkeypatch):
    """Both ways of applying a bitmask: xgrammar's CPU kernel, and plain torch (the GPU's,
    and the CPU's without xgrammar)."""
    if request.param == "torch":
        monkeypatch.setattr(grammar_mask, "_cpu_kernel", lambda: None)
    else:
        assert grammar_mask._cpu_kernel() is not None
    return request.param


@pytest.mark.parametrize("vocab, words", [(100, 4), (128, 4), (70, 2), (96, 2)])
def test_bitmask_op_matches_xgrammar(vocab, words, mask_path):
    g = torch.Generator().manual_seed(vocab)
    bitmask = torch.randint(-2**31, 2**31 - 1, (3, words), dtype=torch.int32, generator=g)
    logits = torch.randn(5, vocab, generator=g)
    rows = [4, 0, 2]
    ours = apply_token_bitmask(logits.clone(), GrammarMask(bitmask, torch.tensor(rows)))
    ref = logits.clone()
    full = torch.zeros(5, words, dtype=torch.int32)
    full[rows] = bitmask
    xgr.apply_token_bitmask_inplace(ref, full, indices=rows)
    if vocab > words * 32:  # ids past the bitmask: disallowed here (xgrammar leaves them)
        ref[rows, words * 32:] = float("-inf")
    assert torch.equal(ours, ref)
    untouched = [1, 3]
    assert torch.equal(ours[untouched], logits[untouched])


def test_bitmask_op_leading_rows_and_unpack_order(mask_path):
    bitmask = torch.tensor([[0b101, 0]], dtype=torch.int32)
    assert unpack_bitmask(bitmask, 40)[0].nonzero().flatten().tolist() == [0, 2]
    logits = torch.zeros(2, 40)
    apply_token_bitmask(logits, GrammarMask(bitmask, None))
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [0, 2]
    assert torch.isfinite(logits[1]).all()


def test_grammar_cache_hits_and_remembers_failures():
    cache = GrammarCache(capacity=2)
    calls = []

    def compile_ok():
        calls.append(1)
        return object()

    a = cache.get_or_compile("a", compile_ok)
    assert cache.get_or_compile("a", compile_ok) is a and len(calls) == 1

    def compile_bad():
        calls.append(2)
        raise GrammarCompileError("bad")

    for _ in range(2):
        with pytest.raises(GrammarCompileError):
            cache.get_or_compile("b", compile_bad)
    assert calls.count(2) == 1
    cache.get_or_compile("c", compile_ok)
    assert len(cache) == 2  # LRU: "a" evicted


def test_missing_library_is_a_clear_error(monkeypatch):
    from octavo.structured_output.manager import StructuredOutputManager

    monkeypatch.setitem(sys.modules, "xgrammar", None)
    manager = StructuredOutputManager(object(), 100, (0,))
    with pytest.raises(InvalidRequestError, match="pip install") as e:
        manager.compile(StructuredOutputsParams(regex="a"))
    assert e.value.param == "structured_outputs"


# ------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def llm():
    from octavo import LLM

    # dtype given: the dequantized float path, whose greedy tokens do not depend on the
    # batch (the GGUF-quantized CPU default switches kernels with the number of rows).
    return LLM(max_model_len=512, dtype="float32")


def _chat(llm, text: str) -> str:
    return llm.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)


def _guided(max_tokens: int = 40, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens,
                          structured_outputs=StructuredOutputsParams(**kwargs))


def _check(kind: str, text: str) -> None:
    if kind == "json":
        jsonschema.validate(json.loads(text), PERSON)
    elif kind == "regex":
        assert re.fullmatch(REGEX, text), text
    elif kind == "choice":
        assert text in CHOICES, text
    elif kind == "grammar":
        assert re.fullmatch(r"yes|no|maybe [0-9]{1,2}", text), text
    elif kind == "json_object":
        assert isinstance(json.loads(text), dict), text


def _batch(llm):
    """A batch mixing guided and free requests: (prompts, params, kinds)."""
    guided = [
        ("json", _chat(llm, "Describe a person as JSON."),
         _guided(48, json=PERSON, disable_any_whitespace=True)),
        ("regex", _chat(llm, "Give me a ticket code."), _guided(16, regex=REGEX)),
        ("choice", _chat(llm, "I love it! Sentiment?"), _guided(8, choice=CHOICES)),
        ("grammar", _chat(llm, "Will it rain?"), _guided(8, grammar=GRAMMAR)),
        ("json_object", _chat(llm, "A cat as a JSON object with two keys."),
         _guided(48, json_object=True, disable_any_whitespace=True)),
    ]
    free = [(None, _chat(llm, q), SamplingParams(temperature=0.0, max_tokens=12))
            for q in ("Hello!", "What is 2+2?", "Name a color.")]
    rows = [guided[0], free[0], guided[1], guided[2], free[1], guided[3], free[2], guided[4]]
    return [r[1] for r in rows], [r[2] for r in rows], [r[0] for r in rows]


def _texts(outs):
    return [o.outputs[0].text for o in outs]


@pytest.fixture(scope="module")
def mixed(llm):
    prompts, params, kinds = _batch(llm)
    outs = llm.generate(prompts, params, use_tqdm=False)
    return prompts, params, kinds, outs


def test_every_guided_output_satisfies_its_constraint(mixed):
    _, _, kinds, outs = mixed
    for kind, out in zip(kinds, outs):
        comp = out.outputs[0]
        if kind is None:
            continue
        # JSON may hit max_tokens only if the model rambles; these are short enough.
        assert comp.finish_reason == "stop", (kind, comp.text)
        _check(kind, comp.text)


def test_free_requests_are_unchanged_by_guided_neighbours(llm, mixed):
    prompts, params, kinds, outs = mixed
    free = [i for i, k in enumerate(kinds) if k is None]
    alone = llm.generate([prompts[i] for i in free], [params[i] for i in free],
                         use_tqdm=False)
    assert [o.outputs[0].token_ids for o in alone] == [outs[i].outputs[0].token_ids
                                                       for i in free]


def test_guided_requests_alone_equal_in_a_batch(llm, mixed):
    prompts, params, kinds, outs = mixed
    i = kinds.index("regex")
    alone = llm.generate(prompts[i], params[i], use_tqdm=False)
    assert alone[0].outputs[0].token_ids == outs[i].outputs[0].token_ids


def test_n_samples_each_follow_the_grammar(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=16,
                            structured_outputs=StructuredOutputsParams(regex=REGEX))
    out = llm.generate(_chat(llm, "Give me three ticket codes."), params, use_tqdm=False)[0]
    assert len(out.outputs) == 3
    for comp in out.outputs:
        _check("regex", comp.text)
    params = SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=8,
                            structured_outputs=StructuredOutputsParams(choice=CHOICES))
    out = llm.generate(_chat(llm, "Sentiment of 'ok'?"), params, use_tqdm=False)[0]
    assert all(c.text in CHOICES for c in out.outputs)


def test_stop_strings_cut_guided_output(llm):
    params = _guided(48, json=PERSON, disable_any_whitespace=True)
    params.stop = [","]
    full = llm.generate(_chat(llm, "Describe a person as JSON."), _guided(
        48, json=PERSON, disable_any_whitespace=True), use_tqdm=False)[0].outputs[0]
    cut = llm.generate(_chat(llm, "Describe a person as JSON."), params,
                       use_tqdm=False)[0].outputs[0]
    assert "," in full.text
    assert cut.text == full.text.split(",")[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == ","


def test_grammar_ends_with_eos_and_length_cap_truncates(llm):
    out = llm.generate(_chat(llm, "Will it rain?"), _guided(8, grammar=GRAMMAR),
                       use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop"  # the grammar ended, then only EOS was allowed
    tok = llm.get_tokenizer()
    assert out.token_ids[-1] == tok.eos_token_id
    capped = llm.generate(_chat(llm, "Describe a person as JSON."), _guided(
        3, json=PERSON), use_tqdm=False)[0].outputs[0]
    assert capped.finish_reason == "length" and capped.text.startswith("{")


def test_logprobs_and_penalties_stay_inside_the_grammar(llm):
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=2,
                            repetition_penalty=1.3, logit_bias={0: 5.0},
                            structured_outputs=StructuredOutputsParams(choice=CHOICES))
    comp = llm.generate(_chat(llm, "Sentiment?"), params, use_tqdm=False)[0].outputs[0]
    assert comp.text in CHOICES
    for tid, pos in zip(comp.token_ids, comp.logprobs):
        assert pos[tid].logprob > float("-inf")


@pytest.mark.parametrize("kwargs, param", [
    ({"regex": "("}, "structured_outputs.regex"),
    ({"grammar": 'root ::= "a" |'}, "structured_outputs.grammar"),
    ({"json": {"type": "frobnicate"}}, "structured_outputs.json"),
    ({"regex": "a", "backend": "nope"}, "structured_outputs.backend"),
    # Empty languages compile, then allow no first token (found by scripts/fuzz_server.py:
    # each was a 500 from the engine after the request was queued).
    ({"grammar": "root ::= root"}, "structured_outputs.grammar"),
    ({"grammar": "root ::= a\na ::= a"}, "structured_outputs.grammar"),
    ({"regex": "[^\\x00-\\U0010FFFF]"}, "structured_outputs.regex"),
])
def test_grammars_that_do_not_compile_are_refused_by_field(llm, kwargs, param):
    params = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(**kwargs))
    with pytest.raises(InvalidRequestError) as e:
        llm.generate(["ok", "fine"], [SamplingParams(max_tokens=2), params], use_tqdm=False)
    assert e.value.param == param
    assert "/project/cpp" not in str(e.value)  # xgrammar's source location is trimmed


def test_compiled_grammars_are_cached(llm):
    cache = llm.llm_engine.processor.structured.cache
    before = cache.misses
    schema = {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]}
    for _ in range(3):
        llm.generate("x", _guided(12, json=schema, disable_any_whitespace=True),
                     use_tqdm=False)
    assert cache.misses == before + 1


def test_preemption_and_async_scheduling_keep_guided_outputs(mixed):
    """Recompute preemption (a tiny KV pool, no prefix sharing) with asynchronous scheduling:
    each matcher follows its request's accepted tokens (never advanced twice by a recompute),
    so every guided output still satisfies its constraint and none is rejected."""
    from octavo import LLM

    prompts, params, kinds, _ = mixed
    small = LLM(max_model_len=160, num_gpu_blocks_override=40, block_size=4, dtype="float32",
                async_scheduling=True, max_num_batched_tokens=64, enable_prefix_caching=False)
    got = small.generate(prompts, params, use_tqdm=False)
    assert small.llm_engine.scheduler.num_preemptions > 0
    for kind, out in zip(kinds, got):
        comp = out.outputs[0]
        assert comp.finish_reason in ("stop", "length"), (kind, comp.text)
        if kind is not None and comp.finish_reason == "stop":
            _check(kind, comp.text)


@pytest.fixture(scope="module")
def async_llm():
    """An engine with asynchronous scheduling, shared by the tests that compare its guided
    steps with the synchronous ``llm``'s (one engine build instead of three). A small KV
    pool: this machine's memory is shared with the module's other engines. Each test resets
    its prefix cache first, so a run computes what a fresh engine would."""
    from octavo import LLM

    return LLM(max_model_len=512, dtype="float32", async_scheduling=True, max_num_seqs=8,
               num_gpu_blocks_override=128)


def test_async_scheduling_overlaps_guided_steps(async_llm, mixed):
    """With asynchronous scheduling a guided step's forward pass is launched while the step
    before is still in flight (its tokens fed to the model on the device); only the sampling
    waits for the bitmask, filled once that step's tokens have advanced the matchers. The
    greedy outputs are the synchronous engine's."""
    prompts, params, kinds, outs = mixed
    guided = [i for i, k in enumerate(kinds) if k is not None]
    assert async_llm.reset_prefix_cache()
    runner = async_llm.llm_engine.executor.worker.runner
    assert not runner.defer_guided_sampling  # the CPU's order (restored by the test below)
    fed = runner.num_tokens_fed_on_device
    got = async_llm.generate([prompts[i] for i in guided], [params[i] for i in guided],
                             use_tqdm=False)
    fed = runner.num_tokens_fed_on_device - fed
    assert [o.outputs[0].token_ids for o in got] == [outs[i].outputs[0].token_ids
                                                     for i in guided]
    assert fed > 0


def test_guided_sampling_enqueued_after_the_next_steps_preparation(async_llm, mixed):
    """The CUDA ordering, forced on the CPU: a guided step's sampling is held until the next
    step's host preparation (or until its tokens are asked for), with seeded random rows and
    free neighbours in the batch. Every token equals sampling at once."""
    prompts, params, kinds, _ = mixed
    seeded = [p.clone() for p in params]
    for i, p in enumerate(seeded):
        if i % 2:
            p.temperature, p.seed = 0.8, 100 + i
    runner = async_llm.llm_engine.executor.worker.runner
    default, inner = runner.defer_guided_sampling, runner.flush_pending_sample
    runs = []
    try:
        for deferred in (False, True):
            assert async_llm.reset_prefix_cache()
            runner.defer_guided_sampling = deferred
            flushes = []

            def counting_flush(flushes=flushes):
                flushes.append(runner._pending is not None)
                inner()

            runner.flush_pending_sample = counting_flush
            outs = async_llm.generate(prompts, seeded, use_tqdm=False)
            runs.append([o.outputs[0].token_ids for o in outs])
            if deferred:  # held, then enqueued by the next step's preparation
                assert sum(flushes) > 10
            else:
                assert not any(flushes)
    finally:
        runner.defer_guided_sampling = default
        del runner.flush_pending_sample  # the method again
    assert runs[0] == runs[1]
    greedy = [o.outputs[0].token_ids for o in mixed[3]]
    assert any(runs[1][i] != greedy[i] for i in range(1, len(greedy), 2))  # really sampled
    for tokens, out_params in zip(runs[1], seeded):
        assert tokens and len(tokens) <= out_params.max_tokens


@pytest.mark.parametrize("backend,async_scheduling", [
    pytest.param("mp", False, marks=pytest.mark.slow),  # ("mp", True) covers the path in CI
    ("mp", True), ("ray", True)])
def test_guided_through_the_mp_executor_matches(mixed, backend, async_scheduling):
    """A guided step crosses the process boundary in two messages (the forward pass, then
    sample_tokens with the bitmask): the worker process gives the in-process tokens."""
    from octavo import LLM

    if backend == "ray":
        pytest.importorskip("ray", reason="ray is not installed (pip install octavo[distributed])")
    prompts, params, kinds, outs = mixed
    guided = [i for i, k in enumerate(kinds) if k is not None][:4]
    llm = LLM(max_model_len=512, dtype="float32", async_scheduling=async_scheduling,
              max_num_seqs=8, num_gpu_blocks_override=128, distributed_executor_backend=backend)
    try:
        got = llm.generate([prompts[i] for i in guided], [params[i] for i in guided],
                           use_tqdm=False)
    finally:
        llm.llm_engine.shutdown()
    assert [o.outputs[0].token_ids for o in got] == [outs[i].outputs[0].token_ids
                                                     for i in guided]


# ------------------------------------------------------------------ logits wider than the tokenizer
def _word_tokenizer(n_words: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, **{f"w{i}": i + 1 for i in range(n_words - 1)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


@pytest.mark.parametrize("threads", [1, 2])  # inline, and xgrammar's pool (8+ rows)
def test_bitmask_covers_the_tokenizer_not_the_padded_logits(threads):
    """A model whose logits are wider than its tokenizer (Qwen pads to 151,936): the bitmask
    holds the tokenizer's 70 ids (3 words, not 8), its tail bits are clear, and the sampler
    disallows every id past it. xgrammar given the padded width rejects each padding id one
    by one on every fill (25x slower at Qwen3's width with a 49k tokenizer)."""
    from octavo.structured_output.xgrammar_backend import XgrammarBackend

    backend = XgrammarBackend(_word_tokenizer(70), vocab_size=256, stop_token_ids=[0],
                              max_threads=threads)
    assert backend.vocab_size == 70
    compiled = backend.compile(StructuredOutputsParams(regex=r"(w\d+)*"))
    matchers = [backend.new_matcher(compiled) for _ in range(9)]
    for rows in (matchers[:1], matchers):
        bitmask = backend.allocate_bitmask(len(rows))
        assert tuple(bitmask.shape) == (len(rows), 3)
        backend.fill_bitmask(rows, bitmask)
        allowed = unpack_bitmask(bitmask, 256)
        assert allowed[:, 1:70].all() and not allowed[:, 70:].any()
    logits = torch.zeros(9, 256)
    apply_token_bitmask(logits, GrammarMask(bitmask, None))
    assert torch.isfinite(logits[:, 1:70]).all() and torch.isinf(logits[:, 70:]).all()


def test_guided_generation_on_logits_wider_than_the_tokenizer(tmp_path):
    """End to end on a tiny random model with SmolLM2's tokenizer and 77 padding logits: the
    output matches its regex and never samples a padding id."""
    from octavo import LLM
    from octavo.default_model import default_model_path
    from octavo.model_loader.gguf_file import open_gguf

    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 49152 + 77, "max_position_embeddings": 256,
           "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "float32"}
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    open_gguf(default_model_path()).load_tokenizer().save_pretrained(str(folder))
    llm = LLM(model=str(folder), load_format="dummy", dtype="float32", max_model_len=128,
              seed=0)
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=12,
                            structured_outputs=StructuredOutputsParams(regex=r"[a-z ]+"))
    outs = llm.generate(["hello"] * 4, params, use_tqdm=False)
    for out in outs:
        assert all(t < 49152 for t in out.outputs[0].token_ids)
        assert re.fullmatch(r"[a-z ]+", out.outputs[0].text), out.outputs[0].text
