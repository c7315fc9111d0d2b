"""The simple /generate server (vLLM's legacy format), over real HTTP on loopback."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
try:
    import httpx
except ImportError:  # newer openai releases ship the same client as httpx2
    httpx = pytest.importorskip("httpx2")


from octavo.engine.arg_utils import EngineArgs  # noqa: E402
from octavo.engine.async_llm import AsyncLLM  # noqa: E402
from octavo.entrypoints.api_server import build_app, make_parser  # noqa: E402
from tests.running_server import RunningServer, wait_idle  # noqa: E402

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def engine():
    llm = AsyncLLM.from_engine_args(EngineArgs(max_model_len=512, max_num_seqs=16))
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def http(engine):
    srv = RunningServer(build_app(engine, shutdown_engine=False))
    with httpx.Client(base_url=srv.base_url, timeout=60) as client:
        yield client
    srv.stop()


@pytest.fixture(autouse=True)
def _settle(engine):
    yield
    wait_idle(engine)


def test_health(http):
    assert http.get("/health").status_code == 200


def test_whole_and_streamed(http):
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    r = http.post("/generate", json=body)
    assert r.status_code == 200
    text = r.json()["text"]
    assert len(text) == 1 and text[0].startswith(PROMPT) and len(text[0]) > len(PROMPT)
    with http.stream("POST", "/generate", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        lines = [json.loads(line) for line in resp.iter_lines() if line]
    assert len(lines) >= 2
    seen = [obj["text"][0] for obj in lines]
    # Cumulative: each line extends the one before, and the last is the whole answer.
    assert all(b.startswith(a) for a, b in zip(seen, seen[1:]))
    assert seen[0].startswith(PROMPT) and seen[-1] == text[0]


def test_n_samples(http):
    body = {"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "n": 3}
    text = http.post("/generate", json=body).json()["text"]
    assert len(text) == 3 and len(set(text)) == 1
    with http.stream("POST", "/generate", json={**body, "n": 2, "stream": True}) as resp:
        last = [json.loads(line) for line in resp.iter_lines() if line][-1]
    assert last["text"] == text[:2]


@pytest.mark.parametrize("raw, needle", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (b'{"max_tokens": 4}', "prompt is required"),
    (b'{"prompt": 5}', "prompt must be a string"),
    (b'{"prompt": "hi", "stream": "yes"}', "stream"),
    (b'{"prompt": "hi", "temprature": 0.5}', "temprature"),
    (b'{"prompt": "hi", "temperature": -1}', "temperature"),
    (b'{"prompt": "hi", "max_tokens": 0}', "max_tokens"),
    (b'{"prompt": "hi", "output_kind": 1}', "output_kind"),
])
def test_bad_requests_400_and_keeps_serving(http, raw, needle):
    r = http.post("/generate", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
    ok = http.post("/generate", json={"prompt": PROMPT, "max_tokens": 2})
    assert ok.status_code == 200 and len(ok.json()["text"]) == 1


def test_too_long_prompt_400(http):
    r = http.post("/generate", json={"prompt": "hi " * 700, "max_tokens": 2})
    assert r.status_code == 400 and "512" in r.json()["error"]["message"]


def test_disconnect_mid_stream_frees_blocks(http, engine):
    pool = engine.engine.scheduler.kv.pool
    body = {"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "stream": True}
    with http.stream("POST", "/generate", json=body) as resp:
        for i, _ in enumerate(resp.iter_lines()):
            if i == 2:
                break
        assert pool.num_free_blocks < pool.num_blocks
    wait_idle(engine, timeout=10)
    assert http.post("/generate", json={"prompt": PROMPT, "max_tokens": 2}).status_code == 200


def test_flags_match_openai_server():
    args = make_parser().parse_args(
        ["--host", "127.0.0.1", "--port", "9001", "--served-model-name", "a", "--max-num-seqs",
         "8", "--gpu-memory-utilization", "0.5", "--tensor-parallel-size", "1",
         "--max-model-len", "256"])
    assert (args.host, args.port, args.served_model_name, args.max_num_seqs) == (
        "127.0.0.1", 9001, ["a"], 8)
    assert args.gpu_memory_utilization == 0.5 and args.max_model_len == 256
