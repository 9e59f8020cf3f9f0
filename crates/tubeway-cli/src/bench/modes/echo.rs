//! `echo`: a function call through the broker; the payload goes both ways.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::call::{request_len, Calls};
use super::{frame_len, Exchange, Mode, Setup, Workload, CORRELATION};

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
            down: frame_len(&[CORRELATION], payload),
        }]
    }

    fn prepare<'a>(&'a self, setup: &'a Setup) -> BoxFuture<'a, anyhow::Result<Arc<dyn Workload>>> {
        Box::pin(Calls::open(setup, ECHO.into(), true))
    }
}
