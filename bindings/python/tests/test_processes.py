"""Between processes: functions served by Python handlers in another process,
broker queues, tubeway.queue with numpy arrays, and peer death."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest

import tubeway
from conftest import finish, python
from transports import Addresses

WORKER = """
import sys, tubeway
with tubeway.Client(sys.argv[1]) as c:
    def square(m):
        if m.data is None:
            raise TypeError("send a number")
        return m.data * m.data
    with c.serve("square", square):
        print("ready", flush=True)
        sys.stdin.read()  # serve until the parent closes our stdin
"""


def test_function_served_by_a_handler_in_another_process(tcp_server: tubeway.Server) -> None:
    child = python(WORKER, tcp_server.url)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    with tubeway.Client(tcp_server.url) as c:
        assert c.send("square", tubeway.Message.data(12)).data == 144
        with pytest.raises(tubeway.HandlerError, match="send a number"):
            c.send("square", "twelve")
        assert c.send("square", tubeway.Message.data(3)).data == 9
    child.kill()
    child.communicate(timeout=30)


SERVER = """
import sys, tubeway
with tubeway.Server([sys.argv[1]]) as s:
    s.create_function("upper", lambda m: m.text.upper())
    s.create_queue("jobs", capacity=100)
    print(s.url, flush=True)
    sys.stdin.read()
"""


def test_embedded_server_in_another_process(addresses: Addresses) -> None:
    child = python(SERVER, addresses.new())
    try:
        assert child.stdout is not None
        url = child.stdout.readline().strip()
        with tubeway.Client(url) as c:
            assert c.send("upper", "abc").text == "ABC"
            c.offer("jobs", "j")
            assert c.poll("jobs", timeout=5).text == "j"
    finally:
        # Ends by its stdin closing: the server shuts down cleanly.
        finish(child)


PRODUCER = """
import sys, tubeway
with tubeway.Client(sys.argv[1]) as c:
    for i in range(200):
        c.offer("work", tubeway.Message.data({"i": i}), timeout=10)
"""


def test_broker_queue_between_processes(server: tubeway.Server) -> None:
    with tubeway.Client(server.url) as c:
        c.create_queue("work", capacity=50)
        producer = python(PRODUCER, server.url)
        got = [c.poll("work", timeout=20).data["i"] for _ in range(200)]
        finish(producer)
        assert got == list(range(200))


def test_poll_raises_when_the_broker_process_dies() -> None:
    child = python(SERVER, "tcp://127.0.0.1:0")
    assert child.stdout is not None
    url = child.stdout.readline().strip()
    with tubeway.Client(url) as c:
        start = time.monotonic()
        import threading

        threading.Timer(0.3, child.kill).start()
        with pytest.raises(tubeway.ConnectionClosed):
            c.poll("jobs", timeout=60)
        assert time.monotonic() - start < 10
    child.communicate(timeout=30)


ECHO = """
import sys, tubeway
with tubeway.queue(sys.argv[1], "client", timeout=30) as q:
    while True:
        try:
            peer, obj = q.get()
        except tubeway.ConnectionClosed:
            break
        if isinstance(obj, str) and obj == "stop":
            break
        q.put(obj, peer).result()
"""

SIZES = [1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]


def test_numpy_arrays_1kb_to_256mb_through_a_queue(addresses: Addresses) -> None:
    with tubeway.queue(addresses.new(), "server") as q:
        child = python(ECHO, q.url)
        assert q.wait_for_peers(1, timeout=30)
        for size in SIZES:
            array = np.arange(size // 4, dtype=np.uint32) * np.uint32(2654435761)
            q.put({"size": size, "array": array}).result(timeout=60)
            _, back = q.get(timeout=60)
            assert back["size"] == size
            assert back["array"].dtype == np.uint32 and back["array"].nbytes == size
            assert np.array_equal(back["array"], array)
            del back
        q.put("stop")
        finish(child)


CLIENT_THEN_DIE = """
import sys, os, tubeway
q = tubeway.queue(sys.argv[1], "client", timeout=30)
q.put("hello").result()
print("sent", flush=True)
sys.stdin.read()
"""


def test_get_raises_when_the_peer_process_dies(addresses: Addresses) -> None:
    with tubeway.queue(addresses.new(), "server") as q:
        child = python(CLIENT_THEN_DIE, q.url)
        peer, obj = q.get(timeout=30)
        assert obj == "hello"
        child.send_signal(signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(tubeway.ConnectionClosed) as e:
            q.get(timeout=60)
        assert e.value.peer == peer  # type: ignore[attr-defined]
        assert time.monotonic() - start < 10
        child.communicate(timeout=30)


QUEUE_SERVER = """
import sys, tubeway
q = tubeway.queue(sys.argv[1], "server")
print(q.url, flush=True)
sys.stdin.read()
"""


def test_client_get_raises_when_the_server_process_dies(addresses: Addresses) -> None:
    child = python(QUEUE_SERVER, addresses.new())
    assert child.stdout is not None
    url = child.stdout.readline().strip()
    with tubeway.queue(url, "client") as q:
        import threading

        threading.Timer(0.3, child.kill).start()
        with pytest.raises(tubeway.ConnectionClosed):
            q.get(timeout=60)
    child.communicate(timeout=30)
