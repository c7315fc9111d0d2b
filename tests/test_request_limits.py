"""The request limits as flags: --max-logprobs (vLLM's) and --max-n (at most
--max-num-seqs), from the command line to the engine's processor; --request-body-timeout,
from the command line to both servers' apps."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from octavo.engine.arg_utils import EngineArgs  # noqa: E402
from octavo.entrypoints.openai.api_server import engine_args_from, make_arg_parser  # noqa: E402


def test_flags_reach_engine_args():
    args = engine_args_from(make_arg_parser().parse_args(
        ["--max-n", "8", "--max-logprobs", "5", "--max-num-seqs", "16"]))
    assert (args.max_n, args.max_logprobs, args.max_num_seqs) == (8, 5, 16)
    cfg = args.create_engine_config()
    assert cfg.scheduler_config.sample_cap == 8 and cfg.model_config.max_logprobs == 5
    default = engine_args_from(make_arg_parser().parse_args([])).create_engine_config()
    assert default.scheduler_config.sample_cap == 256
    assert default.model_config.max_logprobs == 20


@pytest.mark.parametrize("kwargs,match", [
    ({"max_n": 300, "max_num_seqs": 256}, "max_n must be in"),
    ({"max_n": 0}, "max_n must be in"),
    ({"max_logprobs": -2}, "max_logprobs"),
])
def test_bad_limits_are_refused_at_startup(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineArgs(**kwargs).create_engine_config()


def test_request_body_timeout_flag_reaches_both_apps(monkeypatch):
    """--request-body-timeout (both servers, default 30 s) is the BodyLimitMiddleware's bound
    on reading a body; 0 or less is refused at startup."""
    from octavo.entrypoints import api_server as simple_server
    from octavo.entrypoints.openai import api_server
    from octavo.entrypoints.openai.middleware import BodyLimitMiddleware

    engine = object()
    built: list[float] = []
    monkeypatch.setattr(api_server, "start_engine", lambda args: engine)
    monkeypatch.setattr(simple_server, "start_engine", lambda args: engine)
    monkeypatch.setattr(api_server, "build_app",
                        lambda e, s: built.append(s.request_body_timeout) or "app")
    monkeypatch.setattr(simple_server, "build_app",
                        lambda e, *a, **k: built.append(k["request_body_timeout"]) or "app")
    import octavo.entrypoints.launcher as launcher

    monkeypatch.setattr(launcher, "serve", lambda app, e, **k: 0)
    monkeypatch.setenv("OCTAVO_FREEZE_STARTUP_HEAP", "0")
    # --port 0: run_server binds its socket before the engine starts (any free port here)
    assert api_server.run_server(make_arg_parser().parse_args(["--port", "0"])) == 0
    assert api_server.run_server(make_arg_parser().parse_args(
        ["--port", "0", "--request-body-timeout", "2.5"])) == 0
    assert simple_server.run_server(simple_server.make_parser().parse_args(
        ["--port", "0", "--request-body-timeout", "7"])) == 0
    assert built == [30.0, 2.5, 7.0]
    for bad in ("0", "-1", "nan"):
        args = make_arg_parser().parse_args(["--request-body-timeout", bad])
        assert any("--request-body-timeout must be > 0" in p
                   for p in api_server.unsupported_flags(args)), bad
    assert BodyLimitMiddleware(None, 1).timeout == 30.0
