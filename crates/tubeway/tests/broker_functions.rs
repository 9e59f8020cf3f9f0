//! Request/reply functions through an embedded broker, over every transport:
//! local handlers (sync and async), remote workers, errors, pipelining.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{assert_status, eventually, on_thread, status, step, text, within, Harness};
use tokio::sync::mpsc;
use tubeway::{BrokerConfig, Client, Error, Message, ResponseStatus};

crate::transport_tests! {
    call_from_async_client,
    call_from_blocking_client,
    blocking_client_shared_by_threads,
    send_async_future,
    oneway_call_runs_the_handler,
    oneway_call_survives_its_sender_disconnecting,
    handler_error_is_reported_and_the_broker_keeps_serving,
    handler_panic_is_reported_and_the_broker_keeps_serving,
    unknown_function,
    a_replaced_function_serves_the_next_call,
    pipelined_calls_each_get_their_own_answer,
    async_handlers_run_on_the_connection_until_they_wait,
    remote_worker_serves_calls,
    two_idle_workers_take_calls_in_turn,
    calls_go_to_the_worker_that_owes_the_fewest_answers,
    worker_disconnect_fails_the_call_in_flight,
    a_short_remote_timeout_expires_behind_a_long_one,
    a_call_from_inside_the_process_reaches_a_remote_worker,
    a_late_remote_answer_is_dropped_and_every_call_counted,
    a_remote_answer_to_a_caller_that_left_is_dropped,
    forwarded_calls_keep_to_the_callers_in_flight_limit
        with BrokerConfig::default().max_in_flight_per_connection(2),
    call_timeout_shorter_than_the_handler,
    blocking_call_gives_up_at_its_own_timeout,
    blocking_waits_end_when_their_interrupt_check_says_so,
    function_status_counts_calls_and_errors,
    blocking_functions_answer_fail_and_panic,
    blocking_function_calls_run_at_the_same_time,
    a_blocking_function_that_outlasts_its_call_is_answered_timeout,
    blocking_handlers_that_outlast_their_calls_keep_to_the_in_flight_limit
        with BrokerConfig::default().max_in_flight_per_connection(2),
    blocking_worker_serves_while_its_thread_waits,
    a_blocking_call_runs_its_clients_async_worker_meanwhile,
    blocking_worker_sends_large_answers_while_its_thread_waits,
    deferred_answers_are_sent_from_the_thread_that_gives_them,
    a_worker_refuses_calls_beyond_its_blocking_limit,
    a_synchronous_worker_gets_no_more_calls_than_it_runs,
    a_burst_beyond_a_synchronous_workers_threads_is_never_refused,
    calls_wait_at_the_broker_for_a_worker_with_room,
    a_limit_counts_the_calls_it_was_declared_for,
    oneway_calls_beyond_a_workers_threads_wait_and_all_run,
    a_call_a_worker_refuses_goes_to_another,
    a_worker_limit_must_be_a_count_of_calls,
    blocking_oneway_calls_are_flushed_when_the_client_drops,
    large_messages_are_read_into_memory_used_again,
    without_a_pool_the_broker_keeps_no_memory
        with BrokerConfig::default().frame_pool(0),
}

fn echo(h: &Harness) {
    h.broker.create_function("echo", Ok).unwrap();
}

/// A local function `name` that answers only after `delay`.
fn answers_after(h: &Harness, name: &str, delay: Duration) {
    h.broker
        .create_async_function(name, move |_m: Message| async move {
            tokio::time::sleep(delay).await;
            Ok(Message::plain_text("late answer"))
        })
        .unwrap();
}

async fn call_from_async_client(h: &Harness) {
    echo(h);
    let c = h.client().await;
    let req = Message::plain_text("hello").with_request_id("r-1");
    let req_id = req.id;
    let resp = step(c.send("echo", req)).await.unwrap();
    assert_eq!(resp.status(), ResponseStatus::Ok);
    assert_eq!(text(&resp), "hello");
    assert_eq!(resp.correlation_id, Some(req_id));
    assert_eq!(resp.request_id.as_deref(), Some("r-1"));

    // Binary and structured payloads keep their bytes and description.
    let bin = step(c.send("echo", Message::binary(vec![0u8, 1, 255], None)))
        .await
        .unwrap();
    assert_eq!(&bin.payload[..], &[0u8, 1, 255]);
    assert_eq!(
        bin.payload_mimetype, None,
        "the default mimetype is not written"
    );
    assert_eq!(bin.mimetype(), Some(tubeway::MIME_BINARY));
    let png = Message::binary(vec![0x89u8, b'P'], Some("image/png"));
    let png = step(c.send("echo", png)).await.unwrap();
    assert_eq!(png.payload_mimetype.as_deref(), Some("image/png"));
    let v = serde_json::json!({"a": [1, 2, 3]});
    let data = step(c.send("echo", Message::data(&v))).await.unwrap();
    assert_eq!(data.data_payload().unwrap(), v);
}

async fn call_from_blocking_client(h: &Harness) {
    h.broker
        .create_function("greet", |m: Message| {
            Ok(Message::plain_text(format!("hello, {}", m.text_payload()?)))
        })
        .unwrap();
    let (url, options) = (h.url.clone(), h.client_options());
    let answers = on_thread(move || {
        let c = Client::connect_with(&url, options).unwrap();
        let a = c.send("greet", Message::plain_text("tubeway")).unwrap();
        let b = c
            .send_timeout(
                "greet",
                Message::plain_text("again"),
                Duration::from_secs(5),
            )
            .unwrap();
        let missing = c.send("nope", Message::plain_text("x")).unwrap_err();
        c.close().unwrap();
        (text(&a), text(&b), status(&missing))
    })
    .await;
    assert_eq!(answers.0, "hello, tubeway");
    assert_eq!(answers.1, "hello, again");
    assert_eq!(answers.2, ResponseStatus::FunctionNotFound);
}

/// One blocking client, several threads calling at once: quick calls (a
/// lone one reads its own answer) mixed with slow ones (which register and
/// wait); every call gets its own answer.
async fn blocking_client_shared_by_threads(h: &Harness) {
    echo(h);
    answers_after(h, "slow", Duration::from_millis(5));
    let (url, options) = (h.url.clone(), h.client_options());
    let done = on_thread(move || {
        let c = Client::connect_with(&url, options).unwrap();
        std::thread::scope(|s| {
            for t in 0..3 {
                let c = &c;
                s.spawn(move || {
                    for i in 0..300 {
                        let sent = format!("{t}/{i}");
                        let got = c.send("echo", Message::plain_text(sent.clone())).unwrap();
                        assert_eq!(text(&got), sent);
                    }
                });
            }
            for _ in 0..20 {
                let got = c.send("slow", Message::plain_text("x")).unwrap();
                assert_eq!(text(&got), "late answer");
            }
        });
        c.close().unwrap();
        true
    })
    .await;
    assert!(done);
}

async fn send_async_future(h: &Harness) {
    echo(h);
    let (url, options) = (h.url.clone(), h.client_options());
    // Calls started on a plain thread; two are waited for there, one is
    // handed back and awaited here, in async code.
    let (waited, handed_back) = on_thread(move || {
        let c = Client::connect_with(&url, options).unwrap();
        let futures: Vec<_> = (0..3)
            .map(|i| c.send_async("echo", Message::plain_text(format!("m{i}"))))
            .collect();
        let mut it = futures.into_iter();
        let f0 = it.next().unwrap();
        let f1 = it.next().unwrap();
        let f2 = it.next().unwrap();
        let waited = vec![text(&f1.wait().unwrap()), text(&f0.wait().unwrap())];
        (waited, (c, f2))
    })
    .await;
    assert_eq!(waited, ["m1", "m0"]);
    let (client, f2) = handed_back;
    let r = step(f2).await.unwrap();
    assert_eq!(text(&r), "m2");
    // A failing call fails through the future too.
    let e = step(client.send_async("nope", Message::plain_text("x")))
        .await
        .unwrap_err();
    assert_eq!(status(&e), ResponseStatus::FunctionNotFound);
    on_thread(move || drop(client)).await;
}

async fn oneway_call_runs_the_handler(h: &Harness) {
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let calls = Arc::new(AtomicUsize::new(0));
    let calls2 = calls.clone();
    h.broker
        .create_function("record", move |m: Message| {
            calls2.fetch_add(1, Ordering::SeqCst);
            tx.send(m.text_payload()?.into_owned()).unwrap();
            Ok(Message::plain_text("ignored"))
        })
        .unwrap();
    let c = h.client().await;
    for i in 0..3 {
        step(c.send_oneway("record", Message::plain_text(format!("fire {i}"))))
            .await
            .unwrap();
    }
    // Calls run concurrently, so in any order.
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(step(rx.recv()).await.unwrap());
    }
    got.sort();
    assert_eq!(got, ["fire 0", "fire 1", "fire 2"]);
    // The broker sent no response to the oneway calls: a normal call on the
    // same connection is answered with its own response.
    let r = step(c.send("record", Message::plain_text("normal")))
        .await
        .unwrap();
    assert_eq!(text(&r), "ignored");
    assert_eq!(step(rx.recv()).await.unwrap(), "normal");
    assert_eq!(calls.load(Ordering::SeqCst), 4);

    // The same of an async handler that answers without waiting.
    let (atx, mut arx) = mpsc::unbounded_channel::<String>();
    h.broker
        .create_async_function("record-async", move |m: Message| {
            let atx = atx.clone();
            async move {
                atx.send(m.text_payload()?.into_owned()).unwrap();
                Ok(Message::plain_text("ignored"))
            }
        })
        .unwrap();
    step(c.send_oneway("record-async", Message::plain_text("fire")))
        .await
        .unwrap();
    let r = step(c.send("record-async", Message::plain_text("normal")))
        .await
        .unwrap();
    assert_eq!(text(&r), "ignored");
    assert_eq!(step(arx.recv()).await.unwrap(), "fire");
    assert_eq!(step(arx.recv()).await.unwrap(), "normal");

    // A oneway call to a remote worker reaches it too.
    let worker_client = h.client().await;
    let (wtx, mut wrx) = mpsc::unbounded_channel::<String>();
    let _w = step(worker_client.serve("remote-record", move |m: Message| {
        wtx.send(m.text_payload()?.into_owned()).unwrap();
        Ok(Message::plain_text("ignored"))
    }))
    .await
    .unwrap();
    step(c.send_oneway("remote-record", Message::plain_text("to the worker")))
        .await
        .unwrap();
    assert_eq!(step(wrx.recv()).await.unwrap(), "to the worker");
}

async fn oneway_call_survives_its_sender_disconnecting(h: &Harness) {
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    h.broker
        .create_async_function("slow-record", move |m: Message| {
            let tx = tx.clone();
            async move {
                // Still running when the sender's connection is gone.
                tokio::time::sleep(Duration::from_millis(100)).await;
                tx.send(m.text_payload()?.into_owned()).unwrap();
                Ok(Message::request())
            }
        })
        .unwrap();
    let c = h.client().await;
    step(c.send_oneway("slow-record", Message::plain_text("fire and forget")))
        .await
        .unwrap();
    c.close().await;
    drop(c);
    assert_eq!(step(rx.recv()).await.unwrap(), "fire and forget");
}

async fn handler_error_is_reported_and_the_broker_keeps_serving(h: &Harness) {
    echo(h);
    h.broker
        .create_function("fails", |m: Message| {
            Err(format!("no luck with {}", m.text_payload()?).into())
        })
        .unwrap();
    let c = h.client().await;
    for i in 0..2 {
        match step(c.send("fails", Message::plain_text(format!("x{i}")))).await {
            Err(Error::Status { status, reason }) => {
                assert_eq!(status, ResponseStatus::HandlerError);
                assert_eq!(reason, format!("no luck with x{i}"));
            }
            other => panic!("expected handler_error, got {other:?}"),
        }
        let ok = step(c.send("echo", Message::plain_text("still here")))
            .await
            .unwrap();
        assert_eq!(text(&ok), "still here");
    }

    // The same from a remote worker.
    let worker_client = h.client().await;
    let _w = step(worker_client.serve("remote-fails", |_| Err("remote no luck".into())))
        .await
        .unwrap();
    match step(c.send("remote-fails", Message::plain_text("x"))).await {
        Err(Error::Status { status, reason }) => {
            assert_eq!(status, ResponseStatus::HandlerError);
            assert_eq!(reason, "remote no luck");
        }
        other => panic!("expected handler_error, got {other:?}"),
    }
}

async fn handler_panic_is_reported_and_the_broker_keeps_serving(h: &Harness) {
    echo(h);
    h.broker
        .create_function("panics", |_| panic!("deliberate test panic"))
        .unwrap();
    h.broker
        .create_async_function("panics-async", |_| async {
            panic!("deliberate async test panic")
        })
        .unwrap();
    // A panic before the handler's future is made.
    h.broker
        .create_async_function("panics-early", |m: Message| {
            assert!(m.payload.is_empty(), "deliberate early async test panic");
            async { Ok(Message::request()) }
        })
        .unwrap();
    let c = h.client().await;
    for f in ["panics", "panics-async", "panics-early", "panics"] {
        match step(c.send(f, Message::plain_text("x"))).await {
            Err(Error::Status { status, reason }) => {
                assert_eq!(status, ResponseStatus::HandlerError, "{f}");
                assert!(reason.contains("panicked"), "{f}: {reason}");
            }
            other => panic!("{f}: expected handler_error, got {other:?}"),
        }
        let ok = step(c.send("echo", Message::plain_text("alive")))
            .await
            .unwrap();
        assert_eq!(text(&ok), "alive");
    }

    // A remote worker whose handler panics answers handler_error too.
    let worker_client = h.client().await;
    let _w = step(worker_client.serve("remote-panics", |_| panic!("deliberate worker test panic")))
        .await
        .unwrap();
    let e = step(c.send("remote-panics", Message::plain_text("x")))
        .await
        .unwrap_err();
    assert_eq!(status(&e), ResponseStatus::HandlerError);
    let ok = step(c.send("echo", Message::plain_text("alive")))
        .await
        .unwrap();
    assert_eq!(text(&ok), "alive");
}

async fn unknown_function(h: &Harness) {
    let c = h.client().await;
    assert_status(
        step(c.send("nowhere", Message::plain_text("x"))).await,
        ResponseStatus::FunctionNotFound,
    );
    assert_status(
        step(c.function_status("nowhere")).await,
        ResponseStatus::FunctionNotFound,
    );
    assert_status(
        step(c.remove_function("nowhere")).await,
        ResponseStatus::FunctionNotFound,
    );
    // A removed function is unknown from then on.
    echo(h);
    step(c.send("echo", Message::plain_text("x")))
        .await
        .unwrap();
    step(c.remove_function("echo")).await.unwrap();
    assert_status(
        step(c.send("echo", Message::plain_text("x"))).await,
        ResponseStatus::FunctionNotFound,
    );
}

/// A connection keeps the function it called last; a function removed and
/// created again under that name must still serve its next call.
async fn a_replaced_function_serves_the_next_call(h: &Harness) {
    let answer = |n: &'static str| move |_m: Message| Ok(Message::plain_text(n));
    let c = h.client().await;
    let call = || c.send("swap", Message::plain_text("?"));
    h.broker.create_function("swap", answer("first")).unwrap();
    assert_eq!(text(&step(call()).await.unwrap()), "first");
    h.broker.remove_function("swap").unwrap();
    h.broker.create_function("swap", answer("second")).unwrap();
    assert_eq!(text(&step(call()).await.unwrap()), "second");

    // From a local function to a worker, and back.
    h.broker.remove_function("swap").unwrap();
    let worker_client = h.client().await;
    let worker = step(worker_client.serve("swap", answer("worker")))
        .await
        .unwrap();
    assert_eq!(text(&step(call()).await.unwrap()), "worker");
    step(worker.stop()).await.unwrap();
    assert_status(step(call()).await, ResponseStatus::FunctionNotFound);
    h.broker.create_function("swap", answer("third")).unwrap();
    assert_eq!(text(&step(call()).await.unwrap()), "third");
}

async fn pipelined_calls_each_get_their_own_answer(h: &Harness) {
    const N: u64 = 64;
    let finished = Arc::new(Mutex::new(Vec::new()));
    let finished2 = finished.clone();
    h.broker
        .create_async_function("sleepy", move |m: Message| {
            let finished = finished2.clone();
            async move {
                let i: u64 = m.text_payload()?.parse()?;
                // Later requests finish first: the answers leave out of order.
                tokio::time::sleep(Duration::from_millis((N - i) * 4)).await;
                finished.lock().unwrap().push(i);
                Ok(Message::plain_text(format!("answer {i}")))
            }
        })
        .unwrap();
    let c = h.client().await;
    let arrived = Arc::new(Mutex::new(Vec::new()));
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..N {
        let c = c.clone(); // one connection shared by every call
        let arrived = arrived.clone();
        calls.spawn(async move {
            let r = c
                .send("sleepy", Message::plain_text(i.to_string()))
                .await
                .unwrap();
            arrived.lock().unwrap().push(i);
            (i, text(&r))
        });
    }
    let mut answered = 0;
    while let Some(joined) = step(calls.join_next()).await {
        let (i, answer) = joined.unwrap();
        assert_eq!(answer, format!("answer {i}"));
        answered += 1;
    }
    assert_eq!(answered, N);
    let finished = finished.lock().unwrap().clone();
    let arrived = arrived.lock().unwrap().clone();
    let in_order: Vec<u64> = (0..N).collect();
    assert_ne!(
        finished, in_order,
        "the handlers did not finish out of order"
    );
    assert_ne!(arrived, in_order, "the answers did not arrive out of order");
    assert_eq!(step(c.stats()).await.unwrap().connections, 1);
}

/// An async handler runs on its caller's connection until it first waits:
/// one that never waits takes no task of its own, and one that waits leaves
/// the connection free to read the call that releases it.
async fn async_handlers_run_on_the_connection_until_they_wait(h: &Harness) {
    // "wait" says it waits, then waits for a permit that "release" gives;
    // "now" records its task.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let waits = Arc::new(tokio::sync::Notify::new());
    let tasks = Arc::new(Mutex::new(Vec::new()));
    let (g, w, t) = (gate.clone(), waits.clone(), tasks.clone());
    h.broker
        .create_async_function("step", move |m: Message| {
            let (gate, waits, tasks) = (g.clone(), w.clone(), t.clone());
            async move {
                let text = m.text_payload()?;
                if text == "wait" {
                    waits.notify_one();
                    drop(gate.acquire().await?);
                } else if text == "release" {
                    gate.add_permits(1);
                } else {
                    tasks.lock().unwrap().push(tokio::task::try_id());
                }
                drop(text);
                Ok(m)
            }
        })
        .unwrap();
    let c = h.client().await;
    let waiting = tokio::spawn({
        let c = c.clone();
        async move { c.send("step", Message::plain_text("wait")).await }
    });
    step(waits.notified()).await;
    let freed = step(c.send("step", Message::plain_text("release"))).await;
    assert_eq!(text(&freed.unwrap()), "release");
    assert_eq!(text(&step(waiting).await.unwrap().unwrap()), "wait");

    for _ in 0..3 {
        let r = step(c.send("step", Message::plain_text("now"))).await;
        assert_eq!(text(&r.unwrap()), "now");
    }
    // All three ran in the same task (or in none): the connection's, not
    // one spawned per call.
    let tasks = tasks.lock().unwrap().clone();
    assert_eq!(tasks.len(), 3);
    assert!(tasks.iter().all(|t| *t == tasks[0]), "{tasks:?}");
}

async fn remote_worker_serves_calls(h: &Harness) {
    let worker_client = h.client().await;
    let worker = step(worker_client.serve("upper", |m: Message| {
        Ok(Message::plain_text(m.text_payload()?.to_uppercase()).with_subject("uppercased"))
    }))
    .await
    .unwrap();
    assert_eq!(worker.function(), "upper");
    let caller = h.client().await;
    let req = Message::plain_text("shout").with_request_id("rid-7");
    let req_id = req.id;
    let r = step(caller.send("upper", req)).await.unwrap();
    assert_eq!(text(&r), "SHOUT");
    assert_eq!(r.subject.as_deref(), Some("uppercased"));
    assert_eq!(r.correlation_id, Some(req_id));
    assert_eq!(r.request_id.as_deref(), Some("rid-7"));

    let status = step(caller.function_status("upper")).await.unwrap();
    assert_eq!((status.local, status.workers), (false, 1));

    // An async handler in a worker, and a blocking caller.
    let _w2 = step(worker_client.serve_async("lower", |m: Message| async move {
        Ok(Message::plain_text(m.text_payload()?.to_lowercase()))
    }))
    .await
    .unwrap();
    let (url, options) = (h.url.clone(), h.client_options());
    let r = on_thread(move || {
        let c = Client::connect_with(&url, options).unwrap();
        text(&c.send("lower", Message::plain_text("QUIET")).unwrap())
    })
    .await;
    assert_eq!(r, "quiet");

    // Once the worker stops, the function is gone.
    step(worker.stop()).await.unwrap();
    assert_status(
        step(caller.send("upper", Message::plain_text("x"))).await,
        ResponseStatus::FunctionNotFound,
    );
}

async fn two_idle_workers_take_calls_in_turn(h: &Harness) {
    let w1 = h.client().await;
    let w2 = h.client().await;
    let _s1 = step(w1.serve("who", |_| Ok(Message::plain_text("w1"))))
        .await
        .unwrap();
    let _s2 = step(w2.serve("who", |_| Ok(Message::plain_text("w2"))))
        .await
        .unwrap();
    let status = step(w1.function_status("who")).await.unwrap();
    assert_eq!(status.workers, 2);
    let caller = h.client().await;
    let mut seen = Vec::new();
    for _ in 0..10 {
        let r = step(caller.send("who", Message::plain_text("?")))
            .await
            .unwrap();
        seen.push(text(&r));
    }
    let n1 = seen.iter().filter(|s| *s == "w1").count();
    let n2 = seen.iter().filter(|s| *s == "w2").count();
    assert_eq!((n1, n2), (5, 5), "calls not shared round-robin: {seen:?}");
    assert!(
        seen.windows(2).all(|w| w[0] != w[1]),
        "calls did not alternate: {seen:?}"
    );
}

/// A worker that holds a call (slow, or hung) gets no more calls while
/// another owes fewer answers, even once the held call has timed out; its
/// late answer makes it a peer of the others again.
async fn calls_go_to_the_worker_that_owes_the_fewest_answers(h: &Harness) {
    let (_held_client, _held, mut started, release) = held_worker(h, "busy").await;
    let fast_client = h.client().await;
    let _fast = step(fast_client.serve("busy", |_| Ok(Message::plain_text("fast"))))
        .await
        .unwrap();
    let caller = h.client().await;
    let call = |timeout| caller.send_timeout("busy", Message::plain_text("x"), timeout);
    // Calls until one reaches the held worker, and times out there. On a
    // loaded machine a call to the fast worker may time out too: only one
    // the held worker started counts.
    let mut held_one = false;
    for _ in 0..8 {
        match step(call(Duration::from_millis(300))).await {
            Ok(r) => assert_eq!(text(&r), "fast"),
            Err(e) => {
                assert_eq!(status(&e), ResponseStatus::Timeout, "{e}");
                let started = tokio::time::timeout(Duration::from_secs(1), started.recv());
                if matches!(started.await, Ok(Some(()))) {
                    held_one = true;
                    break;
                }
            }
        }
    }
    assert!(held_one, "no call reached the held worker");
    // It still owes that answer: every call goes to the other worker. (A
    // call that went to the held one would time out, however long it waits.)
    for i in 0..20 {
        match step(call(common::STEP - Duration::from_secs(1))).await {
            Ok(r) => assert_eq!(text(&r), "fast", "call {i}"),
            Err(e) => panic!("call {i} went to the held worker: {e}"),
        }
    }
    // Its late answer, and it takes calls again.
    release.add_permits(100);
    common::eventually("the held worker takes calls once it has answered", || {
        let caller = caller.clone();
        async move {
            matches!(caller.send("busy", Message::plain_text("x")).await,
                Ok(r) if text(&r) == "done")
        }
    })
    .await;
}

async fn worker_disconnect_fails_the_call_in_flight(h: &Harness) {
    let worker_client = h.client().await;
    let (started_tx, mut started_rx) = mpsc::unbounded_channel::<()>();
    let _w = step(worker_client.serve_async("stuck", move |_m: Message| {
        let started = started_tx.clone();
        async move {
            started.send(()).unwrap();
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(Message::plain_text("too late"))
        }
    }))
    .await
    .unwrap();
    let caller = h.client().await;
    let call = {
        let caller = caller.clone();
        tokio::spawn(async move {
            caller
                .send_timeout("stuck", Message::plain_text("x"), Duration::from_secs(25))
                .await
        })
    };
    step(started_rx.recv()).await.unwrap();
    let t0 = Instant::now();
    worker_client.close().await;
    let e = within(Duration::from_secs(5), call)
        .await
        .unwrap()
        .unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(status(&e), ResponseStatus::ServerError, "{e}");
    // The function had no other worker: it is gone, and the caller's
    // connection is fine.
    step(caller.ping()).await.unwrap();
    common::eventually("the function is removed with its last worker", || {
        let caller = caller.clone();
        async move {
            matches!(caller.function_status("stuck").await,
                Err(e) if e.status() == Some(ResponseStatus::FunctionNotFound))
        }
    })
    .await;
}

/// Serves `name` on a connection of its own; each call reports that it
/// started, then waits for a permit of `release` before it answers "done".
async fn held_worker(
    h: &Harness,
    name: &str,
) -> (
    tubeway::AsyncClient,
    tubeway::Worker,
    mpsc::UnboundedReceiver<()>,
    Arc<tokio::sync::Semaphore>,
) {
    let client = h.client().await;
    let (started_tx, started_rx) = mpsc::unbounded_channel::<()>();
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let held = release.clone();
    let worker = step(client.serve_async(name, move |_m: Message| {
        let (started, held) = (started_tx.clone(), held.clone());
        async move {
            started.send(()).unwrap();
            held.acquire().await.unwrap().forget();
            Ok(Message::plain_text("done"))
        }
    }))
    .await
    .unwrap();
    (client, worker, started_rx, release)
}

/// The broker sweeps a worker's calls for expired deadlines: a call with
/// a short timeout must not wait for the deadline of an earlier, longer one.
async fn a_short_remote_timeout_expires_behind_a_long_one(h: &Harness) {
    let (worker_client, _w, mut started, _release) = held_worker(h, "held").await;
    let caller = h.client().await;
    let long = {
        let caller = caller.clone();
        tokio::spawn(async move {
            caller
                .send_timeout("held", Message::plain_text("long"), Duration::from_secs(20))
                .await
        })
    };
    step(started.recv()).await.unwrap();
    for _ in 0..2 {
        let t0 = Instant::now();
        let r = step(caller.send_timeout(
            "held",
            Message::plain_text("short"),
            Duration::from_millis(100),
        ))
        .await;
        assert_status(r, ResponseStatus::Timeout);
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    }
    // The long call is still owed; the worker's end fails it.
    worker_client.close().await;
    let e = within(Duration::from_secs(5), long)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(status(&e), ResponseStatus::ServerError, "{e}");
}

/// `Broker::call` waits on a channel for a worker's answer, where a
/// client's call is routed back to its connection.
async fn a_call_from_inside_the_process_reaches_a_remote_worker(h: &Harness) {
    let (worker_client, _w, mut started, release) = held_worker(h, "inside").await;
    release.add_permits(1);
    let r = step(h.broker.call("inside", Message::plain_text("x")))
        .await
        .unwrap();
    assert_eq!(text(&r), "done");
    step(started.recv()).await.unwrap();
    // A worker that leaves mid-call fails the call at once.
    let broker = h.broker.clone();
    let call = tokio::spawn(async move { broker.call("inside", Message::plain_text("y")).await });
    step(started.recv()).await.unwrap();
    worker_client.close().await;
    let e = within(Duration::from_secs(5), call)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.status, ResponseStatus::ServerError, "{e:?}");
    // The message's timeout bounds the wait, as for a client's call.
    let (_worker_client, _w, mut started, _release) = held_worker(h, "inside-held").await;
    let t0 = Instant::now();
    let call = h.broker.call(
        "inside-held",
        Message::plain_text("z").with_timeout(Duration::from_millis(100)),
    );
    let e = step(call).await.unwrap_err();
    assert_eq!(e.status, ResponseStatus::Timeout, "{e:?}");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    step(started.recv()).await.unwrap();
}

async fn a_late_remote_answer_is_dropped_and_every_call_counted(h: &Harness) {
    let (_worker_client, _w, mut started, release) = held_worker(h, "late").await;
    let caller = h.client().await;
    let r = step(caller.send_timeout("late", Message::plain_text("x"), Duration::from_millis(100)))
        .await;
    assert_status(r, ResponseStatus::Timeout);
    step(started.recv()).await.unwrap();
    // Answered now, to nobody; then a call that is answered in time.
    release_and_call_again(&caller, "late", &release, (2, 1)).await;
}

async fn a_remote_answer_to_a_caller_that_left_is_dropped(h: &Harness) {
    let (_worker_client, _w, mut started, release) = held_worker(h, "left").await;
    let caller = h.client().await;
    let call = {
        let caller = caller.clone();
        tokio::spawn(async move { caller.send("left", Message::plain_text("x")).await })
    };
    step(started.recv()).await.unwrap();
    let before = h.broker.stats().connections;
    caller.close().await;
    assert!(matches!(
        within(Duration::from_secs(5), call).await.unwrap(),
        Err(Error::ConnectionClosed(_))
    ));
    common::eventually("the broker has seen the caller leave", || {
        let h = h.broker.clone();
        async move { h.stats().connections < before }
    })
    .await;
    // The answer finds its caller gone; the worker serves the next caller.
    let next = h.client().await;
    release_and_call_again(&next, "left", &release, (2, 0)).await;
}

/// Lets a [`held_worker`] answer the call it holds and the next one, which
/// `caller` makes; then the function counts `(calls, errors)`. The two
/// handlers may end in either order, so the held call's answer may be
/// counted after the next call's comes back.
async fn release_and_call_again(
    caller: &tubeway::AsyncClient,
    name: &str,
    release: &tokio::sync::Semaphore,
    counted: (u64, u64),
) {
    release.add_permits(2);
    let r = step(caller.send(name, Message::plain_text("y")))
        .await
        .unwrap();
    assert_eq!(text(&r), "done");
    common::eventually(&format!("{name} counted {counted:?}"), || {
        let caller = caller.clone();
        let name = name.to_owned();
        async move {
            matches!(caller.function_status(&name).await,
                Ok(s) if (s.calls, s.errors) == counted)
        }
    })
    .await;
}

/// Calls forwarded to a worker hold their caller's slots of requests in
/// flight until answered: past the limit, the broker stops reading from
/// the caller.
async fn forwarded_calls_keep_to_the_callers_in_flight_limit(h: &Harness) {
    let (_worker_client, _w, mut started, release) = held_worker(h, "slots").await;
    let caller = h.client().await;
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let caller = caller.clone();
            tokio::spawn(async move {
                caller
                    .send("slots", Message::plain_text(format!("{i}")))
                    .await
            })
        })
        .collect();
    for _ in 0..2 {
        step(started.recv()).await.unwrap();
    }
    // A negative: given time, the third call still has not reached the worker.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(started.try_recv().is_err(), "a third call was forwarded");
    release.add_permits(1);
    step(started.recv()).await.unwrap();
    release.add_permits(2);
    for call in calls {
        let r = within(Duration::from_secs(5), call).await.unwrap().unwrap();
        assert_eq!(text(&r), "done");
    }
}

async fn call_timeout_shorter_than_the_handler(h: &Harness) {
    echo(h);
    answers_after(h, "slow", Duration::from_secs(3));
    let c = h.client().await;
    let t0 = Instant::now();
    let r =
        step(c.send_timeout("slow", Message::plain_text("x"), Duration::from_millis(200))).await;
    let took = t0.elapsed();
    // The broker answers `timeout` itself (the client waits longer), and
    // counts the call as failed.
    assert_status(r, ResponseStatus::Timeout);
    let slow = step(c.function_status("slow")).await.unwrap();
    assert_eq!((slow.calls, slow.errors), (1, 1));
    assert!(
        took >= Duration::from_millis(200),
        "answered after {took:?}"
    );
    assert!(took < Duration::from_secs(2), "answered after {took:?}");
    // The connection still serves other calls while the handler runs on.
    let ok = step(c.send("echo", Message::plain_text("next")))
        .await
        .unwrap();
    assert_eq!(text(&ok), "next");

    // The same through a remote worker.
    let worker_client = h.client().await;
    let _w = step(
        worker_client.serve_async("slow-remote", |_m: Message| async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            Ok(Message::plain_text("slow answer"))
        }),
    )
    .await
    .unwrap();
    let t0 = Instant::now();
    let r = step(c.send_timeout(
        "slow-remote",
        Message::plain_text("x"),
        Duration::from_millis(200),
    ))
    .await;
    assert_status(r, ResponseStatus::Timeout);
    assert!(t0.elapsed() < Duration::from_secs(2));
}

/// The blocking client's own deadline, with the broker still waiting: the
/// call ends on time whether its thread sleeps or spins, and the
/// connection serves the next call.
async fn blocking_call_gives_up_at_its_own_timeout(h: &Harness) {
    echo(h);
    answers_after(h, "stuck", Duration::from_secs(30));
    for wait in [None, Some(tubeway::WaitStrategy::BusySpin)] {
        let (url, mut options) = (h.url.clone(), h.client_options());
        if wait.is_some() {
            options.wait = wait;
        }
        let (r, took, next) = on_thread(move || {
            let c = Client::connect_with(&url, options).unwrap();
            // The broker is told 30 s; the client waits 300 ms.
            let call = Message::plain_text("x")
                .with_type(tubeway::MessageType::Request)
                .with_destination("stuck")
                .with_timeout(Duration::from_secs(30));
            let t0 = Instant::now();
            let r = c.request_timeout(call, Duration::from_millis(300));
            let took = t0.elapsed();
            let next = c
                .send("echo", Message::plain_text("next"))
                .map(|m| text(&m));
            (r, took, next)
        })
        .await;
        assert!(matches!(r, Err(Error::Timeout(_))), "{wait:?}: {r:?}");
        assert!(
            took >= Duration::from_millis(300),
            "{wait:?}: after {took:?}"
        );
        assert!(took < Duration::from_secs(5), "{wait:?}: after {took:?}");
        assert_eq!(next.unwrap(), "next", "{wait:?}");
    }
}

thread_local! {
    /// Looks of [`third_look`] on this thread.
    static LOOKS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// An interrupt check that says to stop at its third look.
fn third_look() -> bool {
    LOOKS.with(|l| {
        l.set(l.get() + 1);
        l.get() >= 3
    })
}

/// Inside `interruptible`, a call that waits (whether its thread sleeps on
/// the connection or spins) and a poll of an empty queue end with
/// `Interrupted` at the check's third look, long before their timeouts;
/// the poll is withdrawn, so the next message waits for the next poll.
async fn blocking_waits_end_when_their_interrupt_check_says_so(h: &Harness) {
    echo(h);
    answers_after(h, "stuck", Duration::from_secs(30));
    let admin = h.client().await;
    step(admin.create_queue("jobs", 10, tubeway::ops::QueueKind::Bounded))
        .await
        .unwrap();
    let every = Duration::from_millis(20);
    for wait in [None, Some(tubeway::WaitStrategy::BusySpin)] {
        let (url, mut options) = (h.url.clone(), h.client_options());
        if wait.is_some() {
            options.wait = wait;
        }
        let (offered_tx, offered_rx) = std::sync::mpsc::channel::<()>();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let waiter = tokio::spawn(on_thread(move || {
            let c = Client::connect_with(&url, options).unwrap();
            let interrupted = |op: &dyn Fn() -> Result<(), Error>| {
                LOOKS.with(|l| l.set(0));
                let t0 = Instant::now();
                let r = tubeway::blocking::interruptible(every, third_look, op);
                (r, t0.elapsed(), LOOKS.with(std::cell::Cell::get))
            };
            let call = interrupted(&|| {
                c.send_timeout("stuck", Message::plain_text("x"), Duration::from_secs(30))
                    .map(drop)
            });
            let poll = interrupted(&|| c.poll("jobs", Duration::from_secs(30)).map(drop));
            ready_tx.send(()).unwrap();
            offered_rx.recv_timeout(common::TEST_TIMEOUT).unwrap();
            let next = c.poll("jobs", common::STEP).unwrap().map(|m| text(&m));
            let echo = c.send("echo", Message::plain_text("on")).map(|m| text(&m));
            (call, poll, next, echo)
        }));
        step(ready_rx).await.unwrap();
        step(admin.offer("jobs", Message::plain_text("job"), Duration::ZERO))
            .await
            .unwrap();
        offered_tx.send(()).unwrap();
        let (call, poll, next, echo) = step(waiter).await.unwrap();
        for (what, (r, took, looks)) in [("call", call), ("poll", poll)] {
            assert!(
                matches!(r, Err(Error::Interrupted)),
                "{wait:?} {what}: {r:?}"
            );
            assert_eq!(looks, 3, "{wait:?} {what}");
            // Two whole intervals at least before the third look.
            assert!(took >= 2 * every, "{wait:?} {what}: after {took:?}");
            assert!(
                took < Duration::from_secs(5),
                "{wait:?} {what}: after {took:?}"
            );
        }
        assert_eq!(next.as_deref(), Some("job"), "{wait:?}");
        assert_eq!(echo.unwrap(), "on", "{wait:?}");
    }
    // A blocking client wrapping an async one waits on the process-wide
    // runtime, and is cut short there too.
    let wrapped = Client::from_async(h.client().await);
    let (r, looks) = on_thread(move || {
        let r = tubeway::blocking::interruptible(every, third_look, || {
            wrapped.poll("jobs", Duration::from_secs(30))
        });
        (r, LOOKS.with(std::cell::Cell::get))
    })
    .await;
    assert!(matches!(r, Err(Error::Interrupted)), "{r:?}");
    assert_eq!(looks, 3);
}

async fn function_status_counts_calls_and_errors(h: &Harness) {
    echo(h);
    h.broker
        .create_function("fails", |_| Err("no".into()))
        .unwrap();
    let c = h.client().await;
    for _ in 0..3 {
        step(c.send("echo", Message::plain_text("x")))
            .await
            .unwrap();
    }
    step(c.send("fails", Message::plain_text("x")))
        .await
        .unwrap_err();
    let echo_status = step(c.function_status("echo")).await.unwrap();
    assert_eq!(
        (
            echo_status.local,
            echo_status.workers,
            echo_status.calls,
            echo_status.errors
        ),
        (true, 0, 3, 0)
    );
    let fails = step(c.function_status("fails")).await.unwrap();
    assert_eq!((fails.calls, fails.errors), (1, 1));
    let names: Vec<String> = step(c.list_functions())
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.name)
        .collect();
    assert_eq!(names, ["echo", "fails"]);
    // A worker cannot take over a function served inside the broker.
    assert_status(step(c.serve("echo", Ok)).await, ResponseStatus::Conflict);
}

/// A function served by a handler that may block: it answers, fails and
/// panics as any other, and each call is counted once.
async fn blocking_functions_answer_fail_and_panic(h: &Harness) {
    let b = &h.broker;
    b.create_blocking_function("b-echo", Ok).unwrap();
    b.create_blocking_function("b-fails", |_| Err("blocked no luck".into()))
        .unwrap();
    b.create_blocking_function("b-panics", |_| panic!("deliberate blocking test panic"))
        .unwrap();
    let c = h.client().await;
    let r = step(c.send("b-echo", Message::plain_text("hi"))).await;
    assert_eq!(text(&r.unwrap()), "hi");
    for (name, says) in [
        ("b-fails", "blocked no luck"),
        ("b-panics", "deliberate blocking test panic"),
    ] {
        match step(c.send(name, Message::plain_text("x"))).await {
            Err(Error::Status { status, reason }) => {
                assert_eq!(status, ResponseStatus::HandlerError);
                assert!(reason.contains(says), "{name}: {reason}");
            }
            other => panic!("expected handler_error from {name}, got {other:?}"),
        }
    }
    // Oneway calls run too, and get nothing.
    step(c.send_oneway("b-echo", Message::plain_text("quiet")))
        .await
        .unwrap();
    let r = step(c.send("b-echo", Message::plain_text("still here"))).await;
    assert_eq!(text(&r.unwrap()), "still here");
    for (name, calls, errors) in [("b-echo", 3, 0), ("b-fails", 1, 1), ("b-panics", 1, 1)] {
        let s = step(c.function_status(name)).await.unwrap();
        assert_eq!((s.calls, s.errors), (calls, errors), "{name}");
    }
}

/// Calls of a blocking handler run at the same time, on threads of their
/// own: each of these waits until both have started.
async fn blocking_function_calls_run_at_the_same_time(h: &Harness) {
    let started = Arc::new((Mutex::new(0usize), std::sync::Condvar::new()));
    h.broker
        .create_blocking_function("meet", move |m: Message| {
            let (count, met) = &*started;
            let mut n = count.lock().unwrap();
            *n += 1;
            met.notify_all();
            let (n, waited) = met
                .wait_timeout_while(n, common::TEST_TIMEOUT, |n| *n < 2)
                .unwrap();
            drop(n);
            if waited.timed_out() {
                return Err("the other call never started".into());
            }
            Ok(m)
        })
        .unwrap();
    let c = h.client().await;
    let (a, b) = within(
        common::TEST_TIMEOUT,
        futures::future::join(
            c.send("meet", Message::plain_text("a")),
            c.send("meet", Message::plain_text("b")),
        ),
    )
    .await;
    assert_eq!(
        (text(&a.unwrap()), text(&b.unwrap())),
        ("a".into(), "b".into())
    );
}

/// A blocking handler cannot be stopped: the broker answers `timeout` when
/// the call's time is up, serves the next calls meanwhile, drops what the
/// handler gives later, and counts the call once, as failed.
async fn a_blocking_function_that_outlasts_its_call_is_answered_timeout(h: &Harness) {
    echo(h);
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let (ended_tx, mut ended_rx) = mpsc::unbounded_channel();
    h.broker
        .create_blocking_function("stuck", move |_| {
            let _ = release_rx
                .lock()
                .unwrap()
                .recv_timeout(common::TEST_TIMEOUT);
            let _ = ended_tx.send(());
            Ok(Message::plain_text("too late"))
        })
        .unwrap();
    let c = h.client().await;
    let r = step(c.send_timeout(
        "stuck",
        Message::plain_text("x"),
        Duration::from_millis(200),
    ))
    .await;
    assert_status(r, ResponseStatus::Timeout);
    let r = step(c.send("echo", Message::plain_text("next"))).await;
    assert_eq!(text(&r.unwrap()), "next");
    release_tx.send(()).unwrap();
    step(ended_rx.recv()).await.unwrap();
    // The late answer went nowhere: the next answer on this connection is
    // the next call's.
    let r = step(c.send("echo", Message::plain_text("after"))).await;
    assert_eq!(text(&r.unwrap()), "after");
    let s = step(c.function_status("stuck")).await.unwrap();
    assert_eq!((s.calls, s.errors), (1, 1));
}

/// A call of a blocking handler keeps its slot of the caller's in-flight
/// limit until the handler ends, not only until the call times out: else a
/// caller could pile up hung handlers on the pool without bound.
async fn blocking_handlers_that_outlast_their_calls_keep_to_the_in_flight_limit(h: &Harness) {
    let released = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
    let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    {
        let (released, running, most) = (released.clone(), running.clone(), most.clone());
        h.broker
            .create_blocking_function("hangs", move |m: Message| {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let (lock, cvar) = &*released;
                let held = lock.lock().unwrap();
                let _ = cvar
                    .wait_timeout_while(held, common::TEST_TIMEOUT, |r| !*r)
                    .unwrap();
                running.fetch_sub(1, Ordering::SeqCst);
                Ok(m)
            })
            .unwrap();
    }
    let c = h.client().await;
    let mut calls: futures::stream::FuturesUnordered<_> = (0..4)
        .map(|_| {
            c.send_timeout(
                "hangs",
                Message::plain_text("x"),
                Duration::from_millis(300),
            )
        })
        .collect();
    // The first two time out while their handlers hang on; the other two
    // wait for a slot, and get one only once a handler has ended.
    for _ in 0..2 {
        let r = step(futures::StreamExt::next(&mut calls)).await.unwrap();
        assert_status(r, ResponseStatus::Timeout);
    }
    let (lock, cvar) = &*released;
    *lock.lock().unwrap() = true;
    cvar.notify_all();
    for _ in 0..2 {
        let r = step(futures::StreamExt::next(&mut calls)).await.unwrap();
        assert_eq!(text(&r.unwrap()), "x");
    }
    assert_eq!(most.load(Ordering::SeqCst), 2, "handlers running at once");
}

/// A blocking worker serving `function` from a thread of its own, which
/// then waits without touching its client; [`IdleWorker::stop`] ends it.
struct IdleWorker {
    done: std::sync::mpsc::Sender<()>,
    thread: tokio::task::JoinHandle<()>,
}

impl IdleWorker {
    async fn start<F>(h: &Harness, function: &'static str, handler: F) -> IdleWorker
    where
        F: Fn(Message) -> Result<Message, tubeway::HandlerError> + Send + Sync + 'static,
    {
        let (url, options) = (h.url.clone(), h.client_options());
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (done, done_rx) = std::sync::mpsc::channel::<()>();
        let thread = tokio::spawn(on_thread(move || {
            let c = Client::connect_with(&url, options).unwrap();
            let w = c.serve(function, handler).unwrap();
            ready_tx.send(()).unwrap();
            done_rx.recv_timeout(common::TEST_TIMEOUT).unwrap();
            w.stop().unwrap();
        }));
        step(ready_rx).await.unwrap();
        IdleWorker { done, thread }
    }

    async fn stop(self) {
        self.done.send(()).unwrap();
        step(self.thread).await.unwrap();
    }
}

/// A blocking client's connection is driven by the thread that calls; a
/// worker must go on serving while that thread does something else.
async fn blocking_worker_serves_while_its_thread_waits(h: &Harness) {
    let worker = IdleWorker::start(h, "double", |m: Message| {
        Ok(Message::plain_text(m.text_payload()?.repeat(2)))
    })
    .await;
    let caller = h.client().await;
    for _ in 0..3 {
        let r = step(caller.send("double", Message::plain_text("ab"))).await;
        assert_eq!(text(&r.unwrap()), "abab");
    }
    worker.stop().await;
}

/// A blocking client that serves a function with an async handler, and
/// calls a function that needs that handler's answer first: whichever
/// thread reads the connection (the caller's, reading its own answer, or
/// the client's background thread) starts the handler, which waits on a
/// timer and so needs the client's runtime.
async fn a_blocking_call_runs_its_clients_async_worker_meanwhile(h: &Harness) {
    let helper = h.client().await;
    let inner = h.client().await;
    let _relay = step(helper.serve_async("relay", move |m: Message| {
        let inner = inner.clone();
        async move {
            let r = inner.send("halve", m).await.map_err(|e| e.to_string())?;
            Ok(Message::plain_text(format!("relayed {}", text(&r))))
        }
    }))
    .await
    .unwrap();
    let (url, options) = (h.url.clone(), h.client_options());
    let done = on_thread(move || {
        let c = Client::connect_with(&url, options).unwrap();
        let w = c
            .serve_async("halve", |m: Message| async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let t = m.text_payload()?.into_owned();
                Ok(Message::plain_text(&t[..t.len() / 2]))
            })
            .unwrap();
        for i in 0..20 {
            let sent = format!("{i}{i}");
            let got = c.send("relay", Message::plain_text(sent)).unwrap();
            assert_eq!(text(&got), format!("relayed {i}"));
        }
        w.stop().unwrap();
        c.close().unwrap();
        true
    })
    .await;
    assert!(done);
}

/// A synchronous handler's answer is sent by the thread that ran it. Answers
/// larger than the transport holds at once, and more of them than the write
/// queue holds, must all go out while the worker's own thread waits.
async fn blocking_worker_sends_large_answers_while_its_thread_waits(h: &Harness) {
    const SIZE: usize = 3 << 20;
    let worker = IdleWorker::start(h, "fill", |m: Message| {
        let byte = m.payload.first().copied().ok_or("no payload")?;
        Ok(Message::binary(vec![byte; SIZE], None))
    })
    .await;
    let caller = h.client().await;
    let calls = (1..=4u8).map(|i| caller.send("fill", Message::binary(vec![i], None)));
    let answers = within(common::TEST_TIMEOUT, futures::future::join_all(calls)).await;
    for (i, answer) in (1..=4u8).zip(answers) {
        let answer = answer.unwrap();
        assert_eq!(answer.payload.len(), SIZE);
        assert!(
            answer.payload.iter().all(|&b| b == i),
            "answer {i} is its own"
        );
    }
    worker.stop().await;
}

/// A worker serving with `serve_deferred` answers each call later, from any
/// thread, through its responder; a responder dropped unanswered, or a
/// handler that panics, answers `handler_error`, so no caller waits forever.
async fn deferred_answers_are_sent_from_the_thread_that_gives_them(h: &Harness) {
    let worker_client = h.client().await;
    let _w = step(
        worker_client.serve_deferred("later", |m: Message, r| match text(&m).as_str() {
            "drop" => drop(r),
            "panic" => panic!("deliberate deferred test panic"),
            "fail" => {
                std::thread::spawn(move || r.answer(Err("failed later".into())));
            }
            _ => {
                std::thread::spawn(move || r.answer(Ok(m)));
            }
        }),
    )
    .await
    .unwrap();
    let c = h.client().await;
    let calls = ["a", "b", "c"].map(|t| c.send("later", Message::plain_text(t)));
    let answers = within(common::TEST_TIMEOUT, futures::future::join_all(calls)).await;
    let texts: Vec<String> = answers.into_iter().map(|a| text(&a.unwrap())).collect();
    assert_eq!(texts, ["a", "b", "c"]);
    for (call, says) in [
        ("fail", "failed later"),
        ("drop", "without answering"),
        ("panic", "without answering"),
    ] {
        match step(c.send("later", Message::plain_text(call))).await {
            Err(Error::Status { status, reason }) => {
                assert_eq!(status, ResponseStatus::HandlerError);
                assert!(reason.contains(says), "{call}: {reason}");
            }
            other => panic!("expected handler_error for {call}, got {other:?}"),
        }
    }
    let r = step(c.send("later", Message::plain_text("still served"))).await;
    assert_eq!(text(&r.unwrap()), "still served");
}

/// Options of a connection that runs `n` calls of synchronous handlers at once.
fn threads(h: &Harness, n: usize) -> tubeway::ClientOptions {
    tubeway::ClientOptions {
        max_blocking_calls: n,
        ..h.client_options()
    }
}

/// A worker's connection, the worker, word of each call it starts, and the
/// gate its calls wait at.
type GatedWorker = (
    tubeway::AsyncClient,
    tubeway::Worker,
    mpsc::UnboundedReceiver<()>,
    Arc<Gate>,
);

/// Serves `name` with a synchronous handler on a connection of `options`:
/// each call reports that it started, then waits at the gate before it
/// answers with its request.
async fn gated_worker(h: &Harness, options: tubeway::ClientOptions, name: &str) -> GatedWorker {
    let client = h.client_with(options).await;
    let (started_tx, started) = mpsc::unbounded_channel();
    let gate = Arc::new(Gate::default());
    let held = gate.clone();
    let worker = step(client.serve(name, move |m: Message| {
        let _ = started_tx.send(());
        held.pass();
        Ok(m)
    }))
    .await
    .unwrap();
    (client, worker, started, gate)
}

/// [`gated_worker`] on a connection that runs `n` calls at once but
/// declares ten to the broker: calls beyond its threads reach it, and it
/// refuses them `unavailable`.
async fn overcommitted_worker(h: &Harness, n: usize, name: &str) -> GatedWorker {
    let options = tubeway::ClientOptions {
        max_worker_calls: Some(10),
        ..threads(h, n)
    };
    gated_worker(h, options, name).await
}

/// A worker runs at most `max_blocking_calls` calls of its synchronous
/// handlers at once and answers a call beyond them `unavailable` at once,
/// so calls to a handler that hangs cannot pile up without bound.
async fn a_worker_refuses_calls_beyond_its_blocking_limit(h: &Harness) {
    let (_worker_client, _w, mut started, release) = overcommitted_worker(h, 2, "held").await;
    let c = h.client().await;
    let caller = c.clone();
    let running = tokio::spawn(async move {
        futures::future::join(
            caller.send("held", Message::plain_text("a")),
            caller.send("held", Message::plain_text("b")),
        )
        .await
    });
    for _ in 0..2 {
        step(started.recv()).await.unwrap();
    }
    assert_status(
        step(c.send("held", Message::plain_text("c"))).await,
        ResponseStatus::Unavailable,
    );
    release.open(3);
    let (a, b) = step(running).await.unwrap();
    assert_eq!(
        (text(&a.unwrap()), text(&b.unwrap())),
        ("a".into(), "b".into())
    );
    // Places free again as handlers end.
    let r = step(c.send("held", Message::plain_text("d"))).await;
    assert_eq!(text(&r.unwrap()), "d");
}

/// Lets blocked threads through, as many as it is opened for.
#[derive(Default)]
struct Gate {
    open: Mutex<usize>,
    changed: std::sync::Condvar,
}

impl Gate {
    /// Blocks until the gate lets this thread through (at most the test's
    /// time limit).
    fn pass(&self) {
        let open = self.open.lock().unwrap();
        let (mut open, _) = self
            .changed
            .wait_timeout_while(open, common::TEST_TIMEOUT, |n| *n == 0)
            .unwrap();
        *open = open.saturating_sub(1);
    }

    fn open(&self, n: usize) {
        *self.open.lock().unwrap() += n;
        self.changed.notify_all();
    }
}

/// A connection that serves with synchronous handlers tells the broker how
/// many calls it runs at once: further calls wait at the broker, not
/// answered `unavailable`, and go on as running calls end.
async fn a_synchronous_worker_gets_no_more_calls_than_it_runs(h: &Harness) {
    let (_worker_client, _w, mut started, release) =
        gated_worker(h, threads(h, 2), "limited").await;
    let caller = h.client().await;
    let calls = spawn_calls(&caller, "limited", &["a", "b", "c", "d"]);
    for _ in 0..2 {
        step(started.recv()).await.unwrap();
    }
    // The other two wait at the broker.
    calls_waiting(&caller, "limited", 2).await;
    assert!(started.try_recv().is_err(), "a third call was forwarded");
    release.open(1);
    step(started.recv()).await.unwrap();
    calls_waiting(&caller, "limited", 1).await;
    assert!(started.try_recv().is_err(), "a fourth call was forwarded");
    release.open(3);
    let mut answers = Vec::new();
    for call in calls {
        answers.push(text(&within(common::STEP, call).await.unwrap().unwrap()));
    }
    assert_eq!(answers, ["a", "b", "c", "d"]);
}

/// Calls far beyond a synchronous worker's threads, at once and for a
/// while: the broker never forwards one too many, so none is refused.
async fn a_burst_beyond_a_synchronous_workers_threads_is_never_refused(h: &Harness) {
    let worker_client = h.client_with(threads(h, 2)).await;
    let _w = step(worker_client.serve("burst", |m: Message| {
        std::thread::sleep(Duration::from_micros(200));
        Ok(m)
    }))
    .await
    .unwrap();
    let caller = h.client().await;
    let callers: Vec<_> = (0..16)
        .map(|i| {
            let caller = caller.clone();
            tokio::spawn(async move {
                for j in 0..50 {
                    let r = caller
                        .send("burst", Message::plain_text(format!("{i}.{j}")))
                        .await;
                    assert_eq!(text(&r.unwrap()), format!("{i}.{j}"));
                }
            })
        })
        .collect();
    for c in callers {
        within(common::STEP, c).await.unwrap();
    }
}

/// Serves `name` on `client` with an async handler: each call reports
/// that it started, then waits for a permit before it answers with its
/// request.
async fn held_async_worker(
    client: &tubeway::AsyncClient,
    name: &str,
) -> (
    tubeway::Worker,
    mpsc::UnboundedReceiver<()>,
    Arc<tokio::sync::Semaphore>,
) {
    let (started_tx, started) = mpsc::unbounded_channel();
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let held = release.clone();
    let worker = step(client.serve_async(name, move |m: Message| {
        let (started, held) = (started_tx.clone(), held.clone());
        async move {
            let _ = started.send(());
            held.acquire().await.unwrap().forget();
            Ok(m)
        }
    }))
    .await
    .unwrap();
    (worker, started, release)
}

/// Calls `function` with each of `texts`, each call on a task of its own.
fn spawn_calls(
    caller: &tubeway::AsyncClient,
    function: &'static str,
    texts: &[&'static str],
) -> Vec<tokio::task::JoinHandle<tubeway::Result<Message>>> {
    texts
        .iter()
        .map(|&t| {
            let caller = caller.clone();
            tokio::spawn(async move { caller.send(function, Message::plain_text(t)).await })
        })
        .collect()
}

/// Waits until `n` calls of `function` wait at the broker for room.
async fn calls_waiting(caller: &tubeway::AsyncClient, function: &str, n: u64) {
    common::eventually(&format!("{n} calls of {function} waiting"), || {
        let caller = caller.clone();
        let function = function.to_owned();
        async move { matches!(caller.function_status(&function).await, Ok(s) if s.waiting == n) }
    })
    .await;
}

/// A call that finds every worker at its limit waits at the broker until
/// one has room, another worker comes, its timeout passes, or no worker is
/// left.
async fn calls_wait_at_the_broker_for_a_worker_with_room(h: &Harness) {
    let options = tubeway::ClientOptions {
        max_worker_calls: Some(1),
        ..h.client_options()
    };
    let held_client = h.client_with(options).await;
    let (_w, mut started, release) = held_async_worker(&held_client, "roomy").await;
    let caller = h.client().await;
    let first = {
        let caller = caller.clone();
        tokio::spawn(async move { caller.send("roomy", Message::plain_text("1")).await })
    };
    step(started.recv()).await.unwrap();
    // The worker owes one call: the next waits, and times out at the broker.
    let t0 = Instant::now();
    let r = step(caller.send_timeout(
        "roomy",
        Message::plain_text("2"),
        Duration::from_millis(200),
    ))
    .await;
    let e = r.unwrap_err();
    assert_eq!(status(&e), ResponseStatus::Timeout, "{e}");
    assert!(
        e.to_string()
            .contains("no worker of function \"roomy\" had room"),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert!(
        started.try_recv().is_err(),
        "the waiting call reached the worker"
    );
    // A waiting call goes to a worker that comes meanwhile.
    let waiting = {
        let caller = caller.clone();
        tokio::spawn(async move { caller.send("roomy", Message::plain_text("3")).await })
    };
    calls_waiting(&caller, "roomy", 1).await;
    let other = h.client().await;
    let _o = step(other.serve("roomy", |_| Ok(Message::plain_text("other"))))
        .await
        .unwrap();
    let r = within(common::STEP, waiting).await.unwrap().unwrap();
    assert_eq!(text(&r), "other");
    drop(_o);
    step(other.close()).await;
    // Room made by an answer lets a waiting call go on.
    common::eventually("the second worker is gone", || {
        let caller = caller.clone();
        async move { matches!(caller.function_status("roomy").await, Ok(s) if s.workers == 1) }
    })
    .await;
    let waiting = {
        let caller = caller.clone();
        tokio::spawn(async move { caller.send("roomy", Message::plain_text("4")).await })
    };
    calls_waiting(&caller, "roomy", 1).await;
    release.add_permits(2);
    assert_eq!(
        text(&within(common::STEP, first).await.unwrap().unwrap()),
        "1"
    );
    assert_eq!(
        text(&within(common::STEP, waiting).await.unwrap().unwrap()),
        "4"
    );
    // A call waiting when the last worker leaves fails at once.
    let again = {
        let caller = caller.clone();
        tokio::spawn(async move { caller.send("roomy", Message::plain_text("5")).await })
    };
    step(started.recv()).await.unwrap();
    step(started.recv()).await.unwrap();
    let waiting = {
        let caller = caller.clone();
        tokio::spawn(async move { caller.send("roomy", Message::plain_text("6")).await })
    };
    calls_waiting(&caller, "roomy", 1).await;
    held_client.close().await;
    let e = within(common::STEP, waiting).await.unwrap().unwrap_err();
    assert_eq!(status(&e), ResponseStatus::FunctionNotFound, "{e}");
    let e = within(common::STEP, again).await.unwrap().unwrap_err();
    assert_eq!(status(&e), ResponseStatus::ServerError, "{e}");
}

/// A connection's limit counts the calls of the functions it declared it
/// for, and no others: its synchronous handlers are limited by its threads,
/// and calls in flight to its async handlers take none of their room. A
/// limited call that timed out keeps its place until the worker answers.
async fn a_limit_counts_the_calls_it_was_declared_for(h: &Harness) {
    let (worker_client, _w, mut started, gate) = gated_worker(h, threads(h, 1), "sync").await;
    let (_a, mut async_started, release) = held_async_worker(&worker_client, "async").await;
    let caller = h.client().await;
    let async_calls = spawn_calls(&caller, "async", &["x", "y"]);
    for _ in 0..2 {
        step(async_started.recv()).await.unwrap();
    }
    // The connection owes two async calls, more than its limit of one.
    gate.open(1);
    let r = step(caller.send("sync", Message::plain_text("a"))).await;
    assert_eq!(text(&r.unwrap()), "a");
    step(started.recv()).await.unwrap();
    // A synchronous call that times out at the broker still holds the
    // worker's thread, and its place, until the worker answers it.
    let e = step(caller.send_timeout("sync", Message::plain_text("b"), Duration::from_millis(100)))
        .await
        .unwrap_err();
    assert_eq!(status(&e), ResponseStatus::Timeout, "{e}");
    step(started.recv()).await.unwrap();
    let waiting = {
        let caller = caller.clone();
        tokio::spawn(async move { caller.send("sync", Message::plain_text("c")).await })
    };
    calls_waiting(&caller, "sync", 1).await;
    // The late answer makes room.
    gate.open(2);
    let r = within(common::STEP, waiting).await.unwrap();
    assert_eq!(text(&r.unwrap()), "c");
    release.add_permits(2);
    for (call, t) in async_calls.into_iter().zip(["x", "y"]) {
        assert_eq!(text(&within(common::STEP, call).await.unwrap().unwrap()), t);
    }
}

/// A oneway call to a worker that runs a limited number of calls takes a
/// place until it has run, as a call with an answer does: calls beyond the
/// worker's threads wait at the broker, where they reached a worker that
/// could neither run them nor refuse them to anyone, and dropped them.
async fn oneway_calls_beyond_a_workers_threads_wait_and_all_run(h: &Harness) {
    let (_worker_client, _w, mut started, gate) = gated_worker(h, threads(h, 2), "fire").await;
    let caller = h.client().await;
    for i in 0..6 {
        step(caller.send_oneway("fire", Message::plain_text(i.to_string())))
            .await
            .unwrap();
    }
    for _ in 0..2 {
        step(started.recv()).await.unwrap();
    }
    calls_waiting(&caller, "fire", 4).await;
    assert!(started.try_recv().is_err(), "a third call was forwarded");
    gate.open(6);
    for _ in 0..4 {
        step(started.recv()).await.unwrap();
    }
    // Each counted once it has run, from the answer the caller never sees.
    common::eventually("six calls counted", || {
        let caller = caller.clone();
        async move {
            matches!(caller.function_status("fire").await,
                Ok(s) if s.calls == 6 && s.errors == 0 && s.waiting == 0)
        }
    })
    .await;
}

/// A call its worker refuses without running it goes to another worker
/// with room, not back to its caller as `unavailable`.
async fn a_call_a_worker_refuses_goes_to_another(h: &Harness) {
    // It refuses a second call while it runs one.
    let (_sync_client, _s, mut started, gate) = overcommitted_worker(h, 1, "f").await;
    let other = h.client().await;
    let (_a, mut other_started, release) = held_async_worker(&other, "f").await;
    let caller = h.client().await;
    // Whichever worker each goes to first, one runs on the synchronous
    // worker and two on the other.
    let mut calls = spawn_calls(&caller, "f", &["a", "b", "c"]);
    step(started.recv()).await.unwrap();
    for _ in 0..2 {
        step(other_started.recv()).await.unwrap();
    }
    // The synchronous worker owes fewer: it is picked, and refuses.
    calls.extend(spawn_calls(&caller, "f", &["d"]));
    step(other_started.recv()).await.unwrap();
    gate.open(1);
    release.add_permits(3);
    let mut answers = Vec::new();
    for call in calls {
        answers.push(text(&within(common::STEP, call).await.unwrap().unwrap()));
    }
    assert_eq!(answers, ["a", "b", "c", "d"]);
    let s = step(caller.function_status("f")).await.unwrap();
    assert_eq!((s.calls, s.errors), (4, 0));
}

/// `create_function`'s limit on a worker's calls is checked.
async fn a_worker_limit_must_be_a_count_of_calls(h: &Harness) {
    let c = h.client().await;
    for body in [
        &br#"{"max_calls": 0}"#[..],
        br#"{"max_calls": "many"}"#,
        b"[1",
    ] {
        let mut m =
            Message::binary(body.to_vec(), Some("application/json")).with_destination("limits");
        m.r#type = tubeway::MessageType::CreateFunction;
        let r = step(c.request(m)).await.unwrap();
        assert_eq!(
            r.response_status,
            Some(ResponseStatus::BadRequest),
            "{body:?}"
        );
    }
    assert_status(
        step(c.function_status("limits")).await,
        ResponseStatus::FunctionNotFound,
    );
}

/// Oneway calls are queued, not sent, when `send_oneway` returns; dropping
/// the client right after must still deliver every one.
async fn blocking_oneway_calls_are_flushed_when_the_client_drops(h: &Harness) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    h.broker
        .create_function("sink", move |m: Message| {
            tx.send(text(&m)).unwrap();
            Ok(Message::plain_text(""))
        })
        .unwrap();
    let (url, options) = (h.url.clone(), h.client_options());
    on_thread(move || {
        let c = Client::connect_with(&url, options).unwrap();
        for i in 0..200 {
            let payload = format!("{i}:{}", "x".repeat(32 * 1024));
            c.send_oneway("sink", Message::plain_text(payload)).unwrap();
        }
    })
    .await;
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 200 {
        let got = step(rx.recv()).await.unwrap();
        let (i, _) = got.split_once(':').unwrap();
        assert!(seen.insert(i.parse::<u32>().unwrap()), "{i} twice");
    }
}

/// Echoes `payload` through the broker's `echo` function.
async fn echoed(c: &tubeway::AsyncClient, payload: &[u8]) -> Message {
    let m = Message::binary(payload.to_vec(), None);
    let answer = step(c.send("echo", m)).await.unwrap();
    assert_eq!(&answer.payload[..], payload);
    answer
}

/// A large request is read into memory the broker keeps once it has been
/// answered, and a large answer into memory the client reads the next one
/// into: neither side faults in fresh pages for every large message.
async fn large_messages_are_read_into_memory_used_again(h: &Harness) {
    echo(h);
    let c = h.client().await;
    let first = echoed(&c, &vec![1u8; 1 << 20]).await;
    let at = first.payload.as_ptr();
    drop(first);
    let second = echoed(&c, &vec![2u8; 1 << 20]).await;
    assert_eq!(
        second.payload.as_ptr(),
        at,
        "the client read it into the same memory"
    );
    eventually("the broker keeps the request's memory", || async {
        h.broker.stats().frame_pool_bytes >= 1 << 20
    })
    .await;
    let remote = step(c.stats()).await.unwrap();
    assert!(remote.frame_pool_bytes > 0, "{remote:?}");
    // A small message does not take a buffer that large.
    let small = echoed(&c, &[3u8; 100]).await;
    assert_ne!(small.payload.as_ptr(), at);
}

/// `BrokerConfig::frame_pool(0)`: large messages leave nothing behind.
async fn without_a_pool_the_broker_keeps_no_memory(h: &Harness) {
    echo(h);
    let c = h.client().await;
    for fill in 0..3 {
        drop(echoed(&c, &vec![fill; 1 << 20]).await);
    }
    assert_eq!(h.broker.stats().frame_pool_bytes, 0);
}
