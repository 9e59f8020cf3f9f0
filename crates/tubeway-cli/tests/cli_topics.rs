//! Topics from the command line: management, subscribe and publish.

mod common;

use std::time::Duration;

use common::{entry, Proc, Server};

/// Starts `subscribe` on `topic` and waits until the broker counts it.
fn subscriber(server: &Server, topic: &str, extra: &[&str]) -> Proc {
    let mut args = vec!["subscribe", topic];
    args.extend_from_slice(extra);
    let proc = Proc::spawn(&mut server.cmd(&args));
    server.wait_for_stats("the subscription to be live", |s| {
        entry(s, "topics", topic)["subscribers"] == 1
    });
    proc
}

#[test]
fn topic_create_list_remove() {
    let server = Server::start();
    let out = server.run(&["topic", "create", "news"]);
    assert_eq!(out.ok(), "topic news: 0 subscribers, 0 published\n");
    server.run(&["topic", "create", "news"]).ok();
    server.run(&["topic", "create", "weather"]).ok();
    let out = server.run(&["topic", "list", "--json"]);
    let names: Vec<_> = out
        .json_lines()
        .iter()
        .map(|t| t["name"].as_str().expect("name").to_owned())
        .collect();
    assert_eq!(names, ["news", "weather"]);
    assert!(server.run(&["topic", "list"]).ok().starts_with("NAME"));
    assert_eq!(
        server.run(&["topic", "remove", "news"]).ok(),
        "removed topic news\n"
    );
    let out = server.run(&["topic", "remove", "news"]);
    assert!(out.fails_with(1).starts_with("error: topic_not_found: "));
    let out = server.run(&["publish", "news", "x"]);
    assert!(out.fails_with(1).starts_with("error: topic_not_found: "));
}

#[test]
fn subscriber_prints_published_messages_in_order() {
    let server = Server::start();
    server.run(&["topic", "create", "news"]).ok();
    let sub = subscriber(&server, "news", &["--count", "2", "--json"]);
    assert_eq!(
        server.run(&["publish", "news", "first"]).ok(),
        "published to news\n"
    );
    server
        .run(&["publish", "news", "--data", r#"{"second":2}"#])
        .ok();
    let out = sub.finish(Duration::from_secs(20));
    out.ok();
    let lines = out.json_lines();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    assert_eq!(lines[0]["type"], "publish");
    assert_eq!(lines[0]["payload"], "first");
    assert_eq!(lines[1]["payload"], serde_json::json!({"second": 2}));
    assert_eq!(lines[0]["correlation_id"], lines[1]["correlation_id"]);
    let stats = server.stats();
    let t = entry(&stats, "topics", "news");
    assert_eq!(t["published"], 2);
    assert_eq!(t["delivered"], 2);
}

#[test]
fn human_subscriber_prints_payloads() {
    let server = Server::start();
    server.run(&["topic", "create", "t"]).ok();
    let sub = subscriber(&server, "t", &["--count", "2"]);
    server.run(&["publish", "t", "hello"]).ok();
    server.run(&["publish", "t", "world"]).ok();
    let out = sub.finish(Duration::from_secs(20));
    assert_eq!(out.ok(), "hello\nworld\n");
}

#[test]
fn subscribe_fails_when_the_topic_is_removed() {
    let server = Server::start();
    server.run(&["topic", "create", "t"]).ok();
    let sub = subscriber(&server, "t", &[]);
    server.run(&["topic", "remove", "t"]).ok();
    let out = sub.finish(Duration::from_secs(20));
    let stderr = out.fails_with(1);
    assert!(stderr.starts_with("error: subscription ended"), "{stderr}");
}

#[test]
fn subscribe_stops_cleanly_on_sigterm() {
    let server = Server::start();
    server.run(&["topic", "create", "t"]).ok();
    let sub = subscriber(&server, "t", &[]);
    server.run(&["publish", "t", "one"]).ok();
    assert_eq!(
        sub.next_line(Duration::from_secs(20)).as_deref(),
        Some("one")
    );
    sub.terminate();
    sub.finish(Duration::from_secs(20)).ok();
    server.wait_for_stats("the subscriber to leave", |s| {
        entry(s, "topics", "t")["subscribers"] == 0
    });
}

#[test]
fn subscribe_to_a_missing_topic_fails() {
    let server = Server::start();
    let out = server.run(&["subscribe", "nope"]);
    assert!(out.fails_with(1).starts_with("error: topic_not_found: "));
}
