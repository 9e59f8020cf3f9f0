//! Connections, limits, errors, shutdown and statistics of an embedded
//! broker, over every transport.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{assert_status, eventually, start, status, step, text, within, Harness};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tubeway::ops::QueueKind;
use tubeway::{AsyncClient, BrokerConfig, Error, Message, MessageType, ResponseStatus};
use tubeway_proto::{codec, ops, Decoded};
use tubeway_transport::FrameReader;

crate::transport_tests! {
    bad_names_are_bad_requests,
    create_conflicts,
    too_large_messages with BrokerConfig::default().max_message_size(64 * 1024),
    connection_limit_counts_live_connections with BrokerConfig::default().max_connections(2),
    broker_going_away_fails_pending_calls
        with BrokerConfig::default().shutdown_timeout(Duration::from_millis(300)),
    graceful_shutdown with BrokerConfig::default().shutdown_timeout(Duration::from_secs(3)),
    graceful_shutdown_lets_remote_worker_calls_finish
        with BrokerConfig::default().shutdown_timeout(Duration::from_secs(3)),
    graceful_shutdown_answers_calls_waiting_for_a_worker
        with BrokerConfig::default().shutdown_timeout(Duration::from_secs(3)),
    shutdown_is_not_held_up_by_clients_that_keep_sending
        with BrokerConfig::default().shutdown_timeout(Duration::from_secs(3)),
    statistics,
    error_responses_over_the_wire with BrokerConfig::default().max_message_size(64 * 1024),
    handshake_refusals,
    silent_connection_is_closed_after_the_handshake_timeout
        with BrokerConfig::default().handshake_timeout(Duration::from_millis(200)),
    vanished_poller_does_not_take_a_message,
}

const SHORT: Duration = Duration::from_secs(1);

async fn bad_names_are_bad_requests(h: &Harness) {
    let c = h.client().await;
    let long = "x".repeat(300);
    let bad = ["", "a b", "tab\there", "line\nbreak", "nbsp\u{a0}x", &long];
    for name in bad {
        assert_status(
            step(c.create_queue(name, 10, QueueKind::Bounded)).await,
            ResponseStatus::BadRequest,
        );
        assert_status(step(c.create_topic(name)).await, ResponseStatus::BadRequest);
        assert_status(
            step(c.send(name, Message::plain_text("x"))).await,
            ResponseStatus::BadRequest,
        );
        assert_status(
            step(c.offer(name, Message::plain_text("x"), SHORT)).await,
            ResponseStatus::BadRequest,
        );
        assert_status(step(c.poll(name, SHORT)).await, ResponseStatus::BadRequest);
        assert_status(
            step(c.publish(name, Message::plain_text("x"))).await,
            ResponseStatus::BadRequest,
        );
        assert_status(step(c.serve(name, Ok)).await, ResponseStatus::BadRequest);
        let e = h.broker.create_function(name, Ok).unwrap_err();
        assert_eq!(e.status, ResponseStatus::BadRequest);
    }
    // 255 bytes is the longest name; UTF-8 is fine.
    let longest = "q".repeat(255);
    step(c.create_queue(&longest, 10, QueueKind::Bounded))
        .await
        .unwrap();
    assert_status(
        step(c.create_queue(&"q".repeat(256), 10, QueueKind::Bounded)).await,
        ResponseStatus::BadRequest,
    );
    step(c.create_topic("übung.événements/1")).await.unwrap();
    // A missing destination and impossible settings are bad requests too.
    let resp = step(c.request(Message::new(MessageType::Poll)))
        .await
        .unwrap();
    assert_eq!(resp.status(), ResponseStatus::BadRequest);
    assert_status(
        step(c.create_queue("zero", 0, QueueKind::Bounded)).await,
        ResponseStatus::BadRequest,
    );
    let durable = Message::serialize(&ops::CreateQueue {
        capacity: 10,
        kind: QueueKind::Bounded,
        durable: true,
    })
    .unwrap()
    .with_type(MessageType::CreateQueue)
    .with_destination("durable");
    let resp = step(c.request(durable)).await.unwrap();
    assert_eq!(resp.status(), ResponseStatus::BadRequest);
    // None of this broke the connection or created anything.
    step(c.ping()).await.unwrap();
    let names: Vec<String> = step(c.list_queues())
        .await
        .unwrap()
        .into_iter()
        .map(|q| q.name)
        .collect();
    assert_eq!(names, [longest]);
}

async fn create_conflicts(h: &Harness) {
    let c = h.client().await;
    step(c.create_queue("c", 10, QueueKind::Bounded))
        .await
        .unwrap();
    // Same settings: accepted, nothing changes.
    step(c.create_queue("c", 10, QueueKind::Bounded))
        .await
        .unwrap();
    assert_status(
        step(c.create_queue("c", 10, QueueKind::Circular)).await,
        ResponseStatus::Conflict,
    );
    assert_status(
        step(c.create_queue("c", 20, QueueKind::Bounded)).await,
        ResponseStatus::Conflict,
    );
    let e = h
        .broker
        .create_queue("c", 5, QueueKind::Bounded)
        .unwrap_err();
    assert_eq!(e.status, ResponseStatus::Conflict);
    let status = step(c.queue_status("c")).await.unwrap();
    assert_eq!((status.capacity, status.kind), (10, QueueKind::Bounded));

    h.broker.create_function("f", Ok).unwrap();
    let e = h.broker.create_function("f", Ok).unwrap_err();
    assert_eq!(e.status, ResponseStatus::Conflict);
    assert_status(step(c.serve("f", Ok)).await, ResponseStatus::Conflict);
}

async fn too_large_messages(h: &Harness) {
    const MAX: usize = 64 * 1024;
    let big = bytes::Bytes::from(vec![7u8; 100 * 1024]);
    h.broker
        .create_function("big-answer", {
            let big = big.clone();
            move |_| Ok(Message::binary(big.clone(), None))
        })
        .unwrap();
    let c = h.client().await;
    assert_eq!(c.max_message_size(), MAX);
    assert_eq!(c.welcome().max_message_size, MAX as u64);
    step(c.create_queue("q", 10, QueueKind::Bounded))
        .await
        .unwrap();
    step(c.create_topic("t")).await.unwrap();

    // Refused by the client before anything is sent.
    let before = step(c.stats()).await.unwrap();
    for r in [
        step(c.offer("q", Message::binary(big.clone(), None), SHORT)).await,
        step(c.publish("t", Message::binary(big.clone(), None))).await,
        step(c.send("big-answer", Message::binary(big.clone(), None)))
            .await
            .map(drop),
    ] {
        match r {
            Err(Error::TooLarge { len, max }) => {
                assert_eq!(max, MAX);
                assert!(len > 100 * 1024, "{len}");
            }
            other => panic!("expected a local TooLarge, got {other:?}"),
        }
    }
    let after = step(c.stats()).await.unwrap();
    assert_eq!(
        after.messages_in - before.messages_in,
        1,
        "only the second stats request reached the broker"
    );
    assert_eq!(step(c.queue_status("q")).await.unwrap().size, 0);

    // The connection is fine, and a message just under the limit passes.
    let fits = Message::binary(vec![1u8; MAX - 1024], None);
    step(c.offer("q", fits, SHORT)).await.unwrap();
    let got = step(c.poll("q", SHORT)).await.unwrap().unwrap();
    assert_eq!(got.payload.len(), MAX - 1024);

    // An answer the broker cannot send becomes too_large for the caller.
    let r = step(c.send("big-answer", Message::plain_text("small"))).await;
    assert_status(r, ResponseStatus::TooLarge);
    // Likewise an answer a remote worker cannot send.
    let worker_client = h.client().await;
    let _w = step(worker_client.serve("big-remote", move |_| {
        Ok(Message::binary(big.clone(), None))
    }))
    .await
    .unwrap();
    let r = step(c.send("big-remote", Message::plain_text("small"))).await;
    assert_eq!(status(&r.unwrap_err()), ResponseStatus::TooLarge);
    step(c.ping()).await.unwrap();
}

async fn connection_limit_counts_live_connections(h: &Harness) {
    let c1 = h.client().await;
    let c2 = h.client().await;
    match step(AsyncClient::connect(&h.url)).await {
        Err(Error::Handshake(reason)) => {
            assert!(reason.contains("unavailable"), "{reason}");
        }
        other => panic!("expected the third connection refused, got {other:?}"),
    }
    let stats = step(c2.stats()).await.unwrap();
    assert_eq!(stats.connections_rejected, 1);
    // The limit counts live connections: closing one makes room.
    step(c1.close()).await;
    eventually("the closed and the refused connections are gone", || {
        let c2 = c2.clone();
        async move { c2.stats().await.unwrap().connections == 1 }
    })
    .await;
    let c3 = h.client().await;
    step(c3.ping()).await.unwrap();
    assert!(step(AsyncClient::connect(&h.url)).await.is_err());
    step(c2.ping()).await.unwrap();
}

async fn broker_going_away_fails_pending_calls(h: &Harness) {
    let (started_tx, mut started_rx) = mpsc::unbounded_channel::<()>();
    h.broker
        .create_async_function("hang", move |_m: Message| {
            let started = started_tx.clone();
            async move {
                started.send(()).unwrap();
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok(Message::plain_text("never"))
            }
        })
        .unwrap();
    let c = h.client().await;
    step(c.create_queue("q", 10, QueueKind::Bounded))
        .await
        .unwrap();
    step(c.create_topic("t")).await.unwrap();
    let mut sub = step(c.subscribe("t")).await.unwrap();
    let call = {
        let c = c.clone();
        tokio::spawn(async move {
            c.send_timeout("hang", Message::plain_text("x"), Duration::from_secs(25))
                .await
        })
    };
    step(started_rx.recv()).await.unwrap();
    let mut poll = Box::pin(c.poll("q", Duration::from_secs(25)));
    start(&mut poll).await;
    step(c.ping()).await.unwrap(); // the poll is parked at the broker

    let t0 = Instant::now();
    within(Duration::from_secs(3), h.broker.shutdown()).await;
    let bound = Duration::from_secs(3);
    // The waiting poll is answered; the call that cannot finish fails when
    // the connection closes; the subscription ends. Nothing hangs.
    assert_status(within(bound, poll).await, ResponseStatus::Unavailable);
    match within(bound, call).await.unwrap() {
        Err(Error::ConnectionClosed(_)) => {}
        Err(e) if e.status() == Some(ResponseStatus::Unavailable) => {}
        other => panic!("expected the call to fail with the connection, got {other:?}"),
    }
    assert!(within(bound, sub.recv()).await.is_none());
    assert!(t0.elapsed() < bound, "took {:?}", t0.elapsed());
    within(bound, c.closed()).await;
    assert!(c.is_closed());
    match step(c.ping()).await {
        Err(Error::ConnectionClosed(_)) => {}
        other => panic!("expected ConnectionClosed, got {other:?}"),
    }
}

async fn graceful_shutdown(h: &Harness) {
    let (started_tx, mut started_rx) = mpsc::unbounded_channel::<()>();
    h.broker
        .create_async_function("slow", move |m: Message| {
            let started = started_tx.clone();
            async move {
                started.send(()).unwrap();
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok(Message::plain_text(format!("done {}", m.text_payload()?)))
            }
        })
        .unwrap();
    let caller = h.client().await;
    let call = {
        let c = caller.clone();
        tokio::spawn(async move { c.send("slow", Message::plain_text("job")).await })
    };
    step(started_rx.recv()).await.unwrap();
    let poller = h.client().await;
    step(poller.create_queue("q", 10, QueueKind::Bounded))
        .await
        .unwrap();
    let mut poll = Box::pin(poller.poll("q", Duration::from_secs(25)));
    start(&mut poll).await;
    step(poller.ping()).await.unwrap(); // the poll is parked at the broker
                                        // An offer waiting for room in a full queue.
    step(poller.create_queue("full", 1, QueueKind::Bounded))
        .await
        .unwrap();
    step(poller.offer("full", Message::plain_text("x"), SHORT))
        .await
        .unwrap();
    let mut offer =
        Box::pin(poller.offer("full", Message::plain_text("y"), Duration::from_secs(25)));
    start(&mut offer).await;
    step(poller.ping()).await.unwrap(); // the offer is parked at the broker
    let subscriber = h.client().await;
    step(subscriber.create_topic("t")).await.unwrap();
    let mut sub = step(subscriber.subscribe("t")).await.unwrap();

    let grace = h.broker.config().shutdown_timeout;
    let t0 = Instant::now();
    within(grace + Duration::from_secs(2), h.broker.shutdown()).await;
    let took = t0.elapsed();
    assert!(h.broker.is_shut_down());
    // The call in flight finished with its answer.
    let answer = step(call).await.unwrap().unwrap();
    assert_eq!(text(&answer), "done job");
    // It did not need the whole grace period.
    assert!(took < grace, "shutdown took {took:?}");
    assert_status(step(poll).await, ResponseStatus::Unavailable);
    assert_status(step(offer).await, ResponseStatus::Unavailable);
    assert!(step(sub.recv()).await.is_none());
    // Nothing is served any more.
    assert!(step(AsyncClient::connect(&h.url)).await.is_err());
    let listen: tubeway::Url = h.url.parse().unwrap();
    assert!(h.broker.listen(&listen).await.is_err());
}

/// A connection whose requests keep arriving (frames always ready to read,
/// so its reader never waits) still learns of the shutdown: it is closed
/// and the shutdown finishes well inside the grace period.
async fn shutdown_is_not_held_up_by_clients_that_keep_sending(h: &Harness) {
    let mut raw = Raw::connect(h).await;
    raw.send(&hello(1, 1)).await;
    assert_eq!(raw.recv().await.status(), ResponseStatus::Ok);
    let mut ping = Message::new(MessageType::Ping);
    ping.oneway = true;
    let frame = codec::encode(&ping, 1024).unwrap().to_vec();
    let burst = frame.repeat(1000);
    let Raw { frames, mut writer } = raw;
    // Oneway pings get no answer, so nothing ever waits for this side to read.
    let flood = tokio::spawn(async move { while writer.write_all(&burst).await.is_ok() {} });
    let c = h.client().await;
    let sent = step(c.stats()).await.unwrap().messages_in;
    eventually("the pings are flowing", || {
        let c = c.clone();
        async move { step(c.stats()).await.unwrap().messages_in > sent + 10_000 }
    })
    .await;
    let grace = h.broker.config().shutdown_timeout;
    let t0 = Instant::now();
    within(grace + Duration::from_secs(2), h.broker.shutdown()).await;
    assert!(t0.elapsed() < grace, "shutdown took {:?}", t0.elapsed());
    step(flood).await.unwrap();
    drop(frames);
}

/// Serves `name` on `client`: each call reports that it started, then
/// answers "done" 300 ms later.
async fn slow_worker(
    client: &AsyncClient,
    name: &str,
) -> (tubeway::Worker, mpsc::UnboundedReceiver<()>) {
    let (started_tx, started_rx) = mpsc::unbounded_channel::<()>();
    let worker = step(client.serve_async(name, move |_m: Message| {
        let started = started_tx.clone();
        async move {
            started.send(()).unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(Message::plain_text("done"))
        }
    }))
    .await
    .unwrap();
    (worker, started_rx)
}

/// Graceful shutdown lets calls in flight finish, as `graceful_shutdown`
/// checks for a handler inside the broker; a call forwarded to a remote
/// worker must finish too. The broker stops reading every connection at
/// shutdown, the worker's included, so the worker's answer is never read;
/// and the worker's session, having no requests of its own in flight,
/// closes at once and fails the forwarded call with `server_error`
/// ("worker disconnected before answering") within a millisecond.
async fn graceful_shutdown_lets_remote_worker_calls_finish(h: &Harness) {
    let worker_client = h.client().await;
    let (_w, mut started_rx) = slow_worker(&worker_client, "slow").await;
    let caller = h.client().await;
    let call = {
        let c = caller.clone();
        tokio::spawn(async move { c.send("slow", Message::plain_text("job")).await })
    };
    step(started_rx.recv()).await.unwrap();
    let grace = h.broker.config().shutdown_timeout;
    within(grace + Duration::from_secs(2), h.broker.shutdown()).await;
    let answer = step(call).await.unwrap();
    assert_eq!(text(&answer.unwrap()), "done");
}

/// A call held at the broker for a worker with room is answered
/// `unavailable` at shutdown, as a waiting poll or offer is; it does not
/// keep the shutdown waiting, and the call already forwarded finishes.
async fn graceful_shutdown_answers_calls_waiting_for_a_worker(h: &Harness) {
    let options = tubeway::ClientOptions {
        max_worker_calls: Some(1),
        ..h.client_options()
    };
    let worker_client = h.client_with(options).await;
    let (_w, mut started_rx) = slow_worker(&worker_client, "one").await;
    let caller = h.client().await;
    let call = |text: &'static str| {
        let c = caller.clone();
        tokio::spawn(async move { c.send("one", Message::plain_text(text)).await })
    };
    let first = call("first");
    step(started_rx.recv()).await.unwrap();
    let second = call("second");
    eventually("the second call waits at the broker", || {
        let c = caller.clone();
        async move { matches!(c.function_status("one").await, Ok(s) if s.waiting == 1) }
    })
    .await;
    let grace = h.broker.config().shutdown_timeout;
    let t0 = Instant::now();
    within(grace + Duration::from_secs(2), h.broker.shutdown()).await;
    assert!(t0.elapsed() < grace, "shutdown took {:?}", t0.elapsed());
    assert_status(step(second).await.unwrap(), ResponseStatus::Unavailable);
    assert_eq!(text(&step(first).await.unwrap().unwrap()), "done");
}

async fn statistics(h: &Harness) {
    h.broker.create_function("echo", Ok).unwrap();
    let c = h.client().await;
    let s0 = step(c.stats()).await.unwrap();
    assert_eq!(s0.connections, 1);
    let other = h.client().await;
    let s1 = step(c.stats()).await.unwrap();
    assert_eq!(s1.connections, 2);
    assert_eq!(s1.connections_total, 2);
    assert!(s1.uptime_ms >= s0.uptime_ms);

    // Exactly the frames exchanged: a ping and the next stats request in,
    // the answers to the last stats request and to the ping out.
    step(c.ping()).await.unwrap();
    let s2 = step(c.stats()).await.unwrap();
    assert_eq!(s2.messages_in - s1.messages_in, 2);
    assert_eq!(s2.messages_out - s1.messages_out, 2);

    step(c.create_queue("q", 10, QueueKind::Bounded))
        .await
        .unwrap();
    for i in 0..3 {
        step(c.offer("q", Message::plain_text(i.to_string()), SHORT))
            .await
            .unwrap();
    }
    for _ in 0..2 {
        step(other.poll("q", SHORT)).await.unwrap().unwrap();
    }
    step(c.send("echo", Message::plain_text("x")))
        .await
        .unwrap();
    step(c.send("missing", Message::plain_text("x")))
        .await
        .unwrap_err();
    let s3 = step(c.stats()).await.unwrap();
    let q = s3.queues.iter().find(|q| q.status.name == "q").unwrap();
    assert_eq!(
        (q.offered, q.polled, q.status.size, q.rejected, q.expired),
        (3, 2, 1, 0, 0)
    );
    let f = s3.functions.iter().find(|f| f.name == "echo").unwrap();
    assert_eq!((f.calls, f.errors), (1, 0));
    assert_eq!(s3.errors - s2.errors, 1);
    assert!(s3.messages_in > s2.messages_in && s3.messages_out > s2.messages_out);

    step(other.close()).await;
    eventually("the closed connection is no longer counted", || {
        let c = c.clone();
        async move { c.stats().await.unwrap().connections == 1 }
    })
    .await;
    // The embedded broker reports the same numbers.
    let local = h.broker.stats();
    assert_eq!(local.connections, 1);
    assert_eq!(local.connections_total, 2);
    // A closed connection's messages stay counted: since s3, at least one
    // more stats request came in and its answer went out.
    assert!(local.messages_in > s3.messages_in, "{local:?} after {s3:?}");
    assert!(
        local.messages_out > s3.messages_out,
        "{local:?} after {s3:?}"
    );
    // And the counts are exact across the two: one request in since, its
    // answer not out yet when the numbers were taken.
    let again = step(c.stats()).await.unwrap();
    assert_eq!(again.messages_in, local.messages_in + 1);
    assert_eq!(again.messages_out, local.messages_out);
}

/// Sends `msg` and checks the answer has `expected` and the shape every
/// response has: correlated, request id echoed, a text reason on errors.
async fn expect_answer(c: &AsyncClient, msg: Message, expected: ResponseStatus) {
    let msg = msg.with_request_id(format!("rid-{expected}"));
    let id = msg.id;
    let r = step(c.request(msg)).await.unwrap();
    assert_eq!(r.status(), expected, "reason: {:?}", r.text_payload());
    assert_eq!(r.r#type, MessageType::Response);
    assert_eq!(r.correlation_id, Some(id));
    assert_eq!(r.request_id, Some(format!("rid-{expected}")));
    assert_ne!(r.id, id);
    if expected != ResponseStatus::Ok {
        assert_eq!(r.payload_mimetype.as_deref(), Some(tubeway::MIME_TEXT));
        assert!(!text(&r).is_empty(), "{expected} without a reason");
    }
}

async fn error_responses_over_the_wire(h: &Harness) {
    h.broker
        .create_function("fails", |_| Err("nope".into()))
        .unwrap();
    h.broker
        .create_function("big-answer", |_| {
            Ok(Message::binary(vec![0u8; 100 * 1024], None))
        })
        .unwrap();
    h.broker
        .create_async_function("slow", |_m: Message| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(Message::plain_text("late"))
        })
        .unwrap();
    let c = h.client().await;
    step(c.create_queue("full", 1, QueueKind::Bounded))
        .await
        .unwrap();
    step(c.offer("full", Message::plain_text("x"), SHORT))
        .await
        .unwrap();
    step(c.create_queue("empty", 1, QueueKind::Bounded))
        .await
        .unwrap();
    let op = |t: MessageType, dest: &str| Message::new(t).with_destination(dest);
    let call = |f: &str| Message::plain_text("x").with_destination(f);

    expect_answer(&c, Message::new(MessageType::Ping), ResponseStatus::Ok).await;
    expect_answer(
        &c,
        op(MessageType::TopicStatus, "a b"),
        ResponseStatus::BadRequest,
    )
    .await;
    expect_answer(&c, call("fails"), ResponseStatus::HandlerError).await;
    expect_answer(
        &c,
        op(MessageType::Poll, "nowhere"),
        ResponseStatus::QueueNotFound,
    )
    .await;
    expect_answer(
        &c,
        op(MessageType::Poll, "empty"),
        ResponseStatus::QueueEmpty,
    )
    .await;
    let offer = Message::plain_text("y").with_type(MessageType::Offer);
    expect_answer(
        &c,
        offer
            .with_destination("full")
            .with_timeout(Duration::from_millis(20)),
        ResponseStatus::QueueFull,
    )
    .await;
    expect_answer(
        &c,
        op(MessageType::Publish, "nowhere"),
        ResponseStatus::TopicNotFound,
    )
    .await;
    expect_answer(&c, call("nowhere"), ResponseStatus::FunctionNotFound).await;
    expect_answer(&c, call("big-answer"), ResponseStatus::TooLarge).await;
    expect_answer(
        &c,
        call("slow").with_timeout(Duration::from_millis(50)),
        ResponseStatus::Timeout,
    )
    .await;
    let conflicting = Message::serialize(&ops::CreateQueue {
        capacity: 2,
        kind: QueueKind::Bounded,
        durable: false,
    })
    .unwrap()
    .with_type(MessageType::CreateQueue)
    .with_destination("full");
    expect_answer(&c, conflicting, ResponseStatus::Conflict).await;
    let mut stale = call("fails");
    stale.expires_at = Some(stale.timestamp - 1);
    expect_answer(&c, stale, ResponseStatus::Expired).await;
    let bad_text = Message::binary(vec![0xff, 0xfe], None);
    let mut bad_text = bad_text
        .with_type(MessageType::Publish)
        .with_destination("t");
    bad_text.payload_mimetype = Some(tubeway::MIME_TEXT.into());
    bad_text.payload_charset = Some("utf-8".into());
    expect_answer(&c, bad_text, ResponseStatus::BadRequest).await;

    // unavailable: a parked poll when the broker shuts down.
    let parked = op(MessageType::Poll, "empty")
        .with_timeout(Duration::from_secs(20))
        .with_request_id("parked");
    let parked_id = parked.id;
    let mut waiting = Box::pin(c.request(parked));
    start(&mut waiting).await;
    step(c.ping()).await.unwrap();
    h.shutdown().await;
    let r = step(waiting).await.unwrap();
    assert_eq!(r.status(), ResponseStatus::Unavailable);
    assert_eq!(r.correlation_id, Some(parked_id));
    assert_eq!(r.request_id.as_deref(), Some("parked"));
    assert!(!text(&r).is_empty());
}

/// A connection that speaks the protocol by hand.
struct Raw {
    frames: FrameReader,
    writer: tubeway_transport::WriteHalf,
}

impl Raw {
    async fn connect(h: &Harness) -> Raw {
        let url: tubeway::Url = h.url.parse().unwrap();
        let conn = step(tubeway_transport::connect(&url)).await.unwrap();
        Raw {
            frames: FrameReader::new(conn.reader, tubeway_proto::DEFAULT_MAX_MESSAGE_SIZE),
            writer: conn.writer,
        }
    }

    async fn send(&mut self, m: &Message) {
        let frame = codec::encode(m, tubeway_proto::DEFAULT_MAX_MESSAGE_SIZE).unwrap();
        step(self.writer.write_all(&frame.to_vec())).await.unwrap();
        step(self.writer.flush()).await.unwrap();
    }

    async fn recv(&mut self) -> Message {
        match step(self.frames.next()).await {
            Ok(Some(Decoded::Message(m))) => *m,
            other => panic!("expected a message, got {other:?}"),
        }
    }

    /// Waits for the broker to close the connection.
    async fn expect_closed(&mut self) {
        match step(self.frames.next()).await {
            Ok(None) | Err(_) => {}
            Ok(Some(other)) => panic!("expected the connection closed, got {other:?}"),
        }
    }
}

fn hello(min_version: u8, max_version: u8) -> Message {
    Message::serialize(&ops::Hello {
        min_version,
        max_version,
        ..ops::Hello::default()
    })
    .unwrap()
    .with_type(MessageType::Hello)
}

async fn handshake_refusals(h: &Harness) {
    // No version in common.
    let mut raw = Raw::connect(h).await;
    let m = hello(2, 3);
    raw.send(&m).await;
    let r = raw.recv().await;
    assert_eq!(r.status(), ResponseStatus::UnsupportedVersion);
    assert_eq!(r.correlation_id, Some(m.id));
    raw.expect_closed().await;

    // Something else than hello first.
    let mut raw = Raw::connect(h).await;
    let ping = Message::new(MessageType::Ping);
    raw.send(&ping).await;
    let r = raw.recv().await;
    assert_eq!(r.status(), ResponseStatus::BadRequest);
    raw.expect_closed().await;

    // A proper hello is welcomed with the capabilities both sides have.
    let mut raw = Raw::connect(h).await;
    let m = Message::serialize(&ops::Hello {
        min_version: 1,
        max_version: 5,
        capabilities: vec!["ping".into(), "teleport".into()],
        client: "raw".into(),
    })
    .unwrap()
    .with_type(MessageType::Hello);
    raw.send(&m).await;
    let r = raw.recv().await;
    assert_eq!(r.status(), ResponseStatus::Ok);
    let welcome: ops::Welcome = r.data_payload_as().unwrap();
    assert_eq!(welcome.version, 1);
    assert_eq!(welcome.capabilities, ["ping"]);
    assert_eq!(
        welcome.max_message_size,
        tubeway_proto::DEFAULT_MAX_MESSAGE_SIZE as u64
    );

    let c = h.client().await;
    let stats = step(c.stats()).await.unwrap();
    assert_eq!(stats.connections_rejected, 2);
}

async fn silent_connection_is_closed_after_the_handshake_timeout(h: &Harness) {
    let t0 = Instant::now();
    let mut raw = Raw::connect(h).await;
    raw.expect_closed().await;
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(200), "closed after {took:?}");
    assert!(took < Duration::from_secs(3), "closed after {took:?}");
    let c = h.client().await;
    let stats = step(c.stats()).await.unwrap();
    assert_eq!(stats.connections_rejected, 1);
}

async fn vanished_poller_does_not_take_a_message(h: &Harness) {
    let producer = h.client().await;
    step(producer.create_queue("q", 10, QueueKind::Bounded))
        .await
        .unwrap();
    let poller = h.client().await;
    let mut poll = Box::pin(poller.poll("q", Duration::from_secs(20)));
    start(&mut poll).await;
    step(poller.ping()).await.unwrap(); // parked at the broker
    step(poller.close()).await;
    match step(poll).await {
        Err(Error::ConnectionClosed(_)) => {}
        other => panic!("expected ConnectionClosed, got {other:?}"),
    }
    eventually("the poller's connection is gone", || {
        let p = producer.clone();
        async move { p.stats().await.unwrap().connections == 1 }
    })
    .await;
    step(producer.offer("q", Message::plain_text("kept"), SHORT))
        .await
        .unwrap();
    let m = step(producer.poll("q", SHORT)).await.unwrap().unwrap();
    assert_eq!(text(&m), "kept");
}
