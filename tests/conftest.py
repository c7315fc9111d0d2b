"""Shared fixtures: tiny random-weight checkpoints, and a leak check on every engine."""

from __future__ import annotations

import gc
import os
import sys
import weakref

import pytest

# Fixtures of the in-process server tests (they take the module's own ``engine``).
pytest_plugins = ("tests.server_apps",)


def _share_cores_between_workers() -> None:
    """Under pytest-xdist, each worker's torch takes its share of the cores, not all of them:
    two workers each starting one OpenMP thread per core on CI's 2 cores ran slower than one
    process (a 71 s sample of the suite took 81 s with 2 workers, 47 s with a thread each).
    Set before torch loads (OpenMP reads it then), so the engines, servers and replica
    processes the tests start inherit it; a user's OMP_NUM_THREADS is left alone."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers or "OMP_NUM_THREADS" in os.environ:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    threads = max(1, cores // int(workers))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None:  # already loaded by some plugin: too late for the variable alone
        torch.set_num_threads(threads)


_share_cores_between_workers()


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


# Triton picks interpreter mode when a kernel module is imported: set it before anything does.
if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_ENGINES: weakref.WeakSet = weakref.WeakSet()


def _lighten_triton_interpreter() -> None:
    """Two pieces of Triton's CPU interpreter that cost the kernel tests time and check
    nothing, turned off for this process (the kernels compute the same values; with
    OCTAVO_TEST_PLAIN_INTERPRETER=1 the interpreter runs as shipped):

    * Integer overflow sanitizing: every integer add / sub / mul also computed the result in
      int64 and compared it with the type's range, for a ``device_assert`` that returns at
      once unless the interpreter's options have ``debug`` (they never do: the interpreter
      builds them without it). About a third of a GPTQ MoE model's interpreted steps.
    * Re-patching ``triton.language`` at each call of a ``@triton.jit`` helper from inside a
      kernel: the launch already patched the modules the kernel sees, and the helper's patch
      (``inspect.getmembers`` over the language, never restored) redoes the same work; a
      helper that sees a module not yet patched in the launch (``triton.language.core``
      from the language's own helpers) still gets its patch, once a launch.

    Both reach into the interpreter's internals, so each applies only where they look as
    expected (Triton 3.x); otherwise the interpreter is left alone."""
    if os.environ.get("TRITON_INTERPRET") != "1" or \
            os.environ.get("OCTAVO_TEST_PLAIN_INTERPRETER") == "1":
        return
    try:
        import dataclasses

        from triton.runtime import interpreter
    except ImportError:
        return
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if dataclasses.is_dataclass(options) and not getattr(options, "debug", True) and \
            getattr(options, "sanitize_overflow", False):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)

    patch_lang = getattr(interpreter, "_patch_lang", None)
    grid_type = getattr(interpreter, "GridExecutor", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    tl = getattr(interpreter, "tl", None)
    if None in (patch_lang, grid_type, scope_type, tl) or \
            getattr(patch_lang, "_octavo_light", False):
        return
    state = {"entering": False, "patched": None}  # langs the running launch patched

    def langs_of(fn) -> set[int]:
        return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}

    def light_patch_lang(fn):
        if state["entering"]:  # the launch's own patch, restored when it ends
            state["entering"] = False
            scope = patch_lang(fn)
            state["patched"] = langs_of(fn)
            return scope
        langs, patched = langs_of(fn), state["patched"]
        if patched is not None and langs <= patched:
            return scope_type()  # a helper inside the launch: already patched
        scope = patch_lang(fn)  # never restored (the interpreter drops a helper's scope)
        if patched is not None:
            patched |= langs  # so patched for the rest of the launch
        return scope

    grid_call = grid_type.__call__

    def light_grid_call(self, *args, **kwargs):
        state["entering"] = True
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            state["entering"], state["patched"] = False, None

    light_patch_lang._octavo_light = True
    interpreter._patch_lang = light_patch_lang
    grid_type.__call__ = light_grid_call


# The packages of the plugins pyproject.toml's addopts turns off (-p no:...). pytest marks
# every module of a pytest11 plugin's distribution for assert rewriting whether or not the
# plugin loads, so importing them (test_fuzz_server does, at collection) rewrote 207 modules
# in each xdist worker, ~7 s of its collection, for asserts no test of ours reaches.
_UNUSED_PLUGIN_PACKAGES = ("schemathesis", "hypothesis", "_hypothesis_pytestplugin",
                           "_hypothesis_globals", "_hypothesis_ftz_detector", "anyio")


def _unmark_unused_plugins_for_rewrite(config) -> None:
    hook = getattr(config.pluginmanager, "rewrite_hook", None)
    marked = getattr(hook, "_must_rewrite", None)  # pytest's own set (no public way out)
    if not isinstance(marked, set):
        return
    unused = {name for name in marked if name.split(".")[0] in _UNUSED_PLUGIN_PACKAGES}
    marked -= unused
    cache = getattr(hook, "_marked_for_rewrite_cache", None)
    if unused and isinstance(cache, dict):
        cache.clear()


def pytest_configure(config):
    _unmark_unused_plugins_for_rewrite(config)
    if getattr(config.option, "dist", "no") == "loadfile":  # xdist: see _LONG_FILES
        config.option.loadscopereorder = False  # its --no-loadscope-reorder
    _lighten_triton_interpreter()
    # Register engines as they are built, without touching torch when a test never needs it.
    try:
        from octavo.engine import llm_engine
    except ImportError:  # torch not installed: torch-free tests still run
        return
    original = llm_engine.LLMEngine.__init__

    def tracking_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _ENGINES.add(self)

    llm_engine.LLMEngine.__init__ = tracking_init


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Captured output with a lone surrogate (the hostile-input tests log such text) written
    as its backslash escape: a report must encode as UTF-8 to cross a process boundary
    (pytest-xdist's workers), and it reads the same on a terminal."""
    outcome = yield
    report = outcome.get_result()
    report.sections = [(title, _utf8_safe(text)) for title, text in report.sections]


def _utf8_safe(text: str) -> str:
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def pytest_collection_modifyitems(config, items):
    if not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    if os.environ.get("OCTAVO_SKIP_SLOW") == "1":
        skip = pytest.mark.skip(reason="slow test (OCTAVO_SKIP_SLOW=1)")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip)
    _long_files_first(config, items)


# Files that take long for their number of tests (CI's 2-core run, the longest first: about
# 110 s down to 10 s), for pytest-xdist's --dist loadfile. It hands a worker the next file
# whenever one runs low, in the order of the collection, and by default sorts the files by
# their number of tests: a long file of few tests came last and ran alone at the end (the
# one-test fuzz file: the other worker idled its last 35 s). These are handed out first,
# then the rest by their number of tests, as before. A stale entry only costs balance.
_LONG_FILES = (
    "tests/test_replicas.py", "tests/test_tensor_parallel.py", "tests/test_fuzz_server.py",
    "tests/test_serving_peers.py", "tests/test_server_shutdown.py", "tests/test_executor_mp.py",
    "tests/kernels/test_fused_moe_fp8.py", "tests/kernels/test_sample_race.py",
    "tests/test_correctness.py", "tests/test_gguf_moe.py", "tests/test_engine_process.py",
    "tests/test_server.py", "tests/test_server_beam_search.py", "tests/test_gguf_quantized.py",
    "tests/test_startup_heap.py", "tests/test_ab_latency.py", "tests/test_gguf_e2e.py",
)


def _long_files_first(config, items) -> None:
    """An xdist worker's collection ordered by file as above (each file's tests in their own
    order): the controller hands out the workers' collection, and under --dist loadfile keeps
    its order (pytest_configure). (A worker's own options no longer say the mode.)"""
    if not hasattr(config, "workerinput"):
        return
    files: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        files[path] = files.get(path, 0) + 1
    rank = {path: i for i, path in enumerate(_LONG_FILES)}
    order = {path: (rank.get(path, len(rank)), -count, i)
             for i, (path, count) in enumerate(files.items())}
    items.sort(key=lambda item: order[item.nodeid.split("::", 1)[0]])


def _first_leak() -> str | None:
    """What the first live engine left behind (None when nothing). Holds the engines only
    while it runs, so a ``gc.collect()`` after it can still drop the ones awaiting collection."""
    for engine in list(_ENGINES):
        sched = engine.scheduler
        if sched.has_unfinished_requests():
            return "requests left in the scheduler"
        if sched.kv.req_to_blocks != {}:
            return "block tables left behind"
        pool = sched.kv.pool
        if pool.num_free_blocks != pool.num_blocks:
            return f"{pool.num_blocks - pool.num_free_blocks} KV blocks not returned to the pool"
        swap = sched.swap
        if swap.req_to_cpu_blocks != {}:
            return "CPU swap block tables left behind"
        if swap.num_free_blocks != swap.num_blocks:
            return f"{swap.num_used_blocks} CPU swap blocks not returned to the pool"
        if engine.states:
            return "output states left behind"
        if engine.parents:
            return "n > 1 parents left behind"
    return None


@pytest.fixture(autouse=True)
def no_block_leaks():
    """After every test, every live engine holds no request and every KV block is free, in
    the GPU pool and in the CPU swap pool: no block leaks in either pool."""
    yield
    if not _ENGINES:  # no engine alive or awaiting collection: nothing to check (a full
        return        # gc.collect after each of ~2,000 tests cost minutes of the suite)
    # Check first and collect garbage only on a finding: an engine that is clean now is clean
    # after a collection too, and a finding is re-checked after one, so only the engines still
    # alive then count, as before. (A gc.collect after each test with a live engine, e.g. a
    # module's shared LLM, cost ~0.4 s a test: ~7 of CI's 19 minutes.)
    if _first_leak() is None:
        return
    gc.collect()
    leak = _first_leak()
    assert leak is None, leak
