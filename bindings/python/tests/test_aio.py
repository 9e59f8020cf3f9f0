"""tubeway.aio: the asyncio mirror, without blocking the event loop."""

from __future__ import annotations

import asyncio
import select
import threading
import time
from typing import Any, List

import numpy as np
import pytest

import tubeway
import tubeway.aio
from transports import Addresses


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


def test_client_operations(server: tubeway.Server) -> None:
    server.create_function("echo", lambda m: m)

    async def main() -> None:
        async with tubeway.aio.Client(server.url, timeout=10) as c:
            assert (await c.send("echo", "hi")).text == "hi"
            replies = await asyncio.gather(*(c.send("echo", str(i)) for i in range(20)))
            assert [r.text for r in replies] == [str(i) for i in range(20)]
            assert (await c.send_async("echo", "x")).text == "x"
            await c.create_queue("q", capacity=10)
            assert await c.exists_queue("q")
            await c.offer("q", tubeway.Message.data([1]))
            assert (await c.queue_status("q"))["size"] == 1
            assert (await c.poll("q", timeout=5)).data == [1]
            with pytest.raises(tubeway.QueueEmpty):
                await c.poll("q", timeout=0.1)
            assert [q["name"] for q in await c.list_queues()] == ["q"]
            await c.remove_queue("q")
            tmp = await c.create_temporary_queue()
            assert tmp["temporary"]
            await c.send_oneway("echo", "x")
            assert (await c.stats())["connections"] >= 1
            assert await c.ping() >= 0
            with pytest.raises(tubeway.NotFound):
                await c.send("missing", "x")
        assert c.closed

    run(main())


def test_replies_come_back_to_the_loop(server: tubeway.Server) -> None:
    """``send`` resolves its future on the loop, straight from the reader:
    many calls at once each get their own reply, an error reply raises, a
    cancelled call leaves the others alone, and a closed client's loop stops
    watching the inbox once its calls are over."""
    release = threading.Event()
    server.create_function("echo", lambda m: m)
    server.create_function("held", lambda m: (release.wait(10), m)[1])

    async def main() -> None:
        loop = asyncio.get_running_loop()
        c = await tubeway.aio.connect(server.url, timeout=10)
        texts = [f"m{i}" for i in range(500)]
        replies = await asyncio.gather(*(c.send("echo", t) for t in texts))
        assert [r.text for r in replies] == texts
        inbox = c._inbox
        assert inbox is not None and inbox.resolved == len(texts)
        with pytest.raises(tubeway.NotFound):
            await c.send("missing", "x")
        held = c.send_async("held", "late")
        cancelled = asyncio.ensure_future(c.send("held", "gone"))
        await asyncio.sleep(0.05)
        cancelled.cancel()
        release.set()
        assert (await held).text == "late"
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert (await c.send("echo", "after")).text == "after"
        # A call in flight when the client closes ends with the connection.
        release.clear()
        stuck = c.send_async("held", "stuck")
        await asyncio.sleep(0.05)
        await c.close()
        with pytest.raises(tubeway.ConnectionClosed):
            await stuck
        release.set()
        await asyncio.sleep(0)
        assert not loop.remove_reader(inbox.fileno()), "the loop still watches the inbox"

    run(main())


def test_an_unclosed_client_lets_go_of_the_loop(server: tubeway.Server) -> None:
    """A client dropped without ``close`` stops the loop watching its inbox."""
    server.create_function("echo", lambda m: m)

    async def main() -> None:
        import gc

        loop = asyncio.get_running_loop()
        c = await tubeway.aio.connect(server.url, timeout=10)
        assert (await c.send("echo", "x")).text == "x"
        inbox = c._inbox
        assert inbox is not None
        del c
        gc.collect()
        # The finalizer ran on this loop's thread: at once.
        assert not loop.remove_reader(inbox.fileno()), "the loop still watches the inbox"

    run(main())


def test_offer_and_publish_come_back_to_the_loop(server: tubeway.Server) -> None:
    async def main() -> None:
        async with tubeway.aio.Client(server.url, timeout=10) as c:
            await c.create_queue("q", capacity=1)
            await c.create_topic("t")
            inbox = c._inbox_here()
            before = inbox.resolved
            await c.offer("q", "one")
            with pytest.raises(tubeway.QueueFull):
                await c.offer("q", "two", timeout=0.05)
            with pytest.raises(tubeway.NotFound):
                await c.offer("missing", "x")
            await c.publish("t", "news")
            with pytest.raises(tubeway.NotFound):
                await c.publish("missing", "x")
            assert inbox.resolved == before + 5
            assert (await c.poll("q", timeout=5)).text == "one"
            # Oneway messages are written at once, with nothing to resolve.
            await c.publish_oneway("t", "a")
            await c.send_oneway("missing", "b")
            assert inbox.resolved == before + 6
        # Nothing left in flight: the loop lets go of the inbox at close.
        assert not asyncio.get_running_loop().remove_reader(inbox.fileno())

    run(main())


def test_a_cancelled_poll_loses_no_message(server: tubeway.Server) -> None:
    """A poll cancelled while it waits at the broker is withdrawn there, so
    the next message goes to the next poll; one cancelled with its message
    already on its way back to the loop returns the message to the queue."""

    async def main() -> None:
        async with tubeway.aio.Client(server.url, timeout=10) as c:
            await c.create_queue("q")
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(c.poll("q", timeout=5), 0.2)
            await c.offer("q", "first")
            assert (await c.poll("q", timeout=5)).text == "first"

            await c.offer("q", "second")
            task = asyncio.ensure_future(c.poll("q", timeout=5))
            await asyncio.sleep(0)  # the task writes its poll
            inbox = c._inbox
            assert inbox is not None
            # The loop held up until the message is in its inbox, then the
            # poll cancelled before the loop resolves its future.
            readable, _, _ = select.select([inbox.fileno()], [], [], 5)
            assert readable, "no reply came"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert (await c.poll("q", timeout=5)).text == "second"
            assert (await c.queue_status("q"))["size"] == 0

    run(main())


def test_a_cancelled_offer_is_not_queued_later(server: tubeway.Server) -> None:
    """An offer cancelled while it waits for room is withdrawn at the broker:
    room made later does not take it."""

    async def main() -> None:
        async with tubeway.aio.Client(server.url, timeout=10) as c:
            await c.create_queue("full", capacity=1)
            await c.offer("full", "first")
            inbox = c._inbox
            assert inbox is not None
            before = inbox.resolved
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(c.offer("full", "cancelled", timeout=20), 0.2)
            # The client gives the offer up (its withdrawal written) before
            # it posts the outcome nobody waits for any more.
            deadline = time.monotonic() + 5
            while inbox.resolved == before:
                assert time.monotonic() < deadline, "the offer was not given up"
                await asyncio.sleep(0.001)
            assert (await c.poll("full", timeout=5)).text == "first"
            # The room made by that poll would have let the offer in by now.
            with pytest.raises(tubeway.QueueEmpty):
                await c.poll("full", timeout=1)

    run(main())


def test_a_client_used_on_another_loop_still_works(server: tubeway.Server) -> None:
    server.create_function("echo", lambda m: m)

    async def connect() -> tubeway.aio.Client:
        return await tubeway.aio.connect(server.url, timeout=10)

    c = run(connect())

    async def use() -> None:
        assert (await c.send("echo", "elsewhere")).text == "elsewhere"
        await c.close()

    run(use())


def test_waiting_does_not_block_the_loop(server: tubeway.Server) -> None:
    async def main() -> int:
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        async with tubeway.aio.Client(server.url) as c:
            await c.create_queue("q")
            t = asyncio.create_task(ticker())
            with pytest.raises(tubeway.QueueEmpty):
                await c.poll("q", timeout=0.5)
            stop.set()
            await t
        return ticks

    assert run(main()) >= 10


def test_subscribe_and_serve_run_on_the_loop(server: tubeway.Server) -> None:
    async def main() -> None:
        loop_thread = threading.get_ident()
        async with tubeway.aio.Client(server.url) as c:
            await c.create_topic("t")
            got: "asyncio.Queue[str]" = asyncio.Queue()

            async def on(m: tubeway.Message) -> None:
                assert threading.get_ident() == loop_thread
                await got.put(m.text)

            sub = await c.subscribe("t", on)
            await c.publish("t", "a")
            await c.publish_oneway("t", "b")
            assert [await got.get(), await got.get()] == ["a", "b"]
            await c.unsubscribe(sub)

            async def handler(m: tubeway.Message) -> str:
                assert threading.get_ident() == loop_thread
                await asyncio.sleep(0)
                return m.text[::-1]

            async with tubeway.aio.Client(server.url) as caller:
                worker = await c.serve("rev", handler)
                assert (await caller.send("rev", "abc")).text == "cba"
                assert (await caller.function_status("rev"))["workers"] == 1
                worker.stop()

    run(main())


def test_deliveries_reach_the_callback_one_at_a_time_in_order(server: tubeway.Server) -> None:
    """Plain and coroutine callbacks alike: a coroutine is awaited before the
    next delivery, and a callback that raises is reported to the loop's
    exception handler while the next delivery still runs."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        errors: List[BaseException] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context["exception"]))
        async with tubeway.aio.Client(server.url) as c:
            await c.create_topic("ordered")
            got: List[str] = []
            running = 0
            done = asyncio.Event()

            async def slow(m: tubeway.Message) -> None:
                nonlocal running
                running += 1
                assert running == 1, "two deliveries at once"
                await asyncio.sleep(0.001 if int(m.text) % 7 == 0 else 0)
                got.append(m.text)
                running -= 1
                if m.text == "99":
                    done.set()

            def on(m: tubeway.Message) -> Any:
                if m.text == "13":
                    raise ValueError("thirteen")
                if int(m.text) % 2:
                    return slow(m)
                assert running == 0, "a delivery overtook a coroutine"
                got.append(m.text)
                return None

            sub = await c.subscribe("ordered", on)
            for i in range(100):
                await c.publish_oneway("ordered", str(i))
            await asyncio.wait_for(done.wait(), 10)
            assert got == [str(i) for i in range(100) if i != 13]
            assert [str(e) for e in errors] == ["thirteen"]
            await c.unsubscribe(sub)

    run(main())


def test_a_slow_loop_slows_its_subscription_instead_of_queueing(addresses: Addresses) -> None:
    """At most ``buffer`` deliveries wait for the loop: a callback that stops
    leaves the rest to the broker, which drops and counts them."""
    n = 500
    with tubeway.Server([addresses.new()], subscriber_buffer=8) as server:

        async def main() -> None:
            async with tubeway.aio.Client(server.url) as c, tubeway.aio.Client(server.url) as publisher:
                await c.create_topic("slow")
                release = asyncio.Event()
                got: List[int] = []

                async def on(m: tubeway.Message) -> None:
                    await release.wait()
                    got.append(int.from_bytes(m.binary[:4], "big"))

                sub = await c.subscribe("slow", on, buffer=4)
                for i in range(n):
                    await publisher.publish("slow", tubeway.Message.binary(i.to_bytes(4, "big") * (16 << 10)))
                status = await publisher.topic_status("slow")
                assert status["published"] == n
                assert status["dropped"] > 0, status
                release.set()
                deadline = time.monotonic() + 10
                while len(got) < n - status["dropped"]:
                    assert time.monotonic() < deadline, (len(got), status)
                    await asyncio.sleep(0.01)
                assert got == sorted(got)
                assert len(got) == n - status["dropped"]
                await c.unsubscribe(sub)

        run(main())


def test_max_worker_calls_holds_calls_at_the_broker(server: tubeway.Server) -> None:
    """A worker that takes one call at a time gets the next once it has
    answered; meanwhile the broker holds it."""

    async def main() -> None:
        async with tubeway.aio.Client(server.url, max_worker_calls=1) as w, tubeway.aio.Client(
            server.url
        ) as caller:
            release = asyncio.Event()
            started: List[str] = []

            async def held(m: tubeway.Message) -> str:
                started.append(m.text)
                await release.wait()
                return m.text

            worker = await w.serve("one-at-a-time", held)
            calls = [asyncio.ensure_future(caller.send("one-at-a-time", t)) for t in "ab"]
            deadline = time.monotonic() + 10
            while not (started and (await caller.function_status("one-at-a-time"))["waiting"] == 1):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            assert len(started) == 1
            release.set()
            assert sorted(r.text for r in await asyncio.gather(*calls)) == ["a", "b"]
            worker.stop()

    run(main())


def test_functions_served_on_the_loop_answer_every_call(server: tubeway.Server) -> None:
    """Calls run on the loop, a coroutine handler's concurrently; what a
    handler returns is the reply, and what it raises (or a return value
    that makes no reply) is the caller's handler_error."""

    async def main() -> None:
        loop_thread = threading.get_ident()
        async with tubeway.aio.Client(server.url) as c, tubeway.aio.Client(server.url) as caller:
            release = asyncio.Event()
            started = 0

            async def slow(m: tubeway.Message) -> str:
                nonlocal started
                assert threading.get_ident() == loop_thread
                started += 1
                if started == 2:
                    release.set()
                await release.wait()  # both calls are in at once
                return m.text.upper()

            def plain(m: tubeway.Message) -> Any:
                assert threading.get_ident() == loop_thread
                if m.text == "boom":
                    raise ValueError("the input was boom")
                if m.text == "odd":
                    return object()
                return {"n": len(m.text)}

            slow_worker = await c.serve("slow", slow)
            plain_worker = await c.serve("plain", plain)
            a, b = await asyncio.gather(caller.send("slow", "a"), caller.send("slow", "b"))
            assert (a.text, b.text) == ("A", "B")
            assert (await caller.send("plain", "abc")).data == {"n": 3}
            with pytest.raises(tubeway.HandlerError) as e:
                await caller.send("plain", "boom")
            assert "the input was boom" in str(e.value)
            with pytest.raises(tubeway.HandlerError):
                await caller.send("plain", "odd")
            assert (await caller.send("plain", "still")).data == {"n": 5}
            slow_worker.stop()
            plain_worker.stop()

    run(main())


def test_topic_management(server: tubeway.Server) -> None:
    async def main() -> None:
        c = await tubeway.aio.connect(server.url)
        await c.create_topic("t")
        assert (await c.topic_status("t"))["subscribers"] == 0
        assert [t["name"] for t in await c.list_topics()] == ["t"]
        await c.remove_topic("t")
        server.create_function("f", lambda m: m)
        assert "f" in [f["name"] for f in await c.list_functions()]
        await c.remove_function("f")
        await c.close()
        with pytest.raises(tubeway.ConnectionClosed):
            await c.stats()

    run(main())


def test_queue(addresses: Addresses) -> None:
    async def main() -> None:
        async with await tubeway.aio.queue(addresses.new(), "server") as s:
            async with await tubeway.aio.queue(s.url, "client") as c:
                assert await s.wait_for_peers(1, timeout=10)
                array = np.arange(1 << 20)
                await c.put({"a": array})
                peer, got = await s.get(timeout=10)
                assert np.array_equal(got["a"], array)
                await s.put("back", peer)
                assert await c.get(timeout=10) == (0, "back")
                assert s.peers == [peer] and c.url == s.url

    run(main())


def test_a_cancelled_get_loses_no_object(addresses: Addresses) -> None:
    """A queue's ``get`` cancelled while it waits takes no object: the next
    ``get`` has the object put afterwards. One taken just as the ``get`` is
    cancelled is kept for the next ``get``."""

    async def main() -> None:
        async with await tubeway.aio.queue(addresses.new(), "server") as s:
            async with await tubeway.aio.queue(s.url, "client") as c:
                assert await s.wait_for_peers(1, timeout=10)
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(s.get(timeout=10), 0.2)
                await c.put("first")
                assert (await s.get(timeout=10))[1] == "first"

                # The object is there; the token was cancelled before the
                # wait could claim it: it stays for the next get.
                await c.put("second")
                token = tubeway._tubeway._GetToken()
                assert token.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await asyncio.get_running_loop().run_in_executor(
                        None, lambda: s.blocking._get(10, token)
                    )
                assert (await s.get(timeout=10))[1] == "second"

    run(main())
