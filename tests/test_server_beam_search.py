"""Beam search through AsyncLLM and both servers (``use_beam_search`` with ``n`` / ``best_of``,
``length_penalty``, ``early_stopping``), compared with offline ``LLM.generate``.

Beam search is deterministic (greedy ranking of raw logprobs), so the same prompt must give
the same beams offline, through ``AsyncLLM.generate``, through /v1/completions (whole and
streamed: one final chunk per beam) and through the simple /generate server. Also: aborts
(a cancelled consumer, a client that goes away) free every KV block, and invalid requests
are 400s naming their field.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from octavo import LLM, SamplingParams
from octavo.engine.arg_utils import EngineArgs
from octavo.engine.async_llm import AsyncLLM
from octavo.errors import InvalidRequestError
from octavo.sampling_params import RequestOutputKind
from tests.running_server import wait_idle
from tests.tiny_models import make_checkpoint

TOKEN_PROMPT = [1, 5, 9, 23, 77, 101, 7, 3]
TEXT_PROMPT = "The capital of France is"


def _beams(out):
    return [(list(c.token_ids), c.text, c.finish_reason, round(c.cumulative_logprob, 4))
            for c in out.outputs]


# =========================================================================== AsyncLLM

@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return make_checkpoint("llama", str(tmp_path_factory.mktemp("llama_async_beams")))


TINY_CASES = {
    "n2_of_3": dict(n=2, best_of=3, max_tokens=10, ignore_eos=True),
    "lp_half_early": dict(n=3, max_tokens=8, length_penalty=0.5, early_stopping=True,
                          stop_token_ids=[7, 9, 23]),
    "never_logprobs": dict(n=2, max_tokens=6, early_stopping="never", logprobs=2,
                           length_penalty=1.5),
}


def _beam_params(**kw) -> SamplingParams:
    return SamplingParams(use_beam_search=True, temperature=0.0, **kw)


@pytest.fixture(scope="module")
def tiny_offline(tiny_dir):
    llm = LLM(model=tiny_dir, dtype="float32", skip_tokenizer_init=True, max_model_len=128)
    prompt = {"prompt_token_ids": TOKEN_PROMPT}
    out = {name: llm.generate(prompt, _beam_params(**kw), use_tqdm=False)[0]
           for name, kw in TINY_CASES.items()}
    out["greedy"] = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=10,
                                                        ignore_eos=True), use_tqdm=False)[0]
    return out


@pytest.fixture(scope="module")
def allm(tiny_dir, tiny_offline):
    engine = AsyncLLM.from_engine_args(EngineArgs(
        model=tiny_dir, dtype="float32", skip_tokenizer_init=True, max_model_len=128))
    yield engine
    engine.shutdown()


@pytest.fixture(autouse=True)
def _settle(request):
    yield
    if "allm" in request.fixturenames:
        wait_idle(request.getfixturevalue("allm"))


async def _final(allm: AsyncLLM, params: SamplingParams, rid: str, prompt=TOKEN_PROMPT):
    outs = [o async for o in allm.generate(prompt, params, rid)]
    assert len(outs) == 1 and outs[0].finished, "beam search yields one final output"
    return outs[0]


@pytest.mark.parametrize("kind", list(RequestOutputKind), ids=lambda k: k.name)
def test_async_llm_equals_offline(allm, tiny_offline, kind):
    """Every case at once (their rounds interleave in the engine's batches) and a plain greedy
    request beside them: each equals its offline result, whatever the output kind."""
    async def main():
        beams = [_final(allm, _beam_params(**kw, output_kind=kind), f"{name}-{kind.name}")
                 for name, kw in TINY_CASES.items()]
        plain = allm.generate(TOKEN_PROMPT, SamplingParams(
            temperature=0, max_tokens=10, ignore_eos=True), f"greedy-{kind.name}")
        return await asyncio.gather(*beams, _collect_last(plain))

    *outs, greedy = asyncio.run(main())
    for (name, kw), out in zip(TINY_CASES.items(), outs):
        ref = tiny_offline[name]
        assert len(out.outputs) == kw["n"]
        assert [c.index for c in out.outputs] == list(range(kw["n"]))
        assert _beams(out) == _beams(ref), name
        assert out.prompt_token_ids == TOKEN_PROMPT
        if kw.get("logprobs"):
            for c, r in zip(out.outputs, ref.outputs):
                assert len(c.logprobs) == len(c.token_ids)
                assert [{t: round(lp.logprob, 4) for t, lp in step.items()}
                        for step in c.logprobs] == [
                    {t: round(lp.logprob, 4) for t, lp in step.items()} for step in r.logprobs]
    assert list(greedy.outputs[0].token_ids) == list(tiny_offline["greedy"].outputs[0].token_ids)


async def _collect_last(gen):
    last = None
    async for out in gen:
        last = out
    return last


def test_async_llm_abort_frees_blocks(allm):
    """A consumer that stops waiting (cancelled mid-search) aborts every live beam's round:
    the conftest leak check and _settle see every block back in the pool."""
    params = _beam_params(n=3, max_tokens=100, ignore_eos=True)

    async def main():
        task = asyncio.ensure_future(_final(allm, params, "to-abort"))
        deadline = time.monotonic() + 20
        while allm.engine.get_num_unfinished_requests() < 2:  # the search has forked
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    wait_idle(allm)
    assert not allm._beams.has_job("to-abort")
    # The request id is free again, and a later search runs normally.
    out = asyncio.run(_final(allm, _beam_params(n=2, max_tokens=4, ignore_eos=True), "to-abort"))
    assert len(out.outputs) == 2


def test_async_llm_abort_by_id(allm):
    params = _beam_params(n=2, max_tokens=100, ignore_eos=True)

    async def main():
        task = asyncio.ensure_future(_final(allm, params, "by-id"))
        deadline = time.monotonic() + 20
        while not allm.engine.get_num_unfinished_requests():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        allm.abort("by-id")
        await asyncio.sleep(0.2)
        assert not task.done()  # an aborted stream gets nothing more, as for other requests
        task.cancel()

    asyncio.run(main())
    wait_idle(allm)


def test_async_llm_search_fault_fails_only_that_search(allm, monkeypatch):
    """A search that faults between rounds fails its own stream (RequestFailedError) and
    frees its rounds; a plain request beside it finishes."""
    from octavo.errors import RequestFailedError

    real = allm._beams.consume
    state = {"calls": 0}

    def flaky(out):
        state["calls"] += 1
        if state["calls"] == 3:
            raise RuntimeError("simulated fault")
        return real(out)

    monkeypatch.setattr(allm._beams, "consume", flaky)

    async def main():
        beam = _final(allm, _beam_params(n=2, max_tokens=50, ignore_eos=True), "faulty")
        plain = _collect_last(allm.generate(TOKEN_PROMPT, SamplingParams(
            temperature=0, max_tokens=10, ignore_eos=True), "beside"))
        return await asyncio.gather(beam, plain, return_exceptions=True)

    beam, plain = asyncio.run(main())
    assert isinstance(beam, RequestFailedError) and "simulated fault" in str(beam)
    assert plain.finished and len(plain.outputs[0].token_ids) == 10
    wait_idle(allm)
    assert not allm._beams.has_job("faulty")


def test_validation_params_for_the_processor(allm, caplog):
    """What a server checks before queueing a beam request: the beam refusals by name, then
    the processor's own checks on the rest, without its "length_penalty is ignored" warning
    (the beam search does use it)."""
    from octavo.engine.beam_runner import validation_params

    engine = allm.engine
    plain = SamplingParams(temperature=0, max_tokens=4)
    assert validation_params(engine, plain) is plain
    params = _beam_params(n=2, best_of=3, max_tokens=4, length_penalty=0.5,
                          early_stopping="never")
    checked = validation_params(engine, params)
    assert params.use_beam_search and params.length_penalty == 0.5  # not modified
    assert not checked.use_beam_search and (checked.n, checked.best_of) == (2, 3)
    engine.processor._warned.discard("length_penalty")
    with caplog.at_level("WARNING", logger="octavo.engine.processor"):
        engine.processor.process("validate", TOKEN_PROMPT, checked)
    assert not caplog.records
    with pytest.raises(InvalidRequestError) as info:
        validation_params(engine, _beam_params(max_tokens=4, bad_words=["x"]))
    assert info.value.param == "bad_words"


@pytest.mark.parametrize("kwargs, param", [
    (dict(presence_penalty=0.5), "presence_penalty"),
    (dict(min_tokens=2), "min_tokens"),
    (dict(n=16), "n"),  # 2 * 16 candidates per step > max_logprobs=20
    (dict(n=2, best_of=12), "best_of"),
])
def test_async_llm_rejects_invalid_requests(allm, kwargs, param):
    async def main():
        return await _final(allm, _beam_params(max_tokens=4, **kwargs), f"bad-{param}")

    with pytest.raises(InvalidRequestError) as info:
        asyncio.run(main())
    assert info.value.param == param


# =========================================================================== the servers

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
try:
    import httpx
except ImportError:  # newer openai releases ship the same client as httpx2
    httpx = pytest.importorskip("httpx2")

SERVER_CASES = {
    "n2_of_3": dict(n=2, best_of=3, max_tokens=8),
    "n3_lp": dict(n=3, max_tokens=6, length_penalty=0.5, early_stopping=True),
}


@pytest.fixture(scope="module")
def smol_offline():
    """Offline results on the embedded model, then that same engine serves both apps (one
    model load for the module)."""
    llm = LLM(max_model_len=256, max_num_seqs=32)
    expected = {name: llm.generate(TEXT_PROMPT, _beam_params(**kw), use_tqdm=False)[0]
                for name, kw in SERVER_CASES.items()}
    return llm, expected


@pytest.fixture(scope="module")
def smol_engine(smol_offline):
    engine = AsyncLLM(smol_offline[0].llm_engine)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def openai_http(smol_engine):
    from octavo.entrypoints.openai.api_server import ServerSettings, build_app
    from tests.running_server import RunningServer

    srv = RunningServer(build_app(smol_engine, ServerSettings(shutdown_engine=False)))
    with httpx.Client(base_url=srv.base_url, timeout=60) as client:
        yield client
    srv.stop()


@pytest.fixture(scope="module")
def simple_http(smol_engine):
    from octavo.entrypoints.api_server import build_app
    from tests.running_server import RunningServer

    srv = RunningServer(build_app(smol_engine, shutdown_engine=False))
    with httpx.Client(base_url=srv.base_url, timeout=60) as client:
        yield client
    srv.stop()


@pytest.fixture
def idle_after(smol_engine):
    yield
    wait_idle(smol_engine)


def _expected_choices(out):
    return [(c.index, c.text, c.finish_reason) for c in out.outputs]


@pytest.mark.parametrize("case", list(SERVER_CASES))
def test_completions_equal_offline(openai_http, smol_offline, case, idle_after):
    body = {"prompt": TEXT_PROMPT, "use_beam_search": True, **SERVER_CASES[case]}
    r = openai_http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    expected = smol_offline[1][case]
    assert [(c["index"], c["text"], c["finish_reason"]) for c in data["choices"]] == \
        _expected_choices(expected)
    assert data["usage"]["completion_tokens"] == sum(len(c.token_ids) for c in expected.outputs)
    assert data["usage"]["prompt_tokens"] == len(expected.prompt_token_ids)


def test_completions_temperature_is_ignored(openai_http, smol_offline, idle_after):
    """As in vLLM, beams are ranked by raw logprobs: a client's temperature changes nothing."""
    body = {"prompt": TEXT_PROMPT, "use_beam_search": True, "temperature": 0.9, "top_p": 0.5,
            **SERVER_CASES["n2_of_3"]}
    r = openai_http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert [(c["index"], c["text"], c["finish_reason"]) for c in r.json()["choices"]] == \
        _expected_choices(smol_offline[1]["n2_of_3"])


def test_completions_stream_sends_the_beams_at_the_end(openai_http, smol_offline, idle_after):
    """Streaming is supported: each beam arrives whole, in one chunk, when the search ends."""
    body = {"prompt": TEXT_PROMPT, "use_beam_search": True, "stream": True,
            "stream_options": {"include_usage": True}, **SERVER_CASES["n3_lp"]}
    with openai_http.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        events = [line[len("data: "):] for line in resp.iter_lines() if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    choices = [c for chunk in chunks for c in chunk["choices"]]
    expected = smol_offline[1]["n3_lp"]
    assert sorted((c["index"], c["text"], c["finish_reason"]) for c in choices) == \
        _expected_choices(expected)
    assert chunks[-1]["usage"]["completion_tokens"] == sum(
        len(c.token_ids) for c in expected.outputs)


def test_completions_several_prompts(openai_http, smol_offline, idle_after):
    """Choice index = prompt index * n + beam index, as for sampled requests."""
    body = {"prompt": [TEXT_PROMPT, TEXT_PROMPT], "use_beam_search": True,
            **SERVER_CASES["n2_of_3"]}
    r = openai_http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    texts = {c["index"]: c["text"] for c in r.json()["choices"]}
    ref = [c.text for c in smol_offline[1]["n2_of_3"].outputs]
    assert texts == {0: ref[0], 1: ref[1], 2: ref[0], 3: ref[1]}


@pytest.mark.parametrize("extra, param", [
    ({"use_beam_search": "yes"}, "use_beam_search"),
    ({"use_beam_search": 1}, "use_beam_search"),
    ({"early_stopping": "sometimes"}, "early_stopping"),
    ({"length_penalty": "1.0"}, "length_penalty"),
    ({"length_penalty": True}, "length_penalty"),
    ({"stop": ["\n"]}, "stop"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"n": 16}, "n"),
])
def test_completions_invalid_beam_requests(openai_http, extra, param, idle_after):
    body = {"prompt": TEXT_PROMPT, "use_beam_search": True, "max_tokens": 4, **extra}
    for stream in (False, True):  # refused before a stream starts, too
        r = openai_http.post("/v1/completions", json={**body, "stream": stream})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param, r.text


def test_completions_client_gone_frees_blocks(openai_http, smol_engine, idle_after):
    """A client that disconnects mid-search (whole or streamed) ends every beam's round."""
    body = {"prompt": TEXT_PROMPT, "use_beam_search": True, "n": 3, "max_tokens": 200,
            "ignore_eos": True}
    with pytest.raises(httpx.TimeoutException):
        openai_http.post("/v1/completions", json=body, timeout=1.0)
    wait_idle(smol_engine)
    with openai_http.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        deadline = time.monotonic() + 20
        while not smol_engine.engine.get_num_unfinished_requests():
            assert time.monotonic() < deadline
            time.sleep(0.01)
    wait_idle(smol_engine)


def test_simple_server_equals_offline(simple_http, smol_offline, idle_after):
    for case, kw in SERVER_CASES.items():
        body = {"prompt": TEXT_PROMPT, "use_beam_search": True, "temperature": 0, **kw}
        r = simple_http.post("/generate", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["text"] == [TEXT_PROMPT + c.text
                                    for c in smol_offline[1][case].outputs], case
    with simple_http.stream("POST", "/generate", json={**body, "stream": True}) as resp:
        lines = [json.loads(line) for line in resp.iter_lines() if line]
    assert lines == [{"text": [TEXT_PROMPT + c.text for c in smol_offline[1][case].outputs]}]


def test_simple_server_takes_sampling_params_as_they_are(simple_http, idle_after):
    """/generate builds SamplingParams from the body, as offline: beam search needs
    temperature 0 there, and the beam-specific refusals name their field."""
    body = {"prompt": TEXT_PROMPT, "use_beam_search": True, "max_tokens": 4}
    r = simple_http.post("/generate", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature", r.text
    r = simple_http.post("/generate", json={**body, "temperature": 0, "min_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens", r.text
