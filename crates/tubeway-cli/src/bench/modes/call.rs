//! `call`: a function call through the broker, answered by an empty `ok`.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::{
    close_all, empty_ok, frame_len, Exchange, Mode, Senders, Setup, Workload, BINARY_MIME, TIMEOUT,
};

/// The built-in function that answers an empty `ok`.
pub const ACK: &str = "ack";

/// See the module.
#[derive(Debug)]
pub struct Call;

impl Mode for Call {
    fn name(&self) -> &'static str {
        "call"
    }

    fn about(&self) -> &'static str {
        "function `ack` through the broker: the payload up, an empty ok back"
    }

    fn exchanges(&self, payload: usize) -> Vec<Exchange> {
        vec![Exchange {
            up: request_len(ACK, payload),
            down: empty_ok(),
        }]
    }

    fn prepare<'a>(&'a self, setup: &'a Setup) -> BoxFuture<'a, anyhow::Result<Arc<dyn Workload>>> {
        Box::pin(
            async move { Ok(Arc::new(Calls(Senders::open(setup).await?)) as Arc<dyn Workload>) },
        )
    }
}

/// A function request as `AsyncClient::send` frames it: timeout, destination, mimetype.
pub fn request_len(function: &str, payload: usize) -> usize {
    frame_len(&[TIMEOUT, function.len(), BINARY_MIME], payload)
}

struct Calls(Senders);

impl Workload for Calls {
    fn op(&self, lane: usize) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let reply = self.0.client(lane)?.send(ACK, self.0.message()).await?;
            anyhow::ensure!(reply.payload.is_empty(), "`ack` answered a payload");
            Ok(())
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(close_all(&self.0.clients))
    }
}
