"""Helpers shared by the scheduler tests."""

from __future__ import annotations

from octavo.core.request import Request
from octavo.core.scheduler import Scheduler
from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput


def step(sched: Scheduler, token: int = 7) -> tuple[SchedulerOutput, list[Request]]:
    """One step with no model: every request whose scheduled tokens reach its end samples
    ``token``. The step's SchedulerOutput and the requests it finished."""
    out = sched.schedule()
    done = [r for r in out.num_scheduled_tokens if sched.requests[r].num_pending]
    _, finished = sched.update_from_output(out, ModelRunnerOutput(done, [token] * len(done)))
    return out, finished
