"""benchmarks/serving_peers.py (W3 with its peer, issue 15 item 3): the random checkpoint's
word tokenizer turns the benchmark's token ids into text and back, the SVG plot is well
formed, and the whole driver runs end to end on a CPU against `octavo serve` and against
`transformers serve --continuous-batching` (about 10 s each): every request completes with exactly
its max_tokens, the JSON and the plot are written."""

from __future__ import annotations

import json
import math
import os
import xml.etree.ElementTree as ET

import pytest

from benchmarks.svg_plot import Panel, Series, render


def test_svg_plot_is_well_formed_with_a_line_per_series():
    series = [Series("octavo", [(100.0, 5.0, "4/s"), (1000.0, 8.0, "inf/s")]),
              Series("peer", [(50.0, 9.0, "4/s"), (0.0, 1.0, "no tokens")])]
    svg = render([Panel("TPOT p50", "tok/s", "ms", series), Panel("empty", "x", "y", [])],
                 "W3 <test>", note="a & b")
    root = ET.fromstring(svg)  # escapes hold: the title's "<" and the note's "&"
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}polyline")) == 1  # the peer has one plottable point
    assert len(root.findall(f"{ns}circle")) == 3
    assert "W3 &lt;test&gt;" in svg and "no data" in svg


def test_requests_per_rate():
    from benchmarks.serving_peers import requests_at

    class Args:
        num_prompts, seconds_per_rate = 100, 10.0
        engine_num_prompts = [("transformers", 30)]

    assert requests_at(4.0, Args, "octavo") == 40
    assert requests_at(64.0, Args, "octavo") == 100
    assert requests_at(math.inf, Args, "octavo") == 100
    assert requests_at(math.inf, Args, "transformers") == 30
    assert requests_at(2.0, Args, "transformers") == 20
    Args.seconds_per_rate = None
    assert requests_at(4.0, Args, "octavo") == 100


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """Written in shards (as the 8B shape's 16 GB are): the embedding in one, the rest in
    another."""
    from benchmarks import random_checkpoint

    saved = random_checkpoint.MAX_SHARD_BYTES
    random_checkpoint.MAX_SHARD_BYTES = 1_000_000
    try:
        return random_checkpoint.write_checkpoint("tiny-qwen3", "float32",
                                                  str(tmp_path_factory.mktemp("ckpt")))
    finally:
        random_checkpoint.MAX_SHARD_BYTES = saved


def test_sharded_checkpoint_loads_whole_in_transformers(checkpoint):
    import torch
    from transformers import AutoModelForCausalLM

    with open(os.path.join(checkpoint, "model.safetensors.index.json")) as f:
        assert len(set(json.load(f)["weight_map"].values())) == 2
    model, info = AutoModelForCausalLM.from_pretrained(checkpoint, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, saved once
    norm = model.model.layers[0].input_layernorm.weight
    assert torch.equal(norm, torch.ones_like(norm))
    assert 0.015 < model.model.embed_tokens.weight.std().item() < 0.025


def test_word_tokenizer_maps_ids_to_text_and_back(checkpoint):
    from transformers import AutoTokenizer

    from benchmarks.random_checkpoint import ids_to_text

    tok = AutoTokenizer.from_pretrained(checkpoint)
    ids = [0, 1, 17, 9999, 11999]
    assert tok(ids_to_text(ids))["input_ids"] == ids  # no BOS, one token per word
    with open(os.path.join(checkpoint, "config.json")) as f:
        assert json.load(f)["eos_token_id"] is None  # nothing stops a peer before max_tokens


def _run(checkpoint, tmp_path, engine: str, *extra: str) -> dict:
    from benchmarks import serving_peers

    out = str(tmp_path / "w3.json")
    rc = serving_peers.main(["--shape", "tiny-qwen3", "--dtype", "float32",
                             "--checkpoint", checkpoint, "--engines", engine,
                             "--rates", "16", "inf", "--num-prompts", "6",
                             "--seconds-per-rate", "0.25", "--input-len", "16",
                             "--output-len", "8", "--client-processes", "1",
                             "--warmup-requests", "2", "--time-limit-per-rate", "120",
                             "--json", out, *extra])
    with open(out) as f:
        result = json.load(f)
    assert rc == 0, result["engines"][engine].get("error")
    runs = result["engines"][engine]["runs"]
    assert [r["request_rate"] for r in runs] == [16.0, "inf"]
    assert [r["completed"] for r in runs] == [4, 6]  # 16/s x 0.25 s, then all
    for r in runs:
        assert r["failed"] == 0 and r["cut"] == 0
        assert r["total_output_tokens"] == r["expected_output_tokens"] == 8 * r["completed"]
        assert r["total_input_tokens"] == 16 * r["completed"]
        assert r["tpot_ms"]["median"] > 0 and r["ttft_ms"]["p99"] > 0
    with open(tmp_path / "w3.svg") as f:
        ET.fromstring(f.read())
    assert os.path.exists(tmp_path / f"w3.{engine}.log")
    return result


def test_octavo_server_end_to_end(checkpoint, tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    result = _run(checkpoint, tmp_path, "octavo")
    assert result["offline"]["output_tokens"] == 6 * 8
    assert result["server_inf_vs_offline"] > 0


def test_transformers_server_end_to_end(checkpoint, tmp_path):
    from transformers.utils.import_utils import is_serve_available

    if not is_serve_available():
        pytest.skip("transformers serve needs fastapi, uvicorn, pydantic and openai")
    result = _run(checkpoint, tmp_path, "transformers", "--engine-num-prompts", "octavo=6")
    assert result["offline"] is None  # Octavo's alone
    assert "--continuous-batching" in result["engines"]["transformers"]["command"]
