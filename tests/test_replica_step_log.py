"""The engine process's step-timings log (OCTAVO_LOG_STEP_TIMINGS=1) says how its last busy
period's requests arrived: how many, over how long, and how much of the period the engine
spent in its steps (W3's server against offline, issue 15 item 4)."""

from __future__ import annotations

import json
import logging
import time

from octavo.engine.arg_utils import EngineArgs
from octavo.replicas.messages import ReplicaSpec
from octavo.replicas.replica_core import ReplicaCore
from octavo.sampling_params import SamplingParams
from tests.tiny_models import make_checkpoint


def test_the_step_log_holds_the_last_busy_period(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("OCTAVO_LOG_STEP_TIMINGS", "1")
    path = str(tmp_path / "llama")
    make_checkpoint("llama", path)
    args = EngineArgs(model=path, dtype="float32", skip_tokenizer_init=True, max_model_len=128)
    core = ReplicaCore(ReplicaSpec(args, 0, "tiny"), on_fatal=lambda e: None)
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=100, detokenize=False)

    def busy_period(tag: str, n: int, gap_s: float) -> None:
        for i in range(n):
            core.handle(("add", f"{tag}{i}", {"prompt_token_ids": [3, 5, 7 + i]}, params, 0,
                         None))
            time.sleep(gap_s)
        deadline = time.monotonic() + 60
        while core._live and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not core._live

    busy_period("a", 2, 0.0)
    busy_period("b", 3, 0.05)  # the one logged: three adds 0.1 s apart end to end, each
    # request decoding long enough (100 steps) to keep the engine busy between them
    with caplog.at_level(logging.WARNING, logger="octavo.replicas.replica_core"):
        core.shutdown()
    line = next(r.getMessage() for r in caplog.records if "step timings" in r.getMessage())
    period = json.loads(line.split("step timings: ", 1)[1])["last_period"]
    assert period["adds"] == 3
    assert period["add_span_s"] >= 0.1
    assert 0 < period["in_steps_s"] <= period["to_last_step_s"]
    assert period["to_last_step_s"] >= period["add_span_s"]
