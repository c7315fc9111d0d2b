"""``plain_deltas`` (issue 15 item 4): an engine process's streams get each unfinished DELTA
output after the first as a StepDelta tuple built in one pass from the request's state, not
a RequestOutput. The tuples must carry exactly what the RequestOutputs they replace carry
(text with stop strings held back, token ids, the completion index of a sample of n > 1);
requests that need more (logprobs, other output kinds) keep their RequestOutputs."""

from __future__ import annotations

import asyncio
import threading

import pytest

from octavo.engine.arg_utils import EngineArgs
from octavo.engine.async_llm import AsyncLLM
from octavo.engine.llm_engine import LLMEngine
from octavo.outputs import RequestOutput
from octavo.sampling_params import RequestOutputKind, SamplingParams
from tests.tiny_models import make_word_llama

PROMPT = "w5 w17 w300 w9"
DELTA = RequestOutputKind.DELTA


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return make_word_llama(str(tmp_path_factory.mktemp("plain_deltas") / "llama"))


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async_sched"])
def engine(model, request):
    # No prefix caching: a request run again computes as the first run did (and reports
    # the same num_cached_tokens).
    eng = LLMEngine.from_engine_args(EngineArgs(
        model=model, dtype="float32", max_model_len=256, enable_prefix_caching=False,
        async_scheduling=request.param))
    yield eng
    eng.shutdown()


def _run(engine: LLMEngine, params: SamplingParams, plain: bool, rid: str = "r",
         abort_after: int | None = None) -> list:
    engine.add_request(rid, PROMPT, params, plain_deltas=plain)
    outs: list = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert (out[0] if out.__class__ is tuple else out.request_id) == rid
            outs.append(out)
        if abort_after is not None and len(outs) >= abort_after:
            engine.abort_request(rid)
            abort_after = None
    return outs


def _fields(out) -> tuple:
    """What a consumer sees of one output (not its time stamps)."""
    if out.__class__ is tuple:
        rid, index, text, token_ids = out
        return ("delta", rid, index, text, list(token_ids))
    assert isinstance(out, RequestOutput)
    return (out.request_id, out.prompt, out.prompt_token_ids, out.prompt_logprobs,
            [(c.index, c.text, list(c.token_ids), c.cumulative_logprob, c.logprobs,
              c.finish_reason, c.stop_reason) for c in out.outputs],
            out.finished, out.num_cached_tokens, out.error)


def _as_plain(outs: list[RequestOutput]) -> list:
    """What the RequestOutput path gives, written as plain_deltas would give it: after each
    completion's first output, its unfinished outputs with nothing beyond text and ids
    become deltas (as an engine process's sink turned them into "delta" messages before)."""
    seen: set[int] = set()
    plain = []
    for out in outs:
        plain.append(_one_as_plain(out, seen))
        seen.update(c.index for c in out.outputs)
    return plain


def _one_as_plain(out: RequestOutput, seen: set[int]):
    c = out.outputs[0] if len(out.outputs) == 1 else None
    if (c is not None and c.index in seen and not out.finished and c.finish_reason is None and c.logprobs is None
            and c.cumulative_logprob is None and out.prompt_logprobs is None):
        return ("delta", out.request_id, c.index, c.text, list(c.token_ids))
    return _fields(out)


def _check_same(engine, params: SamplingParams, expect_deltas: bool) -> list:
    ref = _run(engine, params, plain=False)
    got = _run(engine, params, plain=True)
    assert not any(o.__class__ is tuple for o in ref)
    assert [_fields(o) for o in got] == (
        _as_plain(ref) if expect_deltas else [_fields(o) for o in ref])
    deltas = [o for o in got if o.__class__ is tuple]
    assert bool(deltas) == expect_deltas
    if expect_deltas:  # the first output and the last stay RequestOutputs
        assert isinstance(got[0], RequestOutput) and isinstance(got[-1], RequestOutput)
        assert got[-1].finished
    return got


def _text(engine, **kw) -> str:
    out = _run(engine, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True,
                                      output_kind=RequestOutputKind.FINAL_ONLY, **kw), False)
    return out[-1].outputs[0].text


def test_greedy_stream(engine):
    got = _check_same(engine, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True,
                                             output_kind=DELTA), expect_deltas=True)
    assert len(got) == 16 and sum(o.__class__ is tuple for o in got) == 14


@pytest.mark.parametrize("include", [False, True], ids=["stop_excluded", "stop_included"])
def test_a_stop_string_across_tokens_is_held_back_and_cut(engine, include):
    full = _text(engine)
    words = full.split()
    # The end of the 6th word and the start of the 7th: held back over two steps.
    stop = words[5][1:] + " " + words[6][:2]
    got = _check_same(engine, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True,
                                             output_kind=DELTA, stop=[stop],
                                             include_stop_str_in_output=include),
                      expect_deltas=True)
    last = got[-1].outputs[0]
    assert last.finish_reason == "stop" and last.stop_reason == stop
    text = "".join(o[2] if o.__class__ is tuple else o.outputs[0].text for o in got)
    cut = full.index(stop) + (len(stop) if include else 0)
    assert text == full[:cut]


def test_a_stop_string_never_met_holds_text_back_until_the_end(engine):
    full = _text(engine)
    got = _check_same(engine, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True,
                                             output_kind=DELTA, stop=["not in any text"]),
                      expect_deltas=True)
    assert "".join(o[2] if o.__class__ is tuple else o.outputs[0].text for o in got) == full
    assert len(got[-1].outputs[0].text) >= len("not in any text") - 1  # what was held back


def test_samples_of_n_carry_their_index(engine):
    got = _check_same(engine, SamplingParams(n=3, temperature=0.8, seed=7, max_tokens=10,
                                             ignore_eos=True, output_kind=DELTA),
                      expect_deltas=True)
    deltas = [o for o in got if o.__class__ is tuple]
    assert {d[0] for d in deltas} == {"r"} and {d[1] for d in deltas} == {0, 1, 2}
    tokens = {i: [] for i in range(3)}
    for o in got:
        for index, ids in ([(o[1], o[3])] if o.__class__ is tuple else
                           [(c.index, c.token_ids) for c in o.outputs]):
            tokens[index] += ids
    assert all(len(t) == 10 for t in tokens.values())


def test_prompt_logprobs_come_once_then_deltas(engine):
    got = _check_same(engine, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                                             output_kind=DELTA, prompt_logprobs=1),
                      expect_deltas=True)
    assert got[0].prompt_logprobs is not None


@pytest.mark.parametrize("params", [
    dict(logprobs=2, output_kind=DELTA),
    dict(output_kind=RequestOutputKind.CUMULATIVE),
    dict(output_kind=RequestOutputKind.FINAL_ONLY),
], ids=["logprobs", "cumulative", "final_only"])
def test_requests_that_need_more_keep_their_request_outputs(engine, params):
    _check_same(engine, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, **params),
                expect_deltas=False)


def test_an_abort_ends_a_plain_stream(engine):
    pool = engine.scheduler.kv.pool
    got = _run(engine, SamplingParams(max_tokens=100, ignore_eos=True, output_kind=DELTA),
               plain=True, abort_after=4)
    assert 4 <= len(got) <= 5 and not engine.states and not engine.has_unfinished_requests()
    assert pool.num_free_blocks == pool.num_blocks
    assert not any(o.__class__ is not tuple and o.finished for o in got)


def test_sink_gets_deltas_and_stats_count_their_tokens(model):
    """Through AsyncLLM's sink (an engine process's path): the deltas reach the sink,
    a stream gets the same tokens and text, and the finished request's stats count every
    token."""
    allm = AsyncLLM.from_engine_args(EngineArgs(model=model, dtype="float32",
                                                max_model_len=256))
    finished = []

    class Stats:
        def record(self, stats, num_new_preemptions, done) -> None:
            finished.extend(done)

    allm.stat_loggers.append(Stats())
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, output_kind=DELTA,
                            stop=["never seen"])
    items: list = []
    done = threading.Event()

    def sink(batch: list) -> None:
        items.extend(batch)
        if any(o.__class__ is not tuple and not isinstance(o, BaseException) and o.finished
               for _, o in batch):
            done.set()

    try:
        allm.add_request_to_sink("s", PROMPT, params, sink, plain_deltas=True).result(10)
        assert done.wait(30)
        assert sum(o.__class__ is tuple for _, o in items) == 10

        async def stream():
            return [o async for o in allm.generate(PROMPT, params, "ref")]

        ref = asyncio.run(stream())
    finally:
        allm.shutdown()
    ids, text = [], ""
    for _, o in items:
        if o.__class__ is tuple:
            ids += o[3]
            text += o[2]
        else:
            ids += o.outputs[0].token_ids
            text += o.outputs[0].text
    assert ids == [t for o in ref for t in o.outputs[0].token_ids]
    assert text == "".join(o.outputs[0].text for o in ref)
    assert [f.num_output_tokens for f in finished] == [12, 12]
