"""PipeWriter (an engine process's end of its pipe): a router that stops reading must not
block the engine thread's sends; every batch still arrives, in order, whichever thread
wrote it; a closed pipe is reported, not raised into the engine thread."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

from octavo.replicas.pipe_writer import MAX_DIRECT_BYTES, PipeWriter


def _pipe():
    return mp.get_context("spawn").Pipe()


def test_a_full_pipe_does_not_block_the_sender_and_order_is_kept():
    router, replica = _pipe()
    closed = threading.Event()
    writer = PipeWriter(replica, on_closed=closed.set)
    # ~6 MB: far more than a socket buffer holds while nobody reads.
    batches = [[("delta", f"r{i}", 0, "x" * 20_000, [i])] for i in range(300)]
    sent = threading.Event()

    def send_all():
        for b in batches:
            writer.send(b)
        sent.set()

    threading.Thread(target=send_all, daemon=True).start()
    assert sent.wait(20), "a send blocked on the full pipe"
    assert writer.num_queued > 0  # the pipe did fill up
    got = [router.recv() for _ in batches]
    assert got == batches
    assert not router.poll(0.1)
    # The pipe drained, nothing queued: the caller writes again itself.
    queued = writer.num_queued
    deadline = time.monotonic() + 5
    while writer._busy:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    writer.send([("delta", "again", 0, "y", [1])])
    assert router.recv() == [("delta", "again", 0, "y", [1])]
    assert writer.num_queued == queued
    assert not closed.is_set()


def test_two_threads_and_a_large_batch_arrive_whole_and_in_each_threads_order():
    router, replica = _pipe()
    writer = PipeWriter(replica, on_closed=lambda: None)
    big = [("out", "big", "z" * (2 * MAX_DIRECT_BYTES))]

    def send(tag: str):
        for i in range(200):
            writer.send(big if i == 100 and tag == "a" else [(tag, i)])

    threads = [threading.Thread(target=send, args=(t,)) for t in "ab"]
    for t in threads:
        t.start()
    got = [router.recv() for _ in range(400)]
    for t in threads:
        t.join(10)
    assert big in got
    for tag in "ab":
        mine = [b[0][1] for b in got if b[0][0] == tag]
        assert mine == [i for i in range(200) if not (tag == "a" and i == 100)]


def test_a_closed_pipe_calls_on_closed_instead_of_raising():
    router, replica = _pipe()
    closed = threading.Event()
    writer = PipeWriter(replica, on_closed=closed.set)
    router.close()
    for _ in range(50):  # a write into a socket whose peer is gone fails
        writer.send([("delta", "r", 0, "x" * 1000, [1])])
        if closed.wait(0.05):
            break
    assert closed.is_set()
    writer.send([("delta", "r", 0, "x", [1])])  # later sends are dropped quietly
