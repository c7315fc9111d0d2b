"""``--engine-process`` (issue 15 item 4): one engine in a process of its own behind the
OpenAI server, so that the server's process only serves HTTP. It answers as the engine in
the server's process does (streamed and not, usage, stop strings, logprobs, chat); a
consumer that falls behind gets several tokens per chunk, concatenating to the same text; a
killed engine process ends its streams with an error naming it, promptly, and the server
serves again once the engine is restarted."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from octavo.entrypoints.openai.api_server import (  # noqa: E402
    ServerSettings,
    build_app,
    start_engine,
)
from octavo.replicas import ReplicaRouter  # noqa: E402
from tests.running_server import RunningServer, openai_http_library, server_flags  # noqa: E402
from tests.tiny_models import make_word_llama  # noqa: E402

httpx = openai_http_library(openai)

MAX_LEN = 512
PROMPTS = ["w5 w17 w300", "w9", "w100 w101 w102 w103 w104 w105"]
BOUND_S = 60.0


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_word_llama(str(tmp_path_factory.mktemp("engine_process") / "llama"))


def _flags(model, *extra):
    return server_flags(model, MAX_LEN, *extra)


@pytest.fixture(scope="module")
def servers(model):
    """(the engine-process server, its router, the in-process server)."""
    router = start_engine(_flags(model, "--engine-process"))
    assert isinstance(router, ReplicaRouter) and len(router.slots) == 1
    assert router.slots[0].pid != os.getpid()
    local = start_engine(_flags(model))
    assert not isinstance(local, ReplicaRouter)
    settings = ServerSettings(served_model_names=["tiny"])
    remote_srv = RunningServer(build_app(router, settings))
    local_srv = RunningServer(build_app(local, settings))
    yield remote_srv, router, local_srv
    remote_srv.stop()
    local_srv.stop()
    router.shutdown()
    local.shutdown()


def _stream_events(base_url: str, body: dict, path: str = "/v1/completions",
                   delay_s: float = 0.0) -> list[dict]:
    events = []
    with httpx.stream("POST", base_url + path, json=body, timeout=BOUND_S) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                break
            events.append(json.loads(data))
            if delay_s:
                time.sleep(delay_s)
    return events


def _completion_bodies() -> list[dict]:
    greedy = {"model": "tiny", "temperature": 0, "max_tokens": 24}
    return [
        {**greedy, "prompt": PROMPTS[0], "ignore_eos": True},
        {**greedy, "prompt": PROMPTS[1], "ignore_eos": True, "logprobs": 2},
        {**greedy, "prompt": PROMPTS[2], "stop": ["w7"], "ignore_eos": True},
        {**greedy, "prompt": [5, 17, 300], "ignore_eos": True, "n": 2, "temperature": 0.8,
         "seed": 3},
    ]


def test_answers_as_the_engine_in_the_servers_process(servers):
    remote, _, local = servers
    for body in _completion_bodies():
        want = httpx.post(local.base_url + "/v1/completions", json=body, timeout=BOUND_S)
        got = httpx.post(remote.base_url + "/v1/completions", json=body, timeout=BOUND_S)
        assert got.status_code == want.status_code == 200
        w, g = want.json(), got.json()
        assert g["choices"] == w["choices"] and g["usage"] == w["usage"]
        # Streamed: the same text, finish reasons and usage, chunk by chunk concatenated.
        stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
        for srv, ref in ((remote, w), (local, w)):
            events = _stream_events(srv.base_url, stream)
            assert events[-1]["usage"] == ref["usage"]
            for choice in ref["choices"]:
                mine = [c for e in events for c in e["choices"]
                        if c["index"] == choice["index"]]
                assert "".join(c["text"] for c in mine) == choice["text"]
                assert mine[-1]["finish_reason"] == choice["finish_reason"]
                assert mine[-1]["stop_reason"] == choice["stop_reason"]
                if choice["logprobs"] is not None:
                    assert [t for c in mine for t in c["logprobs"]["tokens"]] == \
                        choice["logprobs"]["tokens"]
    chat = {"model": "tiny", "temperature": 0, "max_tokens": 10, "ignore_eos": True,
            "messages": [{"role": "user", "content": "w5 w6"}]}
    local_chat = httpx.post(local.base_url + "/v1/chat/completions", json=chat,
                            timeout=BOUND_S)
    remote_chat = httpx.post(remote.base_url + "/v1/chat/completions", json=chat,
                             timeout=BOUND_S)
    if local_chat.status_code == 200:  # the word tokenizer may have no chat template
        assert remote_chat.json()["choices"] == local_chat.json()["choices"]
        events = _stream_events(remote.base_url, {**chat, "stream": True},
                                "/v1/chat/completions")
        text = "".join(c["delta"].get("content") or "" for e in events
                       for c in e["choices"])
        assert text == local_chat.json()["choices"][0]["message"]["content"]
    else:
        assert remote_chat.status_code == local_chat.status_code


def test_a_consumer_behind_gets_coalesced_chunks_with_the_same_text(servers):
    """A stream whose consumer (the server's event loop, when busy) falls behind the engine
    gets everything so far in one output: fewer, larger chunks, the same tokens and text."""
    from octavo.sampling_params import RequestOutputKind, SamplingParams

    remote, router, _ = servers
    body = {"model": "tiny", "temperature": 0, "max_tokens": 200, "ignore_eos": True,
            "prompt": PROMPTS[0]}
    want = httpx.post(remote.base_url + "/v1/completions", json=body,
                      timeout=BOUND_S).json()["choices"][0]["text"]
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)

    async def slow_consumer():
        outs = []
        async for out in router.generate(PROMPTS[0], params, "slow"):
            outs.append(out)
            await asyncio.sleep(0.05)  # as a loop busy with other streams
        return outs

    outs = asyncio.run(slow_consumer())
    assert "".join(o.outputs[0].text for o in outs) == want
    assert sum(len(o.outputs[0].token_ids) for o in outs) == 200
    assert outs[-1].finished and len(outs) < 100, len(outs)
    assert all(o.prompt_token_ids == outs[0].prompt_token_ids for o in outs)  # re-attached


def test_a_killed_engine_process_ends_streams_clearly_and_comes_back(servers):
    remote, router, _ = servers
    old_pid = router.slots[0].pid
    body = {"model": "tiny", "temperature": 0, "max_tokens": 480, "ignore_eos": True,
            "prompt": PROMPTS[0], "stream": True}

    async def run():
        aclient = openai.AsyncOpenAI(base_url=remote.base_url + "/v1", api_key="x",
                                     max_retries=0, timeout=BOUND_S)
        seen = asyncio.Event()

        async def streamed():
            text = ""
            stream = await aclient.completions.create(
                **{k: v for k, v in body.items() if k not in ("ignore_eos",)},
                extra_body={"ignore_eos": True})
            async for chunk in stream:
                text += chunk.choices[0].text
                seen.set()
            return text

        t0 = time.monotonic()
        tasks = [asyncio.ensure_future(asyncio.wait_for(streamed(), BOUND_S))
                 for _ in range(16)]
        await asyncio.wait_for(seen.wait(), 30)
        os.kill(router.slots[0].pid, signal.SIGKILL)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        await aclient.close()
        return results, time.monotonic() - t0

    results, took = asyncio.run(run())
    assert took < BOUND_S
    failed = [r for r in results if isinstance(r, BaseException)]
    assert failed  # the tiny engine is fast: some streams may have ended before the kill
    for r in failed:  # each had streamed output: it fails, naming why
        assert isinstance(r, openai.APIError), repr(r)
        assert "killed by signal 9" in str(r), str(r)
    for r in results:
        assert isinstance(r, BaseException) or len(r.split()) == 480
    deadline = time.monotonic() + 60
    while router.slots[0].state != "ready":
        assert time.monotonic() < deadline, router.health_report()
        time.sleep(0.05)
    assert router.slots[0].pid != old_pid
    again = httpx.post(remote.base_url + "/v1/completions", timeout=BOUND_S, json={
        "model": "tiny", "temperature": 0, "max_tokens": 5, "prompt": PROMPTS[1]})
    assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 5


def test_engine_process_defaults_to_the_device(monkeypatch):
    """--engine-process unset: on where the engine runs on CUDA (the measured W3 gain), off on
    the CPU; given either way, the flag wins."""
    import torch

    from octavo.engine.arg_utils import EngineArgs
    from octavo.entrypoints.engine_client import wants_engine_process
    from octavo.entrypoints.openai.api_server import make_arg_parser

    def decide(flags, device, cuda):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        return wants_engine_process(make_arg_parser().parse_args(flags),
                                    EngineArgs(model="m", device=device))

    assert make_arg_parser().parse_args([]).engine_process is None
    assert decide([], "auto", cuda=True) and decide([], "cuda:1", cuda=True)
    assert not decide([], "auto", cuda=False) and not decide([], "cpu", cuda=True)
    assert not decide(["--no-engine-process"], "auto", cuda=True)
    assert decide(["--engine-process"], "cpu", cuda=False)
