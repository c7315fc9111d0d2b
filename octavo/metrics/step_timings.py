"""Where engine step time goes: scheduling, input preparation, model execution (including the
wait for the device), and output processing. Cheap enough to stay on."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepTimings:
    steps: int = 0
    decode_steps: int = 0
    schedule_s: float = 0.0
    prepare_s: float = 0.0  # host-side batch building inside the runner
    execute_s: float = 0.0  # runner total, prepare included
    output_s: float = 0.0
    wall_s: float = 0.0
    tokens: int = 0
    _extra: dict = field(default_factory=dict)

    def reset(self) -> None:
        self.__init__()

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
            "cpu_bookkeeping_ms_per_step": 1e3 * cpu / n,
            "cpu_bookkeeping_fraction": cpu / self.wall_s if self.wall_s else 0.0,
        }
