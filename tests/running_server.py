"""Servers in tests: a uvicorn server for an ASGI app on a free loopback port, in a background
thread; a free port; waiting until a server (thread or subprocess) answers /health, and until
the engine behind it is idle again."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable


def openai_http_library(openai):
    """The HTTP library the openai client is built on (httpx, or httpx2 in newer releases):
    its transports and clients are the ones the client accepts."""
    import importlib

    return importlib.import_module(
        openai.DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_healthy(port: int, timeout: float = 5.0) -> bool:
    """GET /health on 127.0.0.1:port answers 200 (http.client: no proxy from the
    environment stands between the test and the loopback server)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def wait_until_healthy(port: int, timeout: float, alive: Callable[[], bool] | None = None,
                       interval: float = 0.1) -> bool:
    """Poll /health until it answers 200 (True), ``timeout`` seconds pass or ``alive()``
    turns False (False: the caller fails with what it knows, e.g. the server's output)."""
    deadline = time.monotonic() + timeout
    while not is_healthy(port):
        if (alive is not None and not alive()) or time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def engine_idle(allm) -> bool:
    """An AsyncLLM has nothing left: no request or beam search job, no per-request state, every
    KV block back in the pool (aborts reach the engine thread a little after the client)."""
    core = allm.engine
    pool = core.scheduler.kv.pool
    return (not core.has_unfinished_requests() and not core.states
            and pool.num_free_blocks == pool.num_blocks and not allm._beams.num_pending)


def wait_idle(allm, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not engine_idle(allm):
        assert time.monotonic() < deadline, "the engine did not go idle"
        time.sleep(0.02)


class RunningServer:
    def __init__(self, app, http="auto") -> None:
        """``http``: uvicorn's protocol choice, or a protocol class."""
        import uvicorn  # the server test modules import it after pytest.importorskip

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                                    http=http))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def server_flags(model: str, max_model_len: int, *extra: str):
    """The OpenAI server's parsed flags for a float32 test model, stats logging off."""
    from octavo.entrypoints.openai.api_server import make_arg_parser

    return make_arg_parser().parse_args(["--model", model, "--dtype", "float32",
                                         "--max-model-len", str(max_model_len),
                                         "--disable-log-stats", *extra])
