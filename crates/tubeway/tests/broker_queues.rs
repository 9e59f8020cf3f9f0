//! Point-to-point queues through an embedded broker, over every transport.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{assert_status, eventually, on_thread, start, step, text, within, Harness, STEP};
use tubeway::ops::QueueKind;
use tubeway::{Client, Message, MessageType, ResponseStatus};

crate::transport_tests! {
    fifo_order_over_1000_messages,
    bounded_queue_full_and_waiting_offer,
    circular_queue_keeps_the_newest,
    poll_on_empty_queue_waits_its_timeout,
    blocked_poll_does_not_block_the_connection,
    concurrent_pollers_get_each_message_once,
    temporary_queue_goes_away_with_its_connection,
    reply_to_round_trip,
    remove_queue_wakes_waiting_poller,
    expired_message_is_not_handed_out,
    exists_status_and_list,
    queued_message_keeps_its_fields,
    blocking_client_offer_and_poll,
    offer_answered_queue_full_is_not_queued,
    withdrawn_poll_does_not_take_a_message,
    background_offer_publish_and_poll,
    a_message_given_up_goes_back_to_the_head,
    an_offer_given_up_is_not_queued_later,
    a_withdrawn_background_offer_is_not_queued,
    a_poll_dropped_when_its_task_must_yield_loses_nothing,
}

const SHORT: Duration = Duration::from_secs(1);

fn numbered(i: usize) -> Message {
    Message::plain_text(i.to_string())
}

async fn fifo_order_over_1000_messages(h: &Harness) {
    let c = h.client().await;
    step(c.create_queue("fifo", 1000, QueueKind::Bounded))
        .await
        .unwrap();
    for i in 0..1000 {
        step(c.offer("fifo", numbered(i), SHORT)).await.unwrap();
    }
    assert_eq!(step(c.queue_status("fifo")).await.unwrap().size, 1000);
    // Another connection takes them, in order.
    let poller = h.client().await;
    for i in 0..1000 {
        let m = step(poller.poll("fifo", SHORT)).await.unwrap().unwrap();
        assert_eq!(text(&m), i.to_string());
    }
    assert!(step(poller.poll("fifo", Duration::ZERO))
        .await
        .unwrap()
        .is_none());
}

async fn bounded_queue_full_and_waiting_offer(h: &Harness) {
    let c = h.client().await;
    step(c.create_queue("small", 2, QueueKind::Bounded))
        .await
        .unwrap();
    step(c.offer("small", numbered(1), SHORT)).await.unwrap();
    step(c.offer("small", numbered(2), SHORT)).await.unwrap();

    let t0 = Instant::now();
    let r = step(c.offer("small", numbered(99), Duration::from_millis(200))).await;
    let took = t0.elapsed();
    assert_status(r, ResponseStatus::QueueFull);
    assert!(took >= Duration::from_millis(200), "refused after {took:?}");
    assert!(took < Duration::from_secs(3), "refused after {took:?}");
    // Without a timeout, a full queue refuses at once.
    assert_status(
        step(c.offer("small", numbered(99), Duration::ZERO)).await,
        ResponseStatus::QueueFull,
    );

    // An offer that finds the queue full waits; a poll on another connection
    // frees room and the offer completes.
    let mut offer = Box::pin(c.offer("small", numbered(3), Duration::from_secs(10)));
    start(&mut offer).await;
    // The ping is answered after the broker has read (and parked) the offer.
    step(c.ping()).await.unwrap();
    assert_eq!(step(c.queue_status("small")).await.unwrap().size, 2);
    let poller = h.client().await;
    let first = step(poller.poll("small", SHORT)).await.unwrap().unwrap();
    assert_eq!(text(&first), "1");
    step(offer).await.unwrap();
    let rest: Vec<String> = [
        step(poller.poll("small", SHORT)).await.unwrap().unwrap(),
        step(poller.poll("small", SHORT)).await.unwrap().unwrap(),
    ]
    .iter()
    .map(text)
    .collect();
    assert_eq!(rest, ["2", "3"]);

    let stats = step(c.stats()).await.unwrap();
    let q = stats
        .queues
        .iter()
        .find(|q| q.status.name == "small")
        .unwrap();
    assert_eq!((q.offered, q.polled, q.rejected), (3, 3, 2));
}

async fn circular_queue_keeps_the_newest(h: &Harness) {
    let c = h.client().await;
    let status = step(c.create_queue("ring", 3, QueueKind::Circular))
        .await
        .unwrap();
    assert_eq!(status.kind, QueueKind::Circular);
    for i in 0..10 {
        // Never waits and never refuses.
        step(c.offer("ring", numbered(i), Duration::ZERO))
            .await
            .unwrap();
    }
    assert_eq!(step(c.queue_status("ring")).await.unwrap().size, 3);
    let mut got = Vec::new();
    while let Some(m) = step(c.poll("ring", Duration::ZERO)).await.unwrap() {
        got.push(text(&m));
    }
    assert_eq!(got, ["7", "8", "9"]);
    let stats = step(c.stats()).await.unwrap();
    let q = stats
        .queues
        .iter()
        .find(|q| q.status.name == "ring")
        .unwrap();
    assert_eq!((q.offered, q.overwritten, q.polled), (10, 7, 3));
}

async fn poll_on_empty_queue_waits_its_timeout(h: &Harness) {
    let c = h.client().await;
    step(c.create_queue("empty", 10, QueueKind::Bounded))
        .await
        .unwrap();
    let timeout = Duration::from_millis(300);
    let t0 = Instant::now();
    let r = step(c.poll("empty", timeout)).await.unwrap();
    let took = t0.elapsed();
    assert!(r.is_none());
    assert!(took >= timeout, "returned after {took:?}");
    assert!(
        took < timeout + Duration::from_secs(3),
        "returned after {took:?}"
    );

    // Without a timeout it answers at once; the wire status is queue_empty.
    let t0 = Instant::now();
    assert!(step(c.poll("empty", Duration::ZERO))
        .await
        .unwrap()
        .is_none());
    assert!(t0.elapsed() < Duration::from_secs(2));
    let raw = Message::new(MessageType::Poll).with_destination("empty");
    let resp = step(c.request(raw)).await.unwrap();
    assert_eq!(resp.status(), ResponseStatus::QueueEmpty);
    assert!(!text(&resp).is_empty(), "queue_empty carries a reason");
}

async fn blocked_poll_does_not_block_the_connection(h: &Harness) {
    let c = h.client().await;
    step(c.create_queue("idle", 10, QueueKind::Bounded))
        .await
        .unwrap();
    step(c.create_queue("busy", 10, QueueKind::Bounded))
        .await
        .unwrap();
    let mut waiting = Box::pin(c.poll("idle", Duration::from_secs(5)));
    start(&mut waiting).await;
    let t0 = Instant::now();
    within(SHORT, c.ping()).await.unwrap();
    within(SHORT, c.offer("busy", numbered(1), SHORT))
        .await
        .unwrap();
    let m = within(SHORT, c.poll("busy", SHORT)).await.unwrap().unwrap();
    assert_eq!(text(&m), "1");
    assert!(t0.elapsed() < SHORT, "requests waited behind the poll");
    // The waiting poll is served by an offer on its own connection.
    within(SHORT, c.offer("idle", numbered(2), SHORT))
        .await
        .unwrap();
    let m = within(SHORT, waiting).await.unwrap().unwrap();
    assert_eq!(text(&m), "2");
}

async fn concurrent_pollers_get_each_message_once(h: &Harness) {
    const N: u32 = 100_000;
    const PRODUCERS: u32 = 2;
    const POLLERS: usize = 4;
    // Calls each client keeps in flight on its one connection.
    const WINDOW: u32 = 16;
    let setup = h.client().await;
    step(setup.create_queue("work", 10_000, QueueKind::Bounded))
        .await
        .unwrap();

    let received = Arc::new(AtomicUsize::new(0));
    let mut pollers = tokio::task::JoinSet::new();
    for k in 0..POLLERS {
        let c = h.client().await;
        for _ in 0..WINDOW {
            let c = c.clone();
            let received = received.clone();
            pollers.spawn(async move {
                let mut got = Vec::new();
                while received.load(Ordering::SeqCst) < N as usize {
                    if let Some(m) = c.poll("work", Duration::from_millis(100)).await.unwrap() {
                        let bytes: [u8; 4] = m.payload[..].try_into().unwrap();
                        got.push(u32::from_le_bytes(bytes));
                        received.fetch_add(1, Ordering::SeqCst);
                    }
                }
                (k, got)
            });
        }
    }
    let mut producers = tokio::task::JoinSet::new();
    for p in 0..PRODUCERS {
        let c = h.client().await;
        for lane in 0..WINDOW {
            let c = c.clone();
            producers.spawn(async move {
                let mut i = p + lane * PRODUCERS;
                while i < N {
                    let m = Message::binary(i.to_le_bytes().to_vec(), None);
                    c.offer("work", m, Duration::from_secs(10)).await.unwrap();
                    i += PRODUCERS * WINDOW;
                }
            });
        }
    }
    while let Some(r) = producers.join_next().await {
        r.unwrap();
    }
    let mut all = Vec::with_capacity(N as usize);
    let mut per_client = [0usize; POLLERS];
    while let Some(r) = pollers.join_next().await {
        let (k, got) = r.unwrap();
        per_client[k] += got.len();
        all.extend(got);
    }
    assert_eq!(all.len(), N as usize, "messages received");
    let distinct: HashSet<u32> = all.iter().copied().collect();
    assert_eq!(distinct.len(), N as usize, "a message was received twice");
    assert!(distinct.iter().all(|&i| i < N));
    assert!(
        per_client.iter().all(|&n| n > 0),
        "a poller got nothing: {per_client:?}"
    );
    let stats = step(setup.stats()).await.unwrap();
    let q = stats
        .queues
        .iter()
        .find(|q| q.status.name == "work")
        .unwrap();
    assert_eq!(
        (q.offered, q.polled, q.status.size),
        (N as u64, N as u64, 0)
    );
}

async fn temporary_queue_goes_away_with_its_connection(h: &Harness) {
    let other = h.client().await;
    // One owner closes its client, the other drops it.
    for close in [true, false] {
        let owner = h.client().await;
        let status = step(owner.create_temporary_queue(10, QueueKind::Bounded))
            .await
            .unwrap();
        assert!(status.temporary);
        let name = status.name.clone();
        assert!(step(other.exists_queue(&name)).await.unwrap());
        // Usable from any connection while it exists.
        step(other.offer(&name, numbered(1), SHORT)).await.unwrap();
        let m = step(owner.poll(&name, SHORT)).await.unwrap().unwrap();
        assert_eq!(text(&m), "1");
        if close {
            step(owner.close()).await;
        } else {
            drop(owner);
        }
        eventually("the temporary queue is removed", || {
            let other = other.clone();
            let name = name.clone();
            async move { !other.exists_queue(&name).await.unwrap() }
        })
        .await;
        assert_status(
            step(other.offer(&name, numbered(2), SHORT)).await,
            ResponseStatus::QueueNotFound,
        );
    }
}

async fn reply_to_round_trip(h: &Harness) {
    const ORDERS: usize = 20;
    let setup = h.client().await;
    step(setup.create_queue("orders", 100, QueueKind::Bounded))
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let c = h.client().await;
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut served = 0;
            while !stop.load(Ordering::SeqCst) {
                let Some(order) = c.poll("orders", Duration::from_millis(100)).await.unwrap()
                else {
                    continue;
                };
                let reply_to = order.reply_to.clone().expect("orders carry reply_to");
                let mut answer = Message::plain_text(format!("done: {}", text(&order)));
                answer.request_id.clone_from(&order.request_id);
                c.offer(&reply_to, answer, SHORT).await.unwrap();
                served += 1;
            }
            served
        })
    };
    let mut requesters = tokio::task::JoinSet::new();
    for who in ["alice", "bob"] {
        let c = h.client().await;
        requesters.spawn(async move {
            let replies = c
                .create_temporary_queue(ORDERS as u64, QueueKind::Bounded)
                .await
                .unwrap()
                .name;
            for i in 0..ORDERS {
                let order = Message::plain_text(format!("{who} order {i}"))
                    .with_request_id(format!("{who}-{i}"))
                    .with_reply_to(&replies);
                c.offer("orders", order, SHORT).await.unwrap();
            }
            let mut got = HashSet::new();
            for _ in 0..ORDERS {
                let r = c.poll(&replies, Duration::from_secs(5)).await.unwrap();
                let r = r.expect("a reply");
                let rid = r.request_id.clone().unwrap();
                let i: usize = rid
                    .strip_prefix(&format!("{who}-"))
                    .unwrap()
                    .parse()
                    .unwrap();
                assert_eq!(text(&r), format!("done: {who} order {i}"));
                assert!(got.insert(i), "reply {rid} twice");
            }
            // Nothing else arrived: each requester got exactly its own answers.
            assert!(c.poll(&replies, Duration::ZERO).await.unwrap().is_none());
            (who, got.len())
        });
    }
    while let Some(r) = step(requesters.join_next()).await {
        let (who, n) = r.unwrap();
        assert_eq!(n, ORDERS, "{who}");
    }
    stop.store(true, Ordering::SeqCst);
    assert_eq!(step(worker).await.unwrap(), 2 * ORDERS);
}

async fn remove_queue_wakes_waiting_poller(h: &Harness) {
    let c = h.client().await;
    step(c.create_queue("doomed", 10, QueueKind::Bounded))
        .await
        .unwrap();
    let mut waiting = Box::pin(c.poll("doomed", Duration::from_secs(20)));
    start(&mut waiting).await;
    step(c.ping()).await.unwrap(); // the poll is parked at the broker
    let other = h.client().await;
    let t0 = Instant::now();
    step(other.remove_queue("doomed")).await.unwrap();
    assert_status(
        within(Duration::from_secs(3), waiting).await,
        ResponseStatus::QueueNotFound,
    );
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert!(!step(c.exists_queue("doomed")).await.unwrap());
    assert_status(
        step(other.remove_queue("doomed")).await,
        ResponseStatus::QueueNotFound,
    );
}

async fn expired_message_is_not_handed_out(h: &Harness) {
    let c = h.client().await;
    step(c.create_queue("ttl", 10, QueueKind::Bounded))
        .await
        .unwrap();
    let short = Message::plain_text("short-lived").with_ttl(Duration::from_millis(50));
    step(c.offer("ttl", short, SHORT)).await.unwrap();
    let long = Message::plain_text("long-lived").with_ttl(Duration::from_secs(600));
    step(c.offer("ttl", long, SHORT)).await.unwrap();
    // Expiry is a matter of time: let the first message's 50 ms pass.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let m = step(c.poll("ttl", Duration::ZERO)).await.unwrap().unwrap();
    assert_eq!(text(&m), "long-lived");
    assert!(step(c.poll("ttl", Duration::ZERO)).await.unwrap().is_none());
    let stats = step(c.stats()).await.unwrap();
    let q = stats
        .queues
        .iter()
        .find(|q| q.status.name == "ttl")
        .unwrap();
    assert_eq!((q.offered, q.polled, q.expired), (2, 1, 1));

    // A message already expired on arrival is refused.
    let mut stale = Message::plain_text("stale");
    stale.expires_at = Some(stale.timestamp - 1);
    assert_status(
        step(c.offer("ttl", stale, SHORT)).await,
        ResponseStatus::Expired,
    );
}

async fn exists_status_and_list(h: &Harness) {
    let c = h.client().await;
    assert!(!step(c.exists_queue("alpha")).await.unwrap());
    assert!(step(c.list_queues()).await.unwrap().is_empty());
    let created = step(c.create_queue("alpha", 10, QueueKind::Bounded))
        .await
        .unwrap();
    step(c.create_queue("beta", 5, QueueKind::Circular))
        .await
        .unwrap();
    assert_eq!(
        (
            created.name.as_str(),
            created.kind,
            created.capacity,
            created.size
        ),
        ("alpha", QueueKind::Bounded, 10, 0)
    );
    assert!(!created.durable && !created.temporary);
    // Creating again with the same settings is accepted.
    step(c.create_queue("alpha", 10, QueueKind::Bounded))
        .await
        .unwrap();
    assert!(step(c.exists_queue("alpha")).await.unwrap());
    step(c.offer("alpha", numbered(1), SHORT)).await.unwrap();
    let status = step(c.queue_status("alpha")).await.unwrap();
    assert_eq!((status.size, status.capacity), (1, 10));
    let list = step(c.list_queues()).await.unwrap();
    let names: Vec<&str> = list.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(names, ["alpha", "beta"]);
    assert_eq!(list[1].kind, QueueKind::Circular);
    // The embedded broker sees the same.
    assert_eq!(h.broker.queue_status("alpha").unwrap().size, 1);

    assert_status(
        step(c.queue_status("gamma")).await,
        ResponseStatus::QueueNotFound,
    );
    assert_status(
        step(c.offer("gamma", numbered(1), SHORT)).await,
        ResponseStatus::QueueNotFound,
    );
    assert_status(
        step(c.poll("gamma", SHORT)).await,
        ResponseStatus::QueueNotFound,
    );
    step(c.remove_queue("beta")).await.unwrap();
    assert!(!step(c.exists_queue("beta")).await.unwrap());
}

async fn queued_message_keeps_its_fields(h: &Harness) {
    let c = h.client().await;
    step(c.create_queue("fields", 10, QueueKind::Bounded))
        .await
        .unwrap();
    let m = Message::text("<a/>", "application/xml", "utf-8")
        .with_subject("subj")
        .with_request_id("req-9")
        .with_reply_to("somewhere")
        .with_ttl(Duration::from_secs(600));
    let (id, ts, exp) = (m.id, m.timestamp, m.expires_at);
    step(c.offer("fields", m, SHORT)).await.unwrap();
    let poll = Message::new(MessageType::Poll).with_destination("fields");
    let poll_id = poll.id;
    let got = step(c.request(poll)).await.unwrap();
    assert_eq!(got.r#type, MessageType::Response);
    assert_eq!(got.status(), ResponseStatus::Ok);
    assert_eq!(got.correlation_id, Some(poll_id));
    assert_eq!((got.id, got.timestamp, got.expires_at), (id, ts, exp));
    assert_eq!(got.subject.as_deref(), Some("subj"));
    assert_eq!(got.request_id.as_deref(), Some("req-9"));
    assert_eq!(got.reply_to.as_deref(), Some("somewhere"));
    assert_eq!(got.destination.as_deref(), Some("fields"));
    assert_eq!(got.payload_mimetype.as_deref(), Some("application/xml"));
    assert_eq!(got.payload_charset.as_deref(), Some("utf-8"));
    assert_eq!(text(&got), "<a/>");
    // The offer's own wait is not part of the queued message.
    assert_eq!(got.timeout, None);
    assert!(!got.oneway);
}

async fn blocking_client_offer_and_poll(h: &Harness) {
    let (url, options) = (h.url.clone(), h.client_options());
    let got = on_thread(move || {
        let c = Client::connect_with(&url, options).unwrap();
        c.create_queue("sync", 10, QueueKind::Bounded).unwrap();
        for i in 0..5 {
            c.offer("sync", numbered(i), SHORT).unwrap();
        }
        let mut got = Vec::new();
        while let Some(m) = c.poll("sync", Duration::from_millis(50)).unwrap() {
            got.push(text(&m));
        }
        let e = c.poll("missing", SHORT).unwrap_err();
        (got, common::status(&e))
    })
    .await;
    assert_eq!(got.0, ["0", "1", "2", "3", "4"]);
    assert_eq!(got.1, ResponseStatus::QueueNotFound);
}

/// An offer without a wait to a full bounded queue that is refused must not
/// have queued its message. The broker retries the refused offer (to count
/// the refusal) and, when a poller freed room in between, queues the message
/// yet still answers `queue_full`. The race needs a poll to land between the
/// two attempts, so this hammers a one-slot queue for a few seconds and
/// looks for messages that were both refused and delivered.
async fn offer_answered_queue_full_is_not_queued(h: &Harness) {
    let setup = h.client().await;
    step(setup.create_queue("tight", 1, QueueKind::Bounded))
        .await
        .unwrap();
    let mut pollers = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let p = h.client().await;
        pollers.spawn(async move {
            let mut got = Vec::new();
            while let Some(m) = p.poll("tight", Duration::from_millis(300)).await.unwrap() {
                got.push(u64::from_le_bytes(m.payload[..].try_into().unwrap()));
            }
            got
        });
    }
    let mut offerers = tokio::task::JoinSet::new();
    for o in 0..4u64 {
        let c = h.client().await;
        offerers.spawn(async move {
            let (mut accepted, mut refused) = (Vec::new(), Vec::new());
            let t0 = Instant::now();
            let mut i = o;
            while t0.elapsed() < Duration::from_secs(3) {
                let m = Message::binary(i.to_le_bytes().to_vec(), None);
                match c.offer("tight", m, Duration::ZERO).await {
                    Ok(()) => accepted.push(i),
                    Err(e) => {
                        assert_eq!(common::status(&e), ResponseStatus::QueueFull);
                        refused.push(i);
                    }
                }
                i += 4;
            }
            (accepted, refused)
        });
    }
    let (mut accepted, mut refused) = (HashSet::new(), HashSet::new());
    while let Some(r) = offerers.join_next().await {
        let (a, r) = r.unwrap();
        accepted.extend(a);
        refused.extend(r);
    }
    let mut delivered = HashSet::new();
    while let Some(r) = pollers.join_next().await {
        delivered.extend(r.unwrap());
    }
    let refused_yet_delivered: Vec<_> = refused.intersection(&delivered).collect();
    assert!(
        refused_yet_delivered.is_empty(),
        "messages answered queue_full were queued and delivered: {refused_yet_delivered:?}"
    );
    assert_eq!(delivered, accepted);
    let stats = step(setup.stats()).await.unwrap();
    let q = stats
        .queues
        .iter()
        .find(|q| q.status.name == "tight")
        .unwrap();
    assert_eq!(q.rejected, refused.len() as u64);
}

/// A poll whose caller gives up (its future dropped) is withdrawn at the
/// broker: the next message goes to a poller that still waits, not to the
/// connection that would drop it.
async fn withdrawn_poll_does_not_take_a_message(h: &Harness) {
    let producer = h.client().await;
    step(producer.create_queue("w", 10, QueueKind::Bounded))
        .await
        .unwrap();
    let quitter = h.client().await;
    let mut poll = Box::pin(quitter.poll("w", Duration::from_secs(20)));
    common::start(&mut poll).await;
    step(quitter.ping()).await.unwrap(); // the poll waits at the broker
    drop(poll); // the caller gives up; the client withdraws the poll
    step(quitter.ping()).await.unwrap(); // the withdrawal has arrived
    step(producer.offer("w", Message::plain_text("kept"), SHORT))
        .await
        .unwrap();
    let m = step(producer.poll("w", SHORT)).await.unwrap().unwrap();
    assert_eq!(text(&m), "kept");
    // The quitter's connection is still usable.
    step(quitter.offer("w", Message::plain_text("again"), SHORT))
        .await
        .unwrap();
    assert_eq!(
        text(&step(quitter.poll("w", SHORT)).await.unwrap().unwrap()),
        "again"
    );
}

/// The blocking client's background calls: `offer_then`, `publish_then`
/// and `poll_then` hand their outcome to a callback, and a withdrawn
/// `poll_then` ends at once (the broker understands `cancel`) without
/// taking the next message.
async fn background_offer_publish_and_poll(h: &Harness) {
    let (url, options) = (h.url.clone(), h.client_options());
    let got = on_thread(move || {
        let c = Client::connect_with(&url, options).unwrap();
        c.create_queue("bg", 10, QueueKind::Bounded).unwrap();
        c.create_topic("news").unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let outcome = |tx: &std::sync::mpsc::Sender<_>| {
            let tx = tx.clone();
            move |r: tubeway::Result<()>| tx.send(r.map_err(|e| common::status(&e))).unwrap()
        };
        c.offer_then("bg", Message::plain_text("one"), SHORT, outcome(&tx))
            .unwrap();
        c.offer_then("missing", Message::plain_text("x"), SHORT, outcome(&tx))
            .unwrap();
        c.publish_then("news", Message::plain_text("n"), outcome(&tx))
            .unwrap();
        c.publish_then("missing", Message::plain_text("n"), outcome(&tx))
            .unwrap();
        let outcomes: Vec<_> = (0..4).map(|_| rx.recv_timeout(STEP).unwrap()).collect();

        let (ptx, prx) = std::sync::mpsc::channel();
        let poll = |ptx: &std::sync::mpsc::Sender<_>| {
            let ptx = ptx.clone();
            move |r: tubeway::Result<Option<tubeway::blocking::Polled>>| {
                let got = r.map(|p| p.map(|p| text(&p.into_message())));
                ptx.send(got).unwrap();
            }
        };
        c.poll_then("bg", SHORT, poll(&ptx)).unwrap();
        let first = prx.recv_timeout(STEP).unwrap().unwrap();
        // Withdrawn while it waits: it ends long before its 20 s.
        let started = Instant::now();
        let waiting = c
            .poll_then("bg", Duration::from_secs(20), poll(&ptx))
            .unwrap();
        c.ping().unwrap(); // the poll waits at the broker
        waiting.withdraw();
        let withdrawn = prx.recv_timeout(STEP).unwrap();
        let took = started.elapsed();
        c.offer("bg", Message::plain_text("two"), SHORT).unwrap();
        let next = c.poll("bg", SHORT).unwrap().map(|m| text(&m));
        (
            outcomes,
            first,
            withdrawn.map_err(|e| e.to_string()),
            took,
            next,
        )
    })
    .await;
    let (outcomes, first, withdrawn, took, next) = got;
    assert_eq!(
        outcomes,
        [
            Ok(()),
            Err(ResponseStatus::QueueNotFound),
            Ok(()),
            Err(ResponseStatus::TopicNotFound)
        ]
    );
    assert_eq!(first.as_deref(), Some("one"));
    assert!(withdrawn.is_err(), "{withdrawn:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(next.as_deref(), Some("two"));
}

/// A message handed to a poll whose caller then gives up on it goes back
/// to the head of its queue, even once the queue has filled meanwhile:
/// nothing is lost and the order is kept.
async fn a_message_given_up_goes_back_to_the_head(h: &Harness) {
    let (url, options) = (h.url.clone(), h.client_options());
    let (size, full, order) = on_thread(move || {
        let c = Client::connect_with(&url, options).unwrap();
        c.create_queue("back", 2, QueueKind::Bounded).unwrap();
        for t in ["a", "b"] {
            c.offer("back", Message::plain_text(t), SHORT).unwrap();
        }
        let (tx, rx) = std::sync::mpsc::channel();
        c.poll_then("back", SHORT, move |r| {
            tx.send(r.unwrap().unwrap()).unwrap()
        })
        .unwrap();
        let polled = rx.recv_timeout(STEP).unwrap();
        c.offer("back", Message::plain_text("c"), SHORT).unwrap();
        drop(polled); // untaken: it goes back
        c.ping().unwrap(); // written after it, so answered after it was put back
        let size = c.queue_status("back").unwrap().size;
        let full = c
            .offer("back", Message::plain_text("d"), Duration::ZERO)
            .map_err(|e| common::status(&e));
        let order: Vec<_> = (0..4)
            .map(|_| c.poll("back", Duration::ZERO).unwrap().map(|m| text(&m)))
            .collect();
        (size, full, order)
    })
    .await;
    assert_eq!(size, 3);
    assert_eq!(full, Err(ResponseStatus::QueueFull));
    assert_eq!(
        order,
        [Some("a".into()), Some("b".into()), Some("c".into()), None]
    );
}

/// An offer waiting for room whose caller gives up is withdrawn at the
/// broker: room that appears later does not take it.
async fn an_offer_given_up_is_not_queued_later(h: &Harness) {
    let c = h.client().await;
    step(c.create_queue("given-up", 1, QueueKind::Bounded))
        .await
        .unwrap();
    step(c.offer("given-up", Message::plain_text("first"), SHORT))
        .await
        .unwrap();
    let quitter = h.client().await;
    let mut offer = Box::pin(quitter.offer(
        "given-up",
        Message::plain_text("given up"),
        Duration::from_secs(20),
    ));
    common::start(&mut offer).await;
    step(quitter.ping()).await.unwrap(); // the offer waits at the broker
    drop(offer); // the caller gives up; the client withdraws the offer
    step(quitter.ping()).await.unwrap(); // the withdrawal has arrived
    let first = step(c.poll("given-up", SHORT)).await.unwrap().unwrap();
    assert_eq!(text(&first), "first");
    // The room made by that poll would have let the offer in by now.
    let after = step(c.poll("given-up", SHORT)).await.unwrap();
    assert!(after.is_none(), "{after:?}");
}

/// `offer_then`'s handle withdraws an offer waiting for room: its callback
/// learns at once, and room made later does not take it.
async fn a_withdrawn_background_offer_is_not_queued(h: &Harness) {
    let (url, options) = (h.url.clone(), h.client_options());
    let (withdrawn, took, after) = on_thread(move || {
        let c = Client::connect_with(&url, options).unwrap();
        c.create_queue("bg-offer", 1, QueueKind::Bounded).unwrap();
        c.offer("bg-offer", Message::plain_text("first"), SHORT)
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let started = Instant::now();
        let waiting = c
            .offer_then(
                "bg-offer",
                Message::plain_text("withdrawn"),
                Duration::from_secs(20),
                move |r| tx.send(r.map_err(|e| e.to_string())).unwrap(),
            )
            .unwrap();
        c.ping().unwrap(); // the offer waits at the broker
        waiting.withdraw();
        let withdrawn = rx.recv_timeout(STEP).unwrap();
        let took = started.elapsed();
        c.ping().unwrap(); // the withdrawal has arrived
        let first = c.poll("bg-offer", SHORT).unwrap().map(|m| text(&m));
        assert_eq!(first.as_deref(), Some("first"));
        // The room made by that poll would have let the offer in by now.
        let after = c.poll("bg-offer", SHORT).unwrap().map(|m| text(&m));
        (withdrawn, took, after)
    })
    .await;
    assert!(withdrawn.is_err(), "{withdrawn:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(after, None);
}

/// A poll whose future is dropped when its task has spent its coop budget
/// (the first poll of the call then gives the runtime a turn) loses no
/// message, whether the call read its answer itself or waited for it.
async fn a_poll_dropped_when_its_task_must_yield_loses_nothing(h: &Harness) {
    let c = h.client().await;
    step(c.create_queue("turn", 10, QueueKind::Bounded))
        .await
        .unwrap();
    step(c.offer("turn", Message::plain_text("kept"), SHORT))
        .await
        .unwrap();
    // The task's budget spent, without its turn taken.
    std::future::poll_fn(|cx| {
        while tokio::task::coop::has_budget_remaining() {
            if let std::task::Poll::Ready(spent) = tokio::task::coop::poll_proceed(cx) {
                spent.made_progress();
            }
        }
        std::task::Poll::Ready(())
    })
    .await;
    let mut poll = Box::pin(c.poll("turn", SHORT));
    let first = std::future::poll_fn(|cx| {
        std::task::Poll::Ready(std::future::Future::poll(poll.as_mut(), cx))
    })
    .await;
    drop(poll);
    let got = match first {
        std::task::Poll::Ready(got) => got.unwrap(),
        std::task::Poll::Pending => {
            step(c.ping()).await.unwrap(); // a withdrawal or a put-back is in
            step(c.poll("turn", SHORT)).await.unwrap()
        }
    };
    assert_eq!(got.as_ref().map(text).as_deref(), Some("kept"));
}
