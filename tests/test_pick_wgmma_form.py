"""scripts/pick_wgmma_form.py: the device call's choice of the CUDA large-batch kernel's form."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import pick_wgmma_form  # noqa: E402


def _row(shape, m, **forms):
    row = {"shape": shape, "M": m}
    for key, (us, err) in forms.items():
        row[f"{key}_us"], row[f"{key}_rel_err"] = us, err
    return row


def test_the_fastest_correct_form_on_gate_up_and_down():
    rows = [_row("gate_up", 256, cuda=(145, 0), cuda_bf16=(120, 0), cuda_deep=(110, 0.3)),
            _row("down", 256, cuda=(102, 0), cuda_bf16=(95, 0), cuda_deep=(80, 0)),
            _row("qkv", 256, cuda=(60, 0), cuda_bf16=(10, 0)),  # not routed: not counted
            _row("gate_up", 129, cuda=(140, 0), cuda_deep=(100, 0)),
            _row("down", 129, cuda=(95, 0), cuda_deep=(90, 0))]
    result = {"rows": rows}
    # cuda_deep is fastest on the sum but wrong on gate_up: the bf16 form wins.
    assert pick_wgmma_form.pick(result, 256) == \
        "OCTAVO_INT_LARGE_BF16_MATH=1 OCTAVO_INT_LARGE_DEEP=0"
    assert pick_wgmma_form.pick(result, 129) == \
        "OCTAVO_INT_LARGE_BF16_MATH=0 OCTAVO_INT_LARGE_DEEP=1"
    # No form ran (no GPU, a failed build): the float form.
    assert pick_wgmma_form.pick({"rows": []}, 256) == \
        "OCTAVO_INT_LARGE_BF16_MATH=0 OCTAVO_INT_LARGE_DEEP=0"


def test_it_reads_a_real_benchmark_file(tmp_path):
    """Session 55's call 2 (the float form only, then): its figures pick it."""
    path = ROOT / "docs/results/h100_s55/call2/g_cuda.json"
    out = subprocess.run([sys.executable, str(ROOT / "scripts/pick_wgmma_form.py"), str(path)],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "OCTAVO_INT_LARGE_BF16_MATH=0 OCTAVO_INT_LARGE_DEEP=0"
    data = json.loads(path.read_text())
    assert {r["shape"] for r in data["rows"]} >= {"gate_up", "down"}
