"""The executor boundary (issue 14 item 1): ``distributed_executor_backend="mp"`` runs the
worker in its own process, steps crossing as pickled SchedulerOutput / ModelRunnerOutput, and
gives the same greedy tokens as the in-process executor; bad names are clear errors; a step
that fails in the worker fails its requests, not the engine; a dead worker is an error, not a
hang."""

from __future__ import annotations

import os
import signal

import pytest

from octavo import LLM, SamplingParams
from octavo.core.scheduler_output import ModelRunnerOutput
from octavo.executor.registry import get_executor_class, known_backends
from tests.tiny_models import make_checkpoint

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [(7 * i + 3 * n) % 100 for i in range(n)]} for n in (1, 6, 13, 30)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_checkpoint("qwen3", str(tmp_path_factory.mktemp("mp_qwen3")))


def _llm(path, backend, **kw):
    return LLM(model=path, dtype="float32", skip_tokenizer_init=True, max_model_len=128,
               distributed_executor_backend=backend, **kw)


@pytest.fixture(scope="module")
def mp_llm(tiny):
    llm = _llm(tiny, "mp")
    yield llm
    llm.llm_engine.shutdown()


def _tokens(llm, prompts=PROMPTS, params=GREEDY):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def test_registry_and_bad_names():
    assert {"uni", "mp"} <= set(known_backends())
    with pytest.raises(ValueError, match="distributed_executor_backend='threads'"):
        get_executor_class("threads")


def test_bad_name_is_refused_before_anything_starts(tiny):
    with pytest.raises(ValueError, match="'threads' is not supported"):
        _llm(tiny, "threads")


def test_mp_equals_uni(tiny, mp_llm):
    uni = _llm(tiny, "uni")
    assert _tokens(mp_llm) == _tokens(uni)
    # Sampling with seeds, n > 1 and logprobs cross the boundary too.
    params = SamplingParams(temperature=1.0, seed=7, n=2, max_tokens=8, logprobs=2,
                            ignore_eos=True)
    a = mp_llm.generate(PROMPTS[:2], params, use_tqdm=False)
    b = uni.generate(PROMPTS[:2], params, use_tqdm=False)
    assert [[c.token_ids for c in o.outputs] for o in a] == \
        [[c.token_ids for c in o.outputs] for o in b]
    assert a[0].outputs[0].logprobs is not None


def test_mp_with_async_scheduling_matches(tiny):
    """Asynchronous scheduling launches step N+1 before N's tokens are back: the worker
    process must take the next step while one is in flight, and keep results in order."""
    llm = _llm(tiny, "mp", async_scheduling=True)
    try:
        assert _tokens(llm) == _tokens(_llm(tiny, "uni", async_scheduling=True))
    finally:
        llm.llm_engine.shutdown()


def test_engine_reaches_nothing_behind_the_executor(mp_llm):
    executor = mp_llm.llm_engine.executor
    assert not hasattr(executor, "worker")  # the model lives in the other process
    assert executor.num_blocks > 0 and executor._procs[0].pid != os.getpid()
    assert mp_llm.llm_engine.timings.prepare_s >= 0.0


class Boom:
    """A logits processor that raises inside the worker process (module level: pickles)."""

    def __call__(self, token_ids, logits):
        raise RuntimeError("boom")


def test_step_failure_in_worker_is_reported_and_engine_serves_on(mp_llm):
    engine = mp_llm.llm_engine
    bad = SamplingParams(max_tokens=4, logits_processors=[Boom()])
    outs = mp_llm.generate([PROMPTS[1], PROMPTS[2]], [bad, GREEDY], use_tqdm=False)
    assert outs[0].outputs[0].finish_reason == "error" and "boom" in outs[0].error
    assert len(outs[1].outputs[0].token_ids) == GREEDY.max_tokens  # its neighbour finished
    assert _tokens(mp_llm, PROMPTS[:1]) == _tokens(mp_llm, PROMPTS[:1])
    assert engine.scheduler.kv.usage == 0.0  # every block back


def test_unpicklable_logits_processor_is_refused_clearly(mp_llm):
    from octavo.errors import InvalidRequestError

    local = SamplingParams(max_tokens=2, logits_processors=[lambda ids, logits: logits])
    with pytest.raises(InvalidRequestError, match="cannot be pickled") as e:
        mp_llm.generate([PROMPTS[0]], local, use_tqdm=False)
    assert e.value.param == "logits_processors"
    assert _tokens(mp_llm, PROMPTS[:1])  # still serving


def test_dead_worker_is_an_error_not_a_hang(mp_llm):
    """The module's engine, killed here: the last test that takes ``mp_llm`` (its fixture's
    shutdown then stops a dead worker, as the engine's own shutdown after this error would;
    a worker start fewer, ~5 s of CPU on CI)."""
    executor = mp_llm.llm_engine.executor
    os.kill(executor._procs[0].pid, signal.SIGKILL)
    executor._procs[0].join(10)
    with pytest.raises(Exception, match="worker process of rank 0 died"):
        mp_llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)


def test_outputs_are_plain_picklable_messages():
    import pickle

    out = ModelRunnerOutput(["a"], [3], logprobs=None, prepare_s=0.001)
    assert pickle.loads(pickle.dumps(out)) == out


def test_server_flag(tiny, tmp_path):
    """--distributed-executor-backend on the OpenAI server (and so on the simple server and
    `octavo serve`, which share its flags): mp serves; an unknown name is refused first."""
    pytest.importorskip("fastapi")
    import shutil

    from octavo.entrypoints.openai.api_server import (
        make_arg_parser,
        start_engine,
        unsupported_flags,
    )
    from tests.server_checks import assert_completes
    from tests.tiny_models import add_word_tokenizer

    folder = str(tmp_path / "with_tokenizer")
    shutil.copytree(tiny, folder)
    add_word_tokenizer(folder)

    def args(*flags):
        return make_arg_parser().parse_args(["--model", folder, "--dtype", "float32",
                                             "--max-model-len", "64", *flags])

    bad = unsupported_flags(args("--distributed-executor-backend", "threads"))
    assert len(bad) == 1 and "'threads'" in bad[0]
    engine = start_engine(args("--distributed-executor-backend", "mp"))
    assert engine is not None
    try:
        assert engine.engine.executor.crosses_processes
        assert_completes(engine, folder)
    finally:
        engine.shutdown()
    assert not engine.engine.executor._procs[0].is_alive()  # shutdown stops the worker process
