"""kv_cache_dtype: vLLM's name and values, refused clearly where it cannot run."""

from __future__ import annotations

import pytest

from octavo import LLM
from octavo.engine.arg_utils import EngineArgs
from tests.tiny_models import make_checkpoint


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return make_checkpoint("llama", str(tmp_path_factory.mktemp("llama_kvdt")))


def test_unknown_kv_cache_dtype_names_the_field(llama):
    with pytest.raises(ValueError, match=r"kv_cache_dtype.*'int4'"):
        EngineArgs(model=llama, kv_cache_dtype="int4").create_engine_config()


def test_fp8_kv_cache_needs_cuda_and_triton(llama):
    with pytest.raises(ValueError, match=r"kv_cache_dtype='fp8' needs a CUDA device"):
        LLM(model=llama, device="cpu", kv_cache_dtype="fp8", skip_tokenizer_init=True)


def test_the_flag_reaches_the_engine_args():
    from octavo.entrypoints.openai.api_server import engine_args_from, make_arg_parser

    args = make_arg_parser().parse_args(["--kv-cache-dtype", "fp8"])
    assert engine_args_from(args).kv_cache_dtype == "fp8"
    with pytest.raises(SystemExit):
        make_arg_parser().parse_args(["--kv-cache-dtype", "int8"])
