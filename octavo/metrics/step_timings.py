"""Where engine step time goes: scheduling, input preparation, model execution (including the
wait for the device), and output processing. Cheap enough to stay on."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepTrace:
    num_running: int  # after the step (finished requests gone)
    num_scheduled_reqs: int
    num_scheduled_tokens: int
    wall_s: float
    stored_tokens: int  # KV entries written for running requests (sum of computed tokens)
    used_blocks: int  # blocks referenced by some request
    # The step's wall time by phase (a slow step then names where it stalled).
    schedule_s: float = 0.0
    execute_s: float = 0.0  # the runner, the wait for the device included
    output_s: float = 0.0
    start_s: float = 0.0  # time.perf_counter() at the step's start


@dataclass
class StepTimings:
    steps: int = 0
    decode_steps: int = 0
    schedule_s: float = 0.0
    prepare_s: float = 0.0  # host-side batch building inside the runner
    execute_s: float = 0.0  # runner total, prepare included
    output_s: float = 0.0
    # After the step, on an AsyncLLM's engine thread: handing the outputs to their streams
    # or sinks (an engine process: building its messages and the pipe write), before the
    # next step can start.
    dispatch_s: float = 0.0
    wall_s: float = 0.0
    tokens: int = 0
    _extra: dict = field(default_factory=dict)
    # When a list: one StepTrace per step (benchmarks turn it on; off by default).
    trace: list | None = None

    def reset(self) -> None:
        tracing = self.trace is not None
        self.__init__()
        if tracing:
            self.trace = []

    def kv_utilization(self, max_model_len: int, block_size: int) -> dict:
        """W5 figures from the trace: KV slots holding real tokens over slots allocated,
        time-averaged (weighted by step wall time) and the minimum over steps with
        requests running; beside it, the same ratio had every running request been given
        a contiguous region of max_model_len slots up front."""
        rows = [r for r in self.trace or () if r.num_running and r.used_blocks]
        if not rows:
            return {}
        wall = sum(r.wall_s for r in rows)
        paged = [r.stored_tokens / (r.used_blocks * block_size) for r in rows]
        contiguous = [r.stored_tokens / (r.num_running * max_model_len) for r in rows]
        return {
            "steps_sampled": len(rows),
            "paged_time_avg": sum(u * r.wall_s for u, r in zip(paged, rows)) / wall,
            "paged_min": min(paged),
            "contiguous_time_avg": sum(u * r.wall_s for u, r in zip(contiguous, rows)) / wall,
            "contiguous_min": min(contiguous),
        }

    def summary(self) -> dict:
        n = max(self.steps, 1)
        cpu = self.schedule_s + self.prepare_s + self.output_s
        return {
            "steps": self.steps,
            "decode_only_steps": self.decode_steps,
            "mean_step_ms": 1e3 * self.wall_s / n,
            "schedule_ms_per_step": 1e3 * self.schedule_s / n,
            "prepare_inputs_ms_per_step": 1e3 * self.prepare_s / n,
            "execute_ms_per_step": 1e3 * self.execute_s / n,
            "output_processing_ms_per_step": 1e3 * self.output_s / n,
            "dispatch_ms_per_step": 1e3 * self.dispatch_s / n,
            "cpu_bookkeeping_ms_per_step": 1e3 * cpu / n,
            "cpu_bookkeeping_fraction": cpu / self.wall_s if self.wall_s else 0.0,
        }
