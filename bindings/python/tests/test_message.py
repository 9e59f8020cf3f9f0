"""tubeway.Message: fields, constructors, payload accessors, JSON forms."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

import tubeway
from tubeway import Message


def test_plain_text() -> None:
    m = Message.plain_text("héllo", request_id="r1", subject="greeting", durable=True, ttl=5.0)
    assert m.text == "héllo"
    assert m.data is None
    assert bytes(m.binary) == "héllo".encode()
    assert m.payload_mimetype == "text/plain"
    assert m.payload_charset == "utf-8"
    assert m.request_id == "r1"
    assert m.subject == "greeting"
    assert m.durable is True
    assert m.oneway is False
    assert m.type == "request"
    assert m.response_status is None
    assert m.destination is None and m.reply_to is None
    now = int(time.time() * 1000)
    assert abs(m.timestamp - now) < 10_000
    assert m.expires_at is not None and 4_000 < m.expires_at - m.timestamp <= 5_000
    assert len(m.id) == 36


def test_text_in_another_charset_and_mimetype() -> None:
    m = Message.text("<a>é</a>", "application/xml", "iso-8859-1")
    assert m.payload_mimetype == "application/xml"
    assert m.payload_charset == "iso-8859-1"
    assert bytes(m.binary) == "<a>é</a>".encode("latin-1")
    assert m.text == "<a>é</a>"
    assert m.payload_kind == "text"


def test_binary_from_any_buffer() -> None:
    for data in (b"\x00\x01", bytearray(b"\x00\x01"), memoryview(b"\x00\x01"), np.array([0, 1], dtype=np.uint8)):
        m = Message.binary(data)
        assert bytes(m.binary) == b"\x00\x01"
        assert m.text is None and m.data is None
        assert m.payload_kind == "binary"
        assert m.payload_mimetype is None
        assert m.mimetype == "application/octet-stream"
    m = Message.binary(b"x", "image/png")
    assert m.payload_mimetype == "image/png"
    assert m.mimetype == "image/png"
    assert Message.binary(b"").mimetype is None


def test_binary_payload_is_a_read_only_view() -> None:
    m = Message.binary(b"abc" * 100_000)
    view = m.binary
    assert isinstance(view, memoryview)
    assert view.readonly
    with pytest.raises(TypeError):
        view[0] = 1  # type: ignore[index]
    # The view keeps the payload alive after the message is gone.
    del m
    assert bytes(view[:3]) == b"abc"
    assert bytes(view[-3:]) == b"abc"


def test_large_binary_borrows_the_buffer() -> None:
    data = bytearray(1 << 20)
    m = Message.binary(data)
    # The buffer is exported while the message holds it, not copied: a
    # bytearray with exports refuses to resize.
    with pytest.raises(BufferError):
        data.append(0)
    data[0] = 7
    assert m.binary[0] == 7
    del m
    deadline = time.monotonic() + 5
    while True:
        try:
            data.append(0)
            break
        except BufferError:
            # Released on the GIL thread, soon after the message is dropped.
            assert time.monotonic() < deadline, "buffer never released"
            time.sleep(0.01)


def test_small_binary_is_copied() -> None:
    data = bytearray(b"abc")
    m = Message.binary(data)
    data.append(0)
    data[0] = ord("x")
    assert bytes(m.binary) == b"abc"


def test_data() -> None:
    value = {"a": [1, 2.5, "x", None, True], "big": 2**63 + 1}
    m = Message.data(value, subject="s")
    assert m.data == value
    assert m.payload_mimetype == "application/json"
    assert m.text is None
    assert m.subject == "s"
    with pytest.raises(TypeError):
        Message.data({"x": object()})
    with pytest.raises(ValueError):
        Message.data(float("nan"))


def test_to_json_and_dict() -> None:
    m = Message.data({"k": 1}, request_id="q")
    d = m.to_dict()
    assert d["payload"] == {"k": 1}
    assert d["payload_encoding"] == "json"
    assert d["request_id"] == "q"
    assert d["id"] == m.id
    assert json.loads(m.to_json()) == d
    pretty = m.to_json(pretty=True)
    assert "\n" in pretty and json.loads(pretty) == d


def test_fields_are_read_only() -> None:
    m = Message.plain_text("x")
    with pytest.raises(AttributeError):
        m.subject = "y"  # type: ignore[misc]


def test_ttl_must_be_non_negative() -> None:
    with pytest.raises(ValueError):
        Message.plain_text("x", ttl=-1)


def test_equality_and_repr() -> None:
    m = Message.plain_text("x")
    assert m == m
    assert m != Message.plain_text("x")
    assert "request" in repr(m)
    assert len(m) == 1


def test_version() -> None:
    assert tubeway.__version__
