"""Faults while a step runs: one traced to a request ends that request only; one that no
request explains restarts the engine (in-flight requests fail clearly, later ones are
served); one that persists kills the engine and runs its fatal callbacks (a server exits)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from octavo.engine.arg_utils import EngineArgs
from octavo.engine.async_llm import AsyncLLM, EngineDeadError
from octavo.engine.llm_engine import EngineStepError
from octavo.entrypoints.llm import LLM
from octavo.errors import RequestFailedError
from octavo.sampling_params import SamplingParams
from tests.tiny_models import make_checkpoint

PROMPTS = [[1, 5, 9, 23, 77], [1, 300, 301, 302], [1, 42, 43]]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return make_checkpoint("llama", str(tmp_path_factory.mktemp("llama_faults")))


def _args(path: str, **kw) -> EngineArgs:
    return EngineArgs(model=path, dtype="float32", skip_tokenizer_init=True, max_model_len=128,
                      **kw)


@pytest.fixture(scope="module")
def llm(tiny_dir) -> LLM:
    return LLM(model=tiny_dir, dtype="float32", skip_tokenizer_init=True, max_model_len=128)


def _ids(prompts):
    return [{"prompt_token_ids": p} for p in prompts]


def _pool_is_full(engine) -> bool:
    pool = engine.scheduler.kv.pool
    return pool.num_free_blocks == pool.num_blocks


def test_logits_processor_that_raises_fails_only_its_request(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    calls = []

    def explode_at_third(output_ids, logits):
        calls.append(len(output_ids))
        if len(output_ids) == 3:
            raise RuntimeError("processor bug")
        return logits

    bad = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True,
                         logits_processors=[explode_at_third])
    want = llm.generate(_ids(PROMPTS), greedy, use_tqdm=False)
    got = llm.generate(_ids(PROMPTS), [greedy, bad, greedy], use_tqdm=False)
    assert calls == [0, 1, 2, 3]  # it ran mid-request, then its request ended
    assert got[1].finished and got[1].outputs[0].finish_reason == "error"
    assert "processor bug" in got[1].error
    for i in (0, 2):  # the rest of the batch is untouched
        assert got[i].error is None
        assert got[i].outputs[0].token_ids == want[i].outputs[0].token_ids
    assert _pool_is_full(llm.llm_engine)


def test_logits_processor_runs_in_both_signatures(llm):
    seen = {}

    def two(output_ids, logits):
        seen["two"] = len(output_ids)
        return logits

    def three(prompt_ids, output_ids, logits):
        seen["three"] = (len(prompt_ids), len(output_ids))
        out = torch.full_like(logits, float("-inf"))
        out[7] = 0.0  # force token 7
        return out

    out = llm.generate(_ids(PROMPTS[:1]), SamplingParams(
        temperature=0.0, max_tokens=3, ignore_eos=True, logits_processors=[two, three]),
        use_tqdm=False)[0]
    assert out.outputs[0].token_ids == [7, 7, 7]
    assert seen == {"two": 2, "three": (5, 2)}


def test_wrong_shape_from_a_logits_processor_is_that_requests_error(llm):
    bad = SamplingParams(max_tokens=4, logits_processors=[lambda ids, logits: logits[:3]])
    ok = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    got = llm.generate(_ids(PROMPTS[:2]), [bad, ok], use_tqdm=False)
    assert got[0].outputs[0].finish_reason == "error" and "shape" in got[0].error
    assert len(got[1].outputs[0].token_ids) == 4


def test_failed_sample_fails_its_parent_and_aborts_siblings(llm):
    def bad(output_ids, logits):
        raise ValueError("nope")

    out = llm.generate(_ids(PROMPTS[:1]), SamplingParams(n=3, max_tokens=4,
                                                         logits_processors=[bad]),
                       use_tqdm=False)[0]
    assert out.finished and "nope" in out.error
    assert _pool_is_full(llm.llm_engine) and not llm.llm_engine.parents


def test_detokenization_fault_fails_only_its_request(llm):
    engine = llm.llm_engine
    original = engine._output_for

    def flaky(req, state, token, *rest):
        if req.request_id.endswith("-bad") or state.prompt_token_ids == PROMPTS[1]:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "simulated")
        return original(req, state, token, *rest)

    engine._output_for = flaky
    try:
        got = llm.generate(_ids(PROMPTS), SamplingParams(temperature=0.0, max_tokens=4,
                                                         ignore_eos=True), use_tqdm=False)
    finally:
        del engine._output_for
    assert got[1].outputs[0].finish_reason == "error" and "simulated" in got[1].error
    assert [len(got[i].outputs[0].token_ids) for i in (0, 2)] == [4, 4]
    assert _pool_is_full(engine)


def test_unattributable_step_fault_resets_the_engine_offline(llm):
    engine = llm.llm_engine
    original = engine.executor.execute_model_async
    engine.executor.execute_model_async = lambda sched: (_ for _ in ()).throw(
        RuntimeError("device fell over"))
    try:
        with pytest.raises(EngineStepError, match="device fell over"):
            llm.generate(_ids(PROMPTS), SamplingParams(max_tokens=4), use_tqdm=False)
    finally:
        engine.executor.execute_model_async = original
    assert _pool_is_full(engine) and not engine.states
    out = llm.generate(_ids(PROMPTS[:1]), SamplingParams(max_tokens=4, ignore_eos=True),
                       use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 4  # the same LLM serves on


def _collect(allm: AsyncLLM, prompt, params, rid):
    async def run():
        return [o async for o in allm.generate(prompt, params, rid)]
    return run()


def test_async_transient_fault_restarts_and_serves_on(tiny_dir):
    allm = AsyncLLM.from_engine_args(_args(tiny_dir))
    fatal = []
    allm.fatal_callbacks.append(fatal.append)
    executor = allm.engine.executor
    original = executor.execute_model_async
    failures = iter([RuntimeError("transient fault")])

    def once(sched):
        err = next(failures, None)
        if err is not None:
            raise err
        return original(sched)

    executor.execute_model_async = once

    async def main():
        params = SamplingParams(max_tokens=6, ignore_eos=True)
        results = await asyncio.gather(
            _collect(allm, {"prompt_token_ids": PROMPTS[0]}, params, "a"),
            _collect(allm, {"prompt_token_ids": PROMPTS[1]}, params, "b"),
            return_exceptions=True)
        for r in results:
            assert isinstance(r, RequestFailedError) and "restarted" in str(r)
        later = await _collect(allm, {"prompt_token_ids": PROMPTS[2]}, params, "c")
        assert len(later[-1].outputs[0].token_ids) == 6

    try:
        asyncio.run(main())
        assert not allm.errored and allm.num_restarts == 1 and not fatal
        assert _pool_is_full(allm.engine)
    finally:
        allm.shutdown()


def test_async_persistent_fault_kills_engine_and_calls_fatal(tiny_dir):
    allm = AsyncLLM.from_engine_args(_args(tiny_dir))
    fatal = []
    allm.fatal_callbacks.append(fatal.append)

    def broken(sched):
        raise RuntimeError("device lost")

    allm.engine.executor.execute_model_async = broken

    async def main():
        with pytest.raises(RequestFailedError, match="device lost"):
            await _collect(allm, {"prompt_token_ids": PROMPTS[0]}, SamplingParams(), "x")
        for _ in range(100):  # the health check fails on the engine thread
            if allm.errored:
                break
            await asyncio.sleep(0.05)
        assert allm.errored
        with pytest.raises(EngineDeadError):
            await _collect(allm, {"prompt_token_ids": PROMPTS[0]}, SamplingParams(), "y")

    asyncio.run(main())
    assert len(fatal) == 1 and "device lost" in repr(fatal[0].__cause__ or fatal[0])
    assert _pool_is_full(allm.engine) and not allm.engine.states


def _raiser(exc_type):
    def processor(output_ids, logits):
        if len(output_ids) == 2:
            raise exc_type("from user code")
        return logits
    return processor


@pytest.mark.parametrize("exc_type", [RuntimeError, SystemExit, KeyboardInterrupt,
                                      GeneratorExit, asyncio.CancelledError])
def test_async_logits_processor_fault_fails_its_stream_only(tiny_dir, exc_type):
    """Its request alone fails, the engine serves on. Not only Exceptions: SystemExit and
    the like, raised as they were, ended the engine thread (EngineDeadError for every
    request, the server gone); on the engine thread they are user code's, not Ctrl-C."""
    allm = AsyncLLM.from_engine_args(_args(tiny_dir))

    async def main():
        ok = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
        bad = SamplingParams(max_tokens=5, ignore_eos=True,
                             logits_processors=[_raiser(exc_type)])
        results = await asyncio.gather(
            _collect(allm, {"prompt_token_ids": PROMPTS[0]}, ok, "ok1"),
            _collect(allm, {"prompt_token_ids": PROMPTS[1]}, bad, "bad"),
            _collect(allm, {"prompt_token_ids": PROMPTS[2]}, ok, "ok2"),
            return_exceptions=True)
        assert isinstance(results[1], RequestFailedError), results[1]
        assert results[1].request_id == "bad"
        assert exc_type.__name__ in str(results[1]) or exc_type is RuntimeError
        assert "from user code" in str(results[1])
        for r in (results[0], results[2]):
            assert len(r[-1].outputs[0].token_ids) == 5
        later = await _collect(allm, {"prompt_token_ids": PROMPTS[2]}, ok, "later")
        assert len(later[-1].outputs[0].token_ids) == 5

    try:
        asyncio.run(main())
        assert allm.num_restarts == 0 and not allm.errored
        assert _pool_is_full(allm.engine)
    finally:
        allm.shutdown()


def test_offline_system_exit_from_a_processor_fails_its_request(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    bad = SamplingParams(max_tokens=5, ignore_eos=True, logits_processors=[_raiser(SystemExit)])
    got = llm.generate(_ids(PROMPTS[:2]), [greedy, bad], use_tqdm=False)
    assert got[0].error is None and len(got[0].outputs[0].token_ids) == 5
    assert "SystemExit('from user code')" in got[1].error
    assert _pool_is_full(llm.llm_engine)


def test_offline_keyboard_interrupt_still_stops_generate_and_loses_nothing(llm):
    """On the main thread a KeyboardInterrupt may be Ctrl-C: it stops the caller, and the
    engine drops the batch's requests on the way out, so the LLM serves on."""
    greedy = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    bad = SamplingParams(max_tokens=5, ignore_eos=True,
                         logits_processors=[_raiser(KeyboardInterrupt)])
    with pytest.raises(KeyboardInterrupt):
        llm.generate(_ids(PROMPTS[:2]), [greedy, bad], use_tqdm=False)
    assert not llm.llm_engine.states and _pool_is_full(llm.llm_engine)
    again = llm.generate(_ids(PROMPTS[:1]), greedy, use_tqdm=False)
    assert len(again[0].outputs[0].token_ids) == 5


def test_metrics_follow_the_engine_across_a_restart(tiny_dir):
    pytest.importorskip("prometheus_client")
    from octavo.metrics.prometheus import PrometheusStatLogger

    allm = AsyncLLM.from_engine_args(_args(tiny_dir))
    metrics = PrometheusStatLogger(allm.engine, "tiny")
    old = allm.engine.scheduler
    allm.engine.reset()  # what a step fault does
    assert allm.engine.scheduler is not old
    allm.engine.add_request("r", {"prompt_token_ids": PROMPTS[0]}, SamplingParams())
    text = metrics.render().decode()
    assert 'octavo:num_requests_waiting{model_name="tiny"} 1.0' in text
    allm.engine.abort_request("r")
    allm.shutdown()
