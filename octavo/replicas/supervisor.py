"""Keeps the replicas running: starts them, notices a death (the process ended, the actor
died) or a stall (no heartbeat for ``stall_timeout_s``: the process is stopped or wedged;
requests but no finished engine step for ``step_timeout_s``: the engine is stuck; not ready
within ``startup_timeout_s``) and kills the stalled one, and starts a replacement in the same
slot within the restart budget (``slot.MAX_RESTARTS`` per ``slot.RESTART_WINDOW_S``).

The supervisor owns the slots' lifecycle; what a death means for requests is the router's
(``on_death``), called under the shared lock the moment the death is seen, so that no request
can be routed to a replica already known dead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from octavo.replicas.slot import ReplicaSlot

logger = logging.getLogger(__name__)

DEFAULT_STARTUP_TIMEOUT_S = 900.0  # loading a large checkpoint takes minutes
DEFAULT_STALL_TIMEOUT_S = 30.0  # a replica sends stats every 0.5 s, even mid-step
# One engine step, a chunk of prefill included, takes well under this even on a CPU; an
# engine restart's health check is bounded by 60 s.
DEFAULT_STEP_TIMEOUT_S = 300.0
_TICK_S = 0.1


class Supervisor:
    def __init__(self, num_replicas: int, make_handle: Callable[[int], object],
                 lock: threading.RLock,
                 on_batch: Callable[[ReplicaSlot, object, list], None],
                 on_death: Callable[[ReplicaSlot, object, str], None],
                 on_all_failed: Callable[[str], None],
                 startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
                 stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
                 step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S) -> None:
        self.slots = [ReplicaSlot(i) for i in range(num_replicas)]
        self._make_handle = make_handle
        self._lock = lock
        self._on_batch = on_batch
        self._on_death = on_death
        self._on_all_failed = on_all_failed
        self.startup_timeout_s = startup_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.step_timeout_s = step_timeout_s
        self._stopping = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ start
    def start_all(self) -> None:
        """Start every replica and wait until all are ready; RuntimeError naming the first
        that could not start (the others are stopped)."""
        try:
            for slot in self.slots:
                self._launch(slot)
            while True:
                with self._lock:
                    states = [s.state for s in self.slots]
                    bad = next((s for s in self.slots if s.state == "dead"), None)
                if bad is not None:
                    raise RuntimeError(bad.last_error)
                if all(s == "ready" for s in states):
                    break
                if time.monotonic() - min(s.started_at for s in self.slots) > \
                        self.startup_timeout_s:
                    late = [s.index for s in self.slots if s.state != "ready"]
                    raise RuntimeError(f"replica(s) {late} not ready within "
                                       f"{self.startup_timeout_s:.0f} s")
                time.sleep(0.05)
        except BaseException:
            self.stop_all()
            raise
        self._thread = threading.Thread(target=self._run, name="octavo-replica-supervisor",
                                        daemon=True)
        self._thread.start()

    def _launch(self, slot: ReplicaSlot) -> None:
        handle = self._make_handle(slot.index)
        with self._lock:
            if self._stopping:
                # stop_all has collected (or is collecting) the handles to stop: a successor
                # made now would be missed by it and outlive the shutdown.
                return
            slot.handle, slot.state, slot.pid, slot.stats = handle, "starting", None, None
            slot.stuck_s = 0.0
            slot.kill_reason = slot.start_error = None
            slot.started_at = slot.last_seen = time.monotonic()
        handle.start(lambda batch: self._batch(slot, handle, batch),
                     lambda why: self._exited(slot, handle, why))

    # ------------------------------------------------------------------ callbacks
    def _batch(self, slot: ReplicaSlot, handle, batch: list) -> None:
        with self._lock:
            if slot.handle is not handle or slot.state in ("stopped", "dead"):
                return  # a replaced or stopped replica's last words
            slot.last_seen = time.monotonic()
            for msg in batch:
                if msg[0] == "ready":
                    slot.state, slot.pid = "ready", msg[1]["pid"]
                    logger.info("replica %d ready (pid %s)", slot.index, slot.pid)
                elif msg[0] == "start_error":
                    slot.start_error = msg[1]
                elif msg[0] == "stats":
                    slot.stats, slot.stuck_s = msg[1], msg[2]
            self._on_batch(slot, handle, batch)

    def _exited(self, slot: ReplicaSlot, handle, why: str) -> None:
        with self._lock:
            if slot.handle is not handle or slot.state in ("stopped", "dead", "failed"):
                return
            was = slot.state
            slot.state, slot.stats = "dead", None
            if slot.kill_reason is not None:
                slot.last_error = f"replica {slot.index} {slot.kill_reason}, so it was " \
                    f"killed ({why})"
            elif was == "starting":
                slot.last_error = (f"replica {slot.index} could not start: "
                                   f"{slot.start_error or why}")
            else:
                slot.last_error = f"replica {slot.index} died: {why}"
            self._on_death(slot, handle, slot.last_error)
        if not self._stopping:
            logger.warning("%s", slot.last_error)
        self._wake.set()

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(_TICK_S)
            self._wake.clear()
            if self._stopping:
                return
            now = time.monotonic()
            to_kill, to_start = [], []
            with self._lock:
                for slot in self.slots:
                    if slot.state == "dead":
                        if slot.record_death(now):
                            to_start.append(slot)
                        else:
                            slot.state = "failed"
                            logger.error("replica %d died %d times within %.0f s; not "
                                         "restarting it", slot.index, len(slot.deaths),
                                         now - slot.deaths[0])
                    elif slot.kill_reason is not None:
                        continue  # killed already: its reader reports the death
                    elif slot.state == "starting" and \
                            now - slot.started_at > self.startup_timeout_s:
                        slot.kill_reason = (f"was not ready within "
                                            f"{self.startup_timeout_s:.0f} s")
                        to_kill.append(slot.handle)
                    elif slot.state == "ready" and now - slot.last_seen > self.stall_timeout_s:
                        slot.kill_reason = f"sent nothing for {now - slot.last_seen:.0f} s"
                        logger.error("replica %d %s; killing it", slot.index,
                                     slot.kill_reason)
                        to_kill.append(slot.handle)
                    elif slot.state == "ready" and slot.stuck_s > self.step_timeout_s:
                        slot.kill_reason = (f"had requests but finished no engine step for "
                                            f"{slot.stuck_s:.0f} s")
                        logger.error("replica %d %s; killing it", slot.index,
                                     slot.kill_reason)
                        to_kill.append(slot.handle)
                all_failed = all(s.state == "failed" for s in self.slots)
            for handle in to_kill:  # its reader reports the death
                handle.kill()
            for slot in to_start:
                slot.num_restarts += 1
                logger.warning("restarting replica %d (restart %d)", slot.index,
                               slot.num_restarts)
                try:
                    self._launch(slot)
                except Exception as e:  # noqa: BLE001 - counts as a death
                    with self._lock:
                        slot.state, slot.last_error = "dead", f"could not restart: {e}"
            if all_failed:
                self._on_all_failed("every replica failed: " + "; ".join(
                    f"{s.last_error}" for s in self.slots))
                return

    # ------------------------------------------------------------------ stop
    def stop_all(self, timeout: float = 10.0) -> None:
        with self._lock:  # _launch checks it under the same lock before keeping a handle
            self._stopping = True
        self._wake.set()
        # The supervisor loop first: a restart it is making now (a dead replica's successor)
        # must be among the handles stopped below, not started after they were collected.
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        with self._lock:
            handles = [s.handle for s in self.slots if s.handle is not None]
            for slot in self.slots:
                slot.state = "stopped"
        threads = [threading.Thread(target=h.stop, args=(timeout,), daemon=True)
                   for h in handles]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout + 10)
