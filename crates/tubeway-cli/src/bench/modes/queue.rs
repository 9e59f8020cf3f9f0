//! `queue`: an offer, then a poll of the same queue by another connection.
//!
//! Each sending connection has its own queue and its own consumer
//! connection, so one operation is a message's whole trip through a queue.

use std::sync::Arc;

use futures::future::BoxFuture;
use tubeway::{ops::QueueKind, AsyncClient};

use super::{
    close_all, empty_ok, frame_len, lane_client, Exchange, Mode, Setup, Workload, BINARY_MIME,
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
                up: frame_len(&[TIMEOUT, name, BINARY_MIME], payload),
                down: empty_ok(),
            },
            Exchange {
                up: frame_len(&[TIMEOUT, name], 0),
                down: frame_len(&[CORRELATION, name, BINARY_MIME], payload),
            },
        ]
    }

    fn prepare<'a>(&'a self, setup: &'a Setup) -> BoxFuture<'a, anyhow::Result<Arc<dyn Workload>>> {
        Box::pin(async move {
            let producers = setup.connect(setup.connections).await?;
            let consumers = setup.connect(setup.connections).await?;
            let mut names = Vec::with_capacity(setup.connections);
            for (lane, producer) in producers.iter().enumerate() {
                let name = format!("bench-{}-{lane}", setup.tag);
                producer
                    .create_queue(&name, CAPACITY, QueueKind::Bounded)
                    .await?;
                names.push(name);
            }
            Ok(Arc::new(Queues {
                producers,
                consumers,
                names,
                setup: setup.clone(),
            }) as Arc<dyn Workload>)
        })
    }
}

struct Queues {
    producers: Vec<AsyncClient>,
    consumers: Vec<AsyncClient>,
    names: Vec<String>,
    setup: Setup,
}

impl Workload for Queues {
    fn op(&self, lane: usize) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let name = self
                .names
                .get(lane % self.names.len().max(1))
                .ok_or_else(|| anyhow::anyhow!("no queue for lane {lane}"))?;
            lane_client(&self.producers, lane)?
                .offer(name, self.setup.message(), BROKER_WAIT)
                .await?;
            let polled = lane_client(&self.consumers, lane)?
                .poll(name, BROKER_WAIT)
                .await?;
            anyhow::ensure!(polled.is_some(), "queue {name} stayed empty after an offer");
            Ok(())
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Some(first) = self.producers.first() {
                for name in &self.names {
                    let _ = first.remove_queue(name).await;
                }
            }
            close_all(&self.producers).await;
            close_all(&self.consumers).await;
        })
    }
}
