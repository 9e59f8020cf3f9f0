//! `oneway`: a oneway call to `ack`; nothing comes back.
//!
//! A oneway send completes when it is queued for writing, so on its own it
//! would measure the client's buffer. [`Workload::settle`] pings every
//! connection before the clock stops: the broker reads a connection in
//! order, so the ping's answer means every call before it was read.

use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;

use super::call::ACK;
use super::{frame_len, ClientKind, Exchange, FnLane, Lane, Mode, Senders, Setup, Tally, Workload};

/// See the module.
#[derive(Debug)]
pub struct Oneway;

impl Mode for Oneway {
    fn name(&self) -> &'static str {
        "oneway"
    }

    fn about(&self) -> &'static str {
        "oneway call to `ack`: the payload up, nothing back; done once the broker has read it"
    }

    fn exchanges(&self, payload: usize) -> Vec<Exchange> {
        vec![Exchange {
            up: frame_len(&[ACK.len()], payload),
            down: 0,
        }]
    }

    fn prepare<'a>(&'a self, setup: &'a Setup) -> BoxFuture<'a, anyhow::Result<Arc<dyn Workload>>> {
        Box::pin(
            async move { Ok(Arc::new(Oneways(Senders::open(setup).await?)) as Arc<dyn Workload>) },
        )
    }
}

struct Oneways(Senders);

impl Workload for Oneways {
    fn client(&self) -> ClientKind {
        self.0.conns.kind()
    }

    fn op(&self, lane: usize) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let client = self.0.conns.async_client(lane)?;
            client.send_oneway(ACK, self.0.message()).await?;
            Ok(())
        })
    }

    fn lane(&self, lane: usize, _give_up: Instant) -> anyhow::Result<Box<dyn Lane + '_>> {
        let client = self.0.conns.blocking(lane)?;
        Ok(Box::new(FnLane(move || {
            Ok(client.send_oneway(ACK, self.0.message())?)
        })))
    }

    fn settle(&self) -> BoxFuture<'_, anyhow::Result<Tally>> {
        Box::pin(async move {
            self.0.conns.ping_all().await?;
            Ok(Tally::default())
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.0.conns.close())
    }
}
