"""The in-process servers of the hostile-input tests: one AsyncLLM on the embedded default
model behind both apps (the OpenAI one and the simple /generate one), shared by a module.

A module defines its own ``engine`` fixture (``yield from in_process_engine(...)``); the
fixtures here (a plugin of tests/conftest.py) take that engine: ``apps``, and
``settle_engine``, which a module asks for with ``pytestmark = pytest.mark.usefixtures(...)``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.running_server import wait_idle


def in_process_engine(max_model_len: int, max_num_seqs: int) -> Iterator:
    """For a module fixture (``yield from``): the engine, shut down after the module."""
    from octavo.engine.arg_utils import EngineArgs
    from octavo.engine.async_llm import AsyncLLM

    llm = AsyncLLM.from_engine_args(EngineArgs(max_model_len=max_model_len,
                                               max_num_seqs=max_num_seqs))
    yield llm
    llm.shutdown()


def both_apps(engine) -> dict:
    """{"openai": ..., "simple": ...} on ``engine``, which they leave running at shutdown."""
    from octavo.entrypoints import api_server as simple_server
    from octavo.entrypoints.openai.api_server import ServerSettings, build_app

    return {"openai": build_app(engine, ServerSettings(shutdown_engine=False)),
            "simple": simple_server.build_app(engine, shutdown_engine=False)}


@pytest.fixture(scope="module")
def apps(engine):
    return both_apps(engine)


@pytest.fixture
def settle_engine(engine):
    # Before the conftest leak check: let aborted requests reach the engine thread.
    yield
    wait_idle(engine)


def asgi_client(app):
    """An httpx AsyncClient (httpx2 where the openai client is built on it) calling ``app``
    in process."""
    try:
        import httpx
    except ImportError:
        import httpx2 as httpx
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://asgi",
                             timeout=60)
