//! `tubeway call` against a real server: the built-in `echo`, errors, oneway.

mod common;

use common::{entry, Server};

#[test]
fn call_echo_with_text_prints_the_text() {
    let server = Server::start();
    let out = server.run(&["call", "echo", "hello, tubeway"]);
    assert_eq!(out.ok(), "hello, tubeway\n");
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
    assert_eq!(names, ["ack", "echo"]);
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
