//! `worker` and `worker-sync`: a function call that the broker forwards to
//! a worker connection, the request/reply of services behind a broker.
//!
//! Each sending connection has a worker connection of its own (an
//! `AsyncClient` of the bench process, serving with a handler that answers
//! an empty `ok`: an async one for `worker`, which runs on the
//! connection's reader; a synchronous one for `worker-sync`, which runs on
//! the connection's handler threads, as most programs' handlers do); all
//! serve one function, which the broker spreads over them. One operation
//! crosses the broker twice each way.

use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use tubeway::{AsyncClient, HandlerError, Message};

use super::call::Calls;
use super::{
    close_all, empty_ok, frame_len, ClientKind, Exchange, Lane, Mode, Setup, Workload, CORRELATION,
    TIMEOUT,
};

/// The length of the function's name (`bench-<tag>`) the frame sizes assume.
const NAME: usize = 10;

/// See the module: `worker` with `sync` false, `worker-sync` with it true.
#[derive(Debug)]
pub struct Worker {
    pub sync: bool,
}

impl Mode for Worker {
    fn name(&self) -> &'static str {
        if self.sync {
            "worker-sync"
        } else {
            "worker"
        }
    }

    fn about(&self) -> &'static str {
        if self.sync {
            "a function served by a worker connection with a synchronous handler (on a handler thread): the payload up and on to the worker, an empty ok back the same way"
        } else {
            "a function served by a worker connection with an async handler: the payload up and on to the worker, an empty ok back the same way"
        }
    }

    fn exchanges(&self, payload: usize) -> Vec<Exchange> {
        vec![
            Exchange {
                up: frame_len(&[TIMEOUT, NAME], payload),
                down: empty_ok(),
            },
            // Forwarded with the worker's registration as its correlation.
            Exchange {
                up: frame_len(&[TIMEOUT, NAME, CORRELATION], payload),
                down: empty_ok(),
            },
        ]
    }

    fn prepare<'a>(&'a self, setup: &'a Setup) -> BoxFuture<'a, anyhow::Result<Arc<dyn Workload>>> {
        Box::pin(async move {
            let function = format!("bench-{}", setup.tag);
            let clients = setup.connect(setup.connections).await?;
            let mut workers = Vec::with_capacity(clients.len());
            let answer = || Ok::<_, HandlerError>(Message::binary(bytes::Bytes::new(), None));
            for c in &clients {
                let w = if self.sync {
                    c.serve(&function, move |_| answer()).await
                } else {
                    c.serve_async(&function, move |_| async move { answer() })
                        .await
                };
                match w {
                    Ok(w) => workers.push(w),
                    Err(e) => {
                        close_all(&clients).await;
                        return Err(e.into());
                    }
                }
            }
            Ok(Arc::new(Workers {
                calls: Calls::new(setup, function, false).await?,
                _workers: workers,
                clients,
            }) as Arc<dyn Workload>)
        })
    }
}

/// Calls of a function served by worker connections.
struct Workers {
    calls: Calls,
    /// Kept for as long as the workload: a dropped one stops serving.
    _workers: Vec<tubeway::Worker>,
    clients: Vec<AsyncClient>,
}

impl Workload for Workers {
    fn client(&self) -> ClientKind {
        self.calls.client()
    }

    fn op(&self, lane: usize) -> BoxFuture<'_, anyhow::Result<()>> {
        self.calls.op(lane)
    }

    fn lane(&self, lane: usize, give_up: Instant) -> anyhow::Result<Box<dyn Lane + '_>> {
        self.calls.lane(lane, give_up)
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.calls.close().await;
            // A worker's registration ends with its connection.
            close_all(&self.clients).await;
        })
    }
}
