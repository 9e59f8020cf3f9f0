"""tubeway.queue within one process: serializers, peers, restricted pickle,
futures, closing and peer death."""

from __future__ import annotations

import decimal
import threading
import time
from typing import Iterator, Tuple

import msgpack
import numpy as np
import pytest

import tubeway
from transports import Addresses


@pytest.fixture
def pair(addresses: Addresses) -> Iterator[Tuple[tubeway.Queue, tubeway.Queue]]:
    with tubeway.queue(addresses.new(), "server") as server:
        with tubeway.queue(server.url, "client") as client:
            assert server.wait_for_peers(1, timeout=10)
            yield server, client


def test_objects_both_ways(pair: Tuple[tubeway.Queue, tubeway.Queue]) -> None:
    server, client = pair
    assert client.peers == [0]
    [peer] = server.peers
    client.put({"a": [1, 2], "b": (3, "x")}).result(10)
    assert server.get(timeout=10) == (peer, {"a": [1, 2], "b": (3, "x")})
    server.put("reply", peer)
    assert client.get(timeout=10) == (0, "reply")


def test_bytes_like_go_through_untouched(pair: Tuple[tubeway.Queue, tubeway.Queue]) -> None:
    server, client = pair
    for data in (b"raw", bytearray(b"raw"), memoryview(b"raw"), b"", b"y" * 200_000):
        client.put(data)
        _, got = server.get(timeout=10)
        assert isinstance(got, memoryview)
        assert bytes(got) == bytes(data)


@pytest.mark.parametrize("size", [1, 1000, 100_000, 3_000_000])
def test_numpy_round_trip(pair: Tuple[tubeway.Queue, tubeway.Queue], size: int) -> None:
    server, client = pair
    array = np.random.default_rng(size).standard_normal(size)
    matrix = np.arange(size * 2, dtype=np.int32).reshape(2, size)
    client.put({"a": array, "m": matrix, "t": array[::2]}).result(10)
    _, got = server.get(timeout=10)
    assert np.array_equal(got["a"], array)
    assert np.array_equal(got["m"], matrix)
    assert np.array_equal(got["t"], array[::2])
    assert got["m"].dtype == np.int32 and got["m"].shape == (2, size)


def test_received_arrays_keep_their_memory_while_they_live(pair: Tuple[tubeway.Queue, tubeway.Queue]) -> None:
    # Large objects are read into buffers that are used again once every
    # view of an object is gone: never while one still lives.
    server, client = pair
    kept = {}
    for i in range(24):
        client.put(np.full(300_000, i, dtype=np.uint8))
        _, got = server.get(timeout=10)
        assert got.nbytes == 300_000 and int(got[0]) == i and int(got[-1]) == i
        if i % 3 == 0:
            kept[i] = got  # alive across later receives
        elif i % 3 == 1:
            kept[i] = got[1000:2000]  # a slice keeps the whole buffer alive
        del got
    for i, view in kept.items():
        assert np.all(view == i), f"array {i} was overwritten"


def test_large_put_resolves_after_sending_without_copying(pair: Tuple[tubeway.Queue, tubeway.Queue]) -> None:
    server, client = pair
    data = bytearray(8 << 20)
    future = client.put(data)
    # Until the future resolves the buffer is exported (sent from its own memory).
    _, got = server.get(timeout=10)
    assert len(got) == len(data)
    assert future.result(timeout=10) is None
    deadline = time.monotonic() + 5
    while True:
        try:
            data.append(0)  # the buffer was released
            break
        except BufferError:
            assert time.monotonic() < deadline
            time.sleep(0.01)


def test_small_put_is_done_at_once(pair: Tuple[tubeway.Queue, tubeway.Queue]) -> None:
    _, client = pair
    assert client.put(b"tiny").done()


@pytest.mark.parametrize("serializer", ["json", "msgpack", "pickle"])
def test_serializers(addresses: Addresses, serializer: str) -> None:
    value = {"k": [1, 2, "three"], "n": None}
    with tubeway.queue(addresses.new(), "server", serializer=serializer) as s:
        with tubeway.queue(s.url, "client", serializer=serializer) as c:
            c.put(value)
            assert s.get(timeout=10)[1] == value


def test_receiver_reads_what_the_sender_chose(addresses: Addresses) -> None:
    with tubeway.queue(addresses.new(), "server", serializer="json") as s:
        with tubeway.queue(s.url, "client", serializer="msgpack") as c:
            c.put([1, 2])
            assert s.get(timeout=10)[1] == [1, 2]


def test_serialization_errors(pair: Tuple[tubeway.Queue, tubeway.Queue], addresses: Addresses) -> None:
    _, client = pair
    with pytest.raises(tubeway.SerializationError):
        client.put(lambda: None)
    with tubeway.queue(addresses.new(), "server", serializer="json") as s:
        with pytest.raises(tubeway.SerializationError):
            s.put(object())
    with pytest.raises(ValueError):
        tubeway.queue(addresses.new(), "server", serializer="yaml")
    with pytest.raises(ValueError):
        tubeway.queue(addresses.new(), "boss")


class Forbidden:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        import os

        return (os.system, ("echo should-never-run",))


def test_restricted_pickle_refuses_a_forbidden_type(addresses: Addresses) -> None:
    with tubeway.queue(addresses.new(), "server", allow=[np.ndarray]) as s:
        with tubeway.queue(s.url, "client") as c:
            c.put({"array": np.arange(5), "set": {1, 2}})
            _, ok = s.get(timeout=10)
            assert np.array_equal(ok["array"], np.arange(5)) and ok["set"] == {1, 2}
            c.put(Forbidden())
            with pytest.raises(tubeway.SerializationError, match="not in the allow-list"):
                s.get(timeout=10)
            c.put(decimal.Decimal("1.5"))
            with pytest.raises(tubeway.SerializationError):
                s.get(timeout=10)
            # The queue still works after a refusal.
            c.put([1])
            assert s.get(timeout=10)[1] == [1]


def test_pickle_allowing() -> None:
    allowed = tubeway.pickle_allowing(np.ndarray, "collections.OrderedDict")
    assert "numpy.ndarray" in allowed and "collections.OrderedDict" in allowed
    assert "numpy._core.numeric._frombuffer" in allowed
    assert "os.system" not in allowed


def test_several_clients_and_addressed_puts(addresses: Addresses) -> None:
    with tubeway.queue(addresses.new(), "server") as s:
        clients = [tubeway.queue(s.url, "client") for _ in range(3)]
        try:
            assert s.wait_for_peers(3, timeout=10)
            for i, c in enumerate(clients):
                c.put(i)
            senders = dict((obj, peer) for peer, obj in (s.get(timeout=10) for _ in range(3)))
            assert sorted(senders) == [0, 1, 2]
            # Addressed: only that peer gets it.
            s.put("only you", senders[1])
            assert clients[1].get(timeout=10) == (0, "only you")
            with pytest.raises(tubeway.Timeout):
                clients[0].get(timeout=0.2)
            # Unaddressed: every peer gets it.
            s.put("everyone")
            for c in clients:
                assert c.get(timeout=10)[1] == "everyone"
            with pytest.raises(tubeway.ConnectionClosed):
                s.put("nobody", 999)
        finally:
            for c in clients:
                c.close()


def test_get_timeout(pair: Tuple[tubeway.Queue, tubeway.Queue]) -> None:
    server, _ = pair
    start = time.monotonic()
    with pytest.raises(tubeway.Timeout):
        server.get(timeout=0.3)
    assert 0.25 < time.monotonic() - start < 5


def test_peer_leaving_is_reported_not_waited_for(addresses: Addresses) -> None:
    with tubeway.queue(addresses.new(), "server") as s:
        c = tubeway.queue(s.url, "client")
        assert s.wait_for_peers(1, timeout=10)
        [peer] = s.peers
        c.put("last words")
        c.close()
        assert s.get(timeout=10) == (peer, "last words")
        with pytest.raises(tubeway.ConnectionClosed) as e:
            s.get(timeout=10)
        assert e.value.peer == peer  # type: ignore[attr-defined]
        assert s.peers == []
        with pytest.raises(tubeway.ConnectionClosed):
            s.put("to no one")


def test_client_whose_server_is_gone(addresses: Addresses) -> None:
    s = tubeway.queue(addresses.new(), "server")
    c = tubeway.queue(s.url, "client")
    assert s.wait_for_peers(1, timeout=10)
    s.close()
    with pytest.raises(tubeway.ConnectionClosed):
        c.get(timeout=10)
    # And at once afterwards, without waiting for the timeout.
    start = time.monotonic()
    with pytest.raises(tubeway.ConnectionClosed):
        c.get(timeout=30)
    assert time.monotonic() - start < 5
    c.close()


def test_get_after_close_raises(pair: Tuple[tubeway.Queue, tubeway.Queue]) -> None:
    server, client = pair
    client.close()
    with pytest.raises(tubeway.ConnectionClosed):
        client.get(timeout=1)
    with pytest.raises(tubeway.ConnectionClosed):
        client.put("x")


def test_client_waits_for_a_late_server(addresses: Addresses) -> None:
    url = addresses.new()
    if url.startswith("tcp"):
        pytest.skip("a tcp server picks its port when it starts")
    found = []
    t = threading.Thread(target=lambda: found.append(tubeway.queue(url, "client", timeout=10)))
    t.start()
    time.sleep(0.2)  # the client is retrying meanwhile; nothing to wait on
    with tubeway.queue(url, "server") as s:
        t.join(10)
        assert found, "the client never connected"
        found[0].put("hello")
        assert s.get(timeout=10)[1] == "hello"
        found[0].close()


def test_connect_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(tubeway.ConnectError):
        tubeway.queue("tcp://127.0.0.1:1", "client", timeout=0.3)
    assert time.monotonic() - start < 5


def test_msgpack_is_only_needed_when_used() -> None:
    assert msgpack.packb([1]) == b"\x91\x01"


def test_repr(pair: Tuple[tubeway.Queue, tubeway.Queue]) -> None:
    server, client = pair
    assert "server" in repr(server) and "client" in repr(client)


def test_concurrent_gets_each_keep_their_timeout(pair: Tuple[tubeway.Queue, tubeway.Queue]) -> None:
    server, client = pair
    outcome = []

    def long_get() -> None:
        outcome.append(server.get(timeout=30))

    t = threading.Thread(target=long_get)
    t.start()
    start = time.monotonic()
    with pytest.raises(tubeway.Timeout):
        server.get(timeout=0.3)
    assert time.monotonic() - start < 5
    client.put("for the long one")
    t.join(10)
    assert outcome and outcome[0][1] == "for the long one"


def test_handlers_do_not_hold_the_io_threads(addresses: Addresses) -> None:
    # A Python thread holding the GIL for long must not stop the queue's I/O:
    # objects keep arriving in the inbox meanwhile.
    with tubeway.queue(addresses.new(), "server") as s, tubeway.queue(s.url, "client") as c:
        for i in range(100):
            c.put(i)
        end = time.monotonic() + 0.3
        while time.monotonic() < end:  # busy in Python, holding the GIL
            pass
        got = [s.get(timeout=0)[1] for _ in range(100)]
        assert got == list(range(100))


def test_latency_mode(addresses: Addresses) -> None:
    with tubeway.queue(addresses.new(), "server", wait="spin-park:20us") as s:
        with tubeway.queue(s.url, "client", wait="spin-park:20us") as c:
            for i in range(20):
                c.put(i)
                peer, got = s.get(timeout=10)
                assert got == i
                s.put(i, peer)
                assert c.get(timeout=10) == (0, i)
    for never_sleeps in ("busy-spin", "spin-yield:10us"):
        with pytest.raises(ValueError, match="never sleeps"):
            tubeway.queue(addresses.new(), "server", wait=never_sleeps)
    with pytest.raises(ValueError):
        tubeway.queue(addresses.new(), "server", wait="nap")


def test_latency_mode_with_a_second_peer_joining(addresses: Addresses) -> None:
    # get() reads inline while there is one peer, and from the read-ahead
    # tasks once there are two; nothing is lost or reordered in the switch.
    with tubeway.queue(addresses.new(), "server", wait="spin-park:20us") as s:
        first = tubeway.queue(s.url, "client")
        assert s.wait_for_peers(1, timeout=10)
        for i in range(5):
            first.put(i)
        assert [s.get(timeout=10)[1] for _ in range(3)] == [0, 1, 2]
        second = tubeway.queue(s.url, "client")
        assert s.wait_for_peers(2, timeout=10)
        second.put("b")
        got = sorted((str(s.get(timeout=10)[1]) for _ in range(3)))
        assert got == ["3", "4", "b"]
        first.close()
        second.close()
