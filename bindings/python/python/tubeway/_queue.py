"""``tubeway.queue``: point-to-point queues between processes, no broker."""

from __future__ import annotations

import concurrent.futures
from typing import Any, Iterable, List, Optional, Tuple, Union

from ._serializers import Serializer
from ._tubeway import Endpoint, _GetToken


class Queue:
    """One end of a point-to-point queue; see :func:`queue`."""

    def __init__(
        self,
        url: str,
        role: str = "server",
        *,
        serializer: Union[str, Serializer] = "auto",
        allow: Optional[Iterable[Union[str, type]]] = None,
        timeout: float = 10.0,
        max_message_size: int = 1 << 30,
        wait: str = "default",
    ) -> None:
        if isinstance(serializer, Serializer):
            if allow is not None:
                raise ValueError("give allow= to the Serializer, not with one")
            self._serializer = serializer
        else:
            self._serializer = Serializer(serializer, allow)
        self._endpoint = Endpoint(url, role, timeout=timeout, max_message_size=max_message_size, wait=wait)

    @property
    def url(self) -> str:
        """The address; for a server, the one bound (with the real port)."""
        return self._endpoint.url

    @property
    def role(self) -> str:
        """``"server"`` or ``"client"``."""
        return self._endpoint.role

    @property
    def peers(self) -> List[int]:
        """The ids of the peers connected now (a client's server is 0)."""
        return self._endpoint.peers

    def wait_for_peers(self, count: int = 1, timeout: Optional[float] = None) -> bool:
        """Waits until ``count`` peers are connected; False on timeout."""
        return self._endpoint.wait_for_peers(count, timeout)

    def put(self, obj: Any, *peers: int) -> "concurrent.futures.Future[None]":
        """Sends ``obj`` to ``peers`` (default: every connected peer).

        Never blocks. The returned future resolves when the object's memory
        may be reused (modifying a numpy array before then changes what is
        sent); it is already resolved when the data was small enough to copy.
        """
        mimetype, head, buffers = self._serializer.dumps(obj)
        return self._endpoint.send(mimetype, head, buffers, list(peers))

    def get(self, timeout: Optional[float] = None) -> Tuple[int, Any]:
        """The next object as ``(peer, obj)``, waiting up to ``timeout``
        seconds (None: as long as it takes; raises :class:`tubeway.Timeout`).

        Raises :class:`tubeway.ConnectionClosed` (with ``.peer``) once when a
        peer leaves, and at once when a client's server is gone, rather than
        waiting forever. Received arrays and bytes are read-only views of the
        received data (no copy).
        """
        return self._get(timeout, None)

    def _get(self, timeout: Optional[float], token: Optional[_GetToken]) -> Tuple[int, Any]:
        """:meth:`get`; with ``token``, cancellable (``tubeway.aio``)."""
        peer, mimetype, head, buffers = self._endpoint.recv(timeout, token)
        return peer, self._serializer.loads(mimetype, head, buffers)

    def close(self, timeout: float = 5.0) -> None:
        """Flushes what was put (for at most ``timeout`` seconds), closes every
        connection and stops listening."""
        self._endpoint.close(timeout)

    def __enter__(self) -> "Queue":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"tubeway.Queue({self.url!r}, role={self.role!r}, peers={self.peers})"


def queue(
    url: str,
    role: str = "server",
    *,
    serializer: Union[str, Serializer] = "auto",
    allow: Optional[Iterable[Union[str, type]]] = None,
    timeout: float = 10.0,
    max_message_size: int = 1 << 30,
    wait: str = "default",
) -> Queue:
    """A point-to-point queue over ``url`` (``tcp://``, ``unix://``, ``shm://``).

    The ``"server"`` role listens; ``"client"`` roles connect (retrying for
    up to ``timeout`` seconds while the server starts). ``serializer`` is
    ``"auto"`` (bytes-like objects as they are, everything else pickle
    protocol 5 with out-of-band buffers: numpy arrays are sent from their own
    memory), ``"pickle"``, ``"json"``, ``"msgpack"`` or ``"raw"``.

    ``allow`` restricts what received pickles may load to the listed types
    (see :func:`tubeway.pickle_allowing`). Without it, **a peer that can
    connect can run code in this process**: use ``allow`` or json/msgpack
    with peers you do not trust.

    ``wait`` is how ``get`` waits: ``"default"`` (the transport's own: over
    shm, poll for 50 µs, then sleep; over sockets, sleep at once),
    ``"park"`` (sleep until an object comes) or ``"spin-park:DURATION"``
    (latency mode: poll for that long first, which saves a thread wake-up
    when the answer is quick, at the price of a busy core meanwhile).
    """
    return Queue(
        url,
        role,
        serializer=serializer,
        allow=allow,
        timeout=timeout,
        max_message_size=max_message_size,
        wait=wait,
    )
