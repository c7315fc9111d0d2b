"""The engine thread's own cost of serving streams (issue 15 item 4), without HTTP: a
``ReplicaCore`` (what an engine process runs) takes N streaming DELTA requests and pipes
its batches to a child process that unpickles them, as the router's reader does; the same
requests then run through a bare ``LLMEngine`` as ``LLM.generate`` runs them (FINAL_ONLY).

    python benchmarks/engine_process_overhead.py [--shape tiny-qwen3] [--num-requests 256]
        [--output-len 64] [--rounds 5] [--mode serve offline]

Per engine step, median over rounds: the engine's own step timings (wall clock), and the
engine thread's CPU seconds (``time.thread_time``) in output processing (``_process``) and
in the hand-off after the step (``AsyncLLM._dispatch``: streams, the sink, pickling, the
pipe write). On a loaded machine the CPU figures are the ones to compare; wall clock is
noise. On a GPU, ``_process``'s CPU time includes the spin of a device synchronization.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.workloads import SHAPES, write_config  # noqa: E402


def _drain(conn, other) -> None:
    other.close()
    while True:
        try:
            conn.recv()
        except EOFError:
            return


class _ThreadCpu:
    """CPU seconds of the calling thread inside wrapped methods, by name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, cls, name: str, key: str) -> None:
        orig = getattr(cls, name)
        seconds = self.seconds

        def timed(*args, **kwargs):
            t = time.thread_time()
            try:
                return orig(*args, **kwargs)
            finally:
                seconds[key] = seconds.get(key, 0.0) + time.thread_time() - t

        setattr(cls, name, timed)


def run(mode: str, args: argparse.Namespace) -> dict:
    from octavo.engine.arg_utils import EngineArgs
    from octavo.engine.async_llm import AsyncLLM
    from octavo.engine.llm_engine import LLMEngine
    from octavo.sampling_params import RequestOutputKind, SamplingParams

    cpu = _ThreadCpu()
    cpu.wrap(LLMEngine, "_process", "process")
    cpu.wrap(AsyncLLM, "_dispatch", "dispatch")
    engine_args = EngineArgs(model=write_config(args.shape), load_format="dummy",
                             dtype=args.dtype, max_model_len=2048,
                             max_num_seqs=args.num_requests, max_num_batched_tokens=16384)
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 10000) for _ in range(args.input_len)]
               for _ in range(args.num_requests)]
    kind = RequestOutputKind.DELTA if mode == "serve" else RequestOutputKind.FINAL_ONLY
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=args.output_len,
                            output_kind=kind)
    child = None
    if mode == "serve":
        from octavo.replicas.messages import ReplicaSpec
        from octavo.replicas.pipe_writer import PipeWriter
        from octavo.replicas.replica_core import ReplicaCore

        core = ReplicaCore(ReplicaSpec(engine_args, 0, "bench"), on_fatal=lambda e: os._exit(1))
        engine = core.llm.engine
        ctx = mp.get_context("fork")
        mine, theirs = ctx.Pipe()
        child = ctx.Process(target=_drain, args=(theirs, mine))
        child.start()
        theirs.close()
        core.pipe_writer = PipeWriter(mine, on_closed=lambda: None)
        core.direct_send = core.pipe_writer.send

        def one_round(tag: str) -> None:
            for i, ids in enumerate(prompts):
                core.handle(("add", f"{tag}{i}", {"prompt_token_ids": ids}, params, 0, None))
            while core._live:
                time.sleep(0.002)
    else:
        engine = LLMEngine.from_engine_args(engine_args)

        def one_round(tag: str) -> None:
            for i, ids in enumerate(prompts):
                engine.add_request(f"{tag}{i}", {"prompt_token_ids": ids}, params)
            while engine.has_unfinished_requests():
                engine.step()

    one_round("warm")
    rows = []
    for r in range(args.rounds):
        engine.timings.reset()
        cpu.seconds.clear()
        t0 = time.perf_counter()
        one_round(f"r{r}-")
        wall = time.perf_counter() - t0
        s = engine.timings.summary()
        n = max(s["steps"], 1)
        rows.append({"wall_s": wall, "steps": s["steps"],
                     "output_processing_ms": s["output_processing_ms_per_step"],
                     "dispatch_ms": s["dispatch_ms_per_step"],
                     "execute_ms": s["execute_ms_per_step"],
                     "cpu_process_ms": 1e3 * cpu.seconds.get("process", 0.0) / n,
                     "cpu_dispatch_ms": 1e3 * cpu.seconds.get("dispatch", 0.0) / n})
    if mode == "serve":
        core.llm.shutdown()
        mine.close()
        child.join(5)
    else:
        engine.shutdown()
    result = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
    result["mode"] = mode
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="tiny-qwen3", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mode", nargs="+", default=["serve", "offline"],
                    choices=["serve", "offline"])
    args = ap.parse_args()
    if len(args.mode) > 1:  # one process each, in turn
        import subprocess

        for mode in args.mode:
            argv = [a for a in sys.argv[1:] if a not in args.mode and a != "--mode"]
            subprocess.run([sys.executable, __file__, *argv, "--mode", mode], check=True)
        return
    result = run(args.mode[0], args)
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                      for k, v in result.items()}))


if __name__ == "__main__":
    main()
