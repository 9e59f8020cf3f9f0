//! Publish/subscribe topics through an embedded broker, over every transport.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{assert_status, eventually, on_thread, step, text, within, Harness};
use tokio::sync::mpsc;
use tubeway::{Client, Message, MessageType, ResponseStatus, Subscription};

crate::transport_tests! {
    fan_out_to_three_subscribers_in_order,
    stalled_subscriber_does_not_slow_the_others,
    unsubscribe_stops_deliveries,
    dropped_subscription_is_removed,
    remove_topic_ends_subscriptions,
    unknown_topic,
    embedded_subscriber_receives_remote_publishes,
    delivery_keeps_the_published_fields,
    blocking_client_subscribes,
    a_handler_subscription_ends_after_the_handlers_last_call,
    embedded_subscriber_survives_a_panicking_handler,
    oneway_messages_go_out_while_their_sender_idles,
}

/// Receives `n` deliveries and returns their texts.
async fn take(sub: &mut Subscription, n: usize) -> Vec<String> {
    let mut got = Vec::with_capacity(n);
    for _ in 0..n {
        let m = within(Duration::from_secs(10), sub.recv())
            .await
            .expect("a delivery");
        assert_eq!(m.r#type, MessageType::Publish);
        assert_eq!(m.correlation_id, Some(sub.id()));
        got.push(text(&m));
    }
    got
}

fn numbers(n: usize) -> Vec<String> {
    (0..n).map(|i| i.to_string()).collect()
}

async fn fan_out_to_three_subscribers_in_order(h: &Harness) {
    const N: usize = 1000;
    let publisher = h.client().await;
    step(publisher.create_topic("news")).await.unwrap();
    let mut readers = tokio::task::JoinSet::new();
    for _ in 0..3 {
        let c = h.client().await;
        let mut sub = step(c.subscribe("news")).await.unwrap();
        readers.spawn(async move {
            let got = take(&mut sub, N).await;
            drop(c);
            got
        });
    }
    assert_eq!(
        step(publisher.topic_status("news"))
            .await
            .unwrap()
            .subscribers,
        3
    );
    for i in 0..N {
        step(publisher.publish("news", Message::plain_text(i.to_string())))
            .await
            .unwrap();
    }
    while let Some(r) = step(readers.join_next()).await {
        assert_eq!(r.unwrap(), numbers(N));
    }
    let status = step(publisher.topic_status("news")).await.unwrap();
    assert_eq!(
        (status.published, status.delivered, status.dropped),
        (N as u64, 3 * N as u64, 0)
    );
}

async fn stalled_subscriber_does_not_slow_the_others(h: &Harness) {
    const N: usize = 5000;
    // Large enough that what the stalled subscriber's connection can hold
    // (the broker's write queue, socket or pipe buffers) is far less than N
    // messages, so its broker-side buffer overflows.
    let padding = bytes::Bytes::from(vec![b'.'; 8 * 1024]);
    let publisher = h.client().await;
    step(publisher.create_topic("firehose")).await.unwrap();
    // Subscribed on a connection of its own and never read.
    let stalled_client = h.client().await;
    let _stalled = step(stalled_client.subscribe_with_buffer("firehose", 8))
        .await
        .unwrap();
    let mut readers = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let c = h.client().await;
        // Room for everything: these must not lose a message, however
        // loaded the machine.
        let mut sub = step(c.subscribe_with_buffer("firehose", N)).await.unwrap();
        readers.spawn(async move {
            let mut got = Vec::with_capacity(N);
            for _ in 0..N {
                let m = within(Duration::from_secs(10), sub.recv())
                    .await
                    .expect("a delivery");
                assert_eq!(m.payload.len(), 8 * 1024);
                got.push(m.request_id.unwrap());
            }
            (got, sub, c)
        });
    }
    for i in 0..N {
        let m = Message::binary(padding.clone(), None).with_request_id(i.to_string());
        within(Duration::from_secs(2), publisher.publish("firehose", m))
            .await
            .unwrap();
    }
    let mut live = Vec::new();
    while let Some(r) = step(readers.join_next()).await {
        let (got, sub, c) = r.unwrap();
        assert_eq!(got, numbers(N));
        live.push((sub, c));
    }
    // Counters are updated before each publish is answered: settled now.
    let status = step(publisher.topic_status("firehose")).await.unwrap();
    assert_eq!(status.subscribers, 3);
    assert_eq!(status.published, N as u64);
    assert!(status.dropped > 0, "no drops counted: {status:?}");
    assert_eq!(
        status.delivered + status.dropped,
        3 * N as u64,
        "{status:?}"
    );
    assert!(status.delivered >= 2 * N as u64, "{status:?}");
    let stats = step(publisher.stats()).await.unwrap();
    let t = stats.topics.iter().find(|t| t.name == "firehose").unwrap();
    assert_eq!(t, &status);
}

async fn unsubscribe_stops_deliveries(h: &Harness) {
    let c = h.client().await;
    step(c.create_topic("t")).await.unwrap();
    let mut leaving = step(c.subscribe("t")).await.unwrap();
    let mut staying = step(c.subscribe("t")).await.unwrap();
    step(c.publish("t", Message::plain_text("a")))
        .await
        .unwrap();
    assert_eq!(take(&mut leaving, 1).await, ["a"]);
    assert_eq!(take(&mut staying, 1).await, ["a"]);

    step(leaving.unsubscribe()).await.unwrap();
    let before = step(c.topic_status("t")).await.unwrap();
    assert_eq!(before.subscribers, 1);
    step(c.publish("t", Message::plain_text("b")))
        .await
        .unwrap();
    step(c.publish("t", Message::plain_text("c")))
        .await
        .unwrap();
    assert_eq!(take(&mut staying, 2).await, ["b", "c"]);
    let after = step(c.topic_status("t")).await.unwrap();
    // One delivery per publish: nothing went to the ended subscription.
    assert_eq!(after.delivered - before.delivered, 2);
    assert_eq!(after.dropped, 0);

    // Unsubscribing what is not subscribed is a bad request.
    let mut bogus = Message::new(MessageType::Unsubscribe).with_destination("t");
    bogus.correlation_id = Some(uuid::Uuid::new_v4());
    let resp = step(c.request(bogus)).await.unwrap();
    assert_eq!(resp.status(), ResponseStatus::BadRequest);
}

async fn dropped_subscription_is_removed(h: &Harness) {
    let c = h.client().await;
    step(c.create_topic("t")).await.unwrap();
    let sub = step(c.subscribe("t")).await.unwrap();
    let other = h.client().await;
    let _kept = step(other.subscribe("t")).await.unwrap();
    assert_eq!(step(c.topic_status("t")).await.unwrap().subscribers, 2);
    drop(sub);
    eventually("the dropped subscription is removed", || {
        let c = c.clone();
        async move { c.topic_status("t").await.unwrap().subscribers == 1 }
    })
    .await;
    // A subscriber's connection closing removes its subscriptions too.
    step(other.close()).await;
    eventually("the closed connection's subscription is removed", || {
        let c = c.clone();
        async move { c.topic_status("t").await.unwrap().subscribers == 0 }
    })
    .await;
}

async fn remove_topic_ends_subscriptions(h: &Harness) {
    let c = h.client().await;
    step(c.create_topic("doomed")).await.unwrap();
    let mut sub = step(c.subscribe("doomed")).await.unwrap();
    let other = h.client().await;
    let mut other_sub = step(other.subscribe("doomed")).await.unwrap();
    step(c.publish("doomed", Message::plain_text("last")))
        .await
        .unwrap();
    step(c.remove_topic("doomed")).await.unwrap();
    // Deliveries made before the removal are still read, then the end.
    assert_eq!(take(&mut sub, 1).await, ["last"]);
    assert!(step(sub.recv()).await.is_none());
    assert_eq!(take(&mut other_sub, 1).await, ["last"]);
    assert!(step(other_sub.recv()).await.is_none());
    assert_status(
        step(c.publish("doomed", Message::plain_text("x"))).await,
        ResponseStatus::TopicNotFound,
    );
    assert_status(
        step(c.remove_topic("doomed")).await,
        ResponseStatus::TopicNotFound,
    );
    // Both connections go on working.
    step(c.ping()).await.unwrap();
    step(other.ping()).await.unwrap();
}

async fn unknown_topic(h: &Harness) {
    let c = h.client().await;
    assert_status(
        step(c.publish("nowhere", Message::plain_text("x"))).await,
        ResponseStatus::TopicNotFound,
    );
    assert_status(
        step(c.subscribe("nowhere")).await,
        ResponseStatus::TopicNotFound,
    );
    assert_status(
        step(c.topic_status("nowhere")).await,
        ResponseStatus::TopicNotFound,
    );
    // A oneway publish to an unknown topic gets no answer; the connection
    // stays usable.
    step(c.publish_oneway("nowhere", Message::plain_text("x")))
        .await
        .unwrap();
    step(c.ping()).await.unwrap();
    // Creating is idempotent and listed.
    let first = step(c.create_topic("somewhere")).await.unwrap();
    let again = step(c.create_topic("somewhere")).await.unwrap();
    assert_eq!(first, again);
    let topics = step(c.list_topics()).await.unwrap();
    assert_eq!(topics.len(), 1);
    assert_eq!(topics[0].name, "somewhere");
}

async fn embedded_subscriber_receives_remote_publishes(h: &Harness) {
    h.broker.create_topic("events").unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    h.broker
        .subscribe("events", move |m: Message| {
            tx.send(text(&m)).unwrap();
        })
        .unwrap();
    let c = h.client().await;
    for i in 0..100 {
        step(c.publish("events", Message::plain_text(i.to_string())))
            .await
            .unwrap();
    }
    let mut got = Vec::new();
    for _ in 0..100 {
        got.push(step(rx.recv()).await.unwrap());
    }
    assert_eq!(got, numbers(100));
    // The other way round: a remote subscriber receives what the embedded
    // broker publishes.
    let mut sub = step(c.subscribe("events")).await.unwrap();
    h.broker
        .publish("events", Message::plain_text("from inside"))
        .unwrap();
    assert_eq!(take(&mut sub, 1).await, ["from inside"]);
    assert_eq!(step(rx.recv()).await.unwrap(), "from inside");
}

async fn delivery_keeps_the_published_fields(h: &Harness) {
    let c = h.client().await;
    step(c.create_topic("t")).await.unwrap();
    let mut sub = step(c.subscribe("t")).await.unwrap();
    let m = Message::data(&serde_json::json!({"k": 1}))
        .with_subject("subj")
        .with_request_id("r-1")
        .with_reply_to("replies");
    let id = m.id;
    step(c.publish("t", m)).await.unwrap();
    let d = step(sub.recv()).await.unwrap();
    assert_eq!(d.r#type, MessageType::Publish);
    assert_eq!(d.id, id);
    assert_eq!(d.correlation_id, Some(sub.id()));
    assert_eq!(d.destination.as_deref(), Some("t"));
    assert_eq!(d.subject.as_deref(), Some("subj"));
    assert_eq!(d.request_id.as_deref(), Some("r-1"));
    assert_eq!(d.reply_to.as_deref(), Some("replies"));
    assert_eq!(d.data_payload().unwrap(), serde_json::json!({"k": 1}));
}

async fn blocking_client_subscribes(h: &Harness) {
    h.broker.create_topic("t").unwrap();
    let (url, options) = (h.url.clone(), h.client_options());
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let received = tokio::spawn(on_thread(move || {
        let c = Client::connect_with(&url, options).unwrap();
        let mut sub = c.subscribe("t").unwrap();
        ready_tx.send(()).unwrap();
        let mut got = Vec::new();
        for _ in 0..3 {
            let m = sub.recv_timeout(Duration::from_secs(5)).unwrap().unwrap();
            got.push(text(&m));
        }
        // Nothing more: a timeout, not an end.
        assert!(sub
            .recv_timeout(Duration::from_millis(50))
            .unwrap()
            .is_none());
        sub.unsubscribe().unwrap();
        got
    }));
    step(ready_rx).await.unwrap();
    let c = h.client().await;
    for s in ["x", "y", "z"] {
        step(c.publish("t", Message::plain_text(s))).await.unwrap();
    }
    assert_eq!(step(received).await.unwrap(), ["x", "y", "z"]);
    assert_eq!(step(c.topic_status("t")).await.unwrap().subscribers, 0);
}

/// A blocking subscription with a buffer of its own handed to a handler
/// (`with_handler`): deliveries reach it in order, and `unsubscribe`
/// returns only once a handler call in progress has returned.
async fn a_handler_subscription_ends_after_the_handlers_last_call(h: &Harness) {
    h.broker.create_topic("t").unwrap();
    let (url, options) = (h.url.clone(), h.client_options());
    let (log_tx, log_rx) = std::sync::mpsc::channel::<String>();
    let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let (unsubscribing_tx, unsubscribing_rx) = tokio::sync::oneshot::channel();
    let handler_log = log_tx.clone();
    let gate = std::sync::Mutex::new(gate_rx);
    let subscriber = tokio::spawn(on_thread(move || {
        let c = Client::connect_with(&url, options).unwrap();
        let handle = c
            .subscribe_with_buffer("t", 3)
            .unwrap()
            .with_handler(move |m| {
                let t = text(&m);
                handler_log.send(t.clone()).unwrap();
                if t == "slow" {
                    let gate = gate.lock().unwrap();
                    gate.recv_timeout(common::TEST_TIMEOUT).unwrap();
                    handler_log.send("slow done".into()).unwrap();
                }
            })
            .unwrap();
        ready_tx.send(()).unwrap();
        unsubscribing_rx.blocking_recv().unwrap();
        handle.unsubscribe().unwrap();
        log_tx.send("unsubscribed".into()).unwrap();
    }));
    step(ready_rx).await.unwrap();
    let c = h.client().await;
    for s in ["a", "slow"] {
        step(c.publish("t", Message::plain_text(s))).await.unwrap();
    }
    let log = std::sync::Arc::new(std::sync::Mutex::new(log_rx));
    let next =
        |log: std::sync::Arc<std::sync::Mutex<std::sync::mpsc::Receiver<String>>>,
         wait: Duration| { on_thread(move || log.lock().unwrap().recv_timeout(wait).ok()) };
    assert_eq!(next(log.clone(), common::STEP).await.as_deref(), Some("a"));
    assert_eq!(
        next(log.clone(), common::STEP).await.as_deref(),
        Some("slow")
    );
    unsubscribing_tx.send(()).unwrap();
    eventually("the broker drops the subscriber", || async {
        step(c.topic_status("t")).await.unwrap().subscribers == 0
    })
    .await;
    // Confirmed by the broker, yet `unsubscribe` waits for the handler.
    assert_eq!(next(log.clone(), Duration::from_millis(200)).await, None);
    gate_tx.send(()).unwrap();
    assert_eq!(
        next(log.clone(), common::STEP).await.as_deref(),
        Some("slow done")
    );
    assert_eq!(
        next(log.clone(), common::STEP).await.as_deref(),
        Some("unsubscribed")
    );
    step(subscriber).await.unwrap();
}

/// A panic in an embedded subscriber's handler must not end the
/// subscription behind the topic's back. Function handlers' panics become
/// `handler_error` and the client's `SubscriptionHandle` catches its
/// handler's panics and goes on; `Broker::subscribe` runs its handler bare
/// on a task, so the first panic kills the task: later messages are never
/// handled, yet the topic still counts the subscriber, and counts as
/// delivered what it buffered for the dead task.
async fn embedded_subscriber_survives_a_panicking_handler(h: &Harness) {
    h.broker.create_topic("t").unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    h.broker
        .subscribe("t", move |m: Message| {
            let t = text(&m);
            assert_ne!(t, "boom", "deliberate test panic in a subscriber");
            tx.send(t).unwrap();
        })
        .unwrap();
    let c = h.client().await;
    for s in ["a", "boom", "b", "c"] {
        step(c.publish("t", Message::plain_text(s))).await.unwrap();
    }
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(within(Duration::from_secs(3), rx.recv()).await.unwrap());
    }
    assert_eq!(got, ["a", "b", "c"]);
}

/// Oneway messages that did not fit the socket at once go out while the
/// blocking client that sent them makes no further call: nothing waits for
/// the sender's next call to be written.
async fn oneway_messages_go_out_while_their_sender_idles(h: &Harness) {
    const N: u64 = 2_000;
    let c = h.client().await;
    step(c.create_topic("idle-sender")).await.unwrap();
    let (url, options) = (h.url.clone(), h.client_options());
    let (sent_tx, sent_rx) = tokio::sync::oneshot::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let sender = std::thread::spawn(move || {
        let p = Client::connect_with(&url, options).unwrap();
        // Many more small frames than a socket or a ring holds at once.
        for i in 0..N {
            let m = Message::binary(vec![7u8; 1024], None).with_subject(i.to_string());
            p.publish_oneway("idle-sender", m).unwrap();
        }
        sent_tx.send(()).unwrap();
        // Idle, the client still connected, until the test has looked.
        let _ = done_rx.recv_timeout(Duration::from_secs(30));
    });
    within(Duration::from_secs(10), sent_rx).await.unwrap();
    eventually("every oneway publish reached the broker", || async {
        step(c.topic_status("idle-sender")).await.unwrap().published == N
    })
    .await;
    done_tx.send(()).unwrap();
    sender.join().unwrap();
}
