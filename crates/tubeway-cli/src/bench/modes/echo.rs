//! `echo`: a function call through the broker; the payload goes both ways.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::call::request_len;
use super::{
    close_all, frame_len, Exchange, Mode, Senders, Setup, Workload, BINARY_MIME, CORRELATION,
};

/// The built-in function that answers with the request's payload.
pub const ECHO: &str = "echo";

/// See the module.
#[derive(Debug)]
pub struct Echo;

impl Mode for Echo {
    fn name(&self) -> &'static str {
        "echo"
    }

    fn about(&self) -> &'static str {
        "function `echo` through the broker: the payload up and back"
    }

    fn exchanges(&self, payload: usize) -> Vec<Exchange> {
        vec![Exchange {
            up: request_len(ECHO, payload),
            down: frame_len(&[CORRELATION, BINARY_MIME], payload),
        }]
    }

    fn prepare<'a>(&'a self, setup: &'a Setup) -> BoxFuture<'a, anyhow::Result<Arc<dyn Workload>>> {
        Box::pin(
            async move { Ok(Arc::new(Echoes(Senders::open(setup).await?)) as Arc<dyn Workload>) },
        )
    }
}

struct Echoes(Senders);

impl Workload for Echoes {
    fn op(&self, lane: usize) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let reply = self.0.client(lane)?.send(ECHO, self.0.message()).await?;
            anyhow::ensure!(
                reply.payload.len() == self.0.setup.payload.len(),
                "`echo` answered {} bytes for {}",
                reply.payload.len(),
                self.0.setup.payload.len()
            );
            Ok(())
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(close_all(&self.0.clients))
    }
}
