//! `tubeway subscribe`: print each message published to a topic.

use std::time::Duration;

use anyhow::Context as _;
use tokio::signal::unix::{signal, SignalKind};

use crate::cli::SubscribeArgs;
use crate::output::Printer;

/// Subscribes and prints deliveries until `--count`, Ctrl-C or SIGTERM, or
/// until the broker ends the subscription (an error).
pub async fn run(args: SubscribeArgs) -> anyhow::Result<()> {
    let out = Printer::new(args.client.json);
    // Installed first: Ctrl-C then ends the subscription cleanly instead of killing us.
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let client = args.client.connect().await?;
    let mut sub = client.subscribe(&args.topic).await?;
    tracing::info!(topic = %args.topic, "subscribed");

    let mut received = 0u64;
    while args.count.is_none_or(|n| received < n) {
        tokio::select! {
            delivery = sub.recv() => match delivery {
                Some(msg) => {
                    out.message(&msg)?;
                    received += 1;
                }
                None if client.is_closed() => {
                    return Err(tubeway::Error::ConnectionClosed(format!(
                        "the connection to {} was lost; subscription to {:?} ended",
                        args.client.url, args.topic
                    ))
                    .into());
                }
                None => anyhow::bail!(
                    "subscription ended: the broker ended the subscription to topic {:?} \
                     (topic removed, or broker shutting down)",
                    args.topic
                ),
            },
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
        }
    }
    // Best effort and bounded: the broker also ends it when the connection closes.
    let _ = tokio::time::timeout(Duration::from_secs(2), sub.unsubscribe()).await;
    client.close().await;
    Ok(())
}
