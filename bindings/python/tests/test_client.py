"""tubeway.Client: every operation, over every transport."""

from __future__ import annotations

import concurrent.futures as cf
import sys
import threading
import time
from typing import Callable

import numpy as np
import pytest

import tubeway
from tubeway import Message


def echo(m: Message) -> Message:
    return m


def test_send_and_reply(server: tubeway.Server, client: tubeway.Client) -> None:
    server.create_function("echo", echo)
    reply = client.send("echo", Message.plain_text("hi", request_id="r"))
    assert reply.text == "hi"
    assert reply.type == "response"
    assert reply.response_status == "ok"
    assert reply.request_id == "r"
    # Plain values become messages: str text, bytes binary, others data.
    assert client.send("echo", "text").text == "text"
    assert bytes(client.send("echo", b"\x00bin").binary) == b"\x00bin"
    assert client.send("echo", {"n": [1, 2]}).data == {"n": [1, 2]}


def test_send_async(server: tubeway.Server, client: tubeway.Client) -> None:
    server.create_function("echo", echo)
    futures = [client.send_async("echo", str(i)) for i in range(50)]
    assert [f.result(timeout=10).text for f in futures] == [str(i) for i in range(50)]
    bad = client.send_async("nope", "x")
    with pytest.raises(tubeway.NotFound):
        bad.result(timeout=10)


def held_call(
    server: tubeway.Server, client: tubeway.Client, function: str = "held", text: str = "late"
) -> tuple[threading.Event, "cf.Future[Message]"]:
    """A call of a new function that answers with the text once the event is set."""
    release = threading.Event()
    server.create_function(function, lambda m: release.wait(10) and m.text)
    return release, client.send_async(function, text)


def test_a_send_async_reply_waited_for_in_result(server: tubeway.Server, client: tubeway.Client) -> None:
    # A reply that comes while result() waits resolves the future once:
    # result(), exception() and the callback all see it.
    release, future = held_call(server, client)
    assert isinstance(future, cf.Future)
    called: list[str] = []
    future.add_done_callback(lambda f: called.append(f.result().text))
    threading.Timer(0.2, release.set).start()
    assert future.result(timeout=10).text == "late"
    assert future.exception(timeout=0) is None
    assert called == ["late"]
    # Every thread waiting in result() gets the reply.
    release2, second = held_call(server, client, "held2", "both")
    got: list[str] = []
    waiters = [threading.Thread(target=lambda: got.append(second.result(10).text)) for _ in range(3)]
    for w in waiters:
        w.start()
    release2.set()
    for w in waiters:
        w.join(10)
    assert got == ["both"] * 3


def test_a_send_async_result_that_times_out_loses_no_reply(server: tubeway.Server, client: tubeway.Client) -> None:
    release, future = held_call(server, client)
    start = time.monotonic()
    with pytest.raises(cf.TimeoutError):
        future.result(timeout=0.2)
    assert 0.15 < time.monotonic() - start < 5
    with pytest.raises(cf.TimeoutError):
        future.exception(timeout=0)
    # The reply comes with nobody waiting: it still resolves the future.
    done = threading.Event()
    future.add_done_callback(lambda f: done.set())
    release.set()
    assert done.wait(10)
    assert future.result(timeout=0).text == "late"


def test_cancelling_a_send_async_future_ends_its_waiters(server: tubeway.Server, client: tubeway.Client) -> None:
    release, future = held_call(server, client)
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            future.result(timeout=10)
        except BaseException as e:  # noqa: BLE001  (recorded for the test)
            raised.append(e)

    waiter = threading.Thread(target=wait)
    waiter.start()
    # Most likely inside result() by then; either way it must raise at once.
    time.sleep(0.1)
    start = time.monotonic()
    assert future.cancel()
    waiter.join(5)
    assert time.monotonic() - start < 5
    assert len(raised) == 1 and isinstance(raised[0], cf.CancelledError), raised
    release.set()
    # The reply that comes later finds the future cancelled, and leaves it so.
    assert client.send("held", "after", timeout=10).text == "after"
    assert future.cancelled()


def test_send_oneway(server: tubeway.Server, client: tubeway.Client) -> None:
    got = threading.Event()
    server.create_function("sink", lambda m: got.set())
    client.send_oneway("sink", "x")
    assert got.wait(10)


def test_send_timeout(server: tubeway.Server, client: tubeway.Client) -> None:
    release = threading.Event()
    server.create_function("slow", lambda m: release.wait(10))
    start = time.monotonic()
    with pytest.raises(tubeway.Timeout) as e:
        client.send("slow", "x", timeout=0.3)
    assert 0.25 < time.monotonic() - start < 5
    assert e.value.status == "timeout"
    release.set()


def test_unknown_function(client: tubeway.Client) -> None:
    with pytest.raises(tubeway.NotFound) as e:
        client.send("missing", "x")
    assert e.value.status == "function_not_found"
    assert isinstance(e.value, tubeway.Error)


def test_handler_error_keeps_serving(server: tubeway.Server, client: tubeway.Client) -> None:
    def handler(m: Message) -> str:
        if m.text == "boom":
            raise ValueError("the input was boom")
        return "fine"

    server.create_function("f", handler)
    with pytest.raises(tubeway.HandlerError) as e:
        client.send("f", "boom")
    assert "the input was boom" in str(e.value)
    assert e.value.status == "handler_error"
    assert client.send("f", "ok").text == "fine"


def test_queues(client: tubeway.Client) -> None:
    status = client.create_queue("jobs", capacity=2)
    assert status["name"] == "jobs" and status["capacity"] == 2 and status["kind"] == "bounded"
    assert client.exists_queue("jobs")
    assert not client.exists_queue("other")
    client.offer("jobs", Message.data({"job": 1}))
    client.offer("jobs", "job 2")
    with pytest.raises(tubeway.QueueFull) as full:
        client.offer("jobs", "job 3", timeout=0.1)
    assert full.value.status == "queue_full"
    assert client.queue_status("jobs")["size"] == 2
    assert client.poll("jobs").data == {"job": 1}
    assert client.poll("jobs", timeout=1.0).text == "job 2"
    start = time.monotonic()
    with pytest.raises(tubeway.QueueEmpty):
        client.poll("jobs", timeout=0.3)
    assert time.monotonic() - start >= 0.25
    assert [q["name"] for q in client.list_queues()] == ["jobs"]
    client.remove_queue("jobs")
    with pytest.raises(tubeway.NotFound):
        client.poll("jobs")
    with pytest.raises(tubeway.NotFound):
        client.queue_status("jobs")


def test_circular_queue_and_conflict(client: tubeway.Client) -> None:
    client.create_queue("ring", capacity=2, kind="circular")
    for i in range(3):
        client.offer("ring", str(i))
    assert [client.poll("ring").text for _ in range(2)] == ["1", "2"]
    with pytest.raises(tubeway.Conflict):
        client.create_queue("ring", capacity=5)
    with pytest.raises(ValueError):
        client.create_queue("x", kind="sideways")


def test_poll_waits_for_an_offer(server: tubeway.Server, client: tubeway.Client) -> None:
    client.create_queue("q")
    with tubeway.Client(server.url) as other:
        t = threading.Timer(0.2, lambda: other.offer("q", "late"))
        t.start()
        assert client.poll("q", timeout=10).text == "late"
        t.join()


def test_temporary_queue(server: tubeway.Server) -> None:
    with tubeway.Client(server.url) as a, tubeway.Client(server.url) as b:
        name = a.create_temporary_queue(capacity=5)["name"]
        assert b.exists_queue(name)
        a.close()
        deadline = time.monotonic() + 10
        while b.exists_queue(name):
            assert time.monotonic() < deadline
            time.sleep(0.02)


def test_topics(client: tubeway.Client) -> None:
    assert client.create_topic("news")["name"] == "news"
    got = []
    done = threading.Event()

    def on(m: Message) -> None:
        got.append(m.text)
        if len(got) == 3:
            done.set()

    sub = client.subscribe("news", on)
    assert sub.topic == "news"
    for i in range(3):
        client.publish("news", str(i))
    assert done.wait(10)
    assert got == ["0", "1", "2"]
    status = client.topic_status("news")
    assert status["subscribers"] == 1 and status["published"] == 3
    client.unsubscribe(sub)
    assert client.topic_status("news")["subscribers"] == 0
    assert [t["name"] for t in client.list_topics()] == ["news"]
    client.remove_topic("news")
    with pytest.raises(tubeway.NotFound):
        client.publish("news", "x")


def test_pull_subscription(client: tubeway.Client) -> None:
    client.create_topic("t")
    with client.subscribe("t") as sub:
        client.publish_oneway("t", "a")
        client.publish("t", "b")
        assert sub.recv(timeout=10).text == "a"
        assert sub.recv(timeout=10).text == "b"
        with pytest.raises(tubeway.Timeout):
            sub.recv(timeout=0.1)
        client.remove_topic("t")
        with pytest.raises(tubeway.ConnectionClosed):
            sub.recv(timeout=10)
    assert list(sub) == []


def test_subscriber_exception_does_not_stop_deliveries(
    client: tubeway.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_value))
    client.create_topic("t")
    got = []
    done = threading.Event()

    def on(m: Message) -> None:
        got.append(m.text)
        if m.text == "bad":
            raise RuntimeError("subscriber failed")
        done.set()

    with client.subscribe("t", on):
        client.publish("t", "bad")
        client.publish("t", "good")
        assert done.wait(10)
    assert got == ["bad", "good"]
    assert [str(e) for e in reported] == ["subscriber failed"]


def test_serve_a_function_from_a_client(server: tubeway.Server, client: tubeway.Client) -> None:
    with tubeway.Client(server.url) as worker_client:
        worker = worker_client.serve("upper", lambda m: m.text.upper())
        assert worker.function == "upper"
        assert client.send("upper", "abc").text == "ABC"
        assert client.function_status("upper")["workers"] == 1
        assert "upper" in [f["name"] for f in client.list_functions()]
        worker.stop()
        with pytest.raises(tubeway.NotFound):
            client.send("upper", "abc")


def test_worker_may_call_other_functions(server: tubeway.Server, client: tubeway.Client) -> None:
    server.create_function("echo", echo)
    with tubeway.Client(server.url) as wc:
        with wc.serve("twice", lambda m: wc.send("echo", m.text * 2).text):
            assert client.send("twice", "ab").text == "abab"


def test_handler_thread_locals_last_between_calls(server: tubeway.Server, client: tubeway.Client) -> None:
    # Handlers run on threads Python did not start; each keeps its Python
    # thread state, so per-thread data (a cache, a connection) outlives a
    # call as it does on a Python thread.
    local = threading.local()

    def count(_: Message) -> int:
        local.calls = getattr(local, "calls", 0) + 1
        return local.calls

    server.create_function("count-here", count)
    with tubeway.Client(server.url) as wc:
        with wc.serve("count-there", count):
            for function in ("count-here", "count-there"):
                seen = [client.send(function, None).data for _ in range(20)]
                assert max(seen) > 1, (function, seen)


def test_a_worker_refuses_calls_beyond_max_blocking_calls(server: tubeway.Server, client: tubeway.Client) -> None:
    started = threading.Event()
    release = threading.Event()

    def held(m: Message) -> str:
        started.set()
        release.wait(10)
        return m.text

    # Declared to the broker as more than it runs: calls reach it.
    with tubeway.Client(server.url, max_blocking_calls=1, max_worker_calls=2) as wc:
        with wc.serve("held", held):
            first = client.send_async("held", "a")
            assert started.wait(10)
            with pytest.raises(tubeway.Unavailable):
                client.send("held", "b")
            release.set()
            assert first.result(10).text == "a"
            assert client.send("held", "c").text == "c"


def test_handler_spin_is_checked_and_one_thread_serves_calls_in_turn(server: tubeway.Server, client: tubeway.Client) -> None:
    with pytest.raises(ValueError, match="handler_spin"):
        tubeway.Client(server.url, handler_spin=-1.0)
    with tubeway.Client(server.url, handler_spin=1.0) as wc:
        with wc.serve("where", lambda m: str(threading.get_ident())):
            threads = {client.send("where", None).text for _ in range(5)}
    # Calls one after another: each is taken by the thread that answered
    # the one before.
    assert len(threads) == 1, threads


def held_handler() -> tuple[list[str], threading.Event, Callable[[Message], str]]:
    """A handler that notes each call's text, then waits for the event
    before it answers with the text."""
    started: list[str] = []
    release = threading.Event()

    def held(m: Message) -> str:
        started.append(m.text)
        release.wait(10)
        return m.text

    return started, release, held


def test_calls_beyond_max_blocking_calls_wait_at_the_broker(server: tubeway.Server, client: tubeway.Client) -> None:
    started, release, held = held_handler()
    with tubeway.Client(server.url, max_blocking_calls=1) as wc:
        with wc.serve("held", held):
            first = client.send_async("held", "a")
            second = client.send_async("held", "b")
            deadline = time.monotonic() + 10
            # One call runs, the other waits at the broker.
            while not (started and client.function_status("held")["waiting"] == 1):
                assert time.monotonic() < deadline, (started, client.function_status("held"))
                time.sleep(0.01)
            assert len(started) == 1
            release.set()
            assert sorted([first.result(10).text, second.result(10).text]) == ["a", "b"]


def test_oneway_calls_beyond_max_blocking_calls_wait_and_all_run(server: tubeway.Server, client: tubeway.Client) -> None:
    ran, release, held = held_handler()
    with tubeway.Client(server.url, max_blocking_calls=1) as wc:
        with wc.serve("fire", held):
            for text in "abcd":
                client.send_oneway("fire", text)
            deadline = time.monotonic() + 10
            # One runs; the others wait at the broker instead of reaching a
            # worker that could only drop them.
            while not (ran and client.function_status("fire")["waiting"] == 3):
                assert time.monotonic() < deadline, (ran, client.function_status("fire"))
                time.sleep(0.01)
            release.set()
            while len(ran) < 4 or client.function_status("fire")["calls"] < 4:
                assert time.monotonic() < deadline, (ran, client.function_status("fire"))
                time.sleep(0.01)
            assert sorted(ran) == ["a", "b", "c", "d"]


def test_remove_function(server: tubeway.Server, client: tubeway.Client) -> None:
    server.create_function("echo", echo)
    client.remove_function("echo")
    with pytest.raises(tubeway.NotFound):
        client.send("echo", "x")


def test_stats_and_ping(client: tubeway.Client) -> None:
    client.create_queue("q")
    stats = client.stats()
    assert stats["connections"] >= 1
    assert [q["name"] for q in stats["queues"]] == ["q"]
    assert 0 <= client.ping() < 5


def test_large_binary_round_trip(server: tubeway.Server, client: tubeway.Client) -> None:
    server.create_function("echo", echo)
    data = np.random.default_rng(1).integers(0, 255, size=5 << 20, dtype=np.uint8)
    reply = client.send("echo", Message.binary(data))
    assert np.array_equal(np.frombuffer(reply.binary, dtype=np.uint8), data)


def test_too_large_is_refused_locally(server: tubeway.Server, client: tubeway.Client) -> None:
    server.create_function("echo", echo)
    too_big = b"x" * (client.max_message_size + 1)
    with pytest.raises(tubeway.TooLarge):
        client.send("echo", too_big)
    assert client.send("echo", "still fine").text == "still fine"


def test_closed_client_raises(server: tubeway.Server) -> None:
    c = tubeway.Client(server.url)
    assert not c.closed
    c.close()
    c.close()
    assert c.closed
    with pytest.raises(tubeway.ConnectionClosed, match="closed"):
        c.send("echo", "x")
    with pytest.raises(tubeway.ConnectionClosed):
        c.stats()


def test_wait_strategies(server: tubeway.Server) -> None:
    server.create_function("echo", echo)
    for wait in ("default", "park", "spin-park:20us"):
        with tubeway.Client(server.url, wait=wait) as c:
            assert c.send("echo", wait).text == wait
    # Nothing that never sleeps: a wait must not hold a core for its length.
    for wait in ("busy-spin", "spin-yield", "sometimes"):
        with pytest.raises(ValueError):
            tubeway.Client(server.url, wait=wait)


def test_connect_failure() -> None:
    with pytest.raises(tubeway.ConnectError):
        tubeway.Client("tcp://127.0.0.1:1", connect_timeout=2.0)
    with pytest.raises(ValueError):
        tubeway.Client("udp://x:1")


def test_context_manager_closes(server: tubeway.Server) -> None:
    with tubeway.Client(server.url) as c:
        assert "Client" in repr(c)
    assert c.closed
