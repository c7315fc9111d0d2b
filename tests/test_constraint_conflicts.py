"""A request whose own fields conflict in a way found only while it runs: a structured-output
grammar that its ``min_tokens`` forbids ending, or that allows none of its
``allowed_token_ids``. It ends alone with an error naming the field (offline:
``RequestOutput.error_param``; the servers: a 400 with OpenAI's ``param``, in-band when
streamed), its KV blocks go back, and the engine keeps serving. The replica messages carry
the field across processes."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("xgrammar")

from octavo import LLM, SamplingParams  # noqa: E402
from octavo.errors import InvalidRequestError, RequestFailedError  # noqa: E402
from octavo.replicas.messages import fail_error, fail_message  # noqa: E402
from octavo.structured_output.request_state import conflict  # noqa: E402

CHOICE = {"choice": ["yes"]}


@pytest.fixture(scope="module")
def llm():
    return LLM(max_model_len=256)


def _no_ids(llm) -> list[int]:
    """Ids none of which can start the text "yes"."""
    tok = llm.get_tokenizer()
    ids = tok.encode(" no", add_special_tokens=False) + tok.encode("!", add_special_tokens=False)
    assert all(not "yes".startswith(tok.decode([i]).strip() or "\0") for i in ids)
    return ids


def _still_serves(llm):
    engine = llm.llm_engine
    pool = engine.scheduler.kv.pool
    assert pool.num_free_blocks == pool.num_blocks and not engine.states
    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=3),
                       use_tqdm=False)[0]
    assert out.error is None and len(out.outputs[0].token_ids) == 3


def test_conflict_names_the_first_field_at_fault():
    p = SamplingParams(min_tokens=5, max_tokens=9, allowed_token_ids=[1, 2],
                       structured_outputs=CHOICE)
    message, field = conflict(p, 1)
    assert field == "min_tokens"
    assert "min_tokens=5" in message and "allowed_token_ids allows only 2" in message
    assert conflict(p, 5)[0].count("min_tokens") == 0  # past min_tokens it is not the cause
    assert conflict(p, 5)[1] == "allowed_token_ids"
    bare = SamplingParams(structured_outputs=CHOICE)
    assert conflict(bare, 0)[1] == "structured_outputs"
    many = SamplingParams(allowed_token_ids=list(range(1000)), structured_outputs=CHOICE)
    assert len(conflict(many, 0)[0]) < 300  # the list is not echoed whole


@pytest.mark.parametrize("field", ["min_tokens", "allowed_token_ids"])
def test_offline_the_request_ends_alone_naming_the_field(llm, field):
    extra = ({"min_tokens": 6} if field == "min_tokens"
             else {"allowed_token_ids": _no_ids(llm)})
    bad = SamplingParams(temperature=0, max_tokens=12, structured_outputs=CHOICE, **extra)
    good = SamplingParams(temperature=0, max_tokens=12, structured_outputs=CHOICE)
    outs = llm.generate(["Answer yes:", "Answer yes:"], [bad, good], use_tqdm=False)
    assert outs[0].outputs[0].finish_reason == "error"
    assert outs[0].error_param == field and field in outs[0].error, outs[0].error
    assert outs[1].error is None and outs[1].outputs[0].text == "yes"
    _still_serves(llm)


def test_replica_messages_keep_the_field():
    msg = fail_message("r1", RequestFailedError("r1", "boom", "min_tokens"))
    err = fail_error("r1", *msg[2:5], 0)
    assert isinstance(err, RequestFailedError) and err.param == "min_tokens"
    assert err.status == 400 and "replica 0: boom" in str(err)
    msg = fail_message("r2", RequestFailedError("r2", "processor raised"))
    assert fail_error("r2", *msg[2:5], 1).status == 500
    msg = fail_message("r3", InvalidRequestError("top_k", "top_k must be ..."))
    err = fail_error("r3", *msg[2:5], 1)
    assert isinstance(err, InvalidRequestError) and err.param == "top_k"


# ------------------------------------------------------------------ the servers
fastapi = pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def apps():
    from octavo.engine.arg_utils import EngineArgs
    from octavo.engine.async_llm import AsyncLLM
    from octavo.entrypoints import api_server as simple_server
    from octavo.entrypoints.openai.api_server import ServerSettings, build_app

    engine = AsyncLLM.from_engine_args(EngineArgs(max_model_len=256, max_num_seqs=8))
    yield engine, {"openai": build_app(engine, ServerSettings(shutdown_engine=False)),
                   "simple": simple_server.build_app(engine, shutdown_engine=False)}
    engine.shutdown()


def _post(app, path, body):
    from tests.running_server import openai_http_library

    httpx = openai_http_library(pytest.importorskip("openai"))

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://asgi",
                                     timeout=60) as c:
            return await c.post(path, json=body)

    return asyncio.run(go())


@pytest.mark.parametrize("stream", [False, True])
def test_openai_server_answers_400_naming_the_field(apps, stream):
    from tests.running_server import wait_idle

    engine, app = apps[0], apps[1]["openai"]
    body = {"model": engine.model_config.served_model_name, "prompt": "Answer yes:",
            "max_tokens": 12, "temperature": 0, "min_tokens": 6,
            "structured_outputs": CHOICE, "stream": stream}
    r = _post(app, "/v1/completions", body)
    if stream:  # the status was sent with the first byte: the error comes in-band
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.text.splitlines()
                  if line.startswith("data: {")]
        err = events[-1]["error"]
    else:
        assert r.status_code == 400, r.text
        err = r.json()["error"]
    assert err["code"] == 400 and err["param"] == "min_tokens", err
    assert "min_tokens=6" in err["message"] and "cannot be completed" in err["message"]
    ok = _post(app, "/v1/completions", {**body, "min_tokens": 0, "stream": False})
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == "yes"
    wait_idle(engine)


def test_simple_server_answers_400_naming_the_field(apps):
    from tests.running_server import wait_idle

    engine, app = apps[0], apps[1]["simple"]
    r = _post(app, "/generate", {"prompt": "Answer yes:", "max_tokens": 12, "temperature": 0,
                                 "min_tokens": 6, "structured_outputs": CHOICE})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "min_tokens"
    wait_idle(engine)
