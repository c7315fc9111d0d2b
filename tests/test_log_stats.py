"""The periodic stats line (octavo/metrics/log_stats.py), driven with fake StepStats and a fake
clock: what it says, that it logs at most once per interval, and that record() is cheap. Then
the same logger on a real AsyncLLM (the engine thread calls it) and the server flags that
attach it (--metric-interval, --disable-log-stats)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from types import SimpleNamespace

import pytest

from octavo.engine.llm_engine import StepStats
from octavo.metrics.log_stats import DEFAULT_INTERVAL_S, LoggingStatLogger

LOGGER = "octavo.metrics.log_stats"


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def fake_engine(hits: int = 0, queries: int = 0, running: int = 0, waiting: int = 0,
                usage: float = 0.0):
    kv = SimpleNamespace(prefix_hits=hits, prefix_queries=queries, usage=usage)
    return SimpleNamespace(scheduler=SimpleNamespace(kv=kv, running=[None] * running,
                                                     waiting=[None] * waiting))


def step(prompt: int = 0, gen: int = 0, running: int = 1, waiting: int = 0,
         usage: float = 0.25) -> StepStats:
    return StepStats(num_running=running, num_waiting=waiting,
                     num_scheduled_tokens=prompt + gen, num_prompt_tokens=prompt,
                     num_generation_tokens=gen, kv_cache_usage=usage, num_free_blocks=10,
                     step_seconds=0.01)


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_one_line_per_interval_with_the_interval_numbers(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock, engine = FakeClock(), fake_engine(hits=100, queries=400)
    sl = LoggingStatLogger(engine, interval=10.0, clock=clock)
    # Steps every 0.125 s (exact in binary): 500 prompt tokens, then 2 tokens a step.
    sl.record(step(prompt=500, gen=2), 0, [])
    for _ in range(78):
        clock.t += 0.125
        sl.record(step(gen=2), 0, [])
    assert lines(caplog) == []
    engine.scheduler.kv.prefix_hits, engine.scheduler.kv.prefix_queries = 160, 500
    clock.t += 0.125  # 9.875 s
    sl.record(step(gen=2, running=3, waiting=2, usage=0.125), 0, [])
    assert lines(caplog) == []
    clock.t += 0.125  # 10.0 s: the interval is over
    sl.record(step(gen=2, running=3, waiting=2, usage=0.125), 0, [])
    assert lines(caplog) == [
        "Avg prompt throughput: 50.0 tokens/s, Avg generation throughput: 16.2 tokens/s, "
        "Running: 3 reqs, Waiting: 2 reqs, KV cache usage: 12.5%, "
        "Prefix cache hit rate: 60.0%"]
    # The next interval starts from zero: counts, prefix totals and the clock.
    clock.t += 5.0
    sl.record(step(gen=10), 3, [])
    clock.t += 5.0
    sl.record(step(gen=10, usage=0.5), 0, [])
    assert lines(caplog)[1] == (
        "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 2.0 tokens/s, "
        "Running: 1 reqs, Waiting: 0 reqs, KV cache usage: 50.0%, "
        "Prefix cache hit rate: 0.0%, Preemptions: 3")


def test_never_more_than_once_per_interval(caplog):
    """Steps every 7 ms for 100 s of fake time, interval 30 s: three lines, each at least
    30 s after the one before."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = FakeClock(0.0)
    stamps = []
    sl = LoggingStatLogger(fake_engine(), interval=30.0, clock=clock)
    real_info = sl.log.info
    sl.log = SimpleNamespace(info=lambda msg: (stamps.append(clock.t), real_info(msg)))
    while clock.t < 100.0:
        clock.t += 0.007
        sl.record(step(gen=8), 0, [])
    assert len(lines(caplog)) == 3
    assert all(b - a >= 30.0 for a, b in zip([0.0] + stamps, stamps))


def test_first_line_after_an_idle_gap_averages_over_it(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = FakeClock()
    sl = LoggingStatLogger(fake_engine(), interval=10.0, clock=clock)
    sl.record(step(gen=100), 0, [])
    clock.t += 100.0  # idle: no steps, no lines
    assert lines(caplog) == []
    sl.record(step(gen=100), 0, [])
    assert "Avg generation throughput: 2.0 tokens/s" in lines(caplog)[0]


def test_prefix_totals_reset_by_an_engine_restart(caplog):
    """A restart gives the engine a fresh scheduler whose totals start again at zero: the
    rate is then computed from zero, never negative."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock, engine = FakeClock(), fake_engine(hits=900, queries=1000)
    sl = LoggingStatLogger(engine, interval=1.0, clock=clock)
    engine.scheduler = fake_engine(hits=30, queries=40).scheduler
    clock.t += 1.0
    sl.record(step(), 0, [])
    assert lines(caplog)[0].endswith("Prefix cache hit rate: 75.0%")


def test_no_stats_reads_the_scheduler(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = FakeClock()
    sl = LoggingStatLogger(fake_engine(running=2, waiting=5, usage=0.75), interval=1.0,
                           clock=clock)
    clock.t += 1.0
    sl.record(None, 0, [])
    assert "Running: 2 reqs, Waiting: 5 reqs, KV cache usage: 75.0%" in lines(caplog)[0]


@pytest.mark.parametrize("interval", [0, -1.0, float("nan")])
def test_interval_must_be_positive(interval):
    with pytest.raises(ValueError, match="interval"):
        LoggingStatLogger(fake_engine(), interval=interval)


def test_record_costs_nothing_measurable():
    """A step takes milliseconds; record() between two lines must stay in the microseconds
    (a few additions and one clock read). Bound loose enough for a loaded CI machine."""
    sl = LoggingStatLogger(fake_engine(), interval=3600.0)
    stats = step(gen=64)
    n = 50_000
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            sl.record(stats, 0, [])
        best = min(best, (time.perf_counter() - t0) / n)
    assert best < 10e-6, f"record() took {best * 1e6:.2f} us"


# =========================================================================== on an engine

def test_logged_from_a_real_engine_thread(tmp_path, caplog):
    """AsyncLLM calls record() on its engine thread after every step: with a clock that moves
    a full interval per call, each step logs the tokens it did."""
    from octavo.engine.arg_utils import EngineArgs
    from octavo.engine.async_llm import AsyncLLM
    from octavo.sampling_params import SamplingParams
    from tests.tiny_models import make_checkpoint

    caplog.set_level(logging.INFO, logger=LOGGER)
    path = make_checkpoint("llama", str(tmp_path / "tiny"))
    allm = AsyncLLM.from_engine_args(EngineArgs(model=path, dtype="float32",
                                                skip_tokenizer_init=True, max_model_len=128))
    clock = FakeClock()

    def ticking() -> float:
        clock.t += 1.0
        return clock.t

    allm.stat_loggers.append(LoggingStatLogger(allm.engine, interval=1.0, clock=ticking))
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)

    async def main():
        async for _ in allm.generate([1, 2, 3, 4, 5, 6, 7], params, "r"):
            pass

    try:
        asyncio.run(main())
    finally:
        allm.shutdown()
    got = lines(caplog)
    assert got, "no stats line"
    nums = [[float(x) for x in re.findall(r"throughput: ([0-9.]+) tokens/s", line)]
            for line in got]
    assert sum(p for p, _ in nums) == 7.0  # the prompt, once
    assert sum(g for _, g in nums) == 5.0  # every generated token
    assert all(re.search(r"Running: \d+ reqs, Waiting: \d+ reqs, KV cache usage: [0-9.]+%, "
                         r"Prefix cache hit rate: [0-9.]+%$", line) for line in got)


# =========================================================================== server flags

def test_flags_parse_with_vllm_defaults():
    pytest.importorskip("fastapi")
    from octavo.entrypoints.cli import build_parser
    from octavo.entrypoints.openai.api_server import make_arg_parser, unsupported_flags

    args = make_arg_parser().parse_args([])
    assert args.metric_interval == DEFAULT_INTERVAL_S == 10.0
    assert args.disable_log_stats is False and args.metrics_port is None
    # The seed's lines, through `octavo serve` as well.
    args = build_parser().parse_args(["serve", "--metrics-port", "9090",
                                      "--metric-interval", "30", "--disable-log-stats"])
    assert (args.metrics_port, args.metric_interval, args.disable_log_stats) == (9090, 30.0,
                                                                                 True)
    assert unsupported_flags(args) == []
    p = make_arg_parser()
    for argv, word in ((["--metric-interval", "0"], "--metric-interval"),
                       (["--metric-interval", "nan"], "--metric-interval"),
                       (["--metrics-port", "8000"], "--metrics-port"),
                       (["--metrics-port", "70000"], "--metrics-port")):
        problems = unsupported_flags(p.parse_args(argv))
        assert len(problems) == 1 and problems[0].startswith(word), (argv, problems)


@pytest.mark.parametrize("argv, attached", [([], 10.0), (["--metric-interval", "2.5"], 2.5),
                                            (["--disable-log-stats"], None)])
def test_start_engine_attaches_the_logger(monkeypatch, argv, attached):
    pytest.importorskip("fastapi")
    from octavo.engine.async_llm import AsyncLLM
    from octavo.entrypoints.openai import api_server

    stub = SimpleNamespace(engine=fake_engine(), stat_loggers=[])
    monkeypatch.setattr(AsyncLLM, "from_engine_args", classmethod(lambda cls, args: stub))
    assert api_server.start_engine(api_server.make_arg_parser().parse_args(argv)) is stub
    loggers = [sl for sl in stub.stat_loggers if isinstance(sl, LoggingStatLogger)]
    assert [sl.interval for sl in loggers] == ([] if attached is None else [attached])
