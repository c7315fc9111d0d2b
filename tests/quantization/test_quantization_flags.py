"""``--quantization`` on every entry point (issue 12 item 4): the OpenAI server, the simple
/generate server and ``octavo generate|chat|serve`` pass it to the engine; the method is
detected from the checkpoint when the flag is left out; an unknown method or one the
checkpoint does not declare is refused before the engine starts, naming both."""

from __future__ import annotations

import pytest

from octavo.entrypoints import cli
from tests.quantization.test_gptq_awq_checkpoints import CASES, _write_pair
from tests.tiny_models import add_word_tokenizer, make_checkpoint

pytest.importorskip("fastapi")

from octavo.entrypoints import api_server as simple_server  # noqa: E402
from octavo.entrypoints.openai.api_server import (  # noqa: E402
    engine_args_from,
    make_arg_parser,
    start_engine,
    unsupported_flags,
)


@pytest.fixture(scope="module")
def gptq_dir(tmp_path_factory):
    family, qcfg, declared_in = CASES["gptq8-v2-llama"]
    root = tmp_path_factory.mktemp("gptq_flags")
    src = make_checkpoint(family, str(root / "src"))
    quant = _write_pair(src, str(root), qcfg, declared_in)[1]
    add_word_tokenizer(quant)
    return quant


def _server_args(model: str, *flags: str):
    return make_arg_parser().parse_args(["--model", model, "--dtype", "float32",
                                         "--max-model-len", "64", *flags])


def test_known_method_is_passed_to_the_engine(gptq_dir):
    args = _server_args(gptq_dir, "--quantization", "gptq")
    assert unsupported_flags(args) == []
    engine_args = engine_args_from(args)
    assert engine_args.quantization == "gptq"
    assert engine_args.create_engine_config().quantization == "gptq"
    # Left out: the checkpoint's declaration (quantize_config.json here) decides.
    detected = engine_args_from(_server_args(gptq_dir)).create_engine_config()
    assert detected.quantization == "gptq"


def test_unknown_method_is_refused_before_anything_starts(gptq_dir, capsys):
    args = _server_args(gptq_dir, "--quantization", "int3-magic")
    problems = unsupported_flags(args)
    assert len(problems) == 1 and "'int3-magic'" in problems[0] and "gptq" in problems[0]
    assert start_engine(args) is None
    assert "int3-magic" in capsys.readouterr().err
    # The simple server shares the flags and the refusal.
    simple = simple_server.make_parser().parse_args(["--model", gptq_dir, "-q", "int3-magic"])
    assert unsupported_flags(simple) and simple.quantization == "int3-magic"


def test_method_the_checkpoint_does_not_declare_is_a_startup_error(gptq_dir, capsys):
    assert start_engine(_server_args(gptq_dir, "--quantization", "awq")) is None
    err = capsys.readouterr().err
    assert "quantization='awq' does not match the checkpoint" in err and "'gptq'" in err


def test_server_with_quantization_generates(gptq_dir):
    from tests.server_checks import assert_completes

    engine = start_engine(_server_args(gptq_dir, "--quantization", "gptq"))
    assert engine is not None
    try:
        layer = engine.engine.executor.worker.runner.model.model.layers[0]
        assert type(layer.self_attn.qkv_proj.quant_method).__name__ == "GPTQLinearMethod"
        assert_completes(engine, gptq_dir)
    finally:
        engine.shutdown()


def test_cli_generate_takes_quantization(gptq_dir, capsys):
    argv = ["generate", "--model", gptq_dir, "--dtype", "float32", "--max-model-len", "64",
            "--max-tokens", "3", "--temperature", "0", "--raw"]
    assert cli.main([*argv, "--quantization", "gptq", "hello world"]) == 0
    assert capsys.readouterr().out.strip() != ""
    assert cli.main([*argv, "--quantization", "awq", "hello world"]) == 2
    assert "does not match the checkpoint" in capsys.readouterr().err
    serve = cli.build_parser().parse_args(["serve", gptq_dir, "-q", "gptq"])
    assert engine_args_from(serve).quantization == "gptq"
