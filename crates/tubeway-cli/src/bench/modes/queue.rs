//! `queue`: an offer, then a poll of the same queue by another connection.
//!
//! Each sending connection has its own queue and its own consumer
//! connection, so one operation is a message's whole trip through a queue.
//! Queues are made and removed on a connection of their own.

use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use tubeway::{ops::QueueKind, AsyncClient};

use super::{
    empty_ok, frame_len, pick, ClientKind, Conns, Exchange, FnLane, Lane, Mode, Setup, Workload,
    BROKER_WAIT, CORRELATION, TIMEOUT,
};

/// Room for every message in flight; offers never wait for it.
const CAPACITY: u64 = 1_000_000;

/// See the module.
#[derive(Debug)]
pub struct Queue;

impl Mode for Queue {
    fn name(&self) -> &'static str {
        "queue"
    }

    fn about(&self) -> &'static str {
        "offer to a queue, then a poll of it by another connection"
    }

    fn exchanges(&self, payload: usize) -> Vec<Exchange> {
        // Queue names are `bench-<tag>-<lane>`; 16 bytes is typical.
        let name = 16;
        vec![
            Exchange {
                up: frame_len(&[TIMEOUT, name], payload),
                down: empty_ok(),
            },
            Exchange {
                up: frame_len(&[TIMEOUT, name], 0),
                down: frame_len(&[CORRELATION, name], payload),
            },
        ]
    }

    fn prepare<'a>(&'a self, setup: &'a Setup) -> BoxFuture<'a, anyhow::Result<Arc<dyn Workload>>> {
        Box::pin(async move {
            let control = setup.connect(1).await?.remove(0);
            let mut names = Vec::with_capacity(setup.connections);
            for lane in 0..setup.connections {
                let name = format!("bench-{}-{lane}", setup.tag);
                control
                    .create_queue(&name, CAPACITY, QueueKind::Bounded)
                    .await?;
                names.push(name);
            }
            Ok(Arc::new(Queues {
                producers: Conns::open(setup, setup.connections).await?,
                consumers: Conns::open(setup, setup.connections).await?,
                control,
                names,
                setup: setup.clone(),
            }) as Arc<dyn Workload>)
        })
    }
}

struct Queues {
    producers: Conns,
    consumers: Conns,
    /// Makes and removes the queues.
    control: AsyncClient,
    names: Vec<String>,
    setup: Setup,
}

fn polled(name: &str, message: Option<tubeway::Message>) -> anyhow::Result<()> {
    anyhow::ensure!(
        message.is_some(),
        "queue {name} stayed empty after an offer"
    );
    Ok(())
}

impl Workload for Queues {
    fn client(&self) -> ClientKind {
        self.producers.kind()
    }

    fn op(&self, lane: usize) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let name = pick(&self.names, lane)?;
            let producer = self.producers.async_client(lane)?;
            producer
                .offer(name, self.setup.message(), BROKER_WAIT)
                .await?;
            let consumer = self.consumers.async_client(lane)?;
            polled(name, consumer.poll(name, BROKER_WAIT).await?)
        })
    }

    fn lane(&self, lane: usize, _give_up: Instant) -> anyhow::Result<Box<dyn Lane + '_>> {
        let name = pick(&self.names, lane)?;
        let producer = self.producers.blocking(lane)?;
        let consumer = self.consumers.blocking(lane)?;
        Ok(Box::new(FnLane(move || {
            producer.offer(name, self.setup.message(), BROKER_WAIT)?;
            polled(name, consumer.poll(name, BROKER_WAIT)?)
        })))
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            for name in &self.names {
                let _ = self.control.remove_queue(name).await;
            }
            self.producers.close().await;
            self.consumers.close().await;
            self.control.close().await;
        })
    }
}
