"""The ``ray`` executor (issue 14 item 3): one Ray actor per tensor-parallel rank, placed by a
placement group on a local Ray cluster that the test starts, gives the same greedy tokens as
the in-process executor at TP=1 and TP=2 (gloo between the actors), with asynchronous
scheduling too; a step that fails in an actor fails its request, a dead actor is an error;
and the bad configurations are refused before anything starts: Ray not installed, no cluster
at RAY_ADDRESS, more ranks than the cluster has CPUs."""

from __future__ import annotations

import importlib.util
import socket
import sys
import time

import pytest

from octavo import LLM, SamplingParams
from tests.tiny_models import make_checkpoint

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="ray is not installed (pip install octavo[distributed])")

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [(7 * i + 3 * n) % 500 for i in range(n)]} for n in (1, 6, 13)]


def _llm(path, backend, tp=1, **kw):
    return LLM(model=path, dtype="float32", skip_tokenizer_init=True, max_model_len=64,
               tensor_parallel_size=tp, distributed_executor_backend=backend, **kw)


def _tokens(llm, prompts=PROMPTS):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


def _run(path, backend, tp=1, **kw):
    llm = _llm(path, backend, tp, **kw)
    try:
        return _tokens(llm)
    finally:
        llm.llm_engine.shutdown()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return make_checkpoint("llama", str(tmp_path_factory.mktemp("ray_llama")))


def test_ray_not_installed_is_refused_first(llama, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ImportError, match=r"needs Ray.*pip install octavo\[distributed\]"):
        _llm(llama, "ray")


def test_server_flag_without_ray_is_refused_first(llama, monkeypatch):
    pytest.importorskip("fastapi")
    from octavo.entrypoints.openai.api_server import make_arg_parser, unsupported_flags

    monkeypatch.setitem(sys.modules, "ray", None)
    args = make_arg_parser().parse_args(["--model", llama, "--distributed-executor-backend",
                                         "ray", "--tensor-parallel-size", "2"])
    bad = unsupported_flags(args)
    assert len(bad) == 1 and "pip install octavo[distributed]" in bad[0]


@needs_ray
def test_no_cluster_at_address_is_refused_first(llama, monkeypatch):
    import ray

    if ray.is_initialized():
        pytest.skip("this process is already connected to a Ray cluster")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=f"no Ray cluster answers at "
                                              f"RAY_ADDRESS='127.0.0.1:{port}'"):
        _llm(llama, "ray")
    assert time.monotonic() - start < 30  # refused, not waited on
    assert not ray.is_initialized()


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="ray is not installed")
    start = time.monotonic()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    print(f"local Ray cluster started in {time.monotonic() - start:.1f} s")
    yield ray
    ray.shutdown()


@needs_ray
@pytest.mark.parametrize("family,overrides,tp", [
    ("llama", {}, 1),
    ("llama", {}, 2),
    ("qwen2", {}, 2),  # q/k/v biases, split with their rows
    ("qwen3", {"num_key_value_heads": 1}, 2),  # one KV head for two ranks: replicated
    ("llama", {"vocab_size": 501}, 2),  # vocab-parallel table with a padding row
])
def test_ray_equals_uni(ray_cluster, tmp_path, family, overrides, tp):
    path = make_checkpoint(family, str(tmp_path / family), **overrides)
    assert _run(path, "ray", tp) == _run(path, "uni")
    # Every actor and its bundle are given back (Ray frees them asynchronously).
    deadline = time.monotonic() + 20
    while ray_cluster.available_resources().get("CPU", 0) < 2:
        assert time.monotonic() < deadline, ray_cluster.available_resources()
        time.sleep(0.2)


@needs_ray
def test_ray_tp2_gptq_checkpoint(ray_cluster, tmp_path):
    """Packed GPTQ tensors narrowed per rank inside the Ray actors, as in the mp workers."""
    from tests.quantization.test_gptq_awq_checkpoints import _write_pair

    qcfg = {"bits": 4, "group_size": 32, "desc_act": False, "sym": True,
            "checkpoint_format": "gptq_v2"}
    src = make_checkpoint("llama", str(tmp_path / "src"))
    _, quant = _write_pair(src, str(tmp_path / "g32"), qcfg, "quantize_config.json")
    assert _run(quant, "ray", 2) == _run(quant, "uni")


@needs_ray
def test_ray_tp2_with_async_scheduling_matches(ray_cluster, llama):
    assert _run(llama, "ray", 2, async_scheduling=True) == \
        _run(llama, "uni", async_scheduling=True)


class Boom:
    """A logits processor that raises inside the actor (module level: pickles)."""

    def __call__(self, token_ids, logits):
        raise RuntimeError("boom")


@needs_ray
def test_step_failure_is_its_requests_and_a_dead_actor_is_an_error(ray_cluster, llama):
    llm = _llm(llama, "ray")
    try:
        executor = llm.llm_engine.executor
        assert executor.crosses_processes and not hasattr(executor, "worker")
        bad = SamplingParams(max_tokens=4, logits_processors=[Boom()])
        outs = llm.generate([PROMPTS[1], PROMPTS[2]], [bad, GREEDY], use_tqdm=False)
        assert outs[0].outputs[0].finish_reason == "error" and "boom" in outs[0].error
        assert len(outs[1].outputs[0].token_ids) == GREEDY.max_tokens
        assert llm.llm_engine.scheduler.kv.usage == 0.0
        ray_cluster.kill(executor.actors[0])
        with pytest.raises(Exception, match="worker actor of rank 0 died"):
            llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
    finally:
        llm.llm_engine.shutdown()


@needs_ray
def test_more_ranks_than_the_cluster_has_are_refused_first(ray_cluster, llama):
    with pytest.raises(ValueError, match="tensor_parallel_size=4 needs 4 CPUs in the Ray "
                                         "cluster.*it has 2"):
        _llm(llama, "ray", 4)
