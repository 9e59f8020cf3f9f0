"""Publish/subscribe with a slow subscriber: nobody else waits for it and
every drop is counted. Deliveries are 64 KiB, so that the sockets cannot
buffer them all."""

from __future__ import annotations

import threading
import time

import tubeway

# More than the broker and the sockets can hold for a stalled subscriber.
N = 2000


def test_slow_subscriber_stalls_nobody() -> None:
    with tubeway.Server(["tcp://127.0.0.1:0"], subscriber_buffer=8) as server:
        server.create_topic("ticks")
        release = threading.Event()
        slow_got = []
        fast_got = []
        fast_done = threading.Event()

        def slow(m: tubeway.Message) -> None:
            release.wait(30)  # a subscriber that stops reading
            slow_got.append(int.from_bytes(m.binary[:4], "big"))

        def fast(m: tubeway.Message) -> None:
            fast_got.append(int.from_bytes(m.binary[:4], "big"))
            if len(fast_got) == N:
                fast_done.set()

        with tubeway.Client(server.url) as slow_c, tubeway.Client(server.url) as fast_c, tubeway.Client(
            server.url
        ) as publisher:
            slow_sub = slow_c.subscribe("ticks", slow, buffer=4)
            # Room for every delivery, so that it misses none however slowly
            # this machine runs its callback.
            fast_sub = fast_c.subscribe("ticks", fast, buffer=N)
            start = time.monotonic()
            for i in range(N):
                publisher.publish("ticks", tubeway.Message.binary(i.to_bytes(4, "big") * (16 << 10)))
            assert time.monotonic() - start < 10, "the publisher was held up"
            assert fast_done.wait(60)
            assert fast_got == list(range(N))
            status = publisher.topic_status("ticks")
            assert status["published"] == N
            assert status["dropped"] > 0, status
            assert publisher.stats()["topics"][0]["dropped"] == status["dropped"]
            release.set()
            deadline = time.monotonic() + 10
            while len(slow_got) < N - status["dropped"] and time.monotonic() < deadline:
                time.sleep(0.01)
            assert slow_got == sorted(slow_got)
            assert len(slow_got) == N - status["dropped"]
            slow_sub.unsubscribe()
            fast_sub.unsubscribe()


def test_oneway_messages_go_out_while_the_sender_idles(server: tubeway.Server) -> None:
    """Oneway messages that did not fit the socket at once go out while the
    client that sent them makes no further call."""
    server.create_topic("idle")
    with tubeway.Client(server.url) as sender, tubeway.Client(server.url) as watcher:
        for i in range(N):
            sender.publish_oneway("idle", tubeway.Message.binary(b"x" * 1024))
        deadline = time.monotonic() + 10
        while watcher.topic_status("idle")["published"] < N:
            assert time.monotonic() < deadline, watcher.topic_status("idle")
            time.sleep(0.01)
