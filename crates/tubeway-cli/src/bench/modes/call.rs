//! `call` and `call-blocking`: a function call through the broker, answered
//! by an empty `ok`, from a handler that runs on the caller's connection or
//! on one of the broker's handler threads.

use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use tubeway::Message;

use super::{
    empty_ok, frame_len, ClientKind, Exchange, FnLane, Lane, Mode, Senders, Setup, Workload,
    TIMEOUT,
};

/// The built-in function that answers an empty `ok`.
pub const ACK: &str = "ack";

/// The same, served as a function that may block: on the broker's handler
/// threads.
pub const ACK_BLOCKING: &str = "ack-blocking";

/// See the module: `call` with `blocking` false, `call-blocking` with it
/// true.
#[derive(Debug)]
pub struct Call {
    pub blocking: bool,
}

impl Call {
    fn function(&self) -> &'static str {
        if self.blocking {
            ACK_BLOCKING
        } else {
            ACK
        }
    }
}

impl Mode for Call {
    fn name(&self) -> &'static str {
        if self.blocking {
            "call-blocking"
        } else {
            "call"
        }
    }

    fn about(&self) -> &'static str {
        if self.blocking {
            "function `ack-blocking` through the broker, served on its handler threads: the payload up, an empty ok back"
        } else {
            "function `ack` through the broker: the payload up, an empty ok back"
        }
    }

    fn exchanges(&self, payload: usize) -> Vec<Exchange> {
        vec![Exchange {
            up: request_len(self.function(), payload),
            down: empty_ok(),
        }]
    }

    fn prepare<'a>(&'a self, setup: &'a Setup) -> BoxFuture<'a, anyhow::Result<Arc<dyn Workload>>> {
        Box::pin(Calls::open(setup, self.function().into(), false))
    }
}

/// A function request as `AsyncClient::send` frames it: timeout, destination.
pub fn request_len(function: &str, payload: usize) -> usize {
    frame_len(&[TIMEOUT, function.len()], payload)
}

/// Calls of one function that answers an empty `ok` (`ack`), or the
/// payload back (`echo`) if `echoes`.
pub struct Calls {
    senders: Senders,
    function: String,
    echoes: bool,
}

impl Calls {
    /// Opens the connections of a workload calling `function`.
    pub async fn open(
        setup: &Setup,
        function: String,
        echoes: bool,
    ) -> anyhow::Result<Arc<dyn Workload>> {
        Ok(Arc::new(Calls::new(setup, function, echoes).await?))
    }

    /// [`open`](Self::open), for a workload that adds to it.
    pub async fn new(setup: &Setup, function: String, echoes: bool) -> anyhow::Result<Calls> {
        Ok(Calls {
            senders: Senders::open(setup).await?,
            function,
            echoes,
        })
    }

    /// Checks that the answer is what the function sends back.
    fn check(&self, reply: &Message) -> anyhow::Result<()> {
        let expected = if self.echoes {
            self.senders.setup.payload.len()
        } else {
            0
        };
        anyhow::ensure!(
            reply.payload.len() == expected,
            "`{}` answered {} bytes, {expected} expected",
            self.function,
            reply.payload.len()
        );
        Ok(())
    }
}

impl Workload for Calls {
    fn client(&self) -> ClientKind {
        self.senders.conns.kind()
    }

    fn op(&self, lane: usize) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let client = self.senders.conns.async_client(lane)?;
            self.check(&client.send(&self.function, self.senders.message()).await?)
        })
    }

    fn lane(&self, lane: usize, _give_up: Instant) -> anyhow::Result<Box<dyn Lane + '_>> {
        let client = self.senders.conns.blocking(lane)?;
        Ok(Box::new(FnLane(move || {
            self.check(&client.send(&self.function, self.senders.message())?)
        })))
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.senders.conns.close())
    }
}
