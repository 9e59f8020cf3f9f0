"""Tubeway for asyncio: the blocking API's mirror, awaitable.

The event loop never blocks. ``send``, ``send_async``, ``poll``, ``offer``
and ``publish`` write their request from the loop's thread, and the reply
comes straight back to the loop, which resolves the call's future (no
thread in between); a cancelled ``poll`` is withdrawn, and loses no
message, and a cancelled ``offer`` is withdrawn. A subscription's
deliveries, and the calls of a function served here, come to the loop the
same way. ``send_oneway`` and ``publish_oneway`` return as soon as the loop's
thread has written the message (or, when the write queue is full, once the
client's thread has). The other operations run the blocking call on a thread of a pool
of this module's, the GIL released while it waits. Callbacks (subscribers,
function handlers) run on the event loop; they may be coroutine functions.

    async with tubeway.aio.Client("tcp://127.0.0.1:33333") as client:
        reply = await client.send("echo", "hello")
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import inspect
import weakref
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple, TypeVar

from . import _tubeway
from ._queue import Queue as _BlockingQueue

T = TypeVar("T")

# Waits are long (polls, gets) and cheap (the GIL is released), so the pool
# is larger than the default executor's.
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="tubeway-aio")


async def _run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_POOL, functools.partial(fn, *args, **kwargs))


def _close_inbox(loop: asyncio.AbstractEventLoop, inbox: _tubeway._LoopInbox) -> None:
    """The loop stops watching ``inbox`` once its futures are resolved; from
    any thread (a finalizer's), as the loop's own calls must be made on it."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        inbox.close()
        return
    try:
        loop.call_soon_threadsafe(inbox.close)
    except RuntimeError:
        pass  # the loop is closed, and watches nothing any more


class _Deliveries:
    """Hands a subscription's deliveries, which the loop's inbox brings, to
    its callback: one at a time and in order, a coroutine awaited before the
    next delivery. Each delivery's credit goes back once the callback is done
    with it, which gives the delivering thread room for another."""

    def __init__(self, callback: Callable[[_tubeway.Message], Any]) -> None:
        self._callback = callback
        self._waiting: Deque[_tubeway.Message] = collections.deque()
        self._running: Optional["asyncio.Future[None]"] = None
        self._credits: Optional[_tubeway._Credits] = None
        # Deliveries done before the credits were attached.
        self._owed = 0

    def attach(self, credits: _tubeway._Credits) -> None:
        self._credits = credits
        for _ in range(self._owed):
            credits.release()
        self._owed = 0

    def __call__(self, message: _tubeway.Message) -> None:
        self._waiting.append(message)
        if self._running is None:
            self._run_waiting()

    def _run_waiting(self) -> None:
        # Plain callbacks run right here; the first coroutine goes on in a task.
        while self._waiting:
            out = self._call(self._waiting.popleft())
            if inspect.isawaitable(out):
                self._running = asyncio.ensure_future(self._finish(out))
                return
            self._done()

    async def _finish(self, out: Any) -> None:
        try:
            await out
        except Exception as e:  # noqa: BLE001 - as in _call
            self._report(e)
        self._done()
        self._running = None
        self._run_waiting()

    def _call(self, message: _tubeway.Message) -> Any:
        try:
            return self._callback(message)
        except Exception as e:  # noqa: BLE001 - reported, and the next delivery still runs
            self._report(e)
            return None

    def _done(self) -> None:
        if self._credits is None:
            self._owed += 1
        else:
            self._credits.release()

    def _report(self, e: Exception) -> None:
        asyncio.get_running_loop().call_exception_handler(
            {"message": "subscription callback failed", "exception": e}
        )


class _Calls:
    """Runs a served function's handler on the loop for each call, which the
    loop's inbox brings with its responder, and answers through it: calls
    run concurrently, a coroutine handler's each in a task of its own."""

    def __init__(self, handler: Callable[[_tubeway.Message], Any]) -> None:
        self._handler = handler
        self._running: "set[asyncio.Future[None]]" = set()

    def __call__(self, message: _tubeway.Message, responder: _tubeway._Responder) -> None:
        try:
            out = self._handler(message)
        except Exception as e:  # noqa: BLE001 - the caller gets it as handler_error
            responder.fail(e)
            return
        if inspect.isawaitable(out):
            task = asyncio.ensure_future(self._finish(out, responder))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        else:
            responder.reply(out)

    @staticmethod
    async def _finish(out: Any, responder: _tubeway._Responder) -> None:
        try:
            value = await out
        except Exception as e:  # noqa: BLE001 - as in __call__
            responder.fail(e)
            return
        responder.reply(value)


class Client:
    """A connection to a Tubeway broker for asyncio code; use ``async with``
    or ``await tubeway.aio.connect(...)``. The methods are those of
    :class:`tubeway.Client`, awaitable."""

    def __init__(self, url: str, timeout: float = 30.0, **options: Any) -> None:
        self._url = url
        self._timeout = timeout
        self._options = options
        self._client: Optional[_tubeway.Client] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._inbox: Optional[_tubeway._LoopInbox] = None
        self._release_inbox: Callable[[], Any] = lambda: None

    async def connect(self) -> "Client":
        """Connects (``async with`` does it)."""
        if self._client is None:
            self._client = await _run(_tubeway.Client, self._url, self._timeout, **self._options)
        return self

    def _inbox_here(self) -> _tubeway._LoopInbox:
        """The running loop's inbox, where the replies of the calls made
        from it come back (one loop at a time: a client moved to another
        loop lets go of the last one's inbox)."""
        loop = asyncio.get_running_loop()
        if self._inbox is None or loop is not self._loop:
            self._release_inbox()
            inbox = _tubeway._LoopInbox(loop)
            loop.add_reader(inbox.fileno(), inbox.drain)
            self._loop, self._inbox = loop, inbox
            self._release_inbox = weakref.finalize(self, _close_inbox, loop, inbox)
        return self._inbox

    @property
    def blocking(self) -> _tubeway.Client:
        """The blocking client underneath."""
        if self._client is None:
            raise _tubeway.ConnectionClosed("the client is not connected: await client.connect() or use async with")
        return self._client

    @property
    def closed(self) -> bool:
        return self._client is None or self._client.closed

    async def close(self) -> None:
        if self._client is not None:
            await _run(self._client.close)
            self._release_inbox()

    async def __aenter__(self) -> "Client":
        return await self.connect()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def send(self, function: str, message: Any, timeout: Optional[float] = None) -> _tubeway.Message:
        return await self.send_async(function, message, timeout)

    def send_async(self, function: str, message: Any, timeout: Optional[float] = None) -> "asyncio.Future[_tubeway.Message]":
        """Starts a call; await the returned future for the reply."""
        client = self.blocking
        inbox = self._inbox_here()
        future = asyncio.get_running_loop().create_future()
        client._send_to_loop(function, message, inbox, future, timeout)
        return future

    async def send_oneway(self, function: str, message: Any) -> None:
        client = self.blocking
        future = asyncio.get_running_loop().create_future()
        if not client._oneway_to_loop(function, message, self._inbox_here(), future):
            await future  # the write queue was full: written once there is room

    async def serve(self, function: str, handler: Callable[[_tubeway.Message], Any]) -> _tubeway.Worker:
        """Serves ``function``; ``handler`` (a function or a coroutine
        function) runs on this event loop for each call."""
        calls = _Calls(handler)
        return await _run(self.blocking._serve_on_loop, function, calls, self._inbox_here())

    async def remove_function(self, function: str) -> None:
        await _run(self.blocking.remove_function, function)

    async def function_status(self, function: str) -> Dict[str, Any]:
        return await _run(self.blocking.function_status, function)

    async def list_functions(self) -> List[Dict[str, Any]]:
        return await _run(self.blocking.list_functions)

    async def offer(self, queue: str, message: Any, timeout: float = 0.0) -> None:
        """As :meth:`tubeway.Client.offer`. Cancelled while it waits for room,
        the offer is withdrawn at the broker: unless the broker had queued it
        already, it is not queued later."""
        client = self.blocking
        future = asyncio.get_running_loop().create_future()
        handle = client._offer_to_loop(queue, message, timeout, self._inbox_here(), future)
        future.add_done_callback(lambda f: f.cancelled() and handle.withdraw())
        await future

    async def poll(self, queue: str, timeout: float = 0.0) -> _tubeway.Message:
        """As :meth:`tubeway.Client.poll`. Cancelled (``asyncio.wait_for``,
        say), the poll is withdrawn at the broker, and a message the broker
        had already taken for it goes back to its queue: none is lost."""
        client = self.blocking
        inbox = self._inbox_here()
        future = asyncio.get_running_loop().create_future()
        handle = client._poll_to_loop(queue, timeout, inbox, future)
        future.add_done_callback(lambda f: f.cancelled() and handle.withdraw())
        return await future

    async def create_queue(self, name: str, capacity: int = 1000, kind: str = "bounded") -> Dict[str, Any]:
        return await _run(self.blocking.create_queue, name, capacity, kind)

    async def create_temporary_queue(self, capacity: int = 1000, kind: str = "bounded") -> Dict[str, Any]:
        return await _run(self.blocking.create_temporary_queue, capacity, kind)

    async def remove_queue(self, name: str) -> None:
        await _run(self.blocking.remove_queue, name)

    async def exists_queue(self, name: str) -> bool:
        return await _run(self.blocking.exists_queue, name)

    async def queue_status(self, name: str) -> Dict[str, Any]:
        return await _run(self.blocking.queue_status, name)

    async def list_queues(self) -> List[Dict[str, Any]]:
        return await _run(self.blocking.list_queues)

    async def create_topic(self, name: str) -> Dict[str, Any]:
        return await _run(self.blocking.create_topic, name)

    async def remove_topic(self, name: str) -> None:
        await _run(self.blocking.remove_topic, name)

    async def topic_status(self, name: str) -> Dict[str, Any]:
        return await _run(self.blocking.topic_status, name)

    async def list_topics(self) -> List[Dict[str, Any]]:
        return await _run(self.blocking.list_topics)

    async def publish(self, topic: str, message: Any) -> None:
        client = self.blocking
        future = asyncio.get_running_loop().create_future()
        client._publish_to_loop(topic, message, self._inbox_here(), future)
        await future

    async def publish_oneway(self, topic: str, message: Any) -> None:
        client = self.blocking
        future = asyncio.get_running_loop().create_future()
        if not client._oneway_to_loop(topic, message, self._inbox_here(), future, publish=True):
            await future  # the write queue was full: written once there is room

    async def subscribe(
        self, topic: str, callback: Callable[[_tubeway.Message], Any], *, buffer: Optional[int] = None
    ) -> _tubeway.Subscription:
        """Subscribes; ``callback`` (a function or a coroutine function) runs
        on this event loop for each delivery, in order. At most ``buffer``
        deliveries (default 1024) wait here for it: a loop that falls behind
        slows the subscription, and the broker counts what it drops."""
        deliveries = _Deliveries(callback)
        subscription, credits = await _run(
            self.blocking._subscribe_to_loop, topic, deliveries, self._inbox_here(), buffer
        )
        deliveries.attach(credits)
        return subscription

    async def unsubscribe(self, subscription: _tubeway.Subscription) -> None:
        await _run(subscription.unsubscribe)

    async def stats(self) -> Dict[str, Any]:
        return await _run(self.blocking.stats)

    async def ping(self) -> float:
        return await _run(self.blocking.ping)


async def connect(url: str, timeout: float = 30.0, **options: Any) -> Client:
    """A connected :class:`Client`."""
    return await Client(url, timeout, **options).connect()


class Queue:
    """:func:`tubeway.queue` for asyncio: ``put`` returns an awaitable
    future, ``get`` is awaitable."""

    def __init__(self, queue: _BlockingQueue) -> None:
        self.blocking = queue

    @property
    def url(self) -> str:
        return self.blocking.url

    @property
    def peers(self) -> List[int]:
        return self.blocking.peers

    async def wait_for_peers(self, count: int = 1, timeout: Optional[float] = None) -> bool:
        return await _run(self.blocking.wait_for_peers, count, timeout)

    def put(self, obj: Any, *peers: int) -> "asyncio.Future[None]":
        """Sends ``obj``; never blocks. Await the result to know when the
        object's memory may be reused."""
        return asyncio.wrap_future(self.blocking.put(obj, *peers))

    async def get(self, timeout: Optional[float] = None) -> Tuple[int, Any]:
        """As :meth:`tubeway.Queue.get`. Cancelled (``asyncio.wait_for``,
        say), it loses no object: one that arrives as it is cancelled is
        kept for the next ``get``, or, if it was already this one's, is
        returned all the same."""
        token = _tubeway._GetToken()
        loop = asyncio.get_running_loop()
        waiting = loop.run_in_executor(_POOL, functools.partial(self.blocking._get, timeout, token))
        try:
            return await asyncio.shield(waiting)
        except asyncio.CancelledError:
            if token.cancel():
                # The wait ends without an object; nobody reads how.
                waiting.add_done_callback(lambda f: f.cancelled() or f.exception())
                raise
            return await waiting

    async def close(self, timeout: float = 5.0) -> None:
        await _run(self.blocking.close, timeout)

    async def __aenter__(self) -> "Queue":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


async def queue(url: str, role: str = "server", **options: Any) -> Queue:
    """:func:`tubeway.queue`, awaitable; takes the same options."""
    return Queue(await _run(_BlockingQueue, url, role, **options))
