"""Shared fixtures: an embedded server and a client on every transport."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Iterator, List

import pytest

import tubeway
from transports import Addresses, addresses  # noqa: F401  (a fixture)


@pytest.fixture
def server(addresses: Addresses) -> Iterator[tubeway.Server]:  # noqa: F811
    with tubeway.Server([addresses.new()], shutdown_timeout=1.0) as s:
        yield s


@pytest.fixture
def client(server: tubeway.Server) -> Iterator[tubeway.Client]:
    with tubeway.Client(server.url, timeout=10.0) as c:
        yield c


@pytest.fixture
def tcp_server() -> Iterator[tubeway.Server]:
    with tubeway.Server(["tcp://127.0.0.1:0"], shutdown_timeout=1.0) as s:
        yield s


def python(code: str, *args: str) -> "subprocess.Popen[str]":
    """Starts another Python process running ``code`` with ``args`` in sys.argv."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def finish(proc: "subprocess.Popen[str]", timeout: float = 60.0) -> List[str]:
    """Waits for ``proc``; fails the test with its stderr if it failed."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"child process hung; stderr:\n{err}")
    assert proc.returncode == 0, f"child exited {proc.returncode}; stderr:\n{err}"
    return out.splitlines()
