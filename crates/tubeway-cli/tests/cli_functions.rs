//! `tubeway call` against a real server: the built-in `echo`, errors, oneway.

mod common;

use std::time::{Duration, Instant};

use common::{entry, Proc, Server};

#[test]
fn call_echo_with_text_prints_the_text() {
    let server = Server::start();
    let out = server.run(&["call", "echo", "hello, tubeway"]);
    assert_eq!(out.ok(), "hello, tubeway\n");
}

#[test]
fn ack_answers_an_empty_ok_whatever_was_sent() {
    let server = Server::start();
    for function in ["ack", "ack-blocking"] {
        let out = server.run(&[
            "call",
            function,
            "--data",
            r#"{"n": 42}"#,
            "--request-id",
            "req-8",
            "--subject",
            "greeting",
            "--json",
        ]);
        out.ok();
        let m = &out.json_lines()[0];
        assert_eq!(m["response_status"], "ok", "{function}: {m}");
        assert_eq!(m["request_id"], "req-8", "{function}: {m}");
        for absent in [
            "payload_mimetype",
            "payload_charset",
            "subject",
            "destination",
        ] {
            assert!(m[absent].is_null(), "{function}: {absent} in {m}");
        }
        assert!(
            m["payload"].is_null() || m["payload"] == "",
            "{function}: a payload in {m}"
        );
    }
}

#[test]
fn call_echo_with_data_round_trips_as_json() {
    let server = Server::start();
    let out = server.run(&[
        "call",
        "echo",
        "--data",
        r#"{"n": 42, "list": [1, "two", null], "nested": {"ok": true}}"#,
        "--request-id",
        "req-7",
        "--subject",
        "greeting",
        "--json",
    ]);
    out.ok();
    let lines = out.json_lines();
    assert_eq!(lines.len(), 1, "exactly one JSON object: {}", out.stdout);
    let m = &lines[0];
    assert_eq!(m["type"], "response");
    assert_eq!(m["response_status"], "ok");
    assert_eq!(m["payload_encoding"], "json");
    assert_eq!(m["payload_mimetype"], "application/json");
    assert_eq!(
        m["payload"],
        serde_json::json!({"n": 42, "list": [1, "two", null], "nested": {"ok": true}})
    );
    assert_eq!(m["request_id"], "req-7");
    assert_eq!(m["subject"], "greeting");
    assert!(m["correlation_id"].is_string());
    // One compact object per line.
    assert!(!out.stdout.trim_end().contains('\n'));
}

#[test]
fn call_echo_with_data_prints_pretty_json_for_humans() {
    let server = Server::start();
    let out = server.run(&["call", "echo", "--data", r#"{"a":[1,2]}"#]);
    let parsed: serde_json::Value = serde_json::from_str(out.ok()).expect("pretty JSON");
    assert_eq!(parsed, serde_json::json!({"a": [1, 2]}));
}

#[test]
fn call_echo_with_a_file_reports_binary() {
    let server = Server::start();
    let file = server.dir.path().join("blob.bin");
    std::fs::write(&file, [0u8, 1, 2, 255]).expect("write file");
    let file = file.to_str().expect("utf-8 path");
    let out = server.run(&["call", "echo", "--file", file]);
    assert_eq!(out.ok(), "<4 bytes binary application/octet-stream>\n");
    let out = server.run(&["call", "echo", "--file", file, "--mimetype", "image/x-test"]);
    assert_eq!(out.ok(), "<4 bytes binary image/x-test>\n");
    let out = server.run(&["call", "echo", "--file", file, "--json"]);
    let m = &out.json_lines()[0];
    assert_eq!(m["payload_encoding"], "base64");
    assert_eq!(m["payload"], "AAEC/w==");
}

#[test]
fn call_unknown_function_fails_with_status_1() {
    let server = Server::start();
    let out = server.run(&["call", "no-such-function", "x"]);
    let stderr = out.fails_with(1);
    assert!(
        stderr.starts_with("error: function_not_found: "),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn invalid_data_json_is_a_usage_error() {
    let server = Server::start();
    let out = server.run(&["call", "echo", "--data", "{not json"]);
    let stderr = out.fails_with(2);
    assert!(stderr.contains("not valid JSON"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
}

#[test]
fn text_file_and_data_are_exclusive() {
    let server = Server::start();
    let out = server.run(&["call", "echo", "text", "--data", "1"]);
    out.fails_with(2);
}

#[test]
fn oneway_call_returns_at_once_and_runs() {
    let server = Server::start();
    let before = entry(&server.stats(), "functions", "echo")["calls"]
        .as_u64()
        .expect("calls");
    let out = server.run(&["call", "echo", "fire and forget", "--oneway", "--json"]);
    out.ok();
    let status = &out.json_lines()[0];
    assert_eq!(status["status"], "ok");
    assert_eq!(status["oneway"], true);
    server.wait_for_stats("the oneway call to run", |s| {
        entry(s, "functions", "echo")["calls"].as_u64() == Some(before + 1)
    });
}

#[test]
fn function_status_list_remove() {
    let server = Server::start();
    server.run(&["call", "echo", "x"]).ok();
    let out = server.run(&["function", "status", "echo", "--json"]);
    let f = &out.json_lines()[0];
    assert_eq!(f["name"], "echo");
    assert_eq!(f["local"], true);
    assert_eq!(f["calls"], 1);
    assert_eq!(f["waiting"], 0);
    let out = server.run(&["function", "status", "echo"]);
    let table = out.ok();
    assert!(table.starts_with("NAME"), "{table}");
    assert!(table.contains("WAITING"), "{table}");
    let out = server.run(&["function", "list", "--json"]);
    let names: Vec<_> = out
        .json_lines()
        .iter()
        .map(|f| f["name"].as_str().expect("name").to_owned())
        .collect();
    assert_eq!(names, ["ack", "ack-blocking", "echo"]);
    assert_eq!(
        server.run(&["function", "remove", "echo"]).ok(),
        "removed function echo\n"
    );
    let out = server.run(&["function", "status", "echo"]);
    assert!(out.fails_with(1).starts_with("error: function_not_found: "));
    let out = server.run(&["function", "remove", "echo"]);
    assert!(out.fails_with(1).starts_with("error: function_not_found: "));
    let out = server.run(&["call", "echo", "x"]);
    assert!(out.fails_with(1).starts_with("error: function_not_found: "));
}

/// Starts `serve FUNCTION ...` and waits until the broker has its worker.
fn worker(server: &Server, function: &str, args: &[&str]) -> Proc {
    let mut all = vec!["serve", function];
    all.extend_from_slice(args);
    let proc = Proc::spawn(&mut server.cmd(&all));
    server.wait_for_stats(&format!("a worker of {function}"), |s| {
        s["functions"].as_array().is_some_and(|fs| {
            fs.iter()
                .any(|f| f["name"] == function && f["workers"] == 1)
        })
    });
    proc
}

/// Waits (bounded) until `path` exists: what a command made when it ran.
fn wait_for_file(path: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn serve_answers_with_a_fixed_reply_or_the_request() {
    let server = Server::start();
    let fixed = worker(&server, "pong", &["pong!", "--count", "2"]);
    assert_eq!(server.run(&["call", "pong", "ping 1"]).ok(), "pong!\n");
    assert_eq!(server.run(&["call", "pong", "ping 2"]).ok(), "pong!\n");
    // It prints each call, and stops after --count.
    let out = fixed.finish(Duration::from_secs(20));
    assert_eq!(out.ok(), "ping 1\nping 2\n");

    let echo = worker(&server, "mirror", &["--echo", "--quiet"]);
    let out = server.run(&[
        "call",
        "mirror",
        "--data",
        r#"{"n":1}"#,
        "--subject",
        "s",
        "--json",
    ]);
    let m = &out.json_lines()[0];
    assert_eq!(m["payload"], serde_json::json!({"n": 1}));
    assert_eq!(m["subject"], "s");
    echo.terminate();
    assert_eq!(echo.finish(Duration::from_secs(20)).ok(), "");
    let out = server.run(&["call", "mirror", "x"]);
    assert!(out.fails_with(1).starts_with("error: function_not_found: "));
}

#[test]
fn serve_command_gets_the_request_on_stdin_and_in_its_environment() {
    let server = Server::start();
    let _w = worker(
        &server,
        "shout",
        &[
            "--command",
            r#"printf '%s|%s|%s|' "$TUBEWAY_FUNCTION" "$TUBEWAY_SUBJECT" "$TUBEWAY_REQUEST_ID"; tr a-z A-Z"#,
        ],
    );
    let out = server.run(&[
        "call",
        "shout",
        "hello",
        "--subject",
        "greeting",
        "--request-id",
        "r-1",
        "--json",
    ]);
    let m = &out.json_lines()[0];
    assert_eq!(m["payload"], "shout|greeting|r-1|HELLO");
    assert_eq!(m["payload_mimetype"], "text/plain");
    // A command that fails is the caller's handler_error, with its reason.
    let _f = worker(
        &server,
        "broken",
        &[
            "--command",
            "echo 'warming up' >&2; echo 'no such file: x' >&2; exit 4",
        ],
    );
    let out = server.run(&["call", "broken", "x"]);
    assert_eq!(
        out.fails_with(1),
        "error: handler_error: the command exited with status 4: no such file: x\n"
    );
}

/// A command runs one call at a time unless told otherwise: the broker
/// holds the others. Stopped, the worker answers the call it runs before
/// it exits, so none is lost.
#[test]
fn serve_command_runs_one_call_at_a_time_and_stops_without_losing_one() {
    let server = Server::start();
    let dir = server.dir.path();
    let (started, go) = (dir.join("started"), dir.join("go"));
    let command = format!(
        "touch {started}; while [ ! -e {go} ]; do sleep 0.01; done; cat",
        started = started.display(),
        go = go.display()
    );
    let w = worker(&server, "gated", &["--command", &command]);
    let first = Proc::spawn(&mut server.cmd(&["call", "gated", "one"]));
    wait_for_file(&started);
    let second = Proc::spawn(&mut server.cmd(&["call", "gated", "two"]));
    server.wait_for_stats("the second call waiting at the broker", |s| {
        entry(s, "functions", "gated")["waiting"] == 1
    });
    // Stopped while it runs the first, it leaves the broker: the second,
    // which no worker is left to take, fails; the first is answered.
    w.terminate();
    let out = second.finish(Duration::from_secs(20));
    assert!(
        out.fails_with(1).starts_with("error: function_not_found: "),
        "{}",
        out.stderr
    );
    std::fs::write(&go, b"").expect("write go");
    assert_eq!(first.finish(Duration::from_secs(20)).ok(), "one\n");
    assert_eq!(w.finish(Duration::from_secs(20)).ok(), "one\n");
}

#[test]
fn serve_needs_something_to_answer_with() {
    let server = Server::start();
    let out = server.run(&["serve", "f"]);
    assert!(out.fails_with(2).contains("say what to answer with"));
    let out = server.run(&["serve", "f", "--echo", "x"]);
    out.fails_with(2);
}

#[test]
fn serve_fails_when_the_broker_goes_away() {
    let server = Server::start();
    let w = worker(&server, "f", &["--echo"]);
    server.proc.terminate();
    let out = w.finish(Duration::from_secs(20));
    assert!(
        out.fails_with(3).contains("stopped serving \"f\""),
        "{}",
        out.stderr
    );
}
