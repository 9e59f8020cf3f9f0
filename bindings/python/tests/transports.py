"""The transports every transport-generic test runs over: the one place to
add one. A transport this build's URL parser does not know yet (``shm``
until the shared-memory transport lands) is skipped, with the reason."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from typing import Iterator

import pytest

TRANSPORTS = ["tcp", "unix", "shm"]

_counter = itertools.count()


def _supported(transport: str) -> bool:
    import tubeway

    if transport in ("tcp", "unix"):
        return True

    probe = f"{transport}://tubeway-probe-{os.getpid()}"
    try:
        tubeway.Server([probe]).close()
    except ValueError:
        return False
    except tubeway.Error:
        return True  # known, but this probe could not use it
    return True


_SUPPORT: "dict[str, bool]" = {}


def supported(transport: str) -> bool:
    if transport not in _SUPPORT:
        _SUPPORT[transport] = _supported(transport)
    return _SUPPORT[transport]


class Addresses:
    """Makes fresh listening addresses on one transport."""

    def __init__(self, transport: str, directory: str) -> None:
        self.transport = transport
        self._dir = directory

    def new(self) -> str:
        n = next(_counter)
        if self.transport == "tcp":
            return "tcp://127.0.0.1:0"
        if self.transport == "unix":
            return f"unix://{self._dir}/s{n}.sock"
        if self.transport == "shm":
            # A socket path in our directory, not a name in the user's runtime
            # directory: a server killed on purpose leaves its socket file.
            return f"shm://{self._dir}/s{n}.shm"
        return f"{self.transport}://tw-{os.getpid()}-{n}"


@pytest.fixture(params=TRANSPORTS)
def addresses(request: pytest.FixtureRequest) -> Iterator[Addresses]:
    transport = request.param
    if not supported(transport):
        pytest.skip(f"{transport}:// is not supported by this build yet")
    # Unix socket paths must be short (108 bytes): not under pytest's tmp_path.
    directory = tempfile.mkdtemp(prefix="tw")
    try:
        yield Addresses(transport, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
