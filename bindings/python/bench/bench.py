#!/usr/bin/env python3
"""Benchmarks of tubeway.queue and tubeway.Client against plain Python
sockets, in one run.

    python bench.py                  # everything, default sizes
    python bench.py --quick          # a short run (smaller counts)
    python bench.py --only latency   # or: throughput, call, subscribe

Every measurement runs in fresh processes (so peak memory is each
pattern's own) and prints a Markdown table; figures are relative to the
plain-socket references measured in the same run. Needs numpy. `call`
measures `Client.send` of the broker's built-in `ack`, then
`send_async(...).result()` and `await tubeway.aio.Client.send` one at a
time and with 1000 in flight; `subscribe` measures deliveries a second to
a subscriber's callback, on a thread of `tubeway.Client` and on the event
loop of `tubeway.aio`. Both need the
`tubeway` binary (`--tubeway PATH`; by default the one on PATH, else the
release build of this repository).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, Iterator, List, Optional

import numpy as np

MiB = 1 << 20
#: Puts an echoing side lets run ahead of their completion.
WINDOW = 8


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def emit(result: Dict[str, Any]) -> None:
    result["peak_rss_mb"] = peak_rss_mb()
    print("RESULT " + json.dumps(result), flush=True)


# ----------------------------------------------------------------- latency


def latency_tubeway_a(url: str, n: int, warmup: int, wait: str) -> None:
    import tubeway

    with tubeway.queue(url, "server", wait=wait) as q:
        print("URL " + q.url, flush=True)
        assert q.wait_for_peers(1, timeout=30)
        payload = b"x" * 16
        rtts = []
        for i in range(n + warmup):
            t0 = time.perf_counter_ns()
            q.put(payload)
            q.get()
            if i >= warmup:
                rtts.append(time.perf_counter_ns() - t0)
        q.put(b"stop")
        emit({"rtt_ns": rtts})


def latency_tubeway_b(url: str, wait: str) -> None:
    import tubeway

    with tubeway.queue(url, "client", timeout=30, wait=wait) as q:
        while True:
            peer, obj = q.get()
            if bytes(obj) == b"stop":
                break
            q.put(obj, peer)
        emit({})


def _socket_server(family: str, address: str) -> socket.socket:
    if family == "tcp":
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(address)
    s.listen(1)
    return s


def _socket_url(family: str, s: socket.socket) -> str:
    if family == "tcp":
        return f"tcp:127.0.0.1:{s.getsockname()[1]}"
    return f"unix:{s.getsockname()}"


def _socket_connect(url: str) -> socket.socket:
    family, _, rest = url.partition(":")
    if family == "tcp":
        host, _, port = rest.rpartition(":")
        c = socket.create_connection((host, int(port)))
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return c
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(rest)
    return c


def _accept(s: socket.socket, family: str) -> socket.socket:
    conn, _ = s.accept()
    if family == "tcp":
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _recv_exactly(conn: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        k = conn.recv_into(view[got:])
        if k == 0:
            raise EOFError("peer closed")
        got += k


def latency_socket_a(family: str, address: str, n: int, warmup: int) -> None:
    s = _socket_server(family, address)
    print("URL " + _socket_url(family, s), flush=True)
    conn = _accept(s, family)
    payload = b"x" * 16
    buf = bytearray(16)
    view = memoryview(buf)
    rtts = []
    for i in range(n + warmup):
        t0 = time.perf_counter_ns()
        conn.sendall(payload)
        _recv_exactly(conn, view)
        if i >= warmup:
            rtts.append(time.perf_counter_ns() - t0)
    conn.close()
    emit({"rtt_ns": rtts})


def latency_socket_b(url: str) -> None:
    conn = _socket_connect(url)
    buf = bytearray(16)
    view = memoryview(buf)
    try:
        while True:
            _recv_exactly(conn, view)
            conn.sendall(view)
    except (EOFError, ConnectionError):
        pass
    emit({})


# -------------------------------------------------------------- throughput


def _sizes(pattern: str, n: int) -> List[int]:
    if pattern != "mix":
        return [2 * MiB] * n
    rng = np.random.default_rng(7)
    # Log-uniform from 256 B to 64 MiB.
    return [int(x) for x in np.exp(rng.uniform(np.log(256), np.log(64 * MiB), n))]


def _array(size: int) -> np.ndarray:
    # One allocation of `size` bytes, with a pattern to check.
    return np.resize(np.arange(251, dtype=np.uint8), size)


def throughput_tubeway_a(url: str, pattern: str, n: int) -> None:
    import tubeway

    sizes = _sizes(pattern, n)
    base = _array(max(sizes))
    with tubeway.queue(url, "server") as q:
        print("URL " + q.url, flush=True)
        assert q.wait_for_peers(1, timeout=30)
        t0 = time.perf_counter()
        if pattern == "async":
            sender = threading.Thread(target=lambda: [q.put(base[:s]) for s in sizes])
            sender.start()
            got = sum(q.get()[1].nbytes for _ in sizes)
            sender.join()
        else:
            futures = [q.put(base[:s]) for s in sizes]
            got = 0
            for i, s in enumerate(sizes):
                _, back = q.get()
                if i % 97 == 0:  # check the content now and then
                    assert back.nbytes == s and back[-1] == base[s - 1] and back[0] == base[0]
                got += back.nbytes
                del back
            for f in futures:
                f.result()
        elapsed = time.perf_counter() - t0
        q.put(b"stop")
        emit({"bytes": sum(sizes) + got, "objects": 2 * len(sizes), "seconds": elapsed})


def throughput_tubeway_b(url: str, pattern: str, n: int) -> None:
    import tubeway

    sizes = _sizes(pattern, n)
    with tubeway.queue(url, "client", timeout=30) as q:
        if pattern == "async":
            base = _array(max(sizes))
            sender = threading.Thread(target=lambda: [q.put(base[:s]) for s in sizes])
            sender.start()
            for _ in sizes:
                q.get()
            sender.join()
        else:
            # put() never blocks; waiting on its futures, a few behind, keeps
            # the objects held for sending bounded.
            window: "collections.deque[Any]" = collections.deque()
            for _ in sizes:
                peer, obj = q.get()
                window.append(q.put(obj, peer))
                del obj
                if len(window) > WINDOW:
                    window.popleft().result()
            for f in window:
                f.result()
        while True:
            _, obj = q.get()
            if isinstance(obj, memoryview) and bytes(obj) == b"stop":
                break
        emit({})


def throughput_socket_a(family: str, address: str, pattern: str, n: int) -> None:
    sizes = _sizes(pattern, n)
    base = _array(max(sizes))
    s = _socket_server(family, address)
    print("URL " + _socket_url(family, s), flush=True)
    conn = _accept(s, family)
    buf = bytearray(max(sizes))
    t0 = time.perf_counter()

    def send() -> None:
        for size in sizes:
            conn.sendall(memoryview(base)[:size])

    sender = threading.Thread(target=send)
    sender.start()
    view = memoryview(buf)
    for size in sizes:
        _recv_exactly(conn, view[:size])
    sender.join()
    elapsed = time.perf_counter() - t0
    conn.close()
    emit({"bytes": 2 * sum(sizes), "objects": 2 * len(sizes), "seconds": elapsed})


def throughput_socket_b(url: str, pattern: str, n: int) -> None:
    sizes = _sizes(pattern, n)
    conn = _socket_connect(url)
    if pattern == "async":
        base = _array(max(sizes))

        def send() -> None:
            for size in sizes:
                conn.sendall(memoryview(base)[:size])

        sender = threading.Thread(target=send)
        sender.start()
        view = memoryview(bytearray(max(sizes)))
        for size in sizes:
            _recv_exactly(conn, view[:size])
        sender.join()
    else:
        view = memoryview(bytearray(max(sizes)))
        for size in sizes:
            _recv_exactly(conn, view[:size])
            conn.sendall(view[:size])
    emit({})


# ------------------------------------------------------------------- calls


#: Calls kept in flight for the throughput of `send_async` and `tubeway.aio`.
IN_FLIGHT = 1000


def call_client(url: str, n: int, warmup: int, wait: str, api: str) -> None:
    """Round trips of `ack` one at a time by `api` (send, send_async: its
    future's result, aio: `await tubeway.aio.Client.send`); for the last two
    also the calls a second with IN_FLIGHT of them in flight."""
    import tubeway

    options = {} if wait == "default" else {"wait": wait}
    payload = b"x" * 64
    rtts: List[int] = []
    if api == "aio":
        import asyncio

        import tubeway.aio

        async def main() -> Dict[str, Any]:
            async with tubeway.aio.Client(url, **options) as c:
                for _ in range(warmup):
                    await c.send("ack", payload)
                cpu0 = time.process_time()
                for _ in range(n):
                    t0 = time.perf_counter_ns()
                    await c.send("ack", payload)
                    rtts.append(time.perf_counter_ns() - t0)
                cpu = (time.process_time() - cpu0) / n * 1e6
                t0 = time.perf_counter_ns()
                for _ in range(max(1, n // IN_FLIGHT)):
                    await asyncio.gather(*(c.send("ack", payload) for _ in range(IN_FLIGHT)))
                took = time.perf_counter_ns() - t0
                return {"cpu_us": cpu, "in_flight_per_s": max(1, n // IN_FLIGHT) * IN_FLIGHT / took * 1e9}

        emit({"rtt_ns": rtts, **asyncio.run(main())})
        return
    with tubeway.Client(url, **options) as c:
        call = (lambda: c.send("ack", payload)) if api == "send" else (lambda: c.send_async("ack", payload).result())
        for _ in range(warmup):
            call()
        cpu0 = time.process_time()
        for _ in range(n):
            t0 = time.perf_counter_ns()
            call()
            rtts.append(time.perf_counter_ns() - t0)
        result: Dict[str, Any] = {"rtt_ns": rtts, "cpu_us": (time.process_time() - cpu0) / n * 1e6}
        if api == "send_async":
            t0 = time.perf_counter_ns()
            for _ in range(max(1, n // IN_FLIGHT)):
                for f in [c.send_async("ack", payload) for _ in range(IN_FLIGHT)]:
                    f.result()
            took = time.perf_counter_ns() - t0
            result["in_flight_per_s"] = max(1, n // IN_FLIGHT) * IN_FLIGHT / took * 1e9
        emit(result)


def subscribe_client(url: str, n: int, api: str) -> None:
    """Deliveries a second to a callback that counts them (on a thread of
    `tubeway.Client`, or with api "aio" on the event loop of
    `tubeway.aio`), of `n` oneway publishes of 64 B from another client,
    timed from the first publish to the last delivery."""
    import tubeway

    topic = f"bench-{api}"
    payload = b"x" * 64
    with tubeway.Client(url) as publisher:
        publisher.create_topic(topic)
        before = publisher.topic_status(topic)["dropped"]
        count = [0]
        done = threading.Event()

        def on(_: Any) -> None:
            count[0] += 1
            if count[0] == n:
                done.set()

        def publish() -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                publisher.publish_oneway(topic, payload)
            publisher.ping()  # every publish is out (as a build that left some queued needs)
            return t0

        def result(t0: float) -> Dict[str, Any]:
            took = time.perf_counter() - t0
            dropped = publisher.topic_status(topic)["dropped"] - before
            return {"deliveries_per_s": count[0] / took, "delivered": count[0], "dropped": dropped}

        if api == "aio":
            import asyncio

            import tubeway.aio

            async def main() -> Dict[str, Any]:
                async with tubeway.aio.Client(url) as c:
                    sub = await c.subscribe(topic, on, buffer=n)
                    t0 = await asyncio.get_running_loop().run_in_executor(None, publish)
                    await asyncio.get_running_loop().run_in_executor(None, done.wait, 60)
                    out = result(t0)
                    await c.unsubscribe(sub)
                    return out

            emit(asyncio.run(main()))
            return
        with tubeway.Client(url) as c:
            sub = c.subscribe(topic, on, buffer=n)
            t0 = publish()
            done.wait(60)
            out = result(t0)
            sub.unsubscribe()
            emit(out)


def tubeway_binary(given: Optional[str]) -> Optional[str]:
    import shutil

    if given:
        return given
    found = shutil.which("tubeway")
    if found:
        return found
    here = os.path.dirname(os.path.abspath(__file__))
    built = os.path.join(here, "..", "..", "..", "target", "release", "tubeway")
    return built if os.access(built, os.X_OK) else None


def bench_call(n: int, warmup: int, tmp: str, binary: Optional[str], waits: List[str]) -> List[Dict[str, Any]]:
    rows: List[Dict[str, Any]] = []
    for family in ("tcp", "unix"):
        r = run_pair("latency-socket", ["--family", family, "--address", f"{tmp}/cs-{family}.sock", "-n", str(n), "--warmup", str(warmup)], [])
        rows.append({"what": f"plain socket ping-pong of 16 B, {family}", **r})
    if binary is None:
        rows.append({"what": "tubeway.Client", "skipped": "no tubeway binary (--tubeway PATH)"})
        return rows
    with broker(binary, tmp, "call") as urls:
        for wait in waits:
            for url in urls:
                transport = url.split(":", 1)[0]
                r = run_one("call", ["--url", url, "-n", str(n), "--warmup", str(warmup), "--wait", wait, "--api", "send"])
                rows.append({"what": f"tubeway.Client.send, {transport}, wait={wait}", **r})
        # The calls that hand their reply over: fewer, each costs a wake-up or two.
        for api, what in (("send_async", "tubeway.Client.send_async().result()"), ("aio", "await tubeway.aio.Client.send")):
            for url in urls:
                transport = url.split(":", 1)[0]
                r = run_one("call", ["--url", url, "-n", str(max(IN_FLIGHT, n // 10)), "--warmup", str(warmup // 10), "--wait", "default", "--api", api])
                rows.append({"what": f"{what}, {transport}", **r})
    return rows


@contextlib.contextmanager
def broker(binary: str, tmp: str, name: str) -> Iterator[List[str]]:
    """A `tubeway server` on tcp, unix and (where built) shm; its URLs."""
    listen = ["tcp://127.0.0.1:0", f"unix://{tmp}/{name}.sock"]
    if supported("shm"):
        listen.append(f"shm://tubeway-bench-{os.getpid()}-{name}")
    args = [binary, "server", "--log-level", "warn"]
    for url in listen:
        args += ["--listen", url]
    server = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        yield [server.stdout.readline().split("listening on ", 1)[-1].strip() for _ in listen]
    finally:
        server.terminate()
        server.wait(timeout=30)


def bench_subscribe(n: int, tmp: str, binary: Optional[str]) -> List[Dict[str, Any]]:
    if binary is None:
        return [{"what": "tubeway subscribers", "skipped": "no tubeway binary (--tubeway PATH)"}]
    rows: List[Dict[str, Any]] = []
    with broker(binary, tmp, "subscribe") as urls:
        for api, what in (("thread", "tubeway.Client.subscribe, callback on a thread"), ("aio", "tubeway.aio.Client.subscribe, callback on the loop")):
            for url in urls:
                transport = url.split(":", 1)[0]
                r = run_one("subscribe", ["--url", url, "-n", str(n), "--api", api])
                rows.append({"what": f"{what}, {transport}", **r})
    return rows


# ------------------------------------------------------------ orchestration


def result_of(kind: str, text: str) -> Dict[str, Any]:
    for ln in text.splitlines():
        if ln.startswith("RESULT "):
            return json.loads(ln[7:])
    raise RuntimeError(f"{kind}: no result")


def run_one(kind: str, args: List[str]) -> Dict[str, Any]:
    """Runs one side alone (against something already listening)."""
    me = os.path.abspath(__file__)
    p = subprocess.run([sys.executable, me, "--side", "b", "--kind", kind, *args], stdout=subprocess.PIPE, text=True, timeout=3600)
    if p.returncode:
        raise RuntimeError(f"{kind} failed: {p.returncode}")
    return result_of(kind, p.stdout)



def run_pair(kind: str, args_a: List[str], args_b: List[str]) -> Dict[str, Any]:
    """Runs side A, passes its URL to side B, returns both results."""
    me = os.path.abspath(__file__)
    a = subprocess.Popen([sys.executable, me, "--side", "a", "--kind", kind, *args_a], stdout=subprocess.PIPE, text=True)
    assert a.stdout is not None
    line = a.stdout.readline()
    if not line.startswith("URL "):
        a.kill()
        raise RuntimeError(f"side a of {kind} did not start: {line!r}")
    url = line[4:].strip()
    b = subprocess.Popen(
        [sys.executable, me, "--side", "b", "--kind", kind, "--url", url, *args_b], stdout=subprocess.PIPE, text=True
    )
    out_a = a.stdout.read()
    out_b, _ = b.communicate(timeout=3600)
    a.wait(timeout=60)
    if a.returncode or b.returncode:
        raise RuntimeError(f"{kind} failed: a={a.returncode} b={b.returncode}")

    ra, rb = result_of(kind, out_a), result_of(kind, out_b)
    ra["peak_rss_mb_b"] = rb["peak_rss_mb"]
    return ra


def address(transport: str, tmp: str, name: str) -> str:
    if transport == "tcp":
        return "tcp://127.0.0.1:0"
    if transport == "unix":
        return f"unix://{tmp}/{name}.sock"
    return f"{transport}://tubeway-bench-{os.getpid()}-{name}"


def supported(transport: str) -> bool:
    import tubeway

    if transport in ("tcp", "unix"):
        return True
    try:
        tubeway.queue(f"{transport}://tubeway-bench-probe-{os.getpid()}", "server").close()
        return True
    except ValueError:
        return False


def percentile(values: List[int], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100.0 * len(ordered)))] / 1000.0


def bench_latency(n: int, warmup: int, tmp: str) -> List[Dict[str, Any]]:
    rows = []
    for family in ("tcp", "unix"):
        r = run_pair("latency-socket", ["--family", family, "--address", f"{tmp}/ls-{family}.sock", "-n", str(n), "--warmup", str(warmup)], [])
        rows.append({"what": f"plain socket ping-pong, {family}", **r})
    for transport in ("tcp", "unix", "shm"):
        if not supported(transport):
            rows.append({"what": f"tubeway.queue, {transport}", "skipped": "transport not available in this build"})
    for wait in ("park", "spin-park:50us"):
        for transport in ("tcp", "unix", "shm"):
            if not supported(transport):
                continue
            r = run_pair(
                "latency-tubeway",
                ["--url", address(transport, tmp, "lat"), "-n", str(n), "--warmup", str(warmup), "--wait", wait],
                ["--wait", wait],
            )
            rows.append({"what": f"tubeway.queue, {transport}, wait={wait}", **r})
    return summarize(rows)


def summarize(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Replaces each row's round trips by their percentiles."""
    for row in rows:
        if "rtt_ns" in row:
            rtts = row.pop("rtt_ns")
            row["median_us"] = statistics.median(rtts) / 1000.0
            row["p90_us"] = percentile(rtts, 90)
            row["p99_us"] = percentile(rtts, 99)
    return rows


def print_latency(rows: List[Dict[str, Any]], cpu: bool) -> None:
    in_flight = any("in_flight_per_s" in r for r in rows)
    extra = (" client CPU µs/call |" if cpu else "") + (f" calls/s, {IN_FLIGHT} in flight |" if in_flight else "")
    columns = 3 + cpu + in_flight
    print(f"| what | median µs | p90 µs | p99 µs |{extra}\n|---|{'---:|' * columns}")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['what']} | {r['skipped']} |{' |' * (columns - 1)}")
            continue
        line = f"| {r['what']} | {r['median_us']:.1f} | {r['p90_us']:.1f} | {r['p99_us']:.1f} |"
        if cpu:
            line += f" {r['cpu_us']:.1f} |" if "cpu_us" in r else " |"
        if in_flight:
            line += f" {r['in_flight_per_s']:.0f} |" if "in_flight_per_s" in r else " |"
        print(line)


def bench_throughput(n: int, n_mix: int, tmp: str, transports: List[str]) -> List[Dict[str, Any]]:
    rows = []
    for pattern in ("sync", "async", "mix"):
        count = n_mix if pattern == "mix" else n
        for family in ("tcp", "unix"):
            if family not in transports:
                continue
            r = run_pair(
                "throughput-socket",
                ["--family", family, "--address", f"{tmp}/ts-{family}-{pattern}.sock", "--pattern", pattern, "-n", str(count)],
                ["--pattern", pattern, "-n", str(count)],
            )
            rows.append({"pattern": pattern, "what": f"raw socket stream, {family}", **r})
        for transport in transports:
            if not supported(transport):
                continue
            r = run_pair(
                "throughput-tubeway",
                ["--url", address(transport, tmp, f"tp-{pattern}"), "--pattern", pattern, "-n", str(count)],
                ["--pattern", pattern, "-n", str(count)],
            )
            rows.append({"pattern": pattern, "what": f"tubeway.queue, {transport}", **r})
    for row in rows:
        row["gbps"] = row["bytes"] * 8 / row["seconds"] / 1e9
        row["ops_per_s"] = row["objects"] / row["seconds"]
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", choices=["a", "b"])
    p.add_argument("--kind")
    p.add_argument("--url")
    p.add_argument("--family")
    p.add_argument("--address")
    p.add_argument("--pattern")
    p.add_argument("-n", type=int, default=0)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--wait", default="park")
    p.add_argument("--api", choices=["send", "send_async", "aio", "thread"], default="send")
    p.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    p.add_argument("--only", choices=["latency", "throughput", "call", "subscribe"])
    p.add_argument("--tubeway", help="the tubeway binary, for `call` (default: on PATH, else target/release)")
    p.add_argument("--waits", default="default,spin-park:50us", help="the clients' wait strategies, for `call`")
    p.add_argument("--transports", default="tcp,unix,shm", help="for throughput (default: tcp,unix,shm)")
    p.add_argument("--json", help="also write the results to this file")
    a = p.parse_args()

    if a.side:
        side = {
            ("latency-tubeway", "a"): lambda: latency_tubeway_a(a.url, a.n, a.warmup, a.wait),
            ("latency-tubeway", "b"): lambda: latency_tubeway_b(a.url, a.wait),
            ("latency-socket", "a"): lambda: latency_socket_a(a.family, a.address, a.n, a.warmup),
            ("latency-socket", "b"): lambda: latency_socket_b(a.url),
            ("throughput-tubeway", "a"): lambda: throughput_tubeway_a(a.url, a.pattern, a.n),
            ("throughput-tubeway", "b"): lambda: throughput_tubeway_b(a.url, a.pattern, a.n),
            ("throughput-socket", "a"): lambda: throughput_socket_a(a.family, a.address, a.pattern, a.n),
            ("throughput-socket", "b"): lambda: throughput_socket_b(a.url, a.pattern, a.n),
            ("call", "b"): lambda: call_client(a.url, a.n, a.warmup, a.wait, a.api),
            ("subscribe", "b"): lambda: subscribe_client(a.url, a.n, a.api),
        }[(a.kind, a.side)]
        side()
        return

    n_lat, warmup = (2000, 200) if a.quick else (20000, 2000)
    n_tp, n_mix = (200, 40) if a.quick else (4000, 400)
    print(f"load average before: {os.getloadavg()}; cpus: {os.cpu_count()}; python {sys.version.split()[0]}")
    results: Dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="twb") as tmp:
        if a.only in (None, "latency"):
            rows = bench_latency(n_lat, warmup, tmp)
            results["latency"] = rows
            print(f"\nRound trip of a 16 B message ({n_lat} round trips after {warmup} warm-up)\n")
            print_latency(rows, cpu=False)
        if a.only in (None, "throughput"):
            rows = bench_throughput(n_tp, n_mix, tmp, a.transports.split(","))
            results["throughput"] = rows
            print(f"\nTransfer, both ways ({n_tp} × 2 MiB for sync/async; {n_mix} of 256 B–64 MiB for mix)\n")
            print("| pattern | what | Gbps | objects/s | peak RSS A MB | peak RSS B MB |\n|---|---|---:|---:|---:|---:|")
            for r in rows:
                print(
                    f"| {r['pattern']} | {r['what']} | {r['gbps']:.2f} | {r['ops_per_s']:.0f} | "
                    f"{r['peak_rss_mb']:.0f} | {r['peak_rss_mb_b']:.0f} |"
                )
        if a.only in (None, "call"):
            n_call, call_warmup = (2000, 200) if a.quick else (200000, 20000)
            rows = summarize(bench_call(n_call, call_warmup, tmp, tubeway_binary(a.tubeway), a.waits.split(",")))
            results["call"] = rows
            print(
                f"\nFunction call `ack` of 64 B through `tubeway server` ({n_call} calls after {call_warmup} warm-up; "
                f"send_async and aio: a tenth as many, then {IN_FLIGHT} at a time)\n"
            )
            print_latency(rows, cpu=True)
        if a.only in (None, "subscribe"):
            n_sub = 2000 if a.quick else 50000
            rows = bench_subscribe(n_sub, tmp, tubeway_binary(a.tubeway))
            results["subscribe"] = rows
            print(f"\nDeliveries to a subscriber's callback ({n_sub} oneway publishes of 64 B from another client)\n")
            print("| what | deliveries/s | delivered | dropped |\n|---|---:|---:|---:|")
            for r in rows:
                if "skipped" in r:
                    print(f"| {r['what']} | {r['skipped']} | | |")
                    continue
                print(f"| {r['what']} | {r['deliveries_per_s']:.0f} | {r['delivered']} | {r['dropped']} |")
    print(f"\nload average after: {os.getloadavg()}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
