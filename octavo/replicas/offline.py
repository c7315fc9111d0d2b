"""``LLM(data_parallel_size=N)``: offline generation spread over N engine processes.

The router runs on an event loop thread of its own (so ``generate`` works from any caller,
a notebook's running loop included); every prompt becomes one request, routed as a server's
would be (least loaded first), and the caller's thread collects the finals in input order,
updating the progress bar as they come.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Sequence

from octavo.engine.arg_utils import EngineArgs
from octavo.engine.processor import PromptType
from octavo.outputs import RequestOutput
from octavo.replicas.router import ReplicaRouter
from octavo.sampling_params import RequestOutputKind, SamplingParams


class OfflineReplicas:
    def __init__(self, args: EngineArgs, num_replicas: int) -> None:
        import logging

        self.router = ReplicaRouter(args, num_replicas,
                                    log_level=logging.getLogger().getEffectiveLevel())
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever,
                                        name="octavo-dp-loop", daemon=True)
        self._thread.start()

    @property
    def front(self):
        return self.router.engine

    def generate(self, prompts: Sequence[PromptType], params: Sequence[SamplingParams],
                 priority: Sequence[int] | None, use_tqdm: bool) -> list[RequestOutput]:
        """One finished RequestOutput per prompt, in order (the prompts are validated).
        A request that fails (its replica died three times under it, or a fault in its own
        step) raises its RequestFailedError here, and the others are aborted."""
        done: queue.SimpleQueue = queue.SimpleQueue()
        ids = [self.front.next_request_id() for _ in prompts]

        async def one(i: int) -> None:
            sp = params[i]
            if sp.output_kind != RequestOutputKind.FINAL_ONLY:
                sp = sp.clone()
                sp.output_kind = RequestOutputKind.FINAL_ONLY
            last = None
            try:
                async for out in self.router.generate(prompts[i], sp, ids[i],
                                                      priority=priority[i] if priority else 0):
                    last = out
            except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
                done.put((i, e))
                return
            done.put((i, last))

        async def run_all() -> None:
            await asyncio.gather(*(one(i) for i in range(len(prompts))))

        future = asyncio.run_coroutine_threadsafe(run_all(), self.loop)
        results: list[RequestOutput | None] = [None] * len(prompts)
        bar = _Progress(len(prompts)) if use_tqdm else None
        try:
            for _ in range(len(prompts)):
                i, item = done.get()
                if isinstance(item, BaseException):
                    raise item
                results[i] = item
                if bar is not None:
                    bar.update(item)
        except BaseException:
            future.cancel()  # each request's generate() aborts it on its replica
            raise
        finally:
            if bar is not None:
                bar.close()
        future.result()
        return results  # type: ignore[return-value]

    def shutdown(self) -> None:
        self.router.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)


class _Progress:
    """The tqdm bar ``LLM.generate`` shows, with its speed estimates."""

    def __init__(self, total: int) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc="Processed prompts", dynamic_ncols=True,
                        postfix="est. speed input: 0.00 toks/s, output: 0.00 toks/s")
        self.t0 = time.perf_counter()
        self.in_toks = self.out_toks = 0

    def update(self, out: RequestOutput) -> None:
        self.in_toks += len(out.prompt_token_ids or [])
        self.out_toks += sum(len(c.token_ids) for c in out.outputs)
        dt = time.perf_counter() - self.t0
        self.bar.postfix = (f"est. speed input: {self.in_toks / dt:.2f} toks/s, "
                            f"output: {self.out_toks / dt:.2f} toks/s")
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
