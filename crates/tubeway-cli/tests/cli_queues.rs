//! Queues from the command line: management, offer and poll, limits, expiry.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::{entry, Server};

#[test]
fn queue_create_status_list_remove() {
    let server = Server::start();
    let out = server.run(&["queue", "create", "jobs", "--capacity", "10"]);
    assert_eq!(out.ok(), "queue jobs: bounded, capacity 10, size 0\n");
    // Declaring it again with the same settings succeeds; other settings conflict.
    server
        .run(&["queue", "create", "jobs", "--capacity", "10"])
        .ok();
    let out = server.run(&["queue", "create", "jobs", "--capacity", "5", "--circular"]);
    assert!(out.fails_with(1).starts_with("error: conflict: "));
    server
        .run(&["queue", "create", "ring", "--capacity", "3", "--circular"])
        .ok();

    let out = server.run(&["queue", "status", "jobs", "--json"]);
    let status = &out.json_lines()[0];
    assert_eq!(status["name"], "jobs");
    assert_eq!(status["kind"], "bounded");
    assert_eq!(status["capacity"], 10);
    assert_eq!(status["size"], 0);

    let out = server.run(&["queue", "list", "--json"]);
    let names: Vec<_> = out
        .json_lines()
        .iter()
        .map(|q| q["name"].as_str().expect("name").to_owned())
        .collect();
    assert_eq!(names, ["jobs", "ring"]);
    let out = server.run(&["queue", "list"]);
    let table = out.ok();
    assert!(table.starts_with("NAME"), "{table}");
    assert!(table.contains("ring  circular  3"), "{table}");

    let out = server.run(&["queue", "remove", "jobs"]);
    assert_eq!(out.ok(), "removed queue jobs\n");
    let out = server.run(&["queue", "status", "jobs"]);
    assert!(out.fails_with(1).starts_with("error: queue_not_found: "));
    let out = server.run(&["queue", "remove", "jobs"]);
    assert!(out.fails_with(1).starts_with("error: queue_not_found: "));
}

#[test]
fn offer_then_poll_is_fifo() {
    let server = Server::start();
    server
        .run(&["queue", "create", "q", "--capacity", "10"])
        .ok();
    for text in ["one", "two", "three"] {
        assert_eq!(server.run(&["offer", "q", text]).ok(), "offered to q\n");
    }
    let out = server.run(&["poll", "q", "--count", "3", "--wait", "5s"]);
    assert_eq!(out.ok(), "one\ntwo\nthree\n");

    server
        .run(&[
            "offer",
            "q",
            "--data",
            "[1,2]",
            "--subject",
            "s",
            "--request-id",
            "r1",
            "--reply-to",
            "answers",
        ])
        .ok();
    let out = server.run(&["poll", "q", "--json"]);
    let m = &out.json_lines()[0];
    assert_eq!(m["response_status"], "ok");
    assert_eq!(m["payload"], serde_json::json!([1, 2]));
    assert_eq!(m["subject"], "s");
    assert_eq!(m["request_id"], "r1");
    assert_eq!(m["reply_to"], "answers");
    assert_eq!(m["destination"], "q");
}

#[test]
fn poll_waits_for_a_message_offered_later() {
    let server = Server::start();
    server
        .run(&["queue", "create", "q", "--capacity", "1"])
        .ok();
    let mut poller = server.cmd(&["poll", "q", "--wait", "20s"]);
    let poller = common::Proc::spawn(&mut poller);
    // Whether the poll is already waiting or not, it gets the message.
    server.run(&["offer", "q", "late"]).ok();
    let out = poller.finish(Duration::from_secs(30));
    assert_eq!(out.ok(), "late\n");
}

#[test]
fn poll_on_an_empty_queue_fails_with_queue_empty() {
    let server = Server::start();
    server
        .run(&["queue", "create", "q", "--capacity", "1"])
        .ok();
    let started = Instant::now();
    let out = server.run(&["poll", "q", "--wait", "200ms"]);
    let stderr = out.fails_with(1);
    assert!(stderr.starts_with("error: queue_empty: "), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(started.elapsed() >= Duration::from_millis(200));

    // A partial --count prints what came, then fails.
    server.run(&["offer", "q", "only"]).ok();
    let out = server.run(&["poll", "q", "--count", "2", "--wait", "200ms"]);
    let stderr = out.fails_with(1);
    assert_eq!(out.stdout, "only\n");
    assert!(stderr.contains("received 1 of 2"), "{stderr}");

    let out = server.run(&["poll", "missing", "--wait", "0s"]);
    assert!(out.fails_with(1).starts_with("error: queue_not_found: "));
}

#[test]
fn offer_to_a_full_bounded_queue_fails_with_queue_full() {
    let server = Server::start();
    server
        .run(&["queue", "create", "q", "--capacity", "1"])
        .ok();
    server.run(&["offer", "q", "first"]).ok();
    let out = server.run(&["offer", "q", "second"]);
    let stderr = out.fails_with(1);
    assert!(stderr.starts_with("error: queue_full: "), "{stderr}");
    let out = server.run(&["offer", "q", "second", "--wait", "100ms"]);
    assert!(out.fails_with(1).starts_with("error: queue_full: "));
    let stats = server.stats();
    assert_eq!(entry(&stats, "queues", "q")["rejected"], 2);
    assert_eq!(server.run(&["poll", "q"]).ok(), "first\n");
}

#[test]
fn circular_queue_overwrites_the_oldest() {
    let server = Server::start();
    server
        .run(&["queue", "create", "ring", "--capacity", "2", "--circular"])
        .ok();
    for text in ["a", "b", "c"] {
        server.run(&["offer", "ring", text]).ok();
    }
    let stats = server.stats();
    let q = entry(&stats, "queues", "ring");
    assert_eq!(q["overwritten"], 1);
    assert_eq!(q["size"], 2);
    let out = server.run(&["poll", "ring", "--count", "2", "--wait", "1s"]);
    assert_eq!(out.ok(), "b\nc\n");
}

#[test]
fn expired_messages_are_never_polled() {
    let server = Server::start();
    server
        .run(&["queue", "create", "q", "--capacity", "10"])
        .ok();
    // The ttl counts from the message's creation, before the command connects.
    let out = server.run(&["offer", "q", "short-lived", "--ttl", "150ms"]);
    let offered = Instant::now();
    if !out.status.success() {
        // A very slow start can let it expire before it reaches the broker.
        assert!(out.stderr.starts_with("error: expired: "), "{}", out.stderr);
    }
    server.run(&["offer", "q", "durable-enough"]).ok();
    thread::sleep(Duration::from_millis(300).saturating_sub(offered.elapsed()));
    let out = server.run(&["poll", "q", "--count", "1", "--wait", "0s"]);
    assert_eq!(out.ok(), "durable-enough\n");
    let out = server.run(&["poll", "q", "--wait", "0s"]);
    assert!(out.fails_with(1).starts_with("error: queue_empty: "));
}

#[test]
fn too_large_offer_fails_and_the_server_keeps_serving() {
    let server = Server::start_with(&["--max-message-size", "1MiB"]);
    server
        .run(&["queue", "create", "q", "--capacity", "4"])
        .ok();
    let big = server.dir.path().join("big.bin");
    std::fs::write(&big, vec![7u8; 2 * 1024 * 1024]).expect("write big file");
    let out = server.run(&["offer", "q", "--file", big.to_str().expect("utf-8 path")]);
    let stderr = out.fails_with(1);
    assert!(stderr.starts_with("error: too_large: "), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    // The next commands on the same server work, and so does a message under the limit.
    let small = server.dir.path().join("small.bin");
    std::fs::write(&small, vec![7u8; 512 * 1024]).expect("write small file");
    server
        .run(&["offer", "q", "--file", small.to_str().expect("utf-8 path")])
        .ok();
    let out = server.run(&["queue", "status", "q", "--json"]);
    assert_eq!(out.json_lines()[0]["size"], 1);
    let out = server.run(&["poll", "q"]);
    assert_eq!(out.ok(), "<524288 bytes binary application/octet-stream>\n");
}
