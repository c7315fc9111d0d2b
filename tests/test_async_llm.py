"""AsyncLLM: background engine loop, per-request async streams, abort on early exit, death."""

from __future__ import annotations

import asyncio
import time

import pytest

from octavo.engine.arg_utils import EngineArgs
from octavo.engine.async_llm import AsyncLLM
from octavo.entrypoints.llm import LLM
from octavo.sampling_params import RequestOutputKind, SamplingParams
from tests.tiny_models import make_checkpoint

PROMPT = [1, 5, 9, 23, 77, 101]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return make_checkpoint("llama", str(tmp_path_factory.mktemp("llama_async")))


def _args(path: str, async_scheduling: bool | None = None) -> EngineArgs:
    return EngineArgs(model=path, dtype="float32", skip_tokenizer_init=True, max_model_len=256,
                      async_scheduling=async_scheduling)


# Asynchronous scheduling (the CUDA default) forced on as well: a step is always in flight
# when a stream ends early or a request is aborted.
@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async_sched"])
def allm(tiny_dir, request):
    engine = AsyncLLM.from_engine_args(_args(tiny_dir, request.param))
    yield engine
    engine.shutdown()


def _wait_idle(allm: AsyncLLM) -> None:
    pool = allm.engine.scheduler.kv.pool
    deadline = time.monotonic() + 10
    while allm.engine.has_unfinished_requests() or pool.num_free_blocks != pool.num_blocks:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_streams_match_offline(allm, tiny_dir):
    greedy = dict(temperature=0, max_tokens=12, ignore_eos=True)

    async def collect(kind: RequestOutputKind, rid: str):
        outs = []
        async for out in allm.generate(PROMPT, SamplingParams(**greedy, output_kind=kind), rid):
            outs.append(out)
        return outs

    async def main():
        return await asyncio.gather(collect(RequestOutputKind.DELTA, "d"),
                                    collect(RequestOutputKind.CUMULATIVE, "c"),
                                    collect(RequestOutputKind.FINAL_ONLY, "f"))

    delta, cumulative, final = asyncio.run(main())
    want = LLM(model=tiny_dir, dtype="float32", skip_tokenizer_init=True, max_model_len=256
               ).generate([PROMPT], SamplingParams(**greedy), use_tqdm=False)[0]
    ids = [t for o in delta for t in o.outputs[0].token_ids]
    assert ids == list(want.outputs[0].token_ids)
    assert list(cumulative[-1].outputs[0].token_ids) == ids
    assert len(final) == 1 and list(final[0].outputs[0].token_ids) == ids
    assert delta[-1].finished and cumulative[-1].finished


def test_early_exit_aborts_and_frees_blocks(allm):
    params = SamplingParams(max_tokens=200, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    pool = allm.engine.scheduler.kv.pool

    async def main():
        gen = allm.generate(PROMPT, params, "early")
        await gen.__anext__()
        assert pool.num_free_blocks < pool.num_blocks
        await gen.aclose()  # the consumer goes away

        async def consume():
            async for _ in allm.generate(PROMPT, params, "cancelled"):
                pass

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    _wait_idle(allm)
    assert pool.num_free_blocks == pool.num_blocks


def test_start_request_queues_at_once_and_aborts_what_nobody_reads(allm):
    # A server handler's start_request reaches the engine before anything iterates; its
    # outputs wait in the stream. Dropped unread, the request is aborted and its blocks
    # come back; a second start under an id in use fails at its first iteration without
    # aborting the request that holds the id.
    import gc

    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    long = SamplingParams(max_tokens=200, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    pool = allm.engine.scheduler.kv.pool

    async def main():
        read = allm.start_request(PROMPT, params, "read")
        await until(lambda: pool.num_free_blocks < pool.num_blocks)  # running, unread
        ids = [t async for o in read for t in o.outputs[0].token_ids]
        expect = [t async for o in allm.generate(PROMPT, params, "lazy")
                  for t in o.outputs[0].token_ids]
        assert ids == expect and len(ids) == 8
        holder = allm.start_request(PROMPT, long, "held")
        first = await holder.__anext__()
        dup = allm.start_request(PROMPT, long, "held")
        with pytest.raises(ValueError, match="already in use"):
            await dup.__anext__()
        del dup
        gc.collect()
        more = await holder.__anext__()  # the holder goes on
        assert first.outputs[0].token_ids and more.outputs[0].token_ids
        await holder.aclose()
        allm.start_request(PROMPT, long, "dropped")  # never kept: collected at once
        await until(lambda: "dropped" in aborted)
        await until(lambda: not allm.engine.has_unfinished_requests())

    aborted: list[str] = []
    real = allm.engine.abort_request
    allm.engine.abort_request = lambda rid, *a, **k: aborted.append(rid) or real(rid, *a, **k)
    try:
        asyncio.run(main())
    finally:
        del allm.engine.abort_request
    assert "held" in aborted and "read" not in aborted
    _wait_idle(allm)
    assert pool.num_free_blocks == pool.num_blocks


async def until(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.002)


def test_invalid_request_and_duplicate_id(allm):
    async def main():
        with pytest.raises(ValueError, match="max_model_len"):
            async for _ in allm.generate([3] * 300, SamplingParams(), "long"):
                pass
        p = SamplingParams(max_tokens=50, ignore_eos=True)
        first = allm.generate(PROMPT, p, "dup")
        task = asyncio.ensure_future(first.__anext__())
        await asyncio.sleep(0.02)
        with pytest.raises(ValueError, match="already in use"):
            async for _ in allm.generate(PROMPT, p, "dup"):
                pass
        await task
        await first.aclose()

    asyncio.run(main())
    _wait_idle(allm)


def test_sink_requests_match_streams_and_abort_frees_blocks(allm):
    """add_request_to_sink (an engine process's path): one call per step with every output
    of the step; the same tokens as a stream; an invalid request fails its future; an abort
    ends the request with no further output and frees its blocks."""
    import threading

    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    calls: list[list] = []
    done = threading.Event()

    def sink(items: list) -> None:
        calls.append(items)
        if any(not isinstance(o, BaseException) and o.finished and rid == "s1"
               for rid, o in items):
            done.set()

    futs = [allm.add_request_to_sink(rid, PROMPT, greedy, sink) for rid in ("s0", "s1")]
    for f in futs:
        assert f.result(10) is None
    assert done.wait(30)
    # Both requests' tokens arrive together: one call per step, not one per request.
    assert any({rid for rid, _ in items} == {"s0", "s1"} for items in calls)
    ids = {rid: [t for items in calls for r, o in items if r == rid
                 for t in o.outputs[0].token_ids] for rid in ("s0", "s1")}

    async def stream():
        return [t async for o in allm.generate(PROMPT, greedy, "ref")
                for t in o.outputs[0].token_ids]

    ref = asyncio.run(stream())
    assert ids["s0"] == ids["s1"] == ref and len(ref) == 12

    bad = allm.add_request_to_sink("long", [3] * 300, greedy, sink)
    with pytest.raises(ValueError, match="max_model_len"):
        bad.result(10)

    calls.clear()
    long = SamplingParams(max_tokens=200, ignore_eos=True,
                          output_kind=RequestOutputKind.DELTA)
    allm.add_request_to_sink("aborted", PROMPT, long, sink).result(10)
    deadline = time.monotonic() + 10
    while not calls:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    allm.abort("aborted")
    _wait_idle(allm)
    n = len(calls)
    time.sleep(0.1)
    assert len(calls) == n  # nothing after the abort took effect
    assert not any(o.finished for items in calls for _, o in items
                   if not isinstance(o, BaseException))
