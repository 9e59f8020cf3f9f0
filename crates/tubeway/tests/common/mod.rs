//! Shared harness of the broker integration tests.
//!
//! Every broker test is an `async fn name(h: &Harness)` listed in
//! [`transport_tests!`], which generates one test per transport (`tcp::name`,
//! `unix::name`, `mem::name`, `shm::name`, and `tcp_spin::name`: tcp in latency mode, where
//! every connection's reader on both sides polls before it sleeps and the
//! broker serves the connections on the threads of its spin pool, where
//! they share a thread on a machine with few CPUs). Each test gets an
//! embedded broker of its own,
//! started on the test's runtime and shut down when the body returns, and the
//! body is bounded by [`TEST_TIMEOUT`].
#![allow(dead_code)]

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use tubeway::{AsyncClient, Broker, BrokerConfig, Error, Message, ResponseStatus};

/// Upper bound for a whole test body.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Upper bound for one step that should complete at once.
pub const STEP: Duration = Duration::from_secs(5);

/// The transport a test runs over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Unix,
    Mem,
    /// tcp in latency mode.
    TcpSpin,
    /// Shared memory, with the transport's default wait (spin, then sleep).
    Shm,
}

/// How readers wait in latency mode. Spin then park, not busy-spin: tests
/// run in parallel on few cores, and idle connections must not burn them.
pub const SPIN: tubeway::WaitStrategy = tubeway::WaitStrategy::SpinPark {
    spin: Duration::from_micros(100),
};

/// An embedded broker serving one address, for one test.
#[derive(Debug)]
pub struct Harness {
    /// The broker; tests register local functions and topics on it directly.
    pub broker: Broker,
    /// The bound address, as a client connects to it.
    pub url: String,
    pub transport: Transport,
    unix_path: Option<PathBuf>,
}

fn unique_suffix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    // Short: a unix socket path must fit in about 100 bytes.
    let rand = uuid::Uuid::new_v4().simple().to_string();
    format!("{}-{n}-{}", std::process::id(), &rand[..8])
}

impl Harness {
    /// Starts a broker with `config` listening on a fresh address of `transport`.
    pub async fn start(transport: Transport, config: BrokerConfig) -> Harness {
        let config = match transport {
            Transport::TcpSpin => config.wait(SPIN),
            _ => config,
        };
        let broker = Broker::new(config);
        let mut unix_path = None;
        let listen: tubeway::Url = match transport {
            Transport::Tcp | Transport::TcpSpin => "tcp://127.0.0.1:0".parse().unwrap(),
            Transport::Unix => {
                let path = std::env::temp_dir().join(format!("tw-{}.sock", unique_suffix()));
                unix_path = Some(path.clone());
                format!("unix://{}", path.display()).parse().unwrap()
            }
            Transport::Mem => format!("mem://tw-test-{}", unique_suffix())
                .parse()
                .unwrap(),
            // Small rings, so large messages stream through them in pieces.
            Transport::Shm => format!("shm://tw-test-{}?ring=64KiB", unique_suffix())
                .parse()
                .unwrap(),
        };
        let bound = within(STEP, broker.listen(&listen))
            .await
            .expect("the broker listens");
        let url = match (&bound, &listen) {
            // The ring size is the connector's request.
            (tubeway::Url::Shm { name, .. }, tubeway::Url::Shm { ring, .. }) => tubeway::Url::Shm {
                name: name.clone(),
                ring: *ring,
            },
            _ => bound,
        };
        Harness {
            broker,
            url: url.to_string(),
            transport,
            unix_path,
        }
    }

    /// A new connection to the broker.
    pub async fn client(&self) -> AsyncClient {
        self.client_with(self.client_options()).await
    }

    /// A new connection to the broker with `options` (built from
    /// [`client_options`](Self::client_options)).
    pub async fn client_with(&self, options: tubeway::ClientOptions) -> AsyncClient {
        within(STEP, AsyncClient::connect_with(&self.url, options))
            .await
            .expect("the client connects")
    }

    /// The options of a client of this test's transport.
    pub fn client_options(&self) -> tubeway::ClientOptions {
        let mut options = tubeway::ClientOptions::default();
        if self.transport == Transport::TcpSpin {
            options.wait = Some(SPIN);
        }
        options
    }

    /// A blocking client of this test's transport; call it on a plain thread.
    pub fn blocking_client(&self) -> tubeway::Client {
        tubeway::Client::connect_with(&self.url, self.client_options())
            .expect("the client connects")
    }

    /// Shuts the broker down (idempotent).
    pub async fn shutdown(&self) {
        within(Duration::from_secs(15), self.broker.shutdown()).await;
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(p) = &self.unix_path {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Runs a test body bounded by [`TEST_TIMEOUT`].
pub async fn bounded<F: Future<Output = ()>>(name: &str, body: F) {
    if tokio::time::timeout(TEST_TIMEOUT, body).await.is_err() {
        panic!("test {name} did not finish within {TEST_TIMEOUT:?}");
    }
}

/// Awaits `f`, failing the test if it takes longer than `limit`.
pub async fn within<F: Future>(limit: Duration, f: F) -> F::Output {
    match tokio::time::timeout(limit, f).await {
        Ok(out) => out,
        Err(_) => panic!("a step did not complete within {limit:?}"),
    }
}

/// Awaits `f` for at most [`STEP`].
pub async fn step<F: Future>(f: F) -> F::Output {
    within(STEP, f).await
}

/// Polls `check` until it holds, for at most [`STEP`]. For states that no
/// event announces (a counter the broker updates after the fact).
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: still not true after {STEP:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls `f` once and checks it is still pending. Used to make a request
/// reach the connection's writer before the next one is sent on the same
/// connection (which then reaches the broker after it).
pub async fn start<F: Future + Unpin>(f: &mut F) {
    let first = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *f).poll(cx))).await;
    assert!(first.is_pending(), "the request completed at once");
}

/// Runs `f` on a plain thread (the blocking client refuses to run inside a
/// runtime) and awaits its result for at most [`TEST_TIMEOUT`].
pub async fn on_thread<R, F>(f: F) -> R
where
    R: Send + 'static,
    F: FnOnce() -> R + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    match within(TEST_TIMEOUT, rx).await {
        Ok(Ok(r)) => r,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("the thread ended without a result"),
    }
}

/// The text payload of `m`.
pub fn text(m: &Message) -> String {
    m.text_payload().expect("a text payload").into_owned()
}

/// The status of an error, panicking on errors that carry none.
pub fn status(e: &Error) -> ResponseStatus {
    e.status()
        .unwrap_or_else(|| panic!("expected an error with a status, got {e:?}"))
}

/// Checks that `r` failed with an `Error::Status` from the broker with `expected`.
#[track_caller]
pub fn assert_status<T: std::fmt::Debug>(r: tubeway::Result<T>, expected: ResponseStatus) {
    match r {
        Err(Error::Status { status, reason }) => {
            assert_eq!(status, expected, "reason: {reason}");
            assert!(!reason.is_empty(), "a {status} error carries a reason");
        }
        other => panic!("expected {expected} from the broker, got {other:?}"),
    }
}

/// The default broker configuration of a test.
pub fn default_config() -> BrokerConfig {
    BrokerConfig::default()
}

/// Generates, for each `async fn name(h: &Harness)` listed, one test per
/// transport: `tcp::name`, `unix::name`, `mem::name`, `shm::name`, `tcp_spin::name`. `name with config`
/// starts the broker with `config` instead of the default; attributes before
/// a name (`#[ignore = "..."]`) go on its generated tests.
#[macro_export]
macro_rules! transport_tests {
    ($($(#[$attr:meta])* $name:ident $(with $cfg:expr)?),* $(,)?) => {
        mod tcp {
            // The configuration expressions name items of the test file.
            #[allow(unused_imports)]
            use super::*;
            $crate::transport_tests!(@each Tcp; $($(#[$attr])* $name $(with $cfg)?),*);
        }
        mod unix {
            // The configuration expressions name items of the test file.
            #[allow(unused_imports)]
            use super::*;
            $crate::transport_tests!(@each Unix; $($(#[$attr])* $name $(with $cfg)?),*);
        }
        mod mem {
            // The configuration expressions name items of the test file.
            #[allow(unused_imports)]
            use super::*;
            $crate::transport_tests!(@each Mem; $($(#[$attr])* $name $(with $cfg)?),*);
        }
        mod shm {
            // The configuration expressions name items of the test file.
            #[allow(unused_imports)]
            use super::*;
            $crate::transport_tests!(@each Shm; $($(#[$attr])* $name $(with $cfg)?),*);
        }
        mod tcp_spin {
            // The configuration expressions name items of the test file.
            #[allow(unused_imports)]
            use super::*;
            $crate::transport_tests!(@each TcpSpin; $($(#[$attr])* $name $(with $cfg)?),*);
        }
    };
    (@config) => { $crate::common::default_config() };
    (@config $cfg:expr) => { $cfg };
    (@each $t:ident; $($(#[$attr:meta])* $name:ident $(with $cfg:expr)?),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            $(#[$attr])*
            async fn $name() {
                let config = $crate::transport_tests!(@config $($cfg)?);
                let h = $crate::common::Harness::start(
                    $crate::common::Transport::$t,
                    config,
                )
                .await;
                $crate::common::bounded(stringify!($name), super::$name(&h)).await;
                h.shutdown().await;
            }
        )*
    };
}
