"""How ``tubeway.queue`` turns objects into bytes and back.

An object travels as a *head* (the serialized object) and zero or more
out-of-band *buffers* sent from the object's own memory. The receiver picks
the loader by the mimetype the sender named, not by its own setting.

Security: loading a pickle runs whatever code the pickle names. Unrestricted
pickle from a peer you do not trust gives that peer your process. Restrict
it with ``allow=`` (see :func:`pickle_allowing`) or use ``serializer="json"``
or ``"msgpack"`` with untrusted peers.
"""

from __future__ import annotations

import io
import json
import pickle
from typing import Any, Callable, FrozenSet, Iterable, List, Optional, Sequence, Tuple, Union

from ._tubeway import SerializationError

RAW = "application/octet-stream"
PICKLE = "application/x-python-pickle"
JSON = "application/json"
MSGPACK = "application/msgpack"

#: Bytes-like objects smaller than this travel inside the head frame.
INLINE_BELOW = 64 * 1024

#: What the numpy array reconstructors are called, in numpy 1.x and 2.x.
NUMPY_GLOBALS: FrozenSet[str] = frozenset(
    {
        "numpy.ndarray",
        "numpy.dtype",
        "numpy.core.numeric._frombuffer",
        "numpy._core.numeric._frombuffer",
        "numpy.core.multiarray._reconstruct",
        "numpy._core.multiarray._reconstruct",
        "numpy.core.multiarray.scalar",
        "numpy._core.multiarray.scalar",
    }
)

#: Harmless builtins always allowed when pickle is restricted.
SAFE_BUILTINS: FrozenSet[str] = frozenset(
    f"builtins.{n}" for n in ("set", "frozenset", "complex", "bytearray", "slice", "range", "bytes", "str", "int", "float", "list", "dict", "tuple", "bool")
)


def _global_name(t: Union[str, type, Callable[..., Any]]) -> str:
    if isinstance(t, str):
        return t
    return f"{t.__module__}.{t.__qualname__}"


def pickle_allowing(*allowed: Union[str, type, Callable[..., Any]]) -> FrozenSet[str]:
    """The allow-list for restricted pickle: the given types or functions
    (or ``"module.qualname"`` strings), plus harmless builtins. Naming
    ``numpy.ndarray`` also allows what numpy needs to rebuild arrays."""
    names = {_global_name(a) for a in allowed}
    if "numpy.ndarray" in names:
        names |= NUMPY_GLOBALS
    return frozenset(names) | SAFE_BUILTINS


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: Any, buffers: Iterable[Any], allowed: FrozenSet[str]) -> None:
        super().__init__(io.BytesIO(data), buffers=buffers)
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if f"{module}.{name}" not in self._allowed:
            raise SerializationError(
                f"pickle refused: {module}.{name} is not in the allow-list "
                "(see tubeway.pickle_allowing)"
            )
        return super().find_class(module, name)


def _is_bytes_like(obj: Any) -> bool:
    return isinstance(obj, (bytes, bytearray, memoryview))


class Serializer:
    """Serializes objects for ``tubeway.queue``.

    ``name`` is one of ``"auto"`` (bytes-like objects raw, everything else
    pickle), ``"pickle"``, ``"json"``, ``"msgpack"`` or ``"raw"`` (bytes-like
    objects only). ``allow`` restricts what received pickles may load
    (``None``: anything — only for peers you trust).
    """

    def __init__(self, name: str = "auto", allow: Optional[Iterable[Union[str, type]]] = None) -> None:
        if name not in ("auto", "pickle", "json", "msgpack", "raw"):
            raise ValueError(f"unknown serializer {name!r}: use auto, pickle, json, msgpack or raw")
        self.name = name
        self.allowed: Optional[FrozenSet[str]] = None
        if allow is not None:
            self.allowed = pickle_allowing(*allow)

    def dumps(self, obj: Any) -> Tuple[str, Any, List[Any]]:
        """``(mimetype, head, buffers)`` for ``obj``; the buffers are views of
        the object's own memory, not copies."""
        name = self.name
        if name == "raw" or (name == "auto" and _is_bytes_like(obj)):
            if not _is_bytes_like(obj):
                try:
                    obj = memoryview(obj)
                except TypeError as e:
                    raise SerializationError(f"raw serializer needs a bytes-like object: {e}") from None
            if memoryview(obj).nbytes < INLINE_BELOW:
                return RAW, obj, []  # one frame: copied, which is cheaper when small
            return RAW, b"", [obj]
        if name in ("auto", "pickle"):
            buffers: List[Any] = []
            try:
                head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
            except Exception as e:
                raise SerializationError(f"cannot pickle {type(obj).__name__}: {e}") from e
            return PICKLE, head, [b.raw() for b in buffers]
        if name == "json":
            try:
                text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise SerializationError(f"cannot encode as JSON: {e}") from e
            return JSON, text.encode(), []
        msgpack = _msgpack()
        try:
            return MSGPACK, msgpack.packb(obj, use_bin_type=True), []
        except Exception as e:
            raise SerializationError(f"cannot encode with msgpack: {e}") from e

    def loads(self, mimetype: str, head: memoryview, buffers: Sequence[memoryview]) -> Any:
        """The object a peer sent."""
        if mimetype == RAW:
            if len(buffers) == 1:
                return buffers[0]
            return head
        if mimetype == PICKLE:
            try:
                if self.allowed is None:
                    return pickle.loads(head, buffers=buffers)
                return _RestrictedUnpickler(head, buffers, self.allowed).load()
            except SerializationError:
                raise
            except Exception as e:
                raise SerializationError(f"cannot unpickle: {e}") from e
        if mimetype == JSON:
            try:
                return json.loads(bytes(head))
            except ValueError as e:
                raise SerializationError(f"invalid JSON: {e}") from e
        if mimetype == MSGPACK:
            try:
                return _msgpack().unpackb(head, raw=False)
            except Exception as e:
                raise SerializationError(f"invalid msgpack: {e}") from e
        raise SerializationError(f"unknown serialization {mimetype!r}")


def _msgpack() -> Any:
    try:
        import msgpack  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        raise SerializationError("serializer 'msgpack' needs the msgpack package (pip install msgpack)") from None
    return msgpack


