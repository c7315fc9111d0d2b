"""A launched step whose sampled tokens may still be on their way from the device.

``ModelRunner.execute_model_async`` enqueues a step and returns one of these at once; the
engine calls ``result()`` when it needs the tokens -- after it has already launched the next
step, so the host's bookkeeping overlaps the device's work.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from octavo.core.scheduler_output import ModelRunnerOutput


class StepHandle:
    def __init__(self, finish: Callable[[list[int]], ModelRunnerOutput],
                 sampled_host: torch.Tensor | None, ready: torch.cuda.Event | None) -> None:
        self._finish = finish
        self._host = sampled_host  # pinned host copy (CUDA) or the tokens themselves (CPU)
        self._ready = ready  # recorded after the device-to-host copy
        self._out: ModelRunnerOutput | None = None

    @classmethod
    def done(cls, out: ModelRunnerOutput) -> StepHandle:
        handle = cls(lambda _: out, None, None)
        handle._out = out
        return handle

    def is_ready(self) -> bool:
        """Whether result() would return without waiting for the device."""
        return self._out is not None or self._ready is None or self._ready.query()

    def result(self) -> ModelRunnerOutput:
        if self._out is None:
            if self._ready is not None:
                self._ready.synchronize()
            tokens = self._host.tolist() if self._host is not None else []
            self._out = self._finish(tokens)
        return self._out


class PendingSample:
    """A deferred step's sampling, called for (its bitmask given) but not yet enqueued.

    On CUDA the runner enqueues it once the next step's host preparation is done, just
    before that step's device work: the device goes from this sampling straight to the next
    forward pass instead of idling while the host prepares it. Whoever needs the tokens first
    (``result()``, ``is_ready()``) enqueues it themselves.
    """

    def __init__(self, enqueue: Callable[[], StepHandle]) -> None:
        self._enqueue: Callable[[], StepHandle] | None = enqueue
        self._handle: StepHandle | None = None

    def enqueue(self) -> StepHandle:
        if self._handle is None:
            enqueue, self._enqueue = self._enqueue, None
            # As every other step of the runner: its persistent tensors (penalty counts,
            # caches) are inference tensors, updated in place only in inference mode.
            with torch.inference_mode():
                self._handle = enqueue()
        return self._handle

    def is_ready(self) -> bool:
        return self.enqueue().is_ready()

    def result(self) -> ModelRunnerOutput:
        return self.enqueue().result()
