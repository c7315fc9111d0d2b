"""No starvation through the server: while one request samples n=5000 sequences, a 1-token
request from someone else completes within a few seconds (the scheduler bounds one request's
share of the batch and makes room for newcomers), and everything is freed afterwards."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from octavo.engine.arg_utils import EngineArgs  # noqa: E402
from octavo.engine.async_llm import AsyncLLM  # noqa: E402
from octavo.entrypoints.openai.api_server import ServerSettings, build_app  # noqa: E402
from tests.running_server import RunningServer, openai_http_library  # noqa: E402
from tests.tiny_models import make_checkpoint  # noqa: E402

httpx = openai_http_library(openai)

N = 5000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = make_checkpoint("llama", str(tmp_path_factory.mktemp("llama_fair")))
    engine = AsyncLLM.from_engine_args(EngineArgs(
        model=path, dtype="float32", skip_tokenizer_init=True, max_model_len=64,
        max_num_seqs=N, max_num_batched_tokens=N + 64))
    srv = RunningServer(build_app(engine, ServerSettings(shutdown_engine=False)))
    yield srv, engine
    srv.stop()
    engine.shutdown()


def test_one_token_request_is_served_while_n_5000_runs(server):
    srv, engine = server
    scheduler = lambda: engine.engine.scheduler  # noqa: E731 - replaced on a restart

    async def main() -> tuple[float, dict]:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=600) as client:
            # Warm up first (a first step may build the CPU kernels): not part of the test.
            warm = await client.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 1})
            assert warm.status_code == 200, warm.text
            big = asyncio.ensure_future(client.post("/v1/completions", json={
                "prompt": [1, 7, 9, 11], "n": N, "max_tokens": 16, "ignore_eos": True,
                "temperature": 1.0}))
            deadline = time.monotonic() + 120
            while len(scheduler().running) < N // 2:  # the big request holds the batch
                assert time.monotonic() < deadline, "the n=5000 request never got going"
                assert not big.done(), big.result().text
                await asyncio.sleep(0.05)
            t0 = time.monotonic()
            small = await client.post("/v1/completions", json={
                "prompt": [1, 2, 3], "max_tokens": 1, "ignore_eos": True})
            waited = time.monotonic() - t0
            assert small.status_code == 200, small.text
            assert not big.done(), "n=5000 finished first: the test measured nothing"
            body = (await big).json()
            return waited, body

    waited, body = asyncio.run(main())
    print(f"1-token request took {waited:.2f} s while n={N} ran")
    assert waited < 5.0
    assert len(body["choices"]) == N
    assert all(len(c["text"]) >= 0 and c["finish_reason"] == "length" for c in body["choices"])
    pool = scheduler().kv.pool
    deadline = time.monotonic() + 10
    while pool.num_free_blocks != pool.num_blocks and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.num_free_blocks == pool.num_blocks
