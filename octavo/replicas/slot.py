"""One replica position in the router: the live handle in it, its state and its load. A slot
outlives its handles: a replica that dies is replaced in the same slot (same index, same
``replica`` label)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

# A replica that dies more than this many times within the window is not started again (its
# slot is "failed"); when every slot has failed the router is dead.
MAX_RESTARTS = 3
RESTART_WINDOW_S = 300.0

# States: starting -> ready -> dead -> starting ... ; failed (restart budget spent);
# stopped (shut down on purpose).
SERVING_STATES = ("starting", "ready", "dead")


@dataclass
class ReplicaSlot:
    index: int
    handle: Any = None  # ProcessReplica | RayReplica
    state: str = "starting"
    in_flight: int = 0
    stats: list | None = None  # the latest metrics snapshot
    pid: int | None = None
    started_at: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    stuck_s: float = 0.0  # the engine's time with requests and no finished step
    num_restarts: int = 0
    deaths: list[float] = field(default_factory=list)
    last_error: str | None = None
    kill_reason: str | None = None  # why the supervisor killed the live replica, if it did
    start_error: str | None = None  # what the replica starting now reported, if it failed

    def record_death(self, now: float) -> bool:
        """Count a death; whether the slot may start a replacement."""
        self.deaths = [t for t in self.deaths if now - t < RESTART_WINDOW_S] + [now]
        return len(self.deaths) <= MAX_RESTARTS

    def report(self) -> dict[str, Any]:
        """What ``/health`` shows of this replica."""
        out: dict[str, Any] = {"replica": self.index, "state": self.state, "pid": self.pid,
                               "in_flight": self.in_flight, "restarts": self.num_restarts}
        if self.last_error is not None:
            out["last_error"] = self.last_error
        return out
