"""Engine runtime switches: a step's launches and transfers (PDL, L2 prefetch, packed
inputs, the custom all-reduce), profiling, logging, caches, replicas, the startup heap."""

from __future__ import annotations

import os

from octavo.envs._parse import _flag, _int


def pdl() -> bool:
    """OCTAVO_PDL (default on): on NVIDIA sm_90+, the decode path's Triton kernels are
    launched with programmatic dependent launch (octavo/kernels/pdl.py)."""
    return _flag("OCTAVO_PDL", True)


def packed_inputs() -> bool:
    """OCTAVO_PACKED_INPUTS (default on): on CUDA, a step's input tensors (token ids,
    positions, KV slots, query starts, sequence lengths, block-table rows, logits rows,
    sampling parameters, in-flight token fixes) are typed views into one pinned host arena
    mirrored by one device arena of the same layout, and a step uploads them with one
    host-to-device copy of the byte range it wrote (octavo/worker/input_buffers.py); off, one
    copy per tensor per step."""
    return _flag("OCTAVO_PACKED_INPUTS", True)


def l2_prefetch() -> frozenset[str]:
    """OCTAVO_L2_PREFETCH (comma list of "o", "mlp", "qkv"; default none): on NVIDIA sm_90+
    with PDL, a launch right after each decoder layer's attention pulls into L2 the weights
    read next (its o_proj, its MLP, the next layer's qkv_proj) for one-token steps,
    octavo/layers/weight_prefetch.py. "0" / "off" / "none" (the default): none. Off by
    default since session 33: on an H200 it cost Qwen3-0.6B batch 1 0.884 -> 0.952 ms and
    Llama-3.1-8B fp8 2.547 -> 2.594 ms, W4A16 2.558 -> 2.571, bf16 nothing; only W8A16 g128
    gained (3.121 -> 3.079)."""
    value = os.environ.get("OCTAVO_L2_PREFETCH", "none")
    names = frozenset(v.strip() for v in value.split(",") if v.strip())
    if names & {"0", "off", "none", "false"}:
        return frozenset()
    bad = names - {"o", "mlp", "qkv"}
    if bad:
        raise ValueError(f"OCTAVO_L2_PREFETCH={value!r}: unknown part(s) {sorted(bad)}; "
                         "expected a comma list of o, mlp, qkv")
    return names


def l2_prefetch_mb() -> int:
    """OCTAVO_L2_PREFETCH_MB (default 24): at most this many MiB prefetched per layer."""
    return _int("OCTAVO_L2_PREFETCH_MB", 24, "a size in MiB")


def l2_prefetch_max_tokens() -> int:
    """OCTAVO_L2_PREFETCH_MAX_TOKENS (default 1): the prefetch runs for steps of at most this
    many tokens (two and more lost on an H200)."""
    return _int("OCTAVO_L2_PREFETCH_MAX_TOKENS", 1, "a token count")


def custom_all_reduce() -> bool:
    """OCTAVO_CUSTOM_ALL_REDUCE (default on): tensor-parallel all-reduces of small CUDA tensors
    in one launch over peer-mapped GPU memory (octavo/distributed/custom_all_reduce.py) where
    every GPU can reach the others; off, NCCL for every all-reduce."""
    return _flag("OCTAVO_CUSTOM_ALL_REDUCE", True)


def profile_steps() -> tuple[int, int] | None:
    """OCTAVO_PROFILE_STEPS="START:STOP" (default unset): each worker (every rank) runs
    torch.profiler over its steps START..STOP-1 and writes a per-kernel summary to
    OCTAVO_PROFILE_DIR (default "."), for finding where a step's device time goes."""
    value = os.environ.get("OCTAVO_PROFILE_STEPS", "").strip()
    if not value:
        return None
    try:
        start, stop = (int(v) for v in value.split(":"))
    except ValueError:
        raise ValueError(f"OCTAVO_PROFILE_STEPS must be START:STOP, got {value!r}") from None
    if not 0 <= start < stop:
        raise ValueError(f"OCTAVO_PROFILE_STEPS needs 0 <= START < STOP, got {value!r}")
    return start, stop


def profile_dir() -> str:
    return os.environ.get("OCTAVO_PROFILE_DIR", ".")


def server_eager_send() -> bool:
    """OCTAVO_SERVER_EAGER_SEND (default on): the servers send each request to the engine
    from its handler (``start_request``) instead of at the response's first iteration,
    which the event loop reaches only after every handler of a burst has run: in
    ``benchmarks/api_ingest.py``'s 1,000-request burst the first request reached the engine
    at 0.66-0.77 s sent lazily, 0.10-0.17 s from the handler. 0: the lazy send. (Session
    65's CI failure with it on was its test's race, not a leak: tests/
    test_server_eager_send.py.)"""
    return _flag("OCTAVO_SERVER_EAGER_SEND", True)


def log_step_timings() -> bool:
    """OCTAVO_LOG_STEP_TIMINGS (default off): an engine process logs where its steps' time
    went (scheduling, input preparation, execution, output processing) when it stops, with
    the time its engine loop spent outside steps (benchmarks compare it with offline)."""
    return _flag("OCTAVO_LOG_STEP_TIMINGS", False)


def tokenizer_cache() -> bool:
    """OCTAVO_TOKENIZER_CACHE (default on): a GGUF file's converted tokenizer is kept under
    the cache directory and loaded from there on later starts
    (octavo/model_loader/tokenizer_cache.py); off, it is converted on every start."""
    return _flag("OCTAVO_TOKENIZER_CACHE", True)


def cache_dir() -> str | None:
    """OCTAVO_CACHE_DIR, else $XDG_CACHE_HOME/octavo, else ~/.cache/octavo (None when there is
    no home to put it in)."""
    explicit = os.environ.get("OCTAVO_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return None if base.startswith("~") else os.path.join(base, "octavo")


def server_gc_gen0() -> int:
    """OCTAVO_SERVER_GC_GEN0 (default 50000; 0: Python's own thresholds): the OpenAI server's
    process collects its youngest generation after this many container allocations instead
    of Python's 700 (``startup_heap.tune_collector_for_serving``). A burst of requests keeps
    their 1,024-id prompt lists alive in that process, and every older-generation pass walks
    them: at 700, 1,000 streamed requests cost its event loop ~0.25 s of collections with
    pauses up to ~0.1 s; at 50,000, ~0.09 s and ~0.03 s (CPU proxy)."""
    return _int("OCTAVO_SERVER_GC_GEN0", 50_000, "allocations between young collections")


def replica_direct_send() -> bool:
    """OCTAVO_REPLICA_DIRECT_SEND (default on): a process replica's engine thread pipes each
    step's outputs to the router itself; off, it hands them to the replica's sender thread
    (a GIL hand-off between two threads every step)."""
    return _flag("OCTAVO_REPLICA_DIRECT_SEND", True)


def freeze_startup_heap() -> bool:
    """OCTAVO_FREEZE_STARTUP_HEAP (default on): a serving process (the API server, an engine
    process) moves every object alive once its engine is built out of the garbage
    collector's reach (``gc.freeze``; octavo/startup_heap.py); off, each full collection
    walks them again."""
    return _flag("OCTAVO_FREEZE_STARTUP_HEAP", True)
