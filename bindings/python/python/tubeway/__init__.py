"""Tubeway for Python.

- :class:`Client`: a connection to a Tubeway broker: function calls
  (``send``), queues (``offer``/``poll``), topics (``publish``/``subscribe``),
  management and statistics, and serving functions (``serve``).
- :class:`Server`: the broker embedded in this process, with functions
  served by Python callables.
- :class:`Message`: the message model, read-only, with typed payloads.
- :func:`queue`: point-to-point queues between processes, no broker needed,
  moving Python objects (numpy arrays without copies).
- :mod:`tubeway.aio`: the same client for asyncio.

Every blocking call releases the GIL while it waits and can be interrupted
with Ctrl-C. Errors are subclasses of :class:`Error`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from . import _tubeway
from ._tubeway import (
    BadRequest,
    Client,
    Conflict,
    ConnectError,
    ConnectionClosed,
    Error,
    Expired,
    HandlerError,
    Message,
    NotFound,
    PermissionDenied,
    QueueEmpty,
    QueueFull,
    SerializationError,
    Server,
    ServerError,
    Subscription,
    Timeout,
    TooLarge,
    Unavailable,
    Worker,
)
from ._queue import Queue, queue
from ._serializers import Serializer, pickle_allowing

__version__: str = _tubeway.__version__

__all__ = [
    "BadRequest",
    "Client",
    "Conflict",
    "ConnectError",
    "ConnectionClosed",
    "Error",
    "Expired",
    "HandlerError",
    "Message",
    "NotFound",
    "PermissionDenied",
    "Queue",
    "QueueEmpty",
    "QueueFull",
    "SerializationError",
    "Serializer",
    "Server",
    "ServerError",
    "Subscription",
    "Timeout",
    "TooLarge",
    "Unavailable",
    "Worker",
    "pickle_allowing",
    "queue",
]


class _PayloadMember:
    """``Message.text`` is a constructor on the class and the payload on an
    instance (likewise ``binary`` and ``data``): the model's names, both ways."""

    def __init__(self, name: str, build: Callable[..., Any], read: Callable[[Any], Any], doc: str) -> None:
        self._name = name
        self._build = build
        self._read = read
        self.__doc__ = doc

    def __get__(self, obj: Optional[Any], owner: Optional[type] = None) -> Any:
        if obj is None:
            return self._build
        return self._read(obj)


def _install_payload_members() -> None:
    # The stubs describe the result; the native class is patched untyped.
    m: Any = _tubeway.Message
    m.plain_text = staticmethod(m._plain_text)
    m.text = _PayloadMember(
        "text",
        m._text,
        m._text_payload,
        "On the class: Message.text(text, mimetype='text/plain', charset='utf-8', ...) builds a text "
        "message. On a message: the text payload (str), or None when the payload is not text.",
    )
    m.binary = _PayloadMember(
        "binary",
        m._binary,
        lambda msg: msg.payload,
        "On the class: Message.binary(data, mimetype=None, ...) builds a binary message from any "
        "buffer. On a message: the payload bytes as a read-only memoryview (no copy).",
    )
    m.data = _PayloadMember(
        "data",
        m._data,
        m._data_payload,
        "On the class: Message.data(value, ...) builds a message of JSON-compatible data. On a "
        "message: the decoded value, or None when the payload is not data.",
    )


_install_payload_members()
