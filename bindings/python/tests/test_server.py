"""tubeway.Server: the embedded broker, its limits and its shutdown."""

from __future__ import annotations

import threading
import time

import pytest

import tubeway
from tubeway import Message


def test_server_urls_and_management(tcp_server: tubeway.Server) -> None:
    assert tcp_server.url.startswith("tcp://127.0.0.1:")
    assert not tcp_server.url.endswith(":0")
    assert tcp_server.urls == [tcp_server.url]
    assert tcp_server.create_queue("q", capacity=3)["capacity"] == 3
    assert tcp_server.create_topic("t")["name"] == "t"
    with tubeway.Client(tcp_server.url) as c:
        assert c.exists_queue("q")
        got = []
        done = threading.Event()
        with c.subscribe("t", lambda m: (got.append(m.text), done.set())):
            tcp_server.publish("t", "from the server")
            assert done.wait(10)
        assert got == ["from the server"]
    tcp_server.remove_queue("q")
    tcp_server.remove_topic("t")
    assert tcp_server.stats()["queues"] == []


def test_server_calls_its_own_function(tcp_server: tubeway.Server) -> None:
    tcp_server.create_function("double", lambda m: m.data * 2)
    assert tcp_server.call("double", Message.data(21)).data == 42
    tcp_server.remove_function("double")
    with pytest.raises(tubeway.NotFound):
        tcp_server.call("double", Message.data(1))


def test_handlers_and_callbacks_may_use_a_client(tcp_server: tubeway.Server) -> None:
    """Python handlers run on threads of an async runtime, where blocking
    calls are allowed: a function of the server's, a worker's handler and
    a subscriber's callback each call through a client."""
    tcp_server.create_function("double", lambda m: m.data * 2)
    tcp_server.create_topic("t")
    with tubeway.Client(tcp_server.url) as inner, tubeway.Client(tcp_server.url) as c:
        tcp_server.create_function("quad", lambda m: inner.send("double", Message.data(m.data * 2)).data)
        assert c.send("quad", Message.data(5)).data == 20
        with c.serve("octo", lambda m: inner.send("quad", Message.data(m.data * 2)).data):
            assert c.send("octo", Message.data(1)).data == 8
        got = []
        done = threading.Event()
        with c.subscribe("t", lambda m: (got.append(inner.send("double", Message.data(m.data)).data), done.set())):
            c.publish("t", Message.data(7))
            assert done.wait(10)
        assert got == [14]


def test_slow_handler_does_not_stall_others(tcp_server: tubeway.Server) -> None:
    release = threading.Event()
    tcp_server.create_function("slow", lambda m: release.wait(10) and "slow")
    tcp_server.create_function("fast", lambda m: "fast")
    with tubeway.Client(tcp_server.url) as c:
        pending = [c.send_async("slow", "x") for _ in range(4)]
        start = time.monotonic()
        for _ in range(20):
            assert c.send("fast", "x").text == "fast"
        assert time.monotonic() - start < 5
        release.set()
        assert [f.result(10).text for f in pending] == ["slow"] * 4


def test_a_handler_that_outlasts_its_call_is_answered_timeout(tcp_server: tubeway.Server) -> None:
    release = threading.Event()
    ended = threading.Event()

    def stuck(_: Message) -> str:
        release.wait(10)
        ended.set()
        return "too late"

    tcp_server.create_function("stuck", stuck)
    tcp_server.create_function("echo", lambda m: m)
    with tubeway.Client(tcp_server.url) as c:
        start = time.monotonic()
        with pytest.raises(tubeway.Timeout):
            c.send("stuck", "x", timeout=0.2)
        assert time.monotonic() - start < 5
        assert c.send("echo", "next").text == "next"
        release.set()
        assert ended.wait(10)
        # What the handler gave late went nowhere; the call counts once, failed.
        assert c.send("echo", "after").text == "after"
        status = c.function_status("stuck")
        assert (status["calls"], status["errors"]) == (1, 1)


def test_max_message_size() -> None:
    with tubeway.Server(["tcp://127.0.0.1:0"], max_message_size=64 * 1024) as s:
        s.create_function("echo", lambda m: m)
        with tubeway.Client(s.url) as c:
            assert c.max_message_size == 64 * 1024
            with pytest.raises(tubeway.TooLarge):
                c.send("echo", b"x" * 100_000)
            assert c.send("echo", "ok").text == "ok"


def test_server_with_several_addresses(addresses) -> None:  # type: ignore[no-untyped-def]
    with tubeway.Server(["tcp://127.0.0.1:0", addresses.new()]) as s:
        assert len(s.urls) == 2
        s.create_function("echo", lambda m: m)
        for url in s.urls:
            with tubeway.Client(url) as c:
                assert c.send("echo", url).text == url


def test_shutdown_while_a_client_waits() -> None:
    s = tubeway.Server(["tcp://127.0.0.1:0"], shutdown_timeout=1.0)
    s.create_queue("q")
    c = tubeway.Client(s.url)
    errors = []

    def waiting_poll() -> None:
        try:
            c.poll("q", timeout=30)
        except tubeway.Error as e:
            errors.append(e)

    t = threading.Thread(target=waiting_poll)
    t.start()
    time.sleep(0.2)  # let the poll reach the broker; no event to wait on from here
    start = time.monotonic()
    s.close()
    t.join(10)
    assert not t.is_alive()
    assert time.monotonic() - start < 10
    assert len(errors) == 1
    assert isinstance(errors[0], (tubeway.Unavailable, tubeway.ConnectionClosed))
    with pytest.raises(tubeway.ConnectionClosed):
        c.send("anything", "x")
    c.close()
    assert s.closed
    s.close()
    with pytest.raises(tubeway.ConnectionClosed):
        s.create_queue("again")


def test_listen_failure() -> None:
    with tubeway.Server(["tcp://127.0.0.1:0"]) as s:
        with pytest.raises(tubeway.Error):
            tubeway.Server([s.url])
    with pytest.raises(ValueError):
        tubeway.Server(["nope"])


def test_connection_limit() -> None:
    with tubeway.Server(["tcp://127.0.0.1:0"], max_connections=1) as s:
        with tubeway.Client(s.url) as first:
            with pytest.raises(tubeway.ConnectError, match="unavailable"):
                tubeway.Client(s.url, connect_timeout=5.0)
            assert first.ping() >= 0
            assert s.stats()["connections_rejected"] == 1


def test_client_refuses_larger_messages_than_its_own_limit(tcp_server: tubeway.Server) -> None:
    tcp_server.create_function("big", lambda m: b"x" * 200_000)
    with tubeway.Client(tcp_server.url, max_message_size=100_000, name="small") as c:
        # The broker's answer is over this client's limit: it is skipped, and
        # the call gets no answer (it waits its timeout plus the client's
        # margin for the broker's own answer).
        with pytest.raises(tubeway.Timeout):
            c.send("big", "x", timeout=0.5)
        assert c.ping() >= 0
