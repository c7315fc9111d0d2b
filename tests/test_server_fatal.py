"""A dead engine never outlives as a live server: when the engine dies of a fault it cannot
recover from, the server stops and ``serve`` returns 1 (the process exits non-zero and a
supervisor restarts it). Also: a killed kernel build leaves no lock that hangs later ones."""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from octavo.engine.arg_utils import EngineArgs  # noqa: E402
from octavo.engine.async_llm import AsyncLLM  # noqa: E402
from octavo.entrypoints.launcher import serve  # noqa: E402
from octavo.entrypoints.openai.api_server import ServerSettings, build_app  # noqa: E402
from tests.running_server import free_port, wait_until_healthy  # noqa: E402
from tests.tiny_models import make_checkpoint  # noqa: E402


def _post(port: int, body: bytes) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_engine_death_stops_the_server_with_exit_code_1(tmp_path):
    path = make_checkpoint("llama", str(tmp_path / "tiny"))
    engine = AsyncLLM.from_engine_args(EngineArgs(
        model=path, dtype="float32", skip_tokenizer_init=True, max_model_len=64))
    app = build_app(engine, ServerSettings())
    port = free_port()
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(
        serve(app, engine, host="127.0.0.1", port=port, log_level="warning")), daemon=True)
    thread.start()
    assert wait_until_healthy(port, 60), "the server did not start"
    status, _ = _post(port, b'{"prompt": [1, 2, 3], "max_tokens": 2}')
    assert status == 200

    def broken(sched):
        raise RuntimeError("the device is gone")

    engine.engine.executor.execute_model_async = broken  # every step fails from now on
    status, body = _post(port, b'{"prompt": [1, 2, 3], "max_tokens": 2}')
    assert status in (500, 503) and b"the device is gone" in body
    thread.join(30)
    assert not thread.is_alive(), "the server kept running in front of a dead engine"
    assert result == [1]
    assert engine.errored


def test_a_killed_builders_lock_file_is_removed(tmp_path):
    from octavo.kernels.cpu import _build_lock

    stale = tmp_path / "lock"
    stale.write_text("left by a killed process")
    with _build_lock(str(tmp_path)):
        assert not stale.exists()
    assert not os.path.exists(stale)
