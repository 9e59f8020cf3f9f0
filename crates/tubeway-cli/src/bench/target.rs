//! The broker under test: a `tubeway server` child process, a broker inside
//! this process (mem), or one already running (`--url`).

use std::path::Path;
use std::time::Duration;

use tubeway::{AsyncClient, Broker, BrokerConfig, ClientOptions, Url};

use super::child::ChildProc;
use super::memory::Proc;
use super::transport::Transport;
use super::wait::Wait;
use crate::cli::{MAX_MESSAGE_SIZE_LIMIT, MIN_MESSAGE_SIZE_LIMIT};

/// Room for the header beside the largest payload.
pub const HEADER_ROOM: usize = 64 * 1024;

/// A broker to bench.
#[derive(Debug)]
pub struct Target {
    /// Its address.
    pub url: String,
    /// Where it runs, for the report.
    pub description: String,
    /// Client settings for connections to it.
    pub options: ClientOptions,
    /// The largest message it accepts, as announced in the handshake.
    pub max_message_size: usize,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Child(ChildProc),
    InProcess(Broker),
    External,
}

impl Target {
    /// Starts a broker for `transport` able to take `largest_payload`, its
    /// connections and ours waiting by `wait`, or uses the one at `url`.
    pub async fn start(
        transport: Transport,
        url: Option<&str>,
        largest_payload: usize,
        dir: &Path,
        tag: &str,
        wait: Wait,
    ) -> anyhow::Result<Target> {
        let limit = max_message_size(largest_payload);
        let options = ClientOptions {
            timeout: Duration::from_secs(60),
            max_message_size: limit,
            name: concat!("tubeway-bench/", env!("CARGO_PKG_VERSION")).to_owned(),
            wait: wait.strategy(),
            ..ClientOptions::default()
        };
        let listen = transport.listen_url(dir, tag);
        let (kind, url, description) = if let Some(url) = url {
            (
                Kind::External,
                url.to_owned(),
                format!("already running at {url} (--url)"),
            )
        } else if transport.in_process() {
            let mut config = BrokerConfig::default().max_message_size(limit);
            if let Some(w) = wait.strategy() {
                config = config.wait(w);
            }
            let broker = Broker::new(config);
            crate::server::install_builtins(&broker)?;
            let bound = broker.listen(&listen.parse::<Url>()?).await?;
            (
                Kind::InProcess(broker),
                bound.to_string(),
                "inside the bench process (tubeway::Broker on its runtime)".to_owned(),
            )
        } else {
            let mut args = [
                "server",
                "--listen",
                &listen,
                "--max-message-size",
                &limit.to_string(),
                "--exit-on-stdin-close",
                "--log-level",
                "warn",
            ]
            .map(str::to_owned)
            .to_vec();
            if let Some(w) = wait.strategy() {
                args.extend(["--wait".to_owned(), w.to_string()]);
            }
            let cmd = ChildProc::command(&args)?;
            let what = format!("broker process (`tubeway server --listen {listen}`)");
            let proc = tokio::task::spawn_blocking(move || ChildProc::start(cmd, &what)).await??;
            let url = proc.url().to_owned();
            let description = proc.describe("tubeway server");
            (Kind::Child(proc), url, description)
        };
        // One handshake, so a broker that cannot be reached fails here.
        let probe = AsyncClient::connect_with(&url, options.clone()).await?;
        let max_message_size = probe.max_message_size();
        probe.close().await;
        Ok(Target {
            url,
            description,
            options,
            max_message_size,
            kind,
        })
    }

    /// The broker's process id, when it is a child of ours.
    pub fn broker_proc(&self) -> Option<Proc> {
        match &self.kind {
            Kind::Child(c) => Some(Proc::Pid(c.pid())),
            Kind::InProcess(_) | Kind::External => None,
        }
    }

    /// An error if the broker process has exited.
    pub fn check(&mut self) -> anyhow::Result<()> {
        if let Kind::Child(c) = &mut self.kind {
            c.check()?;
        }
        Ok(())
    }

    /// Stops a broker we started.
    pub async fn stop(self) {
        match self.kind {
            Kind::Child(c) => {
                let _ = tokio::task::spawn_blocking(move || c.stop()).await;
            }
            Kind::InProcess(b) => b.shutdown().await,
            Kind::External => {}
        }
    }
}

/// The broker's maximum message size for a payload: the payload and room
/// for its header, within the limits `tubeway server` accepts.
pub fn max_message_size(largest_payload: usize) -> usize {
    let (lo, hi) = (
        usize::try_from(MIN_MESSAGE_SIZE_LIMIT).unwrap_or(usize::MAX),
        usize::try_from(MAX_MESSAGE_SIZE_LIMIT).unwrap_or(usize::MAX),
    );
    largest_payload.saturating_add(HEADER_ROOM).clamp(lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_size_limits() {
        assert_eq!(max_message_size(0), 64 * 1024);
        assert_eq!(max_message_size(64), 64 + HEADER_ROOM);
        assert_eq!(max_message_size(200_000_000), 200_000_000 + HEADER_ROOM);
        assert_eq!(max_message_size(usize::MAX), 1 << 30);
    }
}
