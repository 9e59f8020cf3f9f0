"""A smoke run of the benchmark script, so that it never rots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "bindings" / "python" / "bench" / "bench.py"


def tubeway_binary() -> Path:
    for profile in ("release", "debug"):
        built = ROOT / "target" / profile / "tubeway"
        if os.access(built, os.X_OK):
            return built
    pytest.fail("no tubeway binary under target/: build it with `cargo build -p tubeway-cli`")


@pytest.mark.parametrize("only", ["latency", "call", "subscribe"])
def test_a_quick_run_measures_every_row(only: str, tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    args = [sys.executable, str(BENCH), "--quick", "--only", only, "--json", str(out)]
    if only in ("call", "subscribe"):
        args += ["--tubeway", str(tubeway_binary())]
    subprocess.run(args, check=True, timeout=110, stdout=subprocess.DEVNULL)
    rows = json.loads(out.read_text())[only]
    if only == "subscribe":
        # A callback on a thread and one on the event loop, tcp and unix at least.
        assert [r for r in rows if "skipped" in r] == []
        assert len(rows) >= 4, rows
        assert all(r["delivered"] + r["dropped"] == 2000 and r["deliveries_per_s"] > 0 for r in rows), rows
        return
    measured = [r for r in rows if "median_us" in r]
    assert [r for r in rows if "skipped" in r] == []
    # The plain socket references, and tubeway over tcp and unix at least.
    assert len(measured) >= 4, rows
    assert all(r["median_us"] > 0 for r in measured), rows
    if only == "call":
        # send_async and aio, one at a time and many in flight.
        in_flight = [r for r in measured if r.get("in_flight_per_s", 0) > 0]
        assert len(in_flight) >= 4, rows
