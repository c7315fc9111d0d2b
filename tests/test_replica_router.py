"""The router and supervisor of replicas, with fake replica handles (no engine processes, so
each case takes milliseconds): routing to the least loaded, outputs and aborts reaching the
right replica, a death retrying what had no output and failing what had, restarts within a
budget, the router dying (fatal callbacks, /health 503) when every replica has spent it, a
request that finds no ready replica failing instead of waiting forever, and the metrics of
each replica under a ``replica`` label."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

import pytest

from octavo.engine.arg_utils import EngineArgs
from octavo.engine.async_llm import EngineDeadError
from octavo.errors import RequestFailedError
from octavo.outputs import CompletionOutput, RequestOutput
from octavo.replicas import ReplicaRouter
from octavo.sampling_params import RequestOutputKind, SamplingParams
from tests.tiny_models import make_checkpoint

_pids = itertools.count(1000)


def output(request_id: str, tokens: list[int], finished: bool) -> RequestOutput:
    return RequestOutput(request_id, None, [1], None,
                         [CompletionOutput(0, "", tokens, None, None,
                                           "length" if finished else None)], finished)


class FakeReplica:
    """A replica handle that answers as the test tells it to."""

    def __init__(self, spec, starts: bool = True, auto_finish: bool = False) -> None:
        self.spec = spec
        self.index = spec.index
        self.starts = starts
        self.auto_finish = auto_finish
        self.received: list[tuple] = []
        self.pid = next(_pids)
        self.alive = False

    def start(self, on_batch, on_exit) -> None:
        self.on_batch, self.on_exit = on_batch, on_exit
        if not self.starts:
            self.on_exit("it could not load its model")
            return
        self.alive = True
        on_batch([("ready", {"pid": self.pid})])

    def send(self, msg: tuple) -> None:
        self.received.append(msg)
        if msg[0] == "add" and self.auto_finish:
            self.on_batch([("out", msg[1], output(msg[1], [7, 8], True))])

    def adds(self) -> list[str]:
        return [m[1] for m in self.received if m[0] == "add"]

    def die(self, why: str = "its process ended: killed by signal 9") -> None:
        self.alive = False
        self.on_exit(why)

    def kill(self) -> None:
        if self.alive:
            self.die("killed")

    def stop(self, timeout: float = 10.0) -> None:
        self.alive = False


class Fleet:
    """The fakes a router made, and how the next ones behave."""

    def __init__(self) -> None:
        self.made: list[FakeReplica] = []
        self.starts = True
        self.auto_finish = False
        self.lock = threading.Lock()

    def __call__(self, spec) -> FakeReplica:
        fake = FakeReplica(spec, self.starts, self.auto_finish)
        with self.lock:
            self.made.append(fake)
        return fake

    def live(self, index: int) -> FakeReplica:
        return [f for f in self.made if f.index == index][-1]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_checkpoint("llama", str(tmp_path_factory.mktemp("router") / "llama"))


@pytest.fixture
def fleet():
    return Fleet()


@pytest.fixture
def make_router(model, fleet):
    routers = []

    def make(n: int = 2, **kw) -> ReplicaRouter:
        router = ReplicaRouter(EngineArgs(model=model, skip_tokenizer_init=True,
                                          max_model_len=64), n, make_handle=fleet, **kw)
        routers.append(router)
        return router

    yield make
    for r in routers:
        r.shutdown()


PARAMS = SamplingParams(max_tokens=2, output_kind=RequestOutputKind.DELTA)
FINAL = SamplingParams(max_tokens=2, output_kind=RequestOutputKind.FINAL_ONLY)


async def collect(router, request_id: str, params=PARAMS, prompt=None) -> list[RequestOutput]:
    return [o async for o in router.generate(prompt or {"prompt_token_ids": [3, 4]}, params,
                                             request_id)]


def wait_for(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


async def until(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_least_loaded_routing_outputs_and_aborts(make_router, fleet):
    router = make_router(2)
    assert router.health_report()[0]
    f0, f1 = fleet.live(0), fleet.live(1)

    async def run():
        tasks = [asyncio.ensure_future(collect(router, f"r{i}")) for i in range(4)]
        await until(lambda: len(f0.adds()) + len(f1.adds()) == 4)
        assert sorted(f0.adds()) == ["r0", "r2"] and sorted(f1.adds()) == ["r1", "r3"]
        assert [s.in_flight for s in router.slots] == [2, 2]
        # r0 finishes first: the next request goes to replica 0, the least loaded.
        f0.on_batch([("out", "r0", output("r0", [5], False))])
        f0.on_batch([("out", "r0", output("r0", [6], True))])
        first = await tasks[0]  # a consumer behind gets the deltas so far in one output
        assert [o.outputs[0].token_ids for o in first] == [[5, 6]] and first[-1].finished
        tasks.append(asyncio.ensure_future(collect(router, "r4")))
        await until(lambda: "r4" in f0.adds())
        # A consumer that stops early aborts its request on its replica.
        tasks[1].cancel()
        await until(lambda: ("abort", "r1") in f1.received)
        # A second request under an id in use is refused; the first goes on.
        with pytest.raises(ValueError, match="already in use"):
            await collect(router, "r2")
        assert ("abort", "r2") not in f0.received
        for f, rid in ((f0, "r2"), (f1, "r3"), (f0, "r4")):
            f.on_batch([("out", rid, output(rid, [9], True))])
        await asyncio.gather(*tasks[2:])

    asyncio.run(run())
    assert [s.in_flight for s in router.slots] == [0, 0]


def test_start_request_sends_at_once_and_aborts_what_nobody_reads(make_router, fleet):
    # A server handler's start_request() reaches the replica before anything iterates (a burst on a
    # busy event loop would otherwise hold it back); outputs that arrive first wait in the
    # stream. Closing an unread iterator, or dropping it, aborts its request; one that
    # finished aborts nothing.
    import gc

    router = make_router(1)
    f0 = fleet.live(0)
    prompt = {"prompt_token_ids": [3, 4]}

    async def run():
        read = router.start_request(prompt, PARAMS, "read")
        assert f0.adds() == ["read"]  # sent, not yet iterated
        f0.on_batch([("out", "read", output("read", [5], False))])
        f0.on_batch([("out", "read", output("read", [6], True))])
        outs = [o async for o in read]
        assert [o.outputs[0].token_ids for o in outs] == [[5, 6]] and outs[-1].finished
        closed = router.start_request(prompt, PARAMS, "closed")
        await closed.aclose()  # an unstarted generator's aclose runs nothing ...
        del closed  # ... so the finalizer aborts it, on the event loop
        gc.collect()
        await until(lambda: ("abort", "closed") in f0.received)
        router.start_request(prompt, PARAMS, "dropped")  # never kept: collected at once
        await until(lambda: ("abort", "dropped") in f0.received)
        done = router.start_request(prompt, PARAMS, "done")
        f0.on_batch([("out", "done", output("done", [7], True))])
        assert [o.finished async for o in done] == [True]
        del done
        gc.collect()
        await asyncio.sleep(0.05)
        # A dead router refuses at the call.
        router._dead = RuntimeError("gone")
        with pytest.raises(EngineDeadError):
            router.start_request(prompt, PARAMS, "late")
        router._dead = None

    asyncio.run(run())
    assert ("abort", "read") not in f0.received and ("abort", "done") not in f0.received
    assert router.slots[0].in_flight == 0


def test_start_request_with_no_replica_ready_sends_at_the_first_iteration(make_router, fleet):
    fleet.auto_finish = True
    router = make_router(1, ready_wait_s=5.0)
    slot = router.slots[0]

    async def run():
        slot.state = "starting"  # none ready: start_request() leaves the send to the iteration
        outputs = router.start_request({"prompt_token_ids": [3, 4]}, PARAMS, "waits")
        assert fleet.live(0).adds() == []
        task = asyncio.ensure_future(_drain(outputs))
        await asyncio.sleep(0.1)
        slot.state = "ready"
        assert [o.finished for o in await task] == [True]

    asyncio.run(run())
    assert fleet.live(0).adds() == ["waits"]


async def _drain(it) -> list[RequestOutput]:
    return [o async for o in it]


def test_prompts_sharing_a_first_block_stick_to_one_replica(make_router, fleet):
    fleet.auto_finish = True
    router = make_router(2)
    shared = list(range(10, 26))  # one full block of 16

    async def run():
        for i in range(6):
            await collect(router, f"p{i}", prompt={"prompt_token_ids": shared + [i]})

    asyncio.run(run())
    counts = sorted(len(f.adds()) for f in fleet.made)
    assert counts == [0, 6]


def test_a_death_retries_what_had_no_output_and_fails_what_had(make_router, fleet):
    router = make_router(1)
    first = fleet.live(0)

    async def run():
        quiet = asyncio.ensure_future(collect(router, "quiet", FINAL))
        talked = asyncio.ensure_future(collect(router, "talked"))
        await until(lambda: sorted(first.adds()) == ["quiet", "talked"])
        first.on_batch([("out", "talked", output("talked", [5], False))])
        first.die()
        with pytest.raises(RequestFailedError, match="replica 0 died: its process ended: "
                           "killed by signal 9; the request had streamed output already"):
            await talked
        # "quiet" had no output: it is sent again, to the replacement once it is ready.
        await until(lambda: len(fleet.made) == 2 and fleet.live(0).adds() == ["quiet"])
        fleet.live(0).on_batch([("out", "quiet", output("quiet", [1, 2], True))])
        outs = await quiet
        assert outs[-1].finished and outs[-1].outputs[0].token_ids == [1, 2]

    asyncio.run(run())
    assert router.num_restarts == 1 and router.slots[0].state == "ready"
    assert "killed by signal 9" in router.health_report()[1][0]["last_error"]


def test_a_request_lost_three_times_fails(make_router, fleet):
    router = make_router(1)

    async def run():
        task = asyncio.ensure_future(collect(router, "unlucky", FINAL))
        for attempt in range(3):
            await until(lambda n=attempt + 1: len(fleet.made) == n
                        and fleet.live(0).adds() == ["unlucky"])
            fleet.live(0).die(f"death {attempt}")
        with pytest.raises(RequestFailedError, match="lost 3 times: .*death 0.*death 2"):
            await task

    asyncio.run(run())


def test_restart_budget_then_the_router_dies_and_fatal_callbacks_run(make_router, fleet):
    router = make_router(2)
    fatal = []
    router.fatal_callbacks.append(fatal.append)
    fleet.starts = False  # every replacement fails to start
    for index in (0, 1):
        fleet.live(index).die()
    wait_for(lambda: router.errored)
    assert [s.state for s in router.slots] == ["failed", "failed"]
    assert [s.num_restarts for s in router.slots] == [3, 3]
    assert len(fatal) == 1 and isinstance(fatal[0], EngineDeadError)
    assert "every replica failed" in str(fatal[0])
    assert "could not load its model" in str(fatal[0])
    assert router.health_report()[0] is False
    with pytest.raises(EngineDeadError):
        asyncio.run(collect(router, "late"))


def test_no_ready_replica_fails_instead_of_waiting_forever(make_router, fleet):
    router = make_router(1, ready_wait_s=0.3)
    fleet.starts = False
    fleet.live(0).die()
    start = time.monotonic()
    with pytest.raises((RequestFailedError, EngineDeadError)):
        asyncio.run(collect(router, "waits"))
    assert time.monotonic() - start < 5


def test_a_silent_replica_is_killed_after_the_stall_timeout(make_router, fleet):
    router = make_router(2, stall_timeout_s=0.3)
    for f in fleet.made:  # replica 1 keeps sending heartbeats; replica 0 goes silent
        if f.index == 1:
            def beat(f=f):
                while f.alive:
                    f.on_batch([("stats", [], 0.0)])
                    time.sleep(0.05)
            threading.Thread(target=beat, daemon=True).start()
    wait_for(lambda: router.slots[0].num_restarts >= 1)
    assert "sent nothing for" in router.slots[0].last_error
    assert router.slots[1].num_restarts == 0


def test_metrics_carry_a_replica_label(make_router, fleet):
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, Counter
    from prometheus_client.parser import text_string_to_metric_families

    from octavo.replicas.metrics import ReplicaMetrics, snapshot

    router = make_router(2)
    for f in fleet.made:
        reg = CollectorRegistry()
        Counter("octavo:generation_tokens", "Tokens generated.", ["model_name"],
                registry=reg).labels("m").inc(10 + f.index)
        f.on_batch([("stats", snapshot(reg), 0.0)])
    text = ReplicaMetrics(router, "m").render().decode()
    samples = {(s.name, s.labels.get("replica")): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples[("octavo:generation_tokens_total", "0")] == 10
    assert samples[("octavo:generation_tokens_total", "1")] == 11
    assert samples[("octavo:replica_up", "1")] == 1.0
    assert samples[("octavo:replica_restarts_total", "0")] == 0
