"""benchmarks/ab_latency.py: variant parsing, alternation, the summary, and one real run of
benchmarks/latency.py per variant on the CPU (tiny shape) with each variant's environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
sys.path.insert(0, ROOT)

from benchmarks import ab_latency  # noqa: E402


def test_variant_parsing():
    assert ab_latency.parse_variant(["on"]) == ("on", {})
    assert ab_latency.parse_variant(["off", "OCTAVO_L2_PREFETCH=off", "X=a=b,c"]) == (
        "off", {"OCTAVO_L2_PREFETCH": "off", "X": "a=b,c"})
    with pytest.raises(ValueError, match="'OCTAVO_PDL' is not NAME=VALUE"):
        ab_latency.parse_variant(["bad", "OCTAVO_PDL"])


def test_rounds_alternate_so_no_variant_always_runs_first():
    assert ab_latency.order(["a", "b", "c"], 3) == ["a", "b", "c", "c", "b", "a",
                                                     "a", "b", "c"]


def test_summary_takes_medians_per_variant_and_batch():
    def run(name, b1, b32):
        return {"variant": name, "rows": [{"batch": 1, "ms_per_output_token": b1},
                                          {"batch": 32, "ms_per_output_token": b32}]}

    runs = [run("off", 1.0, 2.0), run("on", 0.9, 2.2), run("on", 0.8, 2.4),
            run("off", 1.2, 1.8), run("off", 1.1, 2.1)]
    table = {(t["batch"], t["variant"]): t for t in ab_latency.summarize(runs)}
    assert table[(1, "off")]["median_ms"] == 1.1 and table[(1, "off")]["runs"] == 3
    assert table[(1, "on")]["median_ms"] == pytest.approx(0.85)
    assert table[(1, "on")]["vs_first"] == pytest.approx(0.85 / 1.1)
    assert (table[(32, "on")]["min_ms"], table[(32, "on")]["max_ms"]) == (2.2, 2.4)
    assert table[(32, "off")]["vs_first"] == 1.0


def test_a_real_run_per_variant_with_its_environment(tmp_path):
    out = tmp_path / "ab.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "ab_latency.py"),
         "--variant", "plain", "--variant", "marked", "OCTAVO_AB_TEST_MARK=7",
         "--rounds", "1", "--batch-sizes", "1,2", "--repeat", "2", "--json-out", str(out),
         "--", "--shape", "tiny-qwen3", "--output-len", "4", "--prompt-len", "8"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert [r["variant"] for r in result["runs"]] == ["plain", "marked"]
    marked = result["runs"][1]
    assert marked["child_env"].get("OCTAVO_AB_TEST_MARK") == "7"
    assert "OCTAVO_AB_TEST_MARK" not in result["runs"][0]["child_env"]
    rows = marked["rows"]
    assert [r["batch"] for r in rows] == [1, 2]
    assert all(len(r["samples_ms_per_output_token"]) == 2 for r in rows)
    assert {(t["batch"], t["variant"]) for t in result["summary"]} == {
        (1, "plain"), (1, "marked"), (2, "plain"), (2, "marked")}
    assert "vs first" in proc.stdout
