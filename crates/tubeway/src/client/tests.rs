//! Client tests against a scripted fake broker on an in-process pipe.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tubeway_proto::{codec, ops, Decoded, Message, MessageType, ResponseStatus};
use tubeway_transport::{FrameReader, FrameWriter, Listener, Url, WaitStrategy};
use uuid::Uuid;

use super::{AsyncClient, ClientOptions};
use crate::{Client, Error};

/// Upper bound for any single step, so a bug fails a test instead of hanging it.
const STEP: Duration = Duration::from_secs(5);

/// Held by each test whose async clients spin on a multi-threaded runtime:
/// their readers join one group per process (see [`super::async_readers`]),
/// whose readers stop spinning in place, and stop being lent to callers,
/// once they outnumber its threads.
static SPINNING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(STEP, f)
        .await
        .expect("test step timed out")
}

/// The broker side of one connection, driven by the test.
struct Peer {
    frames: FrameReader,
    tx: FrameWriter,
}

impl Peer {
    async fn recv(&mut self) -> Message {
        match within(self.frames.next()).await {
            Ok(Some(Decoded::Message(m))) => *m,
            other => panic!("expected a message, got {other:?}"),
        }
    }

    /// Waits for the client to close its side.
    async fn expect_eof(&mut self) {
        loop {
            match within(self.frames.next()).await {
                Ok(Some(Decoded::Message(_))) => continue,
                Ok(None) | Err(_) => return,
                Ok(Some(other)) => panic!("unexpected {other:?}"),
            }
        }
    }

    async fn send(&mut self, m: &Message) {
        let frame = codec::encode(m, tubeway_proto::MAX_MESSAGE_SIZE_LIMIT).unwrap();
        within(self.tx.send(frame)).await.unwrap();
    }

    async fn answer(&mut self, to: &Message, status: ResponseStatus) {
        self.send(&to.response(status)).await;
    }

    async fn echo(&mut self, to: &Message) {
        self.send(&to.response(ResponseStatus::Ok).with_payload_of(to))
            .await;
    }
}

fn mem_url() -> Url {
    Url::Mem(format!("client-test-{}", Uuid::new_v4()))
}

/// Accepts one connection on `url` without answering anything.
async fn accept(listener: &mut Listener) -> Peer {
    let conn = within(listener.accept()).await.unwrap();
    let (tx, flusher) = FrameWriter::new(conn.writer);
    tokio::spawn(flusher);
    Peer {
        frames: FrameReader::new(conn.reader, tubeway_proto::MAX_MESSAGE_SIZE_LIMIT),
        tx,
    }
}

/// Reads the hello and welcomes the client with `max_message_size`.
async fn welcome(peer: &mut Peer, max_message_size: u64) {
    welcome_with(peer, max_message_size, vec![]).await;
}

async fn welcome_with(peer: &mut Peer, max_message_size: u64, capabilities: Vec<String>) {
    let hello = peer.recv().await;
    assert_eq!(hello.r#type, MessageType::Hello);
    let body: ops::Hello = hello.data_payload_as().unwrap();
    assert_eq!(body.max_version, tubeway_proto::PROTOCOL_VERSION);
    let w = ops::Welcome {
        version: 1,
        capabilities,
        max_message_size,
        server: "fake".into(),
        connection_id: 7,
    };
    let mut r = Message::serialize(&w)
        .unwrap()
        .with_type(MessageType::Response);
    r.response_status = Some(ResponseStatus::Ok);
    r.correlation_id = Some(hello.id);
    peer.send(&r).await;
}

async fn pair_with(options: ClientOptions, max_message_size: u64) -> (AsyncClient, Peer) {
    let url = mem_url();
    let mut listener = Listener::bind(&url).await.unwrap();
    let url = url.to_string();
    let (client, peer) = tokio::join!(AsyncClient::connect_with(&url, options), async {
        let mut peer = accept(&mut listener).await;
        welcome(&mut peer, max_message_size).await;
        peer
    });
    (client.unwrap(), peer)
}

async fn pair() -> (AsyncClient, Peer) {
    pair_with(ClientOptions::default(), 1 << 20).await
}

/// A pair whose broker understands `cancel`.
async fn pair_that_cancels() -> (AsyncClient, Peer) {
    pair_that_can(&[ops::CAP_CANCEL]).await
}

/// A pair whose broker has `capabilities`.
async fn pair_that_can(capabilities: &[&str]) -> (AsyncClient, Peer) {
    let url = mem_url();
    let mut listener = Listener::bind(&url).await.unwrap();
    let url = url.to_string();
    let capabilities = capabilities.iter().map(|&c| c.into()).collect();
    let (client, peer) = tokio::join!(AsyncClient::connect(&url), async {
        let mut peer = accept(&mut listener).await;
        welcome_with(&mut peer, 1 << 20, capabilities).await;
        peer
    });
    (client.unwrap(), peer)
}

#[tokio::test]
async fn handshake_sets_limit_and_name() {
    let options = ClientOptions {
        name: "tester/1".into(),
        ..ClientOptions::default()
    };
    let url = mem_url();
    let mut listener = Listener::bind(&url).await.unwrap();
    let url_s = url.to_string();
    let (client, hello) = tokio::join!(AsyncClient::connect_with(&url_s, options), async {
        let mut peer = accept(&mut listener).await;
        let hello = peer.recv().await;
        let mut w = Message::serialize(&ops::Welcome {
            version: 1,
            capabilities: vec![],
            max_message_size: 4096,
            server: "fake".into(),
            connection_id: 1,
        })
        .unwrap()
        .with_type(MessageType::Response);
        w.response_status = Some(ResponseStatus::Ok);
        w.correlation_id = Some(hello.id);
        peer.send(&w).await;
        (hello, peer)
    });
    let client = client.unwrap();
    let body: ops::Hello = hello.0.data_payload_as().unwrap();
    assert_eq!(body.client, "tester/1");
    assert_eq!(client.max_message_size(), 4096);
    assert_eq!(client.welcome().server, "fake");
    assert_eq!(client.url(), &url);
    assert!(!client.is_closed());
}

#[tokio::test]
async fn handshake_refusal_is_reported() {
    let url = mem_url();
    let mut listener = Listener::bind(&url).await.unwrap();
    let url = url.to_string();
    let (client, _peer) = tokio::join!(AsyncClient::connect(&url), async {
        let mut peer = accept(&mut listener).await;
        let hello = peer.recv().await;
        peer.send(&hello.error_response(ResponseStatus::Unavailable, "connection limit reached"))
            .await;
        peer
    });
    match client.unwrap_err() {
        Error::Handshake(why) => {
            assert!(
                why.contains("unavailable") && why.contains("limit"),
                "{why}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn handshake_timeout_is_bounded() {
    let url = mem_url();
    let mut listener = Listener::bind(&url).await.unwrap();
    let options = ClientOptions {
        connect_timeout: Duration::from_millis(100),
        ..ClientOptions::default()
    };
    let url = url.to_string();
    let (client, _peer) = tokio::join!(
        within(AsyncClient::connect_with(&url, options)),
        accept(&mut listener)
    );
    assert!(matches!(client, Err(Error::Handshake(_))), "{client:?}");
}

#[tokio::test]
async fn connect_errors() {
    let e = AsyncClient::connect("mem://nobody-listens-here")
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    let e = AsyncClient::connect("nonsense").await.unwrap_err();
    assert!(matches!(e, Error::InvalidUrl(_)), "{e:?}");
}

#[tokio::test]
async fn pipelined_calls_are_matched_by_id_not_order() {
    let (client, mut peer) = pair().await;
    let calls = (0..3).map(|i| {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .send("echo", Message::plain_text(format!("m{i}")))
                .await
        })
    });
    let calls: Vec<_> = calls.collect();
    let mut received = vec![];
    for _ in 0..3 {
        let m = peer.recv().await;
        assert_eq!(m.r#type, MessageType::Request);
        assert_eq!(m.destination.as_deref(), Some("echo"));
        assert!(m.timeout.is_some(), "the broker is told the call's timeout");
        received.push(m);
    }
    for m in received.iter().rev() {
        peer.echo(m).await;
    }
    for (i, call) in calls.into_iter().enumerate() {
        let reply = within(call).await.unwrap().unwrap();
        assert_eq!(reply.text_payload().unwrap(), format!("m{i}"));
    }
    assert_eq!(client.conn().pending_len(), 0);
}

#[tokio::test]
async fn error_status_becomes_error() {
    let (client, mut peer) = pair().await;
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.send("f", Message::plain_text("x")).await }
    });
    let m = peer.recv().await;
    peer.send(&m.error_response(ResponseStatus::HandlerError, "boom"))
        .await;
    match within(call).await.unwrap() {
        Err(Error::Status { status, reason }) => {
            assert_eq!(status, ResponseStatus::HandlerError);
            assert_eq!(reason, "boom");
        }
        other => panic!("{other:?}"),
    }
    // `request` returns error responses as they are.
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.request(Message::new(MessageType::Stats)).await }
    });
    let m = peer.recv().await;
    peer.answer(&m, ResponseStatus::ServerError).await;
    let r = within(call).await.unwrap().unwrap();
    assert_eq!(r.status(), ResponseStatus::ServerError);
}

#[tokio::test]
async fn connection_drop_fails_every_pending_call_at_once() {
    let (client, mut peer) = pair().await;
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.send("slow", Message::plain_text("x")).await })
        })
        .collect();
    for _ in 0..3 {
        peer.recv().await;
    }
    drop(peer);
    for call in calls {
        // `within` (5 s) is far below the calls' 30 s timeout.
        let r = within(call).await.unwrap();
        assert!(matches!(r, Err(Error::ConnectionClosed(_))), "{r:?}");
    }
    assert!(client.is_closed());
    let r = within(client.ping()).await;
    assert!(matches!(r, Err(Error::ConnectionClosed(_))), "{r:?}");
}

#[tokio::test]
async fn timeout_removes_the_pending_entry() {
    let (client, mut peer) = pair().await;
    let call = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .request_timeout(Message::new(MessageType::Ping), Duration::from_millis(50))
                .await
        }
    });
    let unanswered = peer.recv().await;
    let r = within(call).await.unwrap();
    assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
    assert_eq!(r.unwrap_err().status(), Some(ResponseStatus::Timeout));
    assert_eq!(client.conn().pending_len(), 0);

    // A late answer is ignored and the connection stays usable.
    peer.answer(&unanswered, ResponseStatus::Ok).await;
    let ping = tokio::spawn({
        let client = client.clone();
        async move { client.ping().await }
    });
    let m = peer.recv().await;
    peer.answer(&m, ResponseStatus::Ok).await;
    within(ping).await.unwrap().unwrap();
}

/// Makes `msg` on its own task with `timeout`.
fn spawn_request(
    client: &AsyncClient,
    msg: Message,
    timeout: Duration,
) -> tokio::task::JoinHandle<crate::Result<Message>> {
    let client = client.clone();
    tokio::spawn(async move { client.request_timeout(msg, timeout).await })
}

#[tokio::test]
async fn a_short_timeout_expires_on_time_behind_a_long_one() {
    let (client, mut peer) = pair().await;
    // The connection's one timer is set for this call's deadline first.
    let long = spawn_request(
        &client,
        Message::new(MessageType::Ping),
        Duration::from_secs(60),
    );
    let waiting = peer.recv().await;
    // `within` (5 s) fails the test if these wait for the long deadline.
    for _ in 0..2 {
        let short = spawn_request(
            &client,
            Message::new(MessageType::Ping),
            Duration::from_millis(30),
        );
        peer.recv().await;
        let r = within(short).await.unwrap();
        assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
    }
    assert_eq!(client.conn().pending_len(), 1, "the long call still waits");
    peer.answer(&waiting, ResponseStatus::Ok).await;
    within(long).await.unwrap().unwrap();
    assert_eq!(client.conn().pending_len(), 0);
}

#[tokio::test]
async fn a_call_whose_request_waits_for_room_times_out() {
    let (client, _peer) = pair_with(ClientOptions::default(), 64 << 20).await;
    // The peer reads nothing: this request fills the socket and the write
    // queue past its bound.
    let big = Message::binary(vec![0u8; 2 * tubeway_transport::WRITE_QUEUE_BYTES], None);
    let _big = spawn_request(&client, big, Duration::from_secs(60));
    tokio::task::yield_now().await;
    let r =
        within(client.request_timeout(Message::new(MessageType::Ping), Duration::from_millis(30)))
            .await;
    assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
}

#[tokio::test]
async fn an_async_clients_calls_share_the_connections_timer() {
    let (client, _peer) = pair().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    let started = client
        .start_until(Message::new(MessageType::Ping), Some(deadline))
        .unwrap();
    assert_eq!(started.swept, Some(deadline));
    // A call without a deadline is not watched.
    let other = client.start(Message::new(MessageType::Ping)).unwrap();
    assert_eq!(other.swept, None);
}

#[tokio::test]
async fn a_poll_that_times_out_is_withdrawn_and_its_late_message_offered_back() {
    let (client, mut peer) = pair_that_cancels().await;
    let poll = Message::new(MessageType::Poll).with_destination("jobs");
    let poll = spawn_request(&client, poll, Duration::from_millis(30));
    let req = peer.recv().await;
    let r = within(poll).await.unwrap();
    assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
    expect_withdrawn_then_put_back(&mut peer, &req).await;
}

/// Expects poll `req` on `jobs` withdrawn, then answers it with a message
/// (as a broker that had sent it already would) and expects that message
/// offered back to its queue.
async fn expect_withdrawn_then_put_back(peer: &mut Peer, req: &Message) {
    let cancel = peer.recv().await;
    assert_eq!(cancel.r#type, MessageType::Cancel);
    assert_eq!(cancel.correlation_id, Some(req.id));
    assert!(cancel.oneway);
    let answer =
        req.response(ResponseStatus::Ok)
            .with_text("job 1", tubeway_proto::MIME_TEXT, "utf-8");
    peer.send(&answer).await;
    let back = peer.recv().await;
    assert_eq!(back.r#type, MessageType::Offer);
    assert_eq!(back.destination.as_deref(), Some("jobs"));
    assert_eq!(back.text_payload().unwrap(), "job 1");
    assert!(back.oneway);
    assert_ne!(back.id, req.id);
}

/// With a broker that understands `requeue`, the message goes back as
/// what it is, the message that poll was handed: its own id, the poll's as
/// `correlation_id` (by which the broker knows it, and puts it back at the
/// head of its queue).
#[tokio::test]
async fn a_message_for_a_withdrawn_poll_is_requeued() {
    let (client, mut peer) = pair_that_can(&[ops::CAP_CANCEL, ops::CAP_REQUEUE]).await;
    let c = client.clone();
    let poll = tokio::spawn(async move { c.poll("jobs", Duration::from_secs(60)).await });
    let req = peer.recv().await;
    poll.abort();
    let cancel = peer.recv().await;
    assert_eq!(cancel.r#type, MessageType::Cancel);
    let mut answer =
        req.response(ResponseStatus::Ok)
            .with_text("job 1", tubeway_proto::MIME_TEXT, "utf-8");
    answer.subject = Some("resize".into());
    peer.send(&answer).await;
    let back = peer.recv().await;
    assert_eq!(back.r#type, MessageType::Requeue);
    assert_eq!(back.id, answer.id);
    assert_eq!(back.correlation_id, Some(req.id));
    assert_eq!(back.response_status, None);
    assert_eq!(back.destination.as_deref(), Some("jobs"));
    assert_eq!(back.subject.as_deref(), Some("resize"));
    assert_eq!(back.text_payload().unwrap(), "job 1");
    assert!(back.oneway);
}

/// A message going back from a drop path (which cannot wait) while the
/// write queue is full waits for room on the connection's runtime: it is
/// not lost.
#[tokio::test]
async fn a_message_put_back_while_the_write_queue_is_full_waits_for_room() {
    let (client, mut peer) = pair_with(ClientOptions::default(), 64 << 20).await;
    // The peer reads nothing yet: this request fills the socket and the
    // write queue.
    let big = Message::binary(vec![0u8; 2 * tubeway_transport::WRITE_QUEUE_BYTES], None);
    let _big = spawn_request(&client, big, Duration::from_secs(60));
    let conn = client.conn();
    within(async {
        while !conn.write_backlog() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let mut polled = Message::plain_text("job 1");
    polled.r#type = MessageType::Response;
    polled.response_status = Some(ResponseStatus::Ok);
    polled.correlation_id = Some(uuid::Uuid::new_v4());
    conn.put_back_now(polled, "jobs".into());
    assert_eq!(peer.recv().await.r#type, MessageType::Request);
    let back = peer.recv().await;
    assert_eq!(back.r#type, MessageType::Offer);
    assert_eq!(back.destination.as_deref(), Some("jobs"));
    assert_eq!(back.text_payload().unwrap(), "job 1");
}

#[tokio::test]
async fn too_large_is_refused_locally() {
    let (client, mut peer) = pair_with(ClientOptions::default(), 1024).await;
    let r = client
        .send("f", Message::binary(vec![0u8; 2000], None))
        .await;
    match r {
        Err(e @ Error::TooLarge { .. }) => {
            assert_eq!(e.status(), Some(ResponseStatus::TooLarge));
            assert!(matches!(e, Error::TooLarge { max: 1024, .. }));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(client.conn().pending_len(), 0);
    // Nothing was written: the next frame the broker sees is this oneway call.
    client
        .send_oneway("f", Message::plain_text("small"))
        .await
        .unwrap();
    let m = peer.recv().await;
    assert!(m.oneway);
    assert_eq!(m.text_payload().unwrap(), "small");
}

#[tokio::test]
async fn queue_operations_build_the_contract_messages() {
    let (client, mut peer) = pair().await;

    let poll = tokio::spawn({
        let client = client.clone();
        async move { client.poll("q", Duration::from_millis(10)).await }
    });
    let m = peer.recv().await;
    assert_eq!(m.r#type, MessageType::Poll);
    assert_eq!(m.destination.as_deref(), Some("q"));
    assert_eq!(m.timeout, Some(Duration::from_millis(10)));
    peer.answer(&m, ResponseStatus::QueueEmpty).await;
    assert!(within(poll).await.unwrap().unwrap().is_none());

    let poll = tokio::spawn({
        let client = client.clone();
        async move { client.poll("q", Duration::from_millis(10)).await }
    });
    let m = peer.recv().await;
    let mut queued = Message::plain_text("job").with_subject("s");
    queued.r#type = MessageType::Response;
    queued.response_status = Some(ResponseStatus::Ok);
    queued.correlation_id = Some(m.id);
    peer.send(&queued).await;
    let got = within(poll).await.unwrap().unwrap().unwrap();
    assert_eq!(got.id, queued.id);
    assert_eq!(got.subject.as_deref(), Some("s"));

    let offer = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .offer("q", Message::plain_text("x"), Duration::from_secs(1))
                .await
        }
    });
    let m = peer.recv().await;
    assert_eq!(m.r#type, MessageType::Offer);
    assert_eq!(m.timeout, Some(Duration::from_secs(1)));
    peer.send(&m.error_response(ResponseStatus::QueueFull, "full"))
        .await;
    let e = within(offer).await.unwrap().unwrap_err();
    assert_eq!(e.status(), Some(ResponseStatus::QueueFull));

    let create = tokio::spawn({
        let client = client.clone();
        async move { client.create_queue("q", 10, ops::QueueKind::Circular).await }
    });
    let m = peer.recv().await;
    assert_eq!(m.r#type, MessageType::CreateQueue);
    let body: ops::CreateQueue = m.data_payload_as().unwrap();
    assert_eq!(body.capacity, 10);
    assert_eq!(body.kind, ops::QueueKind::Circular);
    let status = ops::QueueStatus {
        name: "q".into(),
        kind: ops::QueueKind::Circular,
        capacity: 10,
        size: 0,
        durable: false,
        temporary: false,
    };
    let mut r = Message::serialize(&status)
        .unwrap()
        .with_type(MessageType::Response);
    r.response_status = Some(ResponseStatus::Ok);
    r.correlation_id = Some(m.id);
    peer.send(&r).await;
    assert_eq!(within(create).await.unwrap().unwrap(), status);
}

/// Calls of a synchronous handler one after another run on one thread;
/// with `handler_spin`, that thread polls for each next call and is never
/// woken, without it, it sleeps and is woken for each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_thread_takes_the_calls_that_follow_its_answers() {
    for (spin, polls) in [(Duration::ZERO, false), (Duration::from_secs(10), true)] {
        let options = ClientOptions {
            handler_spin: spin,
            ..ClientOptions::default()
        };
        let (client, mut peer) = pair_with(options, 1 << 20).await;
        let serve = tokio::spawn({
            let client = client.clone();
            async move {
                client
                    .serve("where", |_| {
                        Ok(Message::plain_text(format!(
                            "{:?}",
                            std::thread::current().id()
                        )))
                    })
                    .await
            }
        });
        let create = peer.recv().await;
        peer.answer(&create, ResponseStatus::Ok).await;
        let _worker = within(serve).await.unwrap().unwrap();
        let mut threads = HashSet::new();
        for _ in 0..5 {
            let mut req = Message::plain_text("");
            req.correlation_id = Some(create.id);
            peer.send(&req).await;
            let r = peer.recv().await;
            assert_eq!(r.status(), ResponseStatus::Ok);
            threads.insert(r.text_payload().unwrap().into_owned());
            if !polls {
                let conn = client.conn_arc();
                within(async {
                    while conn.idle_handler_threads() == 0 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                })
                .await;
            }
        }
        assert_eq!(threads.len(), 1, "{threads:?}");
        let woken = client.conn_arc().handler_threads_woken();
        assert_eq!(woken, if polls { 0 } else { 4 }, "spin {spin:?}");
        // Closed, the connection's polling thread stops and ends.
        let conn = client.conn_arc();
        client.close().await;
        within(async {
            while conn.handler_threads() > 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
    }
}

#[tokio::test]
async fn worker_answers_requests() {
    let (client, mut peer) = pair().await;
    let serve = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .serve("upper", |m: Message| {
                    let text = m.text_payload()?.into_owned();
                    match text.as_str() {
                        "fail" => Err("bad input".into()),
                        "panic" => panic!("handler bug"),
                        _ => Ok(Message::plain_text(text.to_uppercase()).with_subject("done")),
                    }
                })
                .await
        }
    });
    let create = peer.recv().await;
    assert_eq!(create.r#type, MessageType::CreateFunction);
    assert_eq!(create.destination.as_deref(), Some("upper"));
    peer.answer(&create, ResponseStatus::Ok).await;
    let worker = within(serve).await.unwrap().unwrap();
    assert_eq!(worker.function(), "upper");
    assert_eq!(worker.id(), create.id);

    let call = |text: &str| {
        let mut m = Message::plain_text(text).with_request_id("r1");
        m.correlation_id = Some(create.id);
        m
    };

    let req = call("abc");
    peer.send(&req).await;
    let r = peer.recv().await;
    assert_eq!(r.r#type, MessageType::Response);
    assert_eq!(r.correlation_id, Some(req.id));
    assert_eq!(r.request_id.as_deref(), Some("r1"));
    assert_eq!(r.status(), ResponseStatus::Ok);
    assert_eq!(r.text_payload().unwrap(), "ABC");
    assert_eq!(r.subject.as_deref(), Some("done"));

    for (input, reason) in [("fail", "bad input"), ("panic", "handler panicked")] {
        let req = call(input);
        peer.send(&req).await;
        let r = peer.recv().await;
        assert_eq!(r.correlation_id, Some(req.id));
        assert_eq!(r.status(), ResponseStatus::HandlerError);
        assert_eq!(r.text_payload().unwrap(), reason);
    }

    // A oneway call gets no answer: the next frame answers the call after it.
    let mut oneway = call("quiet");
    oneway.oneway = true;
    peer.send(&oneway).await;
    let req = call("next");
    peer.send(&req).await;
    let r = peer.recv().await;
    assert_eq!(r.correlation_id, Some(req.id));

    // A call for a registration this connection does not have is refused.
    let mut stray = Message::plain_text("x");
    stray.correlation_id = Some(Uuid::new_v4());
    peer.send(&stray).await;
    let r = peer.recv().await;
    assert_eq!(r.correlation_id, Some(stray.id));
    assert_eq!(r.status(), ResponseStatus::FunctionNotFound);

    let stop = tokio::spawn(worker.stop());
    let remove = peer.recv().await;
    assert_eq!(remove.r#type, MessageType::RemoveFunction);
    assert_eq!(remove.destination.as_deref(), Some("upper"));
    assert_eq!(remove.correlation_id, Some(create.id));
    peer.answer(&remove, ResponseStatus::Ok).await;
    within(stop).await.unwrap().unwrap();
}

#[tokio::test]
async fn worker_calls_run_concurrently() {
    let (client, mut peer) = pair().await;
    // Each call waits until both have started, so sequential execution would fail.
    let started = Arc::new((Mutex::new(0usize), Condvar::new()));
    let serve = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .serve("meet", move |m: Message| {
                    let (count, cv) = &*started;
                    let mut n = count.lock().unwrap();
                    *n += 1;
                    cv.notify_all();
                    let (n, wait) = cv.wait_timeout_while(n, STEP, |n| *n < 2).unwrap();
                    drop(n);
                    if wait.timed_out() {
                        Err("calls did not overlap".into())
                    } else {
                        Ok(m)
                    }
                })
                .await
        }
    });
    let create = peer.recv().await;
    peer.answer(&create, ResponseStatus::Ok).await;
    let _worker = within(serve).await.unwrap().unwrap();
    for _ in 0..2 {
        let mut req = Message::plain_text("x");
        req.correlation_id = Some(create.id);
        peer.send(&req).await;
    }
    for _ in 0..2 {
        assert_eq!(peer.recv().await.status(), ResponseStatus::Ok);
    }
}

#[tokio::test]
async fn async_calls_that_complete_at_once_run_on_the_reader_and_those_that_wait_overlap() {
    let (client, mut peer) = pair().await;
    let release = Arc::new(tokio::sync::Notify::new());
    let tasks = Arc::new(Mutex::new(Vec::new()));
    let serve = tokio::spawn({
        let (client, release, tasks) = (client.clone(), release.clone(), tasks.clone());
        async move {
            client
                .serve_async("step", move |m: Message| {
                    let (release, tasks) = (release.clone(), tasks.clone());
                    async move {
                        match m.payload.as_ref() {
                            b"wait" => release.notified().await,
                            b"release" => release.notify_one(),
                            _ => tasks.lock().unwrap().push(tokio::task::try_id()),
                        }
                        Ok(m)
                    }
                })
                .await
        }
    });
    let create = peer.recv().await;
    peer.answer(&create, ResponseStatus::Ok).await;
    let _worker = within(serve).await.unwrap().unwrap();
    let call = |text: &str| {
        let mut req = Message::plain_text(text);
        req.correlation_id = Some(create.id);
        req
    };

    // A call that waits leaves the reader free: the call that releases it
    // is read and answered, then the waiting one.
    let (wait, free) = (call("wait"), call("release"));
    peer.send(&wait).await;
    peer.send(&free).await;
    assert_eq!(peer.recv().await.correlation_id, Some(free.id));
    assert_eq!(peer.recv().await.correlation_id, Some(wait.id));

    // Calls whose handlers never wait run in one task, the reader's: no
    // task is spawned for them.
    for _ in 0..3 {
        peer.send(&call("now")).await;
        assert_eq!(peer.recv().await.status(), ResponseStatus::Ok);
    }
    let tasks = tasks.lock().unwrap().clone();
    assert_eq!(tasks.len(), 3);
    assert!(
        tasks[0].is_some() && tasks.iter().all(|t| *t == tasks[0]),
        "{tasks:?}"
    );
}

#[tokio::test]
async fn async_worker_and_dropped_worker() {
    let (client, mut peer) = pair().await;
    let serve = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .serve_async("len", |m: Message| {
                    // A panic before the future is made, in the reader.
                    assert!(m.payload.as_ref() != b"early", "handler bug");
                    async move {
                        if m.payload.as_ref() == b"panic" {
                            panic!("async handler bug");
                        }
                        Ok(Message::plain_text(m.payload.len().to_string()))
                    }
                })
                .await
        }
    });
    let create = peer.recv().await;
    peer.answer(&create, ResponseStatus::Ok).await;
    let worker = within(serve).await.unwrap().unwrap();
    // A panic is answered, and the worker serves the next call.
    let calls = [
        ("panic", "handler panicked"),
        ("early", "handler panicked"),
        ("four", "4"),
    ];
    for (text, answer) in calls {
        let mut req = Message::plain_text(text);
        req.correlation_id = Some(create.id);
        peer.send(&req).await;
        let r = peer.recv().await;
        assert_eq!(r.correlation_id, Some(req.id));
        assert_eq!(r.text_payload().unwrap(), answer);
    }

    // Dropped, it asks the broker to remove it and serves the calls that
    // come until the broker confirms: those are answered, not refused.
    drop(worker);
    let remove = peer.recv().await;
    assert_eq!(remove.r#type, MessageType::RemoveFunction);
    assert_eq!(remove.correlation_id, Some(create.id));
    assert!(!remove.oneway);
    let mut req = Message::plain_text("still");
    req.correlation_id = Some(create.id);
    peer.send(&req).await;
    let r = peer.recv().await;
    assert_eq!(r.correlation_id, Some(req.id));
    assert_eq!(r.text_payload().unwrap(), "5");
    // Once it has, a call is refused.
    peer.answer(&remove, ResponseStatus::Ok).await;
    let refused = within(async {
        loop {
            let mut req = Message::plain_text("late");
            req.correlation_id = Some(create.id);
            peer.send(&req).await;
            let r = peer.recv().await;
            if r.response_status == Some(ResponseStatus::FunctionNotFound) {
                break r;
            }
            assert_eq!(r.text_payload().unwrap(), "4");
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(refused.text_payload().unwrap().contains("no longer serves"));
}

/// Subscribes `client` to `topic` and returns the subscribe message the broker saw.
async fn subscribe(
    client: &AsyncClient,
    peer: &mut Peer,
    buffer: Option<usize>,
) -> (super::Subscription, Message) {
    let sub = tokio::spawn({
        let client = client.clone();
        async move {
            match buffer {
                Some(n) => client.subscribe_with_buffer("t", n).await,
                None => client.subscribe("t").await,
            }
        }
    });
    let m = peer.recv().await;
    assert_eq!(m.r#type, MessageType::Subscribe);
    assert_eq!(m.destination.as_deref(), Some("t"));
    peer.answer(&m, ResponseStatus::Ok).await;
    (within(sub).await.unwrap().unwrap(), m)
}

fn delivery(sub: &Message, text: &str) -> Message {
    let mut d = Message::plain_text(text).with_type(MessageType::Publish);
    d.correlation_id = Some(sub.id);
    d
}

/// A batch handler gets the deliveries buffered at the moment in one call,
/// in order; those of a batch it had not taken when it panicked come in
/// the next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_handler_takes_what_is_buffered_in_order() {
    const N: usize = 50;
    let (client, mut peer) = pair().await;
    let (sub, subscribe_msg) = subscribe(&client, &mut peer, None).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<String>>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let go = std::sync::Mutex::new(go_rx);
    let panicked = std::sync::atomic::AtomicBool::new(false);
    let _handle = sub.with_batch_handler(move |batch| {
        let mut got = Vec::new();
        for m in batch.by_ref() {
            let t = m.text_payload().unwrap().into_owned();
            if t == "0" {
                // Held until every delivery is buffered behind this one.
                go.lock().unwrap().recv_timeout(STEP).unwrap();
            }
            got.push(t);
            if got.len() == 2 && !panicked.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tx.send(std::mem::take(&mut got)).unwrap();
                panic!("deliberate test panic in a batch handler");
            }
        }
        tx.send(got).unwrap();
    });
    for i in 0..N {
        peer.send(&delivery(&subscribe_msg, &i.to_string())).await;
    }
    // Answered once the reader has routed every delivery before it.
    let ping = Message::new(MessageType::Ping);
    peer.send(&ping).await;
    assert_eq!(peer.recv().await.correlation_id, Some(ping.id));
    go_tx.send(()).unwrap();
    let mut batches = Vec::new();
    while batches.iter().map(Vec::len).sum::<usize>() < N {
        batches.push(within(rx.recv()).await.unwrap());
    }
    let all: Vec<String> = batches.concat();
    assert_eq!(all, (0..N).map(|i| i.to_string()).collect::<Vec<_>>());
    // The first call took two and panicked; the next took all the rest.
    assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), [2, N - 2]);
}

#[tokio::test]
async fn subscription_receives_in_order_and_ends_on_topic_removal() {
    let (client, mut peer) = pair().await;
    let (mut sub, subscribe_msg) = subscribe(&client, &mut peer, Some(1)).await;
    let body: ops::Subscribe = subscribe_msg.data_payload_as().unwrap();
    assert_eq!(body.buffer, Some(1));
    assert_eq!(sub.id(), subscribe_msg.id);
    assert_eq!(sub.topic(), "t");

    // More deliveries than the client buffer holds: the reader waits, nothing is lost.
    for i in 0..5 {
        peer.send(&delivery(&subscribe_msg, &i.to_string())).await;
    }
    let mut end = Message::new(MessageType::Unsubscribe).with_destination("t");
    end.correlation_id = Some(subscribe_msg.id);
    peer.send(&end).await;

    for i in 0..5 {
        let m = within(sub.recv()).await.unwrap();
        assert_eq!(m.r#type, MessageType::Publish);
        assert_eq!(m.text_payload().unwrap(), i.to_string());
    }
    assert!(within(sub.recv()).await.is_none());
    // Already ended by the broker: nothing to send.
    within(sub.unsubscribe()).await.unwrap();
}

#[tokio::test]
async fn unsubscribe_and_drop() {
    let (client, mut peer) = pair().await;
    let (sub, subscribe_msg) = subscribe(&client, &mut peer, None).await;
    assert!(subscribe_msg.payload.is_empty());
    let unsub = tokio::spawn(sub.unsubscribe());
    let m = peer.recv().await;
    assert_eq!(m.r#type, MessageType::Unsubscribe);
    assert_eq!(m.correlation_id, Some(subscribe_msg.id));
    assert!(!m.oneway);
    peer.answer(&m, ResponseStatus::Ok).await;
    within(unsub).await.unwrap().unwrap();

    let (sub, subscribe_msg) = subscribe(&client, &mut peer, None).await;
    drop(sub);
    let m = peer.recv().await;
    assert_eq!(m.r#type, MessageType::Unsubscribe);
    assert_eq!(m.correlation_id, Some(subscribe_msg.id));
    assert!(m.oneway);
}

#[tokio::test]
async fn subscription_ends_when_the_connection_drops() {
    let (client, mut peer) = pair().await;
    let (mut sub, subscribe_msg) = subscribe(&client, &mut peer, None).await;
    peer.send(&delivery(&subscribe_msg, "last")).await;
    drop(peer);
    assert_eq!(
        within(sub.recv()).await.unwrap().text_payload().unwrap(),
        "last"
    );
    assert!(within(sub.recv()).await.is_none());
}

#[tokio::test]
async fn subscribe_with_runs_the_handler_in_order() {
    let (client, mut peer) = pair().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let sub = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .subscribe_with("t", move |m: Message| {
                    let text = m.text_payload().unwrap().into_owned();
                    if text == "panic" {
                        panic!("handler bug");
                    }
                    tx.send(text).unwrap();
                })
                .await
        }
    });
    let m = peer.recv().await;
    peer.answer(&m, ResponseStatus::Ok).await;
    let handle = within(sub).await.unwrap().unwrap();
    for text in ["a", "panic", "b", "c"] {
        peer.send(&delivery(&m, text)).await;
    }
    for want in ["a", "b", "c"] {
        assert_eq!(within(rx.recv()).await.unwrap(), want);
    }
    let unsub = tokio::spawn(handle.unsubscribe());
    let u = peer.recv().await;
    assert_eq!(u.correlation_id, Some(m.id));
    peer.answer(&u, ResponseStatus::Ok).await;
    within(unsub).await.unwrap().unwrap();
}

#[tokio::test]
async fn broker_ping_is_answered() {
    let (_client, mut peer) = pair().await;
    let ping = Message::new(MessageType::Ping);
    peer.send(&ping).await;
    let r = peer.recv().await;
    assert_eq!(r.correlation_id, Some(ping.id));
    assert_eq!(r.status(), ResponseStatus::Ok);
}

#[tokio::test]
async fn close_flushes_queued_frames_and_fails_pending_calls() {
    let (client, mut peer) = pair().await;
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.send("f", Message::plain_text("x")).await }
    });
    peer.recv().await;
    client
        .publish_oneway("t", Message::plain_text("bye"))
        .await
        .unwrap();
    within(client.close()).await;
    let r = within(call).await.unwrap();
    assert!(matches!(r, Err(Error::ConnectionClosed(_))), "{r:?}");
    let m = peer.recv().await;
    assert_eq!(m.r#type, MessageType::Publish);
    assert!(m.oneway);
    peer.expect_eof().await;
    assert!(client.is_closed());
}

#[tokio::test]
async fn dropping_the_last_client_closes_the_connection() {
    let (client, mut peer) = pair().await;
    let clone = client.clone();
    drop(client);
    drop(clone);
    peer.expect_eof().await;
}

#[tokio::test]
async fn blocking_client_refuses_to_run_inside_a_runtime() {
    let (client, _peer) = pair().await;
    let blocking = Client::from_async(client);
    assert!(matches!(blocking.ping(), Err(Error::Runtime(_))));
}

#[test]
fn blocking_client() {
    // The fake broker runs on a runtime of its own; the test thread has none.
    let broker = tokio::runtime::Runtime::new().unwrap();
    let url = mem_url();
    let mut listener = broker.block_on(Listener::bind(&url)).unwrap();
    let (events, seen) = std::sync::mpsc::channel();
    let served = broker.spawn(async move {
        let mut peer = accept(&mut listener).await;
        welcome(&mut peer, 1 << 20).await;
        loop {
            let m = peer.recv().await;
            match m.r#type {
                MessageType::Request => peer.echo(&m).await,
                MessageType::CreateFunction => {
                    peer.answer(&m, ResponseStatus::Ok).await;
                    let mut call = Message::plain_text("inner");
                    call.correlation_id = Some(m.id);
                    peer.send(&call).await;
                }
                MessageType::Response => {
                    events.send(m.text_payload().unwrap().into_owned()).unwrap();
                }
                MessageType::Subscribe => {
                    peer.answer(&m, ResponseStatus::Ok).await;
                    peer.send(&delivery(&m, "news")).await;
                }
                MessageType::Unsubscribe => {
                    peer.answer(&m, ResponseStatus::Ok).await;
                    return;
                }
                other => panic!("unexpected {other}"),
            }
        }
    });

    let client = Client::connect(&url.to_string()).unwrap();
    let reply = client.send("echo", Message::plain_text("hi")).unwrap();
    assert_eq!(reply.text_payload().unwrap(), "hi");

    let pending = client.send_async("echo", Message::plain_text("later"));
    assert_eq!(pending.wait().unwrap().text_payload().unwrap(), "later");

    // A handler may call through the blocking client: it runs on a blocking thread.
    let inner = client.clone();
    let _worker = client
        .serve("outer", move |m: Message| {
            let r = inner.send("echo", m)?;
            Ok(Message::plain_text(format!("{}!", r.text_payload()?)))
        })
        .unwrap();
    assert_eq!(seen.recv_timeout(STEP).unwrap(), "inner!");

    let mut sub = client.subscribe("t").unwrap();
    let m = sub.recv_timeout(STEP).unwrap().unwrap();
    assert_eq!(m.text_payload().unwrap(), "news");
    assert!(sub
        .recv_timeout(Duration::from_millis(20))
        .unwrap()
        .is_none());
    sub.unsubscribe().unwrap();
    broker.block_on(within(served)).unwrap();
    client.close().unwrap();
    assert!(client.is_closed());
}

/// A `send_async` awaited from async code (nobody blocking in the client)
/// fails as soon as the connection ends: the client's background thread
/// goes on running the call after its reader has seen the end.
#[test]
fn a_blocking_clients_response_future_fails_when_the_connection_ends() {
    let (client, broker, served) = blocking_pair(ClientOptions::default(), |mut peer| async move {
        let call = peer.recv().await;
        assert_eq!(call.r#type, MessageType::Request);
        // Hangs up without an answer.
    });
    let pending = client.send_async("stuck", Message::plain_text("x"));
    broker.block_on(within(served)).unwrap();
    let got = broker.block_on(within(pending));
    assert!(matches!(got, Err(Error::ConnectionClosed(_))), "{got:?}");
}

/// `send_then` hands each reply to its callback as it comes, not held up
/// behind an earlier call still unanswered, and a call the connection's
/// end cuts short gets that end.
#[test]
fn send_then_hands_every_reply_to_its_callback() {
    let (go_on, answer_first) = tokio::sync::oneshot::channel::<()>();
    let (client, broker, served) = blocking_pair(ClientOptions::default(), |mut peer| async move {
        let first = peer.recv().await;
        let second = peer.recv().await;
        // The second is answered first; the first once its reply is in;
        // the third never.
        peer.echo(&second).await;
        answer_first.await.unwrap();
        peer.echo(&first).await;
        let _third = peer.recv().await;
    });
    let (tx, rx) = std::sync::mpsc::channel();
    for text in ["one", "two", "three"] {
        let tx = tx.clone();
        client
            .send_then("echo", Message::plain_text(text), move |r| {
                let _ = tx.send(r.map(|m| m.text_payload().unwrap().into_owned()));
            })
            .unwrap();
    }
    assert_eq!(rx.recv_timeout(STEP).unwrap().unwrap(), "two");
    go_on.send(()).unwrap();
    assert_eq!(rx.recv_timeout(STEP).unwrap().unwrap(), "one");
    broker.block_on(within(served)).unwrap();
    let last = rx.recv_timeout(STEP).unwrap();
    assert!(matches!(last, Err(Error::ConnectionClosed(_))), "{last:?}");
}

/// Requests made one after the other by one thread with `send_async` or
/// `send_then` go out in that order.
#[test]
fn background_calls_from_one_thread_go_out_in_order() {
    const N: usize = 50;
    let (seen_tx, seen_rx) = std::sync::mpsc::channel();
    let (client, broker, served) =
        blocking_pair(ClientOptions::default(), move |mut peer| async move {
            for _ in 0..2 * N {
                let m = peer.recv().await;
                seen_tx
                    .send(m.text_payload().unwrap().into_owned())
                    .unwrap();
                peer.echo(&m).await;
            }
        });
    let mut futures = Vec::new();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    for i in 0..N {
        futures.push(client.send_async("echo", Message::plain_text(format!("a{i}"))));
        let done = done_tx.clone();
        client
            .send_then("echo", Message::plain_text(format!("t{i}")), move |r| {
                done.send(r.is_ok()).unwrap();
            })
            .unwrap();
    }
    for f in futures {
        f.wait().unwrap();
    }
    assert!((0..N).all(|_| done_rx.recv_timeout(STEP).unwrap()));
    broker.block_on(within(served)).unwrap();
    let seen: Vec<String> = seen_rx.try_iter().collect();
    let made: Vec<String> = (0..N)
        .flat_map(|i| [format!("a{i}"), format!("t{i}")])
        .collect();
    assert_eq!(seen, made);
}

/// A call whose request cannot be written at once (the write queue is
/// full) goes to the background thread to wait for room; calls made after
/// it wait behind it, even one small enough to fit: background calls,
/// oneway messages and blocking calls alike.
#[test]
fn a_call_waiting_for_room_is_not_overtaken() {
    let (read_now, reading) = tokio::sync::oneshot::channel::<()>();
    let (seen_tx, seen_rx) = std::sync::mpsc::channel();
    let (client, broker, served) = blocking_pair(ClientOptions::default(), |mut peer| async move {
        reading.await.unwrap();
        for _ in 0..10 {
            let m = peer.recv().await;
            seen_tx.send(m.subject.clone().unwrap()).unwrap();
            if !m.oneway {
                peer.answer(&m, ResponseStatus::Ok).await;
            }
        }
    });
    // With room, a oneway message is written at once.
    let first = Message::plain_text("y").with_subject("first");
    let written_now = client
        .send_oneway_then("f", first, |_| unreachable!())
        .unwrap();
    assert!(written_now);
    // Four of these fill most of the write queue; the fifth has no room.
    let big = bytes::Bytes::from(vec![7u8; 1_000_000]);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let made = ["x0", "x1", "x2", "x3", "x4", "small"];
    for name in made {
        let payload = if name == "small" {
            bytes::Bytes::new()
        } else {
            big.clone()
        };
        let done = done_tx.clone();
        client
            .send_then(
                "f",
                Message::binary(payload, None).with_subject(name),
                move |r| {
                    done.send(r.is_ok()).unwrap();
                },
            )
            .unwrap();
    }
    // A oneway message behind them waits in the line too.
    let done = done_tx.clone();
    let written_now = client
        .publish_oneway_then(
            "t",
            Message::plain_text("x").with_subject("oneway"),
            move |r| {
                done.send(r.is_ok()).unwrap();
            },
        )
        .unwrap();
    assert!(!written_now);
    // Blocking calls made now, a oneway one and one waiting for its answer
    // (each on a thread of its own, as each blocks), join the line as well
    // rather than write first.
    let in_line = |n: usize| {
        let t0 = std::time::Instant::now();
        while client.as_async().conn().in_line() < n {
            assert!(t0.elapsed() < STEP, "fewer than {n} in line");
            std::thread::yield_now();
        }
    };
    in_line(3);
    let on_thread = |name: &'static str, oneway: bool| {
        let client = client.clone();
        std::thread::spawn(move || {
            let m = Message::plain_text("z").with_subject(name);
            if oneway {
                client.publish_oneway("t", m).unwrap();
            } else {
                client.send("f", m).unwrap();
            }
        })
    };
    let blocking = [on_thread("blocking oneway", true), {
        in_line(4);
        on_thread("blocking call", false)
    }];
    in_line(5);
    read_now.send(()).unwrap();
    assert!((0..=made.len()).all(|_| done_rx.recv_timeout(STEP).unwrap()));
    for t in blocking {
        t.join().unwrap();
    }
    broker.block_on(within(served)).unwrap();
    let mut all = vec!["first"];
    all.extend(made);
    all.extend(["oneway", "blocking oneway", "blocking call"]);
    assert_eq!(seen_rx.try_iter().collect::<Vec<_>>(), all);
}

/// Background calls waited for one after the other are driven by one
/// background thread, which waits for the next call instead of ending
/// with each (starting a thread costs more than a call), and which ends
/// at once when the client is dropped.
#[cfg(target_os = "linux")]
#[test]
fn background_calls_in_a_row_share_one_thread() {
    let (client, broker, served) = blocking_pair(ClientOptions::default(), |mut peer| async move {
        for _ in 0..5 {
            let m = peer.recv().await;
            peer.echo(&m).await;
        }
    });
    // The callback runs on the background thread: it names it.
    let mut seen = Vec::new();
    for i in 0..5 {
        let (tx, rx) = std::sync::mpsc::channel();
        client
            .send_then("echo", Message::plain_text(i.to_string()), move |r| {
                let this = std::path::Path::new("/proc")
                    .join(std::fs::read_link("/proc/thread-self").unwrap());
                tx.send((r.is_ok(), this)).unwrap();
            })
            .unwrap();
        let (ok, thread) = rx.recv_timeout(STEP).unwrap();
        assert!(ok);
        seen.push(thread);
    }
    broker.block_on(within(served)).unwrap();
    assert!(seen.iter().all(|t| *t == seen[0]), "{seen:?}");
    // A client dropped while its thread waits for the next call ends that
    // thread at once, not a linger later.
    drop(client);
    let t0 = std::time::Instant::now();
    while seen[0].exists() {
        assert!(
            t0.elapsed() < Duration::from_millis(500),
            "the thread lingers"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn clients_are_send_sync_clone() {
    fn check<T: Send + Sync + Clone>() {}
    check::<AsyncClient>();
    check::<Client>();
    fn send<T: Send>() {}
    send::<super::Subscription>();
    send::<super::Worker>();
    send::<crate::blocking::Subscription>();
}

#[tokio::test]
async fn oversized_request_to_a_worker_is_refused_and_the_connection_survives() {
    let options = ClientOptions {
        max_message_size: 1024,
        ..ClientOptions::default()
    };
    let (client, mut peer) = pair_with(options, 1 << 20).await;
    let serve = tokio::spawn({
        let client = client.clone();
        async move { client.serve("f", Ok).await }
    });
    let create = peer.recv().await;
    peer.answer(&create, ResponseStatus::Ok).await;
    let _worker = within(serve).await.unwrap().unwrap();

    let mut big = Message::binary(vec![1u8; 4096], None);
    big.correlation_id = Some(create.id);
    peer.send(&big).await;
    let r = peer.recv().await;
    assert_eq!(r.correlation_id, Some(big.id));
    assert_eq!(r.status(), ResponseStatus::TooLarge);

    let mut small = Message::plain_text("ok");
    small.correlation_id = Some(create.id);
    peer.send(&small).await;
    let r = peer.recv().await;
    assert_eq!(r.correlation_id, Some(small.id));
    assert_eq!(r.status(), ResponseStatus::Ok);
}

/// The broker may have taken a message for a poll just as its caller gave
/// up: the client withdraws the poll, and offers such a message back to its
/// queue rather than drop it.
#[tokio::test]
async fn a_message_for_a_withdrawn_poll_is_offered_back() {
    let (client, mut peer) = pair_that_cancels().await;
    let c = client.clone();
    let poll = tokio::spawn(async move { c.poll("jobs", Duration::from_secs(60)).await });
    let req = peer.recv().await;
    assert_eq!(req.r#type, MessageType::Poll);
    poll.abort();
    expect_withdrawn_then_put_back(&mut peer, &req).await;
    // An empty answer to a withdrawn poll is simply dropped.
    let c = client.clone();
    let poll = tokio::spawn(async move { c.poll("jobs", Duration::from_secs(60)).await });
    let req = peer.recv().await;
    poll.abort();
    assert_eq!(peer.recv().await.r#type, MessageType::Cancel);
    peer.answer(&req, ResponseStatus::QueueEmpty).await;
    let ping = tokio::spawn(async move { client.ping().await });
    let next = peer.recv().await;
    assert_eq!(next.r#type, MessageType::Ping, "nothing was offered back");
    peer.answer(&next, ResponseStatus::Ok).await;
    within(ping).await.unwrap().unwrap();
}

/// A reader that spins as a task of a current-thread runtime would keep the
/// caller's own task from running until its spin gave up (tens of µs to
/// milliseconds per call): such a client sleeps instead, whatever it asked.
#[tokio::test]
async fn a_client_on_a_current_thread_runtime_never_spins() {
    let spin = ClientOptions {
        wait: Some(tubeway_transport::WaitStrategy::BusySpin),
        ..ClientOptions::default()
    };
    let (client, mut peer) = pair_with(spin, 1 << 20).await;
    assert_eq!(
        client.wait_strategy(),
        tubeway_transport::WaitStrategy::PARK
    );
    let call = client.send("f", Message::plain_text("x"));
    let answer = async {
        let req = peer.recv().await;
        peer.send(&req.response(ResponseStatus::Ok)).await;
    };
    let (got, ()) = within(async { tokio::join!(call, answer) }).await;
    assert!(got.unwrap().status().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_on_a_multi_thread_runtime_waits_as_asked() {
    let _alone = SPINNING.lock().await;
    let spin = ClientOptions {
        wait: Some(tubeway_transport::WaitStrategy::BusySpin),
        ..ClientOptions::default()
    };
    let (client, _peer) = pair_with(spin, 1 << 20).await;
    assert_eq!(
        client.wait_strategy(),
        tubeway_transport::WaitStrategy::BusySpin
    );
    let (plain, _peer) = pair().await;
    assert_eq!(plain.wait_strategy(), tubeway_transport::WaitStrategy::PARK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spinning_reader_stops_when_the_client_closes() {
    let _alone = SPINNING.lock().await;
    let spin = ClientOptions {
        wait: Some(tubeway_transport::WaitStrategy::BusySpin),
        ..ClientOptions::default()
    };
    let (client, mut peer) = pair_with(spin, 1 << 20).await;
    // A call answered: the reader has read a frame and spins for the next.
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.send("f", Message::plain_text("x")).await }
    });
    let req = peer.recv().await;
    peer.answer(&req, ResponseStatus::Ok).await;
    within(call).await.unwrap().unwrap();
    // A spinning reader never sleeps; it must see the close between spins.
    // The peer stays connected: its end of the stream tells nothing.
    client.close().await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let peer_writer = 1;
    within(async {
        while metrics.num_alive_tasks() > peer_writer {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    drop(peer);
}

#[tokio::test]
async fn a_started_call_is_a_small_future_without_the_message() {
    let (client, mut peer) = pair().await;
    // A payload-laden message: none of it may enter the future.
    let msg = Message::binary(vec![7u8; 4096], None).with_type(MessageType::Request);
    let started = client.start(msg).unwrap();
    let exchange = started.exchange();
    // The blocking client drives this future, on the stack when it is this small.
    assert!(
        std::mem::size_of_val(&exchange) <= super::blocking::INLINE_FUTURE,
        "{} bytes",
        std::mem::size_of_val(&exchange)
    );
    let (answer, ()) = tokio::join!(within(exchange), async {
        let req = peer.recv().await;
        assert_eq!(req.payload.len(), 4096);
        peer.answer(&req, ResponseStatus::Ok).await;
    });
    assert!(answer.unwrap().status().is_ok());
}

/// The reader may take a poll's entry just as its caller gives up, so the
/// caller finds nothing to withdraw: the message is offered back all the
/// same, and a plain call's answer is simply dropped.
#[tokio::test]
async fn a_poll_answer_whose_caller_left_after_its_entry_was_taken_is_offered_back() {
    let (client, mut peer) = pair().await;
    let conn = client.conn_arc();
    let mut poll = Message::new(MessageType::Poll).with_destination("jobs");
    let (rx, _) = conn.register_pending(&mut poll).unwrap();
    drop(rx);
    let answer =
        poll.response(ResponseStatus::Ok)
            .with_text("job 1", tubeway_proto::MIME_TEXT, "utf-8");
    let left = conn
        .answer_waiting_call(Box::new(answer))
        .expect("handed back");
    within(conn.route(*left)).await;
    let back = peer.recv().await;
    assert_eq!(back.r#type, MessageType::Offer);
    assert_eq!(back.destination.as_deref(), Some("jobs"));
    assert_eq!(back.text_payload().unwrap(), "job 1");

    let mut call = Message::new(MessageType::Request).with_destination("f");
    let (rx, _) = conn.register_pending(&mut call).unwrap();
    drop(rx);
    assert!(conn
        .answer_waiting_call(Box::new(call.response(ResponseStatus::Ok)))
        .is_none());
    assert_eq!(conn.pending_len(), 0);
}

/// The reader may hand a poll's answer over just before its caller gives
/// up: left in the channel, untaken, the message is offered back.
#[tokio::test]
async fn a_poll_answer_handed_over_but_never_taken_is_offered_back() {
    let (client, mut peer) = pair().await;
    let conn = client.conn_arc();
    let poll = Message::new(MessageType::Poll).with_destination("jobs");
    let mut exchange = Box::pin(client.start(poll).unwrap().exchange());
    assert!(futures::poll!(exchange.as_mut()).is_pending());
    let req = peer.recv().await;
    let answer =
        req.response(ResponseStatus::Ok)
            .with_text("job 1", tubeway_proto::MIME_TEXT, "utf-8");
    assert!(conn.answer_waiting_call(Box::new(answer)).is_none());
    drop(exchange);
    let back = peer.recv().await;
    assert_eq!(back.r#type, MessageType::Offer);
    assert_eq!(back.destination.as_deref(), Some("jobs"));
    assert_eq!(back.text_payload().unwrap(), "job 1");
    assert_eq!(conn.pending_len(), 0);
}

/// `poll_then` hands a polled message to its callback; a message the
/// callback drops untaken, or one the broker answers a withdrawn poll
/// with, goes back to its queue, and a withdrawn poll's callback learns it
/// was interrupted.
#[test]
fn a_background_poll_loses_no_message() {
    let (withdrawn_tx, withdrawn) = tokio::sync::oneshot::channel::<()>();
    let (client, broker, served) = blocking_pair(ClientOptions::default(), |mut peer| async move {
        let job = |req: &Message, text: &str| {
            req.response(ResponseStatus::Ok)
                .with_text(text, tubeway_proto::MIME_TEXT, "utf-8")
        };
        // Taken by its callback.
        let first = peer.recv().await;
        peer.send(&job(&first, "job 1")).await;
        // Dropped by its callback: offered back.
        let second = peer.recv().await;
        peer.send(&job(&second, "job 2")).await;
        let back = peer.recv().await;
        assert_eq!(
            (back.r#type, back.text_payload().unwrap().as_ref()),
            (MessageType::Offer, "job 2")
        );
        // Answered only once withdrawn: offered back.
        let third = peer.recv().await;
        withdrawn.await.unwrap();
        peer.send(&job(&third, "job 3")).await;
        let back = peer.recv().await;
        assert_eq!(
            (back.r#type, back.text_payload().unwrap().as_ref()),
            (MessageType::Offer, "job 3")
        );
        assert_eq!(back.destination.as_deref(), Some("jobs"));
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let poll = |keep: bool| {
        let tx = tx.clone();
        client
            .poll_then("jobs", Duration::from_secs(5), move |r| {
                let got = r.map(|p| {
                    p.map(|p| {
                        let text = p.message().text_payload().unwrap().into_owned();
                        if keep {
                            drop(p.into_message());
                        }
                        text
                    })
                });
                tx.send(got).unwrap();
            })
            .unwrap()
    };
    poll(true);
    assert_eq!(
        rx.recv_timeout(STEP).unwrap().unwrap().as_deref(),
        Some("job 1")
    );
    poll(false);
    assert_eq!(
        rx.recv_timeout(STEP).unwrap().unwrap().as_deref(),
        Some("job 2")
    );
    // This broker does not understand `cancel`: the withdrawn poll's
    // callback learns it at once, and the answer that comes later goes back.
    let third = poll(true);
    third.withdraw();
    withdrawn_tx.send(()).unwrap();
    let got = rx.recv_timeout(STEP).unwrap();
    assert!(matches!(got, Err(Error::Interrupted)), "{got:?}");
    broker.block_on(within(served)).unwrap();
}

/// A poll withdrawn while its request still waits for room in the write
/// queue ends at once, and is neither written nor withdrawn at the broker.
#[test]
fn a_poll_withdrawn_before_it_was_written_ends_at_once() {
    let (read_now, reading) = tokio::sync::oneshot::channel::<()>();
    let (seen_tx, seen_rx) = std::sync::mpsc::channel();
    let options = ClientOptions::default();
    let (client, broker, served) =
        blocking_pair_that_can(options, &[ops::CAP_CANCEL], |mut peer| async move {
            reading.await.unwrap();
            loop {
                let m = peer.recv().await;
                seen_tx.send(m.r#type).unwrap();
                if !m.oneway {
                    peer.answer(&m, ResponseStatus::Ok).await;
                }
                if m.r#type == MessageType::Ping {
                    break;
                }
            }
        });
    // Four of these fill most of the write queue; the fifth has no room.
    let big = bytes::Bytes::from(vec![7u8; 1_000_000]);
    for _ in 0..5 {
        let m = Message::binary(big.clone(), None);
        client.send_oneway_then("f", m, |_| {}).unwrap();
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let poll = client
        .poll_then("jobs", Duration::from_secs(60), move |r| {
            tx.send(r.map(|p| p.is_some())).unwrap();
        })
        .unwrap();
    assert_eq!(
        client.as_async().conn().in_line(),
        2,
        "the poll waits for room"
    );
    poll.withdraw();
    let got = rx.recv_timeout(STEP).unwrap();
    assert!(matches!(got, Err(Error::Interrupted)), "{got:?}");
    read_now.send(()).unwrap();
    client.ping().unwrap();
    broker.block_on(within(served)).unwrap();
    let seen: Vec<_> = seen_rx.try_iter().collect();
    assert_eq!(
        seen,
        [[MessageType::Request; 5].as_slice(), &[MessageType::Ping]].concat()
    );
}

/// A fake broker on a runtime of its own, for a blocking client on the
/// test thread: `serve` gets the welcomed peer.
fn blocking_pair<F, Fut>(
    options: ClientOptions,
    serve: F,
) -> (Client, tokio::runtime::Runtime, tokio::task::JoinHandle<()>)
where
    F: FnOnce(Peer) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    blocking_pair_that_can(options, &[], serve)
}

/// [`blocking_pair`] whose broker has `capabilities`.
fn blocking_pair_that_can<F, Fut>(
    options: ClientOptions,
    capabilities: &[&str],
    serve: F,
) -> (Client, tokio::runtime::Runtime, tokio::task::JoinHandle<()>)
where
    F: FnOnce(Peer) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let broker = tokio::runtime::Runtime::new().unwrap();
    let url = mem_url();
    let mut listener = broker.block_on(Listener::bind(&url)).unwrap();
    let capabilities = capabilities.iter().map(|&c| c.into()).collect();
    let served = broker.spawn(async move {
        let mut peer = accept(&mut listener).await;
        welcome_with(&mut peer, 1 << 20, capabilities).await;
        serve(peer).await;
    });
    let client = Client::connect_with(&url.to_string(), options).unwrap();
    (client, broker, served)
}

/// A lone blocking call reads its answer on its own thread, unregistered,
/// whether its reader spins or sleeps on the socket; what the broker sends
/// before the answer is still routed (a ping is answered), and a call
/// whose answer comes after the spin, or never, ends as any other, within
/// its one timeout.
#[test]
fn a_lone_blocking_call_routes_what_comes_before_its_answer() {
    for wait in [Some(WaitStrategy::default()), Some(WaitStrategy::PARK)] {
        lone_blocking_calls(ClientOptions {
            wait,
            ..ClientOptions::default()
        });
    }
}

fn lone_blocking_calls(options: ClientOptions) {
    let (pongs, got_pong) = std::sync::mpsc::channel();
    let (ids, first_id) = tokio::sync::oneshot::channel();
    let (sent, both_sent) = std::sync::mpsc::channel();
    let (client, broker, served) = blocking_pair(options, |mut peer| async move {
        // A ping, whose answer the client must send, then the answer to a
        // call not yet made (its id is known): both wait for the caller,
        // who reads them itself.
        let first: Message = first_id.await.unwrap();
        let ping = Message::new(MessageType::Ping);
        peer.send(&ping).await;
        peer.echo(&first).await;
        sent.send(()).unwrap();
        assert_eq!(peer.recv().await.id, first.id);
        let pong = peer.recv().await;
        assert_eq!(pong.correlation_id, Some(ping.id));
        pongs.send(pong.status()).unwrap();
        // Answered well after any spin.
        let call = peer.recv().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        peer.echo(&call).await;
        // Never answered; two pings meanwhile, for which a caller reading
        // its own answer stops waiting on the socket and registers.
        let _ = peer.recv().await;
        for _ in 0..2 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            peer.send(&Message::new(MessageType::Ping)).await;
        }
        for _ in 0..2 {
            assert_eq!(peer.recv().await.r#type, MessageType::Response);
        }
        peer.expect_eof().await;
    });
    let conn = client.as_async().conn_arc();
    let first = Message::plain_text("first")
        .with_type(MessageType::Request)
        .with_destination("echo");
    ids.send(first.clone()).unwrap();
    both_sent.recv_timeout(STEP).unwrap();
    let reply = client.request(first).unwrap();
    assert_eq!(reply.text_payload().unwrap(), "first");
    assert_eq!(got_pong.recv_timeout(STEP).unwrap(), ResponseStatus::Ok);
    let reply = client.send("echo", Message::plain_text("late")).unwrap();
    assert_eq!(reply.text_payload().unwrap(), "late");
    assert_eq!(conn.pending_len(), 0);
    let unanswered = Message::plain_text("never")
        .with_type(MessageType::Request)
        .with_destination("echo");
    // The wait on the socket and the registered wait after it share the
    // one timeout.
    let timeout = Duration::from_millis(400);
    let started = std::time::Instant::now();
    let e = client.request_timeout(unanswered, timeout).unwrap_err();
    assert!(matches!(e, Error::Timeout(t) if t == timeout), "{e:?}");
    let waited = started.elapsed();
    assert!(waited >= timeout && waited < timeout * 3 / 2, "{waited:?}");
    assert_eq!(conn.pending_len(), 0, "the timed-out call is forgotten");
    // The last handles run the writer to the end of the stream.
    drop((client, conn));
    broker.block_on(within(served)).unwrap();
}

/// Options whose reader sleeps at once instead of spinning (the default
/// on sockets), so that a lone call takes the wait on the socket itself.
fn sleeping_reader() -> ClientOptions {
    ClientOptions {
        wait: Some(WaitStrategy::PARK),
        ..ClientOptions::default()
    }
}

/// A lone blocking call whose reader sleeps waits for its answer on the
/// socket itself, not registered for it (the wait a hand-written
/// ping-pong makes), and gets it.
#[test]
fn a_lone_blocking_call_with_a_sleeping_reader_waits_on_the_socket() {
    let options = sleeping_reader();
    let (asked, request_seen) = std::sync::mpsc::channel();
    let (answer, may_answer) = tokio::sync::oneshot::channel();
    let (client, broker, served) = blocking_pair(options, |mut peer| async move {
        let call = peer.recv().await;
        asked.send(()).unwrap();
        may_answer.await.unwrap();
        peer.echo(&call).await;
        peer.expect_eof().await;
    });
    let conn = client.as_async().conn_arc();
    std::thread::scope(|s| {
        let call = s.spawn(|| client.send("echo", Message::plain_text("x")));
        request_seen.recv_timeout(STEP).unwrap();
        assert_eq!(conn.pending_len(), 0, "the call is not registered");
        answer.send(()).unwrap();
        let reply = call.join().unwrap().unwrap();
        assert_eq!(reply.text_payload().unwrap(), "x");
    });
    drop((client, conn));
    broker.block_on(within(served)).unwrap();
}

/// Closing the client (from another thread) fails a lone call asleep on
/// the socket at once, although the broker neither answers nor closes.
#[test]
fn closing_the_client_fails_a_lone_call_asleep_on_the_socket() {
    let options = sleeping_reader();
    let (asked, request_seen) = std::sync::mpsc::channel();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let (client, broker, served) = blocking_pair(options, |mut peer| async move {
        let _ = peer.recv().await;
        asked.send(()).unwrap();
        peer.expect_eof().await;
        // The connection stays open until the test has its answer.
        let _ = released.await;
    });
    std::thread::scope(|s| {
        let call = s.spawn(|| {
            let started = std::time::Instant::now();
            let r = client.send_timeout("echo", Message::plain_text("x"), STEP * 4);
            (r, started.elapsed())
        });
        request_seen.recv_timeout(STEP).unwrap();
        client.close().unwrap();
        let (r, waited) = call.join().unwrap();
        assert!(matches!(r, Err(Error::ConnectionClosed(_))), "{r:?}");
        assert!(waited < STEP, "{waited:?}");
    });
    release.send(()).unwrap();
    drop(client);
    broker.block_on(within(served)).unwrap();
}

/// A blocking call whose connection dies while it reads its own answer
/// fails at once with the reason.
#[test]
fn a_lone_blocking_call_fails_when_the_connection_dies() {
    for wait in [WaitStrategy::default(), WaitStrategy::PARK] {
        let options = ClientOptions {
            wait: Some(wait),
            ..ClientOptions::default()
        };
        let (client, broker, served) = blocking_pair(options, |mut peer| async move {
            let _ = peer.recv().await;
            drop(peer);
        });
        let started = std::time::Instant::now();
        let e = client
            .send_timeout("echo", Message::plain_text("x"), STEP)
            .unwrap_err();
        assert!(matches!(e, Error::ConnectionClosed(_)), "{e:?}");
        assert!(started.elapsed() < STEP);
        broker.block_on(within(served)).unwrap();
    }
}

/// A call begun without registering keeps its id: another call of the
/// same message meanwhile gets a fresh one, and with another call in
/// flight none begins unregistered.
#[tokio::test]
async fn a_call_begun_unregistered_keeps_its_id() {
    let (client, _peer) = pair().await;
    let conn = client.conn_arc();
    let msg = Message::new(MessageType::Request).with_destination("f");
    assert!(conn.begin_unregistered(&msg).unwrap());
    let mut again = msg.clone();
    let (_rx, _) = conn.register_pending(&mut again).unwrap();
    assert_ne!(again.id, msg.id);
    assert!(!conn.begin_unregistered(&msg).unwrap());
    let rx = conn
        .register_sent(msg.id, super::connection::Waits::Nothing)
        .unwrap();
    assert_eq!(conn.pending_len(), 2);
    assert!(conn
        .answer_waiting_call(Box::new(msg.response(ResponseStatus::Ok)))
        .is_none());
    assert_eq!(within(rx).await.unwrap().correlation_id, Some(msg.id));
}

/// A client whose reader spins, on a runtime of two workers: its calls may
/// read their own answers. Over a socket pair (`mem`), or over shared
/// memory, whose sleeping reader asks the peer to ring for it.
async fn spinning_pair(shm: bool) -> (AsyncClient, Peer) {
    let url = if shm {
        Url::Shm {
            name: format!("client-test-{}", Uuid::new_v4().simple()),
            ring: None,
        }
    } else {
        mem_url()
    };
    let mut listener = Listener::bind(&url).await.unwrap();
    let options = ClientOptions {
        wait: Some(WaitStrategy::BusySpin),
        ..ClientOptions::default()
    };
    let url = url.to_string();
    let (client, peer) = tokio::join!(AsyncClient::connect_with(&url, options), async {
        let mut peer = accept(&mut listener).await;
        welcome(&mut peer, 1 << 20).await;
        peer
    });
    (client.unwrap(), peer)
}

/// Runs `test` over a socket pair and over shared memory (see
/// [`spinning_pair`]), alone among the tests whose clients spin.
async fn over_mem_and_shm<F: Future<Output = ()>>(test: impl Fn(bool) -> F) {
    let _alone = SPINNING.lock().await;
    for shm in [false, true] {
        test(shm).await;
    }
}

/// Calls `echo` until a call reads its own answer: each answer comes
/// within the reader's spin of its request, though on a busy machine not
/// every one.
async fn one_reads_its_own_answer(client: &AsyncClient) {
    let before = client.answered_inline();
    within(async {
        while client.answered_inline() == before {
            let reply = client.send("echo", Message::plain_text("x")).await;
            assert_eq!(reply.unwrap().text_payload().unwrap(), "x");
        }
    })
    .await;
}

/// Echoes every request until the client closes.
fn echo_all(mut peer: Peer) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            match within(peer.frames.next()).await {
                Ok(Some(Decoded::Message(m))) => peer.echo(&m).await,
                Ok(None) | Err(_) => return,
                Ok(Some(other)) => panic!("unexpected {other:?}"),
            }
        }
    })
}

/// A lone async call reads its own answer when the reader is free and no
/// other call is in flight: nothing registered, no task woken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_async_call_reads_its_own_answer() {
    over_mem_and_shm(a_lone_async_call_reads_its_own_answer_over).await;
}

async fn a_lone_async_call_reads_its_own_answer_over(shm: bool) {
    let (client, peer) = spinning_pair(shm).await;
    let peer = echo_all(peer);
    let conn = client.conn_arc();
    one_reads_its_own_answer(&client).await;
    assert_eq!(conn.pending_len(), 0);
    client.close().await;
    drop(conn);
    within(peer).await.unwrap();
}

/// After a call that read its own answer, the connection's reader sleeps
/// until something comes, and is woken for it: what the broker sends
/// unasked (a ping) is answered, and the connection's end is seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_resting_between_calls_wakes_for_what_comes() {
    over_mem_and_shm(a_reader_resting_between_calls_wakes_for_what_comes_over).await;
}

async fn a_reader_resting_between_calls_wakes_for_what_comes_over(shm: bool) {
    let (client, mut peer) = spinning_pair(shm).await;
    // Echoes calls until asked for a ping; returns its answer, then hangs up.
    let peer = tokio::spawn(async move {
        loop {
            let m = peer.recv().await;
            if m.destination.as_deref() == Some("ping me") {
                break;
            }
            peer.echo(&m).await;
        }
        let ping = Message::new(MessageType::Ping);
        peer.send(&ping).await;
        let pong = peer.recv().await;
        assert_eq!(pong.correlation_id, Some(ping.id));
        pong.status()
    });
    // The last call read its own answer, which leaves the reader asleep.
    one_reads_its_own_answer(&client).await;
    client
        .send_oneway("ping me", Message::new(MessageType::Request))
        .await
        .unwrap();
    assert_eq!(within(peer).await.unwrap(), ResponseStatus::Ok);
    within(client.closed()).await;
}

/// Calls from many tasks at once over one spinning connection: whichever
/// reads an answer (its caller, another caller, the reader's task), each
/// reaches its own caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_get_their_own_answers_whoever_reads_them() {
    over_mem_and_shm(concurrent_calls_get_their_own_answers_whoever_reads_them_over).await;
}

async fn concurrent_calls_get_their_own_answers_whoever_reads_them_over(shm: bool) {
    let (client, peer) = spinning_pair(shm).await;
    let peer = echo_all(peer);
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let client = client.clone();
            tokio::spawn(async move {
                for i in 0..200 {
                    let text = format!("task {t} call {i}");
                    let reply = client.send("echo", Message::plain_text(&text)).await;
                    assert_eq!(reply.unwrap().text_payload().unwrap(), text);
                }
            })
        })
        .collect();
    for t in tasks {
        within(t).await.unwrap();
    }
    assert_eq!(client.conn_arc().pending_len(), 0);
    client.close().await;
    within(peer).await.unwrap();
}

/// A call that reads its own answer gives up after the reader's spin and
/// waits as any other: an answer that comes later arrives, one that never
/// does ends in its timeout, and a connection that dies fails it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_call_answered_late_never_or_cut_off() {
    over_mem_and_shm(an_async_call_answered_late_never_or_cut_off_over).await;
}

async fn an_async_call_answered_late_never_or_cut_off_over(shm: bool) {
    let (client, mut peer) = spinning_pair(shm).await;
    let late = client.send("echo", Message::plain_text("late"));
    let answer = async {
        let req = peer.recv().await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        peer.echo(&req).await;
    };
    let (reply, ()) = within(async { tokio::join!(late, answer) }).await;
    assert_eq!(reply.unwrap().text_payload().unwrap(), "late");

    let timeout = Duration::from_millis(300);
    let unanswered = Message::plain_text("never")
        .with_type(MessageType::Request)
        .with_destination("echo");
    let started = tokio::time::Instant::now();
    let e = within(client.request_timeout(unanswered, timeout))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout(t) if t == timeout), "{e:?}");
    let waited = started.elapsed();
    assert!(waited >= timeout && waited < timeout * 3 / 2, "{waited:?}");
    let _ = peer.recv().await;
    assert_eq!(
        client.conn_arc().pending_len(),
        0,
        "the timed-out call is forgotten"
    );

    let cut = tokio::spawn({
        let client = client.clone();
        async move { client.send("echo", Message::plain_text("cut")).await }
    });
    let _ = peer.recv().await;
    drop(peer);
    let e = within(cut).await.unwrap().unwrap_err();
    assert!(matches!(e, Error::ConnectionClosed(_)), "{e:?}");
}

/// Readers that outnumber the runtime's threads take turns on them, one
/// look each per poll: a caller spinning for its own answer in place would
/// keep the others' waiting, so their calls wait as any other. With fewer
/// readers again, calls read their own answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_taking_turns_are_not_lent() {
    let _alone = SPINNING.lock().await;
    let mut clients = Vec::new();
    let mut peers = Vec::new();
    for _ in 0..3 {
        let (client, peer) = spinning_pair(false).await;
        clients.push(client);
        peers.push(echo_all(peer));
    }
    async fn calls(client: &AsyncClient) {
        for i in 0..50 {
            let text = format!("call {i}");
            let reply = within(client.send("echo", Message::plain_text(&text))).await;
            assert_eq!(reply.unwrap().text_payload().unwrap(), text);
        }
    }
    for client in &clients {
        calls(client).await;
        assert_eq!(client.answered_inline(), 0);
    }
    let last = clients.pop().unwrap();
    last.close().await;
    drop(last);
    within(peers.pop().unwrap()).await.unwrap();
    // Its reader leaves the group when its task sees the close.
    let group = super::async_readers(&tokio::runtime::Handle::current());
    within(async {
        while group.members() > group.threads() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    one_reads_its_own_answer(&clients[0]).await;
    for (client, peer) in clients.into_iter().zip(peers) {
        client.close().await;
        within(peer).await.unwrap();
    }
}
