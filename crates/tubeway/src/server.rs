//! A broker on threads of its own, for programs that are not async.

use std::time::Duration;

use tokio::runtime::Runtime;
use tubeway_broker::{Broker, BrokerConfig};
use tubeway_transport::Url;

use crate::{Error, Result};

/// An embedded broker with its own runtime threads.
///
/// [`Broker`] is the async type and runs on the caller's tokio runtime;
/// `Server` owns a runtime, so a plain `fn main` can host functions, queues
/// and topics. Dropping it shuts the broker down gracefully.
///
/// ```no_run
/// # fn main() -> tubeway::Result<()> {
/// let server = tubeway::Server::start(Default::default(), &["tcp://127.0.0.1:0"])?;
/// server.broker().create_function("echo", Ok).unwrap();
/// let client = tubeway::Client::connect(&server.url().to_string())?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Server {
    broker: Broker,
    urls: Vec<Url>,
    runtime: Option<Runtime>,
}

impl Server {
    /// Starts a broker with `config` serving every URL in `listen` (at least one).
    pub fn start(config: BrokerConfig, listen: &[&str]) -> Result<Server> {
        if listen.is_empty() {
            return Err(Error::Listen {
                url: String::new(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "a server needs at least one address",
                ),
            });
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tubeway-server")
            .enable_all()
            .build()
            .map_err(|e| Error::Runtime(format!("cannot start the server runtime: {e}")))?;
        let broker = Broker::new(config);
        let mut urls = Vec::with_capacity(listen.len());
        for url in listen {
            let parsed: Url = url.parse()?;
            let bound =
                runtime
                    .block_on(broker.listen(&parsed))
                    .map_err(|source| Error::Listen {
                        url: (*url).to_owned(),
                        source,
                    })?;
            urls.push(bound);
        }
        Ok(Server {
            broker,
            urls,
            runtime: Some(runtime),
        })
    }

    /// The broker, to create functions, queues and topics.
    pub fn broker(&self) -> &Broker {
        &self.broker
    }

    /// The addresses served, with the real ports where 0 was asked for.
    pub fn urls(&self) -> &[Url] {
        &self.urls
    }

    /// The first address served.
    pub fn url(&self) -> &Url {
        let [first, ..] = self.urls.as_slice() else {
            unreachable!("start binds at least one address")
        };
        first
    }

    /// Shuts the broker down gracefully and stops its threads.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.block_on(self.broker.shutdown());
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::{Client, Message};

    #[test]
    fn serves_a_blocking_program() {
        let server = Server::start(BrokerConfig::default(), &["tcp://127.0.0.1:0"]).unwrap();
        server.broker().create_function("echo", Ok).unwrap();
        let client = Client::connect(&server.url().to_string()).unwrap();
        let reply = client.send("echo", Message::plain_text("hi")).unwrap();
        assert_eq!(reply.text_payload().unwrap(), "hi");
        server.shutdown();
        assert!(client.send("echo", Message::plain_text("again")).is_err());
    }

    #[test]
    fn bad_address_is_an_error() {
        let e = Server::start(BrokerConfig::default(), &["udp://x:1"]).unwrap_err();
        assert!(matches!(e, Error::InvalidUrl(_)));
    }
}
