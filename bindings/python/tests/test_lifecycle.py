"""Ctrl-C, fork and the GIL: what blocking calls do for the rest of Python."""

from __future__ import annotations

import _thread
import os
import threading
import time

import pytest

import tubeway


def interrupt_soon() -> threading.Timer:
    """Raises KeyboardInterrupt in the main thread shortly, as Ctrl-C does."""
    t = threading.Timer(0.3, _thread.interrupt_main)
    t.start()
    return t


def test_ctrl_c_interrupts_a_blocking_poll(client: tubeway.Client) -> None:
    client.create_queue("q")
    start = time.monotonic()
    t = interrupt_soon()
    with pytest.raises(KeyboardInterrupt):
        client.poll("q", timeout=60)
    t.join()
    assert time.monotonic() - start < 10
    # The client is still usable. (Not with "q": the broker knows nothing of
    # the interruption and keeps the poll waiting until its timeout.)
    client.create_queue("q2")
    client.offer("q2", "x")
    assert client.poll("q2").text == "x"


def test_ctrl_c_interrupts_a_blocking_send(server: tubeway.Server, client: tubeway.Client) -> None:
    release = threading.Event()

    def late(m: tubeway.Message) -> str:
        release.wait(30)
        return "late"

    server.create_function("late", late)
    server.create_function("echo", lambda m: m.text)
    try:
        start = time.monotonic()
        t = interrupt_soon()
        with pytest.raises(KeyboardInterrupt):
            client.send("late", "x", timeout=60)
        t.join()
        assert time.monotonic() - start < 10
    finally:
        release.set()
    # The late answer, when it comes, is dropped; the client goes on.
    assert client.send("echo", "still here").text == "still here"


def test_ctrl_c_interrupts_queue_get_and_recv(client: tubeway.Client) -> None:
    with tubeway.queue("tcp://127.0.0.1:0", "server") as q:
        t = interrupt_soon()
        with pytest.raises(KeyboardInterrupt):
            q.get()
        t.join()
    client.create_topic("t")
    with client.subscribe("t") as sub:
        t = interrupt_soon()
        with pytest.raises(KeyboardInterrupt):
            sub.recv()
        t.join()


def test_the_gil_is_released_while_waiting(client: tubeway.Client) -> None:
    client.create_queue("q")
    counted = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal counted
        while not stop.is_set():
            counted += 1

    t = threading.Thread(target=count)
    t.start()
    with pytest.raises(tubeway.QueueEmpty):
        client.poll("q", timeout=0.5)
    before = counted
    stop.set()
    t.join()
    assert before > 10_000, "the other thread barely ran while we waited"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_a_clear_error(tcp_server: tubeway.Server) -> None:
    with tubeway.Client(tcp_server.url) as c:
        c.ping()  # the runtime runs in this process now
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            tubeway.Client(tcp_server.url)
        except tubeway.Error as e:
            code = 0 if "forked" in str(e) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


EXIT_BUSY = """
import threading, time, numpy as np, tubeway
server = tubeway.Server(["tcp://127.0.0.1:0"])
started = threading.Event()
def slow(m):
    started.set()
    time.sleep(0.05)
    return m
server.create_function("slow", slow)
client = tubeway.Client(server.url)
client.create_topic("t")
client.subscribe("t", lambda m: time.sleep(0.01))
pending = [client.send_async("slow", str(i)) for i in range(50)]
for i in range(50):
    client.publish_oneway("t", str(i))
q = tubeway.queue("tcp://127.0.0.1:0", "server")
c = tubeway.queue(q.url, "client")
# A reader that keeps buffers being released (on the GIL thread) while
# the interpreter exits.
threading.Thread(target=lambda: [q.get() for _ in iter(int, 1)], daemon=True).start()
big = np.zeros(4 << 20)
for _ in range(400):
    c.put(big)
started.wait(10)
print("exiting", flush=True)
# Exit with handlers, callbacks, buffers and futures in flight.
"""


def test_exit_with_work_in_flight_is_clean() -> None:
    from conftest import finish, python

    for _ in range(3):
        assert finish(python(EXIT_BUSY), timeout=60) == ["exiting"]


def test_dropping_a_server_with_calls_in_flight_does_not_block() -> None:
    server = tubeway.Server(["tcp://127.0.0.1:0"], shutdown_timeout=5.0)
    started = threading.Event()

    def slow(m: tubeway.Message) -> str:
        started.set()
        time.sleep(0.5)  # the handler holds a call in flight; it needs the GIL to finish
        return "done"

    server.create_function("slow", slow)
    client = tubeway.Client(server.url)
    pending = client.send_async("slow", "x")
    assert started.wait(10)
    start = time.monotonic()
    del server  # no close(): shut down in the background
    assert time.monotonic() - start < 0.4
    assert pending.result(timeout=10).text == "done"
    client.close()


def test_dropping_a_queue_stops_listening(addresses) -> None:  # type: ignore[no-untyped-def]
    import gc

    url = addresses.new()
    if url.startswith("tcp"):
        first = tubeway.queue(url, "server")
        url = first.url  # the port it got, to listen on again
    else:
        first = tubeway.queue(url, "server")
    c = tubeway.queue(url, "client")
    del first
    gc.collect()
    with pytest.raises(tubeway.ConnectionClosed):
        c.get(timeout=10)
    deadline = time.monotonic() + 10
    while True:
        try:
            again = tubeway.queue(url, "server")
            break
        except tubeway.ConnectError:
            assert time.monotonic() < deadline, "the dropped queue still listens"
            time.sleep(0.02)
    again.close()
    c.close()
