//! `publish`: a publish to a topic with subscribers on their own connections.
//!
//! An operation is a publish acknowledged by the broker. Each subscriber
//! counts what it receives; [`Workload::settle`] waits until every
//! publish is accounted for as a delivery to each subscriber or as a drop
//! counted by the broker (`topic_status`), so nothing is lost silently and
//! the clock stops only once the deliveries are done. The topic is made,
//! watched and removed on a connection of its own; subscribers are always
//! async clients (they are not what is measured).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::task::JoinHandle;
use tubeway::AsyncClient;

use super::{
    close_all, empty_ok, frame_len, ClientKind, Conns, Exchange, FnLane, Lane, Mode, Setup, Tally,
    Workload,
};

/// How long deliveries may trail the last publish.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Deliveries the broker buffers per subscriber (the broker's default).
const SUBSCRIBER_BUFFER: usize = 1024;

/// See the module.
#[derive(Debug)]
pub struct Publish;

impl Mode for Publish {
    fn name(&self) -> &'static str {
        "publish"
    }

    fn about(&self) -> &'static str {
        "publish to a topic, acknowledged; each subscriber on its own connection counts deliveries"
    }

    fn exchanges(&self, payload: usize) -> Vec<Exchange> {
        // Topic names are `bench-<tag>`; 14 bytes is typical.
        vec![Exchange {
            up: frame_len(&[14], payload),
            down: empty_ok(),
        }]
    }

    fn prepare<'a>(&'a self, setup: &'a Setup) -> BoxFuture<'a, anyhow::Result<Arc<dyn Workload>>> {
        Box::pin(async move {
            let control = setup.connect(1).await?.remove(0);
            let subscribers = setup.connect(setup.subscribers).await?;
            let topic = format!("bench-{}", setup.tag);
            control.create_topic(&topic).await?;
            let delivered = Arc::new(AtomicU64::new(0));
            let mut readers = Vec::with_capacity(subscribers.len());
            for s in &subscribers {
                let mut sub = s.subscribe_with_buffer(&topic, SUBSCRIBER_BUFFER).await?;
                let delivered = delivered.clone();
                readers.push(tokio::spawn(async move {
                    while sub.recv().await.is_some() {
                        delivered.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
            Ok(Arc::new(Topic {
                publishers: Conns::open(setup, setup.connections).await?,
                control,
                subscribers,
                readers,
                topic,
                setup: setup.clone(),
                published: AtomicU64::new(0),
                delivered,
                reported: Mutex::new(Tally::default()),
            }) as Arc<dyn Workload>)
        })
    }
}

struct Topic {
    publishers: Conns,
    /// Makes, watches and removes the topic.
    control: AsyncClient,
    subscribers: Vec<AsyncClient>,
    readers: Vec<JoinHandle<()>>,
    topic: String,
    setup: Setup,
    published: AtomicU64,
    delivered: Arc<AtomicU64>,
    /// The totals at the last `settle`.
    reported: Mutex<Tally>,
}

impl Workload for Topic {
    fn client(&self) -> ClientKind {
        self.publishers.kind()
    }

    fn op(&self, lane: usize) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let publisher = self.publishers.async_client(lane)?;
            publisher.publish(&self.topic, self.setup.message()).await?;
            self.published.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
    }

    fn lane(&self, lane: usize, _give_up: Instant) -> anyhow::Result<Box<dyn Lane + '_>> {
        let publisher = self.publishers.blocking(lane)?;
        Ok(Box::new(FnLane(move || {
            publisher.publish(&self.topic, self.setup.message())?;
            self.published.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })))
    }

    fn settle(&self) -> BoxFuture<'_, anyhow::Result<Tally>> {
        Box::pin(async move {
            let expected = self.published.load(Ordering::Relaxed) * self.subscribers.len() as u64;
            let deadline = Instant::now() + SETTLE_TIMEOUT;
            let mut pause = Duration::from_micros(200);
            loop {
                let drops = self.control.topic_status(&self.topic).await?.dropped;
                let deliveries = self.delivered.load(Ordering::Relaxed);
                if deliveries + drops >= expected {
                    let now = Tally { deliveries, drops };
                    let mut last = self.reported.lock().unwrap_or_else(PoisonError::into_inner);
                    let delta = Tally {
                        deliveries: now.deliveries.saturating_sub(last.deliveries),
                        drops: now.drops.saturating_sub(last.drops),
                    };
                    *last = now;
                    return Ok(delta);
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "publish: {expected} deliveries expected, {deliveries} delivered and \
                     {drops} dropped after {SETTLE_TIMEOUT:?}"
                );
                // Polled, not signalled: drops are only known to the broker.
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(20));
            }
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let _ = self.control.remove_topic(&self.topic).await;
            self.publishers.close().await;
            close_all(&self.subscribers).await;
            self.control.close().await;
            for r in &self.readers {
                r.abort();
            }
        })
    }
}
