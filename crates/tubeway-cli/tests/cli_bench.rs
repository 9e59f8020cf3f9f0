//! `tubeway bench` end to end: smoke runs of the real binary (so the
//! benchmark never rots), their JSON checked for every figure and sane
//! values: sockets and the in-process transport; shared memory with its
//! bare ping-pongs and the channel mode over shm and fifo; latency mode set
//! against the default, and the async client in it; the table and the plot;
//! bad options; a broker that dies mid-run.

mod common;

use std::time::Duration;

use common::{run, tubeway, Proc, Server, TempDir};
use serde_json::Value;

/// Options that keep a run to a few seconds.
const TINY: [&str; 14] = [
    "--duration",
    "60ms",
    "--warmup",
    "20ms",
    "--runs",
    "2",
    "--rate",
    "2000",
    "--latency-duration",
    "200ms",
    "--idle-connections",
    "5",
    "--subscribers",
    "2",
];

/// Runs `cmd` (a `bench --json`), which must succeed, and parses its report.
fn report_of(cmd: &mut std::process::Command) -> Value {
    let out = run(cmd);
    serde_json::from_str(out.ok()).expect("one JSON document")
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn section<'a>(report: &'a Value, transport: &str, mode: Option<&str>) -> &'a Value {
    report["sections"]
        .as_array()
        .expect("sections")
        .iter()
        .find(|s| s["transport"] == transport && s["mode"].as_str() == mode)
        .unwrap_or_else(|| panic!("no section {transport} {mode:?}"))
}

fn figures<'a>(section: &'a Value, group: &str) -> Vec<&'a Value> {
    section["figures"]
        .as_array()
        .expect("figures")
        .iter()
        .filter(|f| f["group"] == group)
        .collect()
}

fn baseline<'a>(figure: &'a Value, prefix: &str) -> &'a Value {
    figure["baselines"]
        .as_array()
        .expect("baselines")
        .iter()
        .find(|b| b["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
        .unwrap_or_else(|| panic!("no baseline {prefix:?} in {figure}"))
}

/// Percentiles never decrease: mean aside, p50 <= p90 <= ... <= max.
fn check_latency(l: &Value) {
    let order = [
        "p50_us", "p90_us", "p99_us", "p999_us", "p9999_us", "max_us",
    ];
    let values: Vec<f64> = order.iter().map(|k| num(&l[*k])).collect();
    assert!(values[0] > 0.0, "{l}");
    assert!(values.windows(2).all(|w| w[0] <= w[1]), "{l}");
    assert!(num(&l["count"]) > 0.0, "{l}");
}

#[test]
fn a_smoke_run_reports_every_figure_with_its_bare_limits() {
    let dir = TempDir::new();
    let plot = dir.path().join("bench.svg");
    let mut cmd = tubeway();
    cmd.args([
        "bench",
        "--json",
        "--transport",
        "mem,unix",
        "--mode",
        "call,publish",
    ])
    .args([
        "--payload",
        "64B,5KB",
        "--connections",
        "1,2",
        "--in-flight",
        "1,4",
    ])
    .args(TINY)
    .arg("--plot")
    .arg(&plot);
    let out = run(&mut cmd);
    out.ok();
    let report: Value = serde_json::from_str(&out.stdout).expect("one JSON document");

    assert!(report["command"]
        .as_str()
        .unwrap()
        .starts_with("tubeway bench --json"));
    assert!(num(&report["machine"]["nproc"]) >= 1.0);
    assert!(report["machine"]["load_before"].is_array());
    assert!(report["machine"]["load_after"].is_array());
    let others = num(&report["machine"]["other_cpu"]);
    assert!((0.0..=1.0).contains(&others), "{others}");
    assert_eq!(report["method"]["runs"], 2);

    for transport in ["mem", "unix"] {
        for mode in ["call", "publish"] {
            let s = section(&report, transport, Some(mode));
            let sizes = figures(s, "size");
            assert_eq!(sizes.len(), 2, "{transport} {mode}");
            for f in &sizes {
                assert!(num(&f["msgs_per_sec"]["median"]) > 0.0, "{f}");
                assert!(num(&f["mb_per_sec"]["median"]) > 0.0, "{f}");
                assert_eq!(f["msgs_per_sec"]["runs"].as_array().unwrap().len(), 2);
                // One in flight: the blocking client.
                assert_eq!(f["client"], "blocking", "{f}");
                let memcpy = baseline(f, "memcpy");
                assert!(num(&memcpy["ratio"]) > 0.0, "{f}");
                if transport == "unix" {
                    assert!(num(&baseline(f, "bare socket ping-pong")["ratio"]) > 0.0);
                    assert!(num(&baseline(f, "bare socket streaming")["ratio"]) > 0.0);
                    assert!(num(&f["rss"]["broker_kib"]) > 0.0, "{f}");
                }
                assert!(num(&f["rss"]["bench_kib"]) > 0.0, "{f}");
            }
            for group in ["connections", "in-flight"] {
                let sweep = figures(s, group);
                assert_eq!(sweep.len(), 2, "{group}");
                assert!(sweep
                    .iter()
                    .all(|f| num(&f["msgs_per_sec"]["median"]) > 0.0));
                // Each point measured in every run, related to the first.
                assert!(sweep
                    .iter()
                    .all(|f| f["msgs_per_sec"]["runs"].as_array().map(Vec::len) == Some(2)));
                assert_eq!(sweep[1]["baselines"][0]["name"], sweep[0]["label"]);
                assert!(num(&sweep[1]["baselines"][0]["ratio"]) > 0.0, "{group}");
                // Pipelined: the async client.
                assert_eq!(sweep[1]["client"], "async", "{group}");
            }
            let rtt = figures(s, "round-trip");
            check_latency(&rtt[0]["latency"]["median"]);
            assert_eq!(rtt[0]["client"], "blocking");
            assert_eq!(s["wait"], "default");
            if transport == "unix" {
                assert!(num(&baseline(rtt[0], "bare socket ping-pong")["ratio"]) > 0.0);
            } else {
                // In one process: the ping-pongs between two threads.
                let pp = baseline(rtt[0], "shared-memory ping-pong, 64 B payload, two threads");
                assert!(num(&pp["ratio"]) > 0.0, "{pp}");
            }
            let rate = figures(s, "rate");
            let l = &rate[0]["latency"];
            check_latency(&l["median"]);
            assert_eq!(l["offered_rate"], 2000);
            assert!(num(&l["achieved_rate"]) > 0.0);
            assert!(!l["curve"].as_array().unwrap().is_empty());
            if mode == "publish" {
                // Every publish reached both subscribers or was counted as a drop.
                for f in sizes {
                    let drops = num(&f["drops"]);
                    let sent = f["msgs_per_sec"]["runs"].as_array().unwrap();
                    let got = f["deliveries_per_sec"]["runs"].as_array().unwrap();
                    for (s, g) in sent.iter().zip(got) {
                        let (s, g) = (num(s), num(g));
                        assert!(g <= 2.0 * s * 1.000_001, "{f}");
                        if drops == 0.0 {
                            assert!((g - 2.0 * s).abs() <= 2.0 * s * 1e-6, "{f}");
                        }
                    }
                }
            }
        }
        let limits = section(&report, transport, None);
        let memory = figures(limits, "memory");
        if transport == "unix" {
            let m = &memory[0]["memory"];
            assert!(num(&m["idle_kib"]) > 0.0, "{m}");
            assert_eq!(m["connections"], 5);
            assert!(num(&m["per_connection_kib"]) >= 0.0, "{m}");
            assert!(num(&m["idle_cpu_ms"]) >= 0.0, "{m}");
            let stream = &limits["figures"][0];
            assert!(num(&stream["mb_per_sec"]["median"]) > 0.0, "{stream}");
        } else {
            assert!(memory[0]["memory"].is_null());
        }
        // The shared-memory ping-pongs are limits of the in-process transport only.
        let shm_limits = limits["figures"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["label"].as_str().unwrap().starts_with("shared-memory"))
            .count();
        assert_eq!(shm_limits, if transport == "mem" { 2 } else { 0 });
    }

    let svg = std::fs::read_to_string(&plot).expect("the plot was written");
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(100)]);
    assert!(svg.contains("unix call"), "the legend names the series");
}

#[test]
fn shared_memory_and_channels_are_set_beside_the_bare_ping_pongs() {
    let mut cmd = tubeway();
    cmd.args(["bench", "--json", "--transport", "shm,fifo"])
        .args(["--mode", "call,channel", "--payload", "64B"])
        .args(["--figures", "size,in-flight,round-trip,rate"])
        .args(["--in-flight", "1,4"])
        .args(TINY);
    let report = report_of(&mut cmd);

    // Through the broker over shm: both ping-pongs beside the figure; one
    // in flight is the blocking client.
    let call = section(&report, "shm", Some("call"));
    let sizes = figures(call, "size");
    for f in &sizes {
        assert!(num(&f["msgs_per_sec"]["median"]) > 0.0, "{f}");
        let line = baseline(f, "shared-memory cache-line ping-pong, two processes");
        assert!(num(&line["ratio"]) > 0.0, "{f}");
        assert!(num(&f["rss"]["broker_kib"]) > 0.0, "{f}");
    }
    assert!(num(&baseline(sizes[0], "shared-memory ping-pong, 64 B payload")["ratio"]) > 0.0);
    let rtt = figures(call, "round-trip");
    assert_eq!(rtt[0]["client"], "blocking");
    assert!(num(&baseline(rtt[0], "shared-memory ping-pong, 64 B payload")["ratio"]) > 0.0);
    // The limits: both ping-pongs, with round-trip percentiles.
    let limits = section(&report, "shm", None);
    for label in [
        "shared-memory cache-line ping-pong, two processes",
        "shared-memory ping-pong, 64 B payload, two processes",
    ] {
        let f = limits["figures"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["label"] == label)
            .unwrap_or_else(|| panic!("no {label} in {limits}"));
        check_latency(&f["latency"]["median"]);
        assert!(num(&f["msgs_per_sec"]["median"]) > 0.0, "{f}");
    }

    // Channels over shm and over named pipes: echoes, every figure.
    for transport in ["shm", "fifo"] {
        let s = section(&report, transport, Some("channel"));
        assert_eq!(s["brokered"], false);
        for f in figures(s, "size") {
            assert!(num(&f["mb_per_sec"]["median"]) > 0.0, "{f}");
            assert_eq!(f["client"], "channel");
        }
        let window = figures(s, "in-flight");
        assert!(num(&window[1]["msgs_per_sec"]["median"]) > 0.0, "{s}");
        check_latency(&figures(s, "round-trip")[0]["latency"]["median"]);
        let rate = &figures(s, "rate")[0]["latency"];
        check_latency(&rate["median"]);
        assert!(num(&rate["achieved_rate"]) > 0.0, "{rate}");
    }
    let rtt = figures(section(&report, "shm", Some("channel")), "round-trip");
    assert!(num(&baseline(rtt[0], "shared-memory ping-pong, 64 B payload")["ratio"]) > 0.0);
    // fifo carries channels only: no broker section.
    assert!(report["sections"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["transport"] != "fifo" || s["mode"] != "call"));
}

/// A broker holding idle shared-memory clients sleeps: no connection
/// spins or loops. 100 ms of CPU in 2 s is far above what sleeping costs
/// and far below what one spinning connection burns (the whole 2 s).
#[test]
fn a_broker_with_100_idle_shm_clients_uses_no_cpu() {
    let mut cmd = tubeway();
    cmd.args([
        "bench",
        "--json",
        "--transport",
        "shm",
        "--figures",
        "memory",
    ])
    .args(["--idle-connections", "100"]);
    let report = report_of(&mut cmd);
    let limits = section(&report, "shm", None);
    let m = &figures(limits, "memory")[0]["memory"];
    assert_eq!(m["connections"], 100, "{m}");
    let cpu = num(&m["idle_cpu_ms"]);
    assert!(cpu < 100.0, "the broker used {cpu} ms of CPU in 2 s: {m}");
}

#[test]
fn latency_mode_is_set_beside_the_default_wait() {
    let mut cmd = tubeway();
    cmd.args(["bench", "--json", "--transport", "unix"])
        .args(["--mode", "call,channel", "--figures", "round-trip"])
        .args(["--wait", "default,spin-park:100us"])
        .args(TINY);
    let report = report_of(&mut cmd);
    for mode in ["call", "channel"] {
        let spinning = report["sections"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["mode"] == mode && s["wait"] == "spin-park:100us")
            .unwrap_or_else(|| panic!("no latency-mode {mode} section"));
        let rtt = figures(spinning, "round-trip");
        check_latency(&rtt[0]["latency"]["median"]);
        // The bare floor polls too, and the default mode is beside it.
        assert!(
            num(&baseline(rtt[0], "bare socket ping-pong, same bytes, polling")["ratio"]) > 0.0
        );
        assert!(num(&baseline(rtt[0], "p50 with the default wait")["ratio"]) > 0.0);
    }
}

#[test]
fn a_message_larger_than_a_streaming_write_is_set_beside_streaming_through_its_size() {
    let mut cmd = tubeway();
    cmd.args(["bench", "--json", "--transport", "tcp"])
        // Over 4 MiB: the bare limits' buffers are huge-page mappings.
        .args(["--figures", "size", "--payload", "64B,5MB"])
        .args(TINY);
    let report = report_of(&mut cmd);
    let sizes = figures(section(&report, "tcp", Some("call")), "size");
    let through = "bare socket streaming through message-sized buffers";
    // 64 B fits the caches, as the plain streaming's buffer does.
    let small = sizes[0]["baselines"].as_array().unwrap();
    assert!(!small.iter().any(|b| b["name"] == through), "{}", sizes[0]);
    assert_eq!(sizes[1]["payload"], 5_000_000);
    let b = baseline(sizes[1], through);
    assert!(num(&b["value"]["median"]) > 0.0, "{b}");
    assert!(num(&b["ratio"]) > 0.0, "{b}");
    assert!(num(&baseline(sizes[1], "bare socket streaming")["ratio"]) > 0.0);
}

#[test]
fn the_lone_client_is_the_one_asked_for() {
    for (flag, expected) in [("blocking", "blocking"), ("async", "async")] {
        let mut cmd = tubeway();
        cmd.args(["bench", "--json", "--transport", "unix", "--client", flag])
            .args(["--figures", "size,in-flight,round-trip", "--payload", "64B"])
            .args(["--in-flight", "1,4"])
            .args(TINY);
        let report = report_of(&mut cmd);
        let s = section(&report, "unix", Some("call"));
        let size = figures(s, "size");
        assert_eq!(size[0]["client"], expected, "{flag}: {}", size[0]);
        assert_eq!(figures(s, "round-trip")[0]["client"], expected, "{flag}");
        let in_flight = figures(s, "in-flight");
        assert_eq!(in_flight[0]["client"], expected, "{flag}: one in flight");
        // Pipelined figures are the async client's whatever the flag.
        assert_eq!(in_flight[1]["client"], "async", "{flag}: four in flight");
    }
}

/// The async client in latency mode over sockets (whose sockets the
/// reactor watches only on demand) against a real broker: calls one at a
/// time, read by their callers, and pipelined, read by the reader's task.
/// Spinning then parking, not busy-spinning: the other tests of this file
/// run beside it on few CPUs.
#[test]
fn the_async_client_in_latency_mode_calls_over_sockets() {
    let mut cmd = tubeway();
    cmd.args(["bench", "--json", "--transport", "unix,tcp"])
        .args(["--client", "async", "--wait", "spin-park:100us"])
        .args(["--figures", "round-trip,in-flight"])
        .args(["--payload", "64B", "--in-flight", "1,4"])
        .args(TINY);
    let report = report_of(&mut cmd);
    for transport in ["unix", "tcp"] {
        let s = section(&report, transport, Some("call"));
        assert_eq!(s["wait"], "spin-park:100us", "{transport}");
        let rtt = figures(s, "round-trip");
        assert_eq!(rtt[0]["client"], "async", "{transport}");
        check_latency(&rtt[0]["latency"]["median"]);
        for f in figures(s, "in-flight") {
            assert!(num(&f["msgs_per_sec"]["median"]) > 0.0, "{transport}: {f}");
        }
    }
}

#[test]
fn the_method_names_the_runtime_of_the_async_client() {
    for workers in ["1", "3"] {
        let mut cmd = tubeway();
        cmd.env("TOKIO_WORKER_THREADS", workers)
            .args(["bench", "--json", "--transport", "mem", "--client", "async"])
            .args(["--figures", "round-trip"])
            .args(TINY);
        let report = report_of(&mut cmd);
        let method = &report["method"];
        assert_eq!(method["runtime_workers"].to_string(), workers, "{method}");
        let summary = method["summary"].as_str().expect("a summary");
        let plural = if workers == "1" { "" } else { "s" };
        assert!(
            summary.ends_with(&format!("a runtime of {workers} worker{plural}")),
            "{summary}"
        );
    }
}

#[test]
fn split_cpus_put_the_bench_and_its_children_on_two_cpus() {
    let mut cmd = tubeway();
    cmd.args(["bench", "--json", "--transport", "unix", "--split-cpus"])
        .args(["--figures", "round-trip"])
        .args(TINY);
    if std::thread::available_parallelism().map_or(1, usize::from) < 2 {
        let out = run(&mut cmd);
        let stderr = out.fails_with(2);
        assert!(stderr.contains("--split-cpus needs two CPUs"), "{stderr}");
        return;
    }
    let report = report_of(&mut cmd);
    let method = &report["method"];
    assert_eq!(method["split_cpus"], true, "{method}");
    assert_eq!(method["one_cpu"], false, "{method}");
    let summary = method["summary"].as_str().expect("a summary");
    assert!(summary.contains("the bench pinned to CPU 0"), "{summary}");
    // The bench itself is on CPU 0 (nproc counts its mask), the broker it
    // started on CPU 1.
    assert_eq!(report["machine"]["nproc"], 1, "{}", report["machine"]);
    let unix = section(&report, "unix", Some("call"));
    let broker = unix["broker"].as_str().expect("where the broker runs");
    assert!(broker.ends_with(", on CPU 1"), "{broker}");
    let rtt = figures(unix, "round-trip");
    let f = rtt[0];
    check_latency(&f["latency"]["median"]);
    let bare = baseline(f, "bare socket ping-pong");
    assert!(num(&bare["ratio"]) > 0.0, "{f}");
    // The peer answered from CPU 1 every time, to the bench on CPU 0.
    assert_eq!(num(&bare["shared_cpu"]), 0.0, "{bare}");
    // Not both.
    let out = run(tubeway().args(["bench", "--split-cpus", "--one-cpu"]));
    let stderr = out.fails_with(2);
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

#[test]
fn one_cpu_puts_both_ends_of_the_bare_ping_pong_on_it() {
    let report = report_of(
        tubeway()
            .args(["bench", "--json", "--transport", "unix", "--one-cpu"])
            .args(["--figures", "round-trip"])
            .args(TINY),
    );
    assert_eq!(report["method"]["one_cpu"], true, "{}", report["method"]);
    let f = figures(section(&report, "unix", Some("call")), "round-trip")[0];
    let bare = baseline(f, "bare socket ping-pong");
    assert_eq!(num(&bare["shared_cpu"]), 1.0, "{bare}");
    // Pinned on purpose: nothing to tell the reader about it.
    let note = f["note"].as_str().unwrap_or_default();
    assert!(!note.contains("one CPU"), "{note}");
}

#[test]
fn the_table_is_for_people() {
    let mut cmd = tubeway();
    cmd.args([
        "bench",
        "--transport",
        "tcp",
        "--mode",
        "echo,worker,worker-sync,queue,oneway",
    ])
    .args(["--figures", "size,round-trip", "--payload", "5KB"])
    .args(TINY);
    let out = run(&mut cmd);
    let stdout = out.ok();
    for expected in [
        "command:  tubeway bench --transport tcp",
        "method:   each figure warmed up for 20ms, then measured in 2 runs of 60ms",
        "others:   other processes used",
        "== tcp echo:",
        "== tcp worker:",
        "== tcp worker-sync:",
        "== tcp queue:",
        "== tcp oneway:",
        "throughput by payload size",
        "bare socket ping-pong, same bytes msg/s",
        "round-trip latency",
        "== tcp limits:",
        "child process `tubeway server`",
    ] {
        assert!(
            stdout.contains(expected),
            "{expected:?} missing from:\n{stdout}"
        );
    }
    // No progress line when stderr is not a terminal.
    assert!(out.stderr.is_empty(), "{}", out.stderr);
}

#[test]
fn a_running_broker_is_benched_within_its_limits() {
    // Its maximum message size is 20 MiB: 30 MB payloads are reported as
    // not measured, not failed.
    let server = Server::start();
    let mut cmd = tubeway();
    cmd.args(["bench", "--json", "--url", &server.tcp, "--mode", "echo"])
        .args(["--figures", "size,memory", "--payload", "64B,30MB"])
        .args(TINY);
    let report = report_of(&mut cmd);
    let s = section(&report, "tcp", Some("echo"));
    assert!(s["broker"].as_str().unwrap().contains("--url"), "{s}");
    let sizes = figures(s, "size");
    assert!(num(&sizes[0]["msgs_per_sec"]["median"]) > 0.0);
    assert!(sizes[1]["msgs_per_sec"].is_null());
    let note = sizes[1]["note"].as_str().unwrap();
    assert!(note.contains("maximum message size"), "{note}");
    // Not our process: its memory is not ours to read.
    let limits = section(&report, "tcp", None);
    assert!(figures(limits, "memory")[0]["memory"].is_null());
}

#[test]
fn bad_options_are_one_clear_line() {
    for (args, code, expected) in [
        (&["--payload", "5XB"][..], 2, "invalid size"),
        (&["--transport", "udp"], 2, "unknown transport"),
        (
            &["--mode", "carrier-pigeon"],
            2,
            "unknown mode \"carrier-pigeon\"",
        ),
        (&["--duration", "0s"], 2, "must be more than 0"),
        (&["--url", "mem://x"], 2, "only inside its own process"),
        (
            &["--plot", "/nonexistent-dir/x.svg"],
            2,
            "no such directory",
        ),
    ] {
        let out = run(tubeway().arg("bench").args(args));
        let stderr = out.fails_with(code);
        let first = stderr.lines().next().unwrap_or_default();
        assert!(first.starts_with("error: "), "{args:?}: {stderr}");
        assert!(first.contains(expected), "{args:?}: {stderr}");
    }
    // Nothing listens there: exit status 3, as for every client command.
    let dir = TempDir::new();
    let url = format!("unix://{}", dir.path().join("none.sock").display());
    let out = run(tubeway().args(["bench", "--url", &url]));
    let stderr = out.fails_with(3);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn a_broker_that_dies_mid_run_ends_the_run_with_an_error() {
    let server = Server::start();
    // Bare streaming first (2 s), then the connection sweep: some 30 s of
    // calls on 1 to 100 connections, during which the broker is killed.
    let bench = Proc::spawn(tubeway().args([
        "bench",
        "--url",
        &server.unix,
        "--figures",
        "connections",
        "--warmup",
        "0s",
        "--duration",
        "2s",
        "--runs",
        "3",
    ]));
    // Once the bench is connected (it and this stats request), kill the broker.
    server.wait_for_stats("the bench to connect", |s| {
        s["connections"].as_u64() >= Some(2)
    });
    let mut server = server;
    server.proc.child.kill().expect("kill the broker");
    let out = bench.finish(Duration::from_secs(30));
    assert!(!out.status.success(), "{out:?}");
    let stderr = out.stderr.trim();
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}
