//! The server process, addresses, statistics, exit statuses.

mod common;

use std::time::{Duration, Instant};

use common::{entry, run, tubeway, Proc, Server};

#[test]
fn stats_json_parses_and_counts_connections() {
    let server = Server::start();
    let stats = server.stats();
    assert!(stats["connections"].as_u64().expect("connections") >= 1);
    assert!(stats["connections_total"].as_u64().expect("total") >= 1);
    for key in ["uptime_ms", "messages_in", "messages_out", "errors"] {
        assert!(stats[key].is_u64(), "{key} in {stats}");
    }
    let echo = common::entry(&stats, "functions", "echo");
    assert_eq!(echo["local"], true);
    assert!(stats["queues"].as_array().expect("queues").is_empty());
    assert!(stats["topics"].as_array().expect("topics").is_empty());
}

#[test]
fn stats_for_humans_has_every_section() {
    let server = Server::start();
    server
        .run(&["queue", "create", "jobs", "--capacity", "3"])
        .ok();
    server.run(&["topic", "create", "news"]).ok();
    let out = server.run(&["stats"]);
    let text = out.ok();
    for needle in [
        "connections",
        "messages",
        "errors",
        "OFFERED",
        "OVERWRITTEN",
        "REJECTED",
        "jobs",
        "SUBSCRIBERS",
        "DROPPED",
        "news",
        "echo",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
}

#[test]
fn url_comes_from_the_environment() {
    let server = Server::start();
    let out = run(tubeway()
        .args(["call", "echo", "via env"])
        .env("TUBEWAY_URL", &server.tcp));
    assert_eq!(out.ok(), "via env\n");
    // --url wins over the environment.
    let out = run(tubeway()
        .args(["call", "echo", "via flag", "--url", &server.tcp])
        .env("TUBEWAY_URL", "tcp://127.0.0.1:1"));
    assert_eq!(out.ok(), "via flag\n");
}

#[test]
fn unix_socket_urls_work() {
    let server = Server::start();
    let out = run(tubeway().args(["call", "echo", "over unix", "--url", &server.unix]));
    assert_eq!(out.ok(), "over unix\n");
    let out = run(tubeway().args([
        "queue",
        "create",
        "u",
        "--capacity",
        "1",
        "--url",
        &server.unix,
    ]));
    out.ok();
    server.run(&["offer", "u", "cross-transport"]).ok();
    let out = run(tubeway().args(["poll", "u", "--url", &server.unix]));
    assert_eq!(out.ok(), "cross-transport\n");
}

#[test]
fn connection_refused_names_the_url_and_exits_3() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let url = format!("tcp://127.0.0.1:{port}");
    let out = run(tubeway().args(["stats", "--url", &url]));
    let stderr = out.fails_with(3);
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains(&url), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn malformed_url_and_values_are_usage_errors() {
    let out = run(tubeway().args(["stats", "--url", "localhost:33333"]));
    assert!(out.fails_with(2).contains("not a URL"));
    let out = run(tubeway().args(["poll", "q", "--wait", "5"]));
    assert!(out.fails_with(2).contains("invalid duration"));
    let out = run(tubeway().args(["stats", "--timeout", "0s"]));
    out.fails_with(2);
    let out = run(tubeway().args(["queue", "create", "q", "--capacity", "0"]));
    out.fails_with(2);
}

#[test]
fn refused_connections_exit_3() {
    let server = Server::start_with(&["--max-connections", "1"]);
    server.run(&["topic", "create", "t"]).ok();
    // The subscriber holds the only connection allowed. It may itself be
    // refused while the broker still counts a connection that just closed:
    // then it is started again.
    let mut sub = Proc::spawn(&mut server.cmd(&["subscribe", "t"]));
    let deadline = Instant::now() + Duration::from_secs(20);
    let stderr = loop {
        assert!(Instant::now() < deadline, "stats never refused");
        if sub.child.try_wait().expect("try_wait").is_some() {
            sub = Proc::spawn(&mut server.cmd(&["subscribe", "t"]));
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        let out = server.run(&["stats"]);
        if !out.status.success() {
            break out.fails_with(3).to_owned();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains("unavailable"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    // Once it leaves, there is room again.
    drop(sub);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !server.run(&["stats"]).status.success() {
        assert!(Instant::now() < deadline, "the connection was never freed");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn max_message_size_above_1gib_is_rejected() {
    let out = run(tubeway().args([
        "server",
        "--listen",
        "tcp://127.0.0.1:0",
        "--max-message-size",
        "2GiB",
    ]));
    let stderr = out.fails_with(2);
    assert!(stderr.contains("1GiB"), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "must not have started: {}",
        out.stdout
    );
    let out = run(tubeway().args(["server", "--max-message-size", "lots"]));
    assert!(out.fails_with(2).contains("invalid size"));
}

#[test]
fn listen_failure_is_reported() {
    let server = Server::start();
    let out = run(tubeway().args(["server", "--listen", &server.tcp]));
    let stderr = out.fails_with(1);
    assert!(stderr.contains("cannot listen on"), "{stderr}");
}

#[test]
fn server_shuts_down_gracefully_on_sigterm() {
    let server = Server::start();
    server.run(&["topic", "create", "t"]).ok();
    // A connected subscriber must not hold the shutdown up.
    let sub = Proc::spawn(&mut server.cmd(&["subscribe", "t"]));
    server.wait_for_stats("the subscription", |s| {
        common::entry(s, "topics", "t")["subscribers"] == 1
    });
    let Server { mut proc, .. } = server;
    let started = Instant::now();
    proc.terminate();
    let status = common::wait_bounded(&mut proc.child, Duration::from_secs(5));
    assert!(status.success(), "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // The subscriber learns the subscription or the connection ended.
    let out = sub.finish(Duration::from_secs(20));
    let code = out.status.code();
    assert!(code == Some(1) || code == Some(3), "{out:?}");
}

#[test]
fn help_documents_the_exit_statuses() {
    let out = run(tubeway().arg("--help"));
    let help = out.ok();
    for needle in ["Exit status", "server", "subscribe", "stats", "TUBEWAY_URL"] {
        assert!(help.contains(needle), "{needle:?} missing from --help");
    }
    run(tubeway().args(["poll", "--help"])).ok();
    run(tubeway().arg("--version")).ok();
}

#[test]
fn latency_mode_serves_every_connection() {
    // Spin then park: the test runs beside others on few cores.
    let server = Server::start_with(&["--wait", "spin-park:200us"]);
    for url in [&server.tcp, &server.unix] {
        let out = run(tubeway().args(["call", "echo", "polled", "--url", url]));
        assert_eq!(out.ok(), "polled\n");
    }
    server
        .run(&["queue", "create", "lm", "--capacity", "2"])
        .ok();
    server.run(&["offer", "lm", "one"]).ok();
    assert_eq!(server.run(&["poll", "lm"]).ok(), "one\n");
}

#[test]
fn one_spin_thread_serves_connections_that_wait_and_that_call() {
    // Latency mode on one thread: a subscriber's connection stays open and
    // idle while other connections create, publish and read statistics on
    // the same thread, polled in turn.
    let server = Server::start_with(&["--wait", "spin-park:200us", "--spin-threads", "1"]);
    server.run(&["topic", "create", "t"]).ok();
    let sub = Proc::spawn(&mut server.cmd(&["subscribe", "t", "--count", "2"]));
    server.wait_for_stats("the subscription to be live", |s| {
        entry(s, "topics", "t")["subscribers"] == 1
    });
    server.run(&["publish", "t", "one"]).ok();
    server.run(&["publish", "t", "two"]).ok();
    assert_eq!(sub.finish(Duration::from_secs(20)).ok(), "one\ntwo\n");
    let out = run(tubeway().args(["server", "--spin-threads", "0"]));
    assert!(out.fails_with(2).contains("--spin-threads"));
}

#[test]
fn bad_wait_strategy_is_a_usage_error() {
    let out = run(tubeway().args(["server", "--wait", "nap"]));
    let err = out.fails_with(2);
    assert!(err.contains("bad wait strategy"), "{err}");
}
