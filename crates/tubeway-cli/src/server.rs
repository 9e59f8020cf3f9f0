//! `tubeway server`: a broker with the built-in `echo` and `ack` functions.

use anyhow::Context as _;
use bytes::Bytes;
use tokio::signal::unix::{signal, SignalKind};
use tubeway::{Broker, BrokerConfig, HandlerError, Message, Url};

use crate::cli::{ServerArgs, UsageError};
use crate::output::Printer;

/// Runs the broker until SIGINT or SIGTERM, then shuts it down gracefully.
pub async fn run(args: ServerArgs) -> anyhow::Result<()> {
    let urls = args
        .listen
        .iter()
        .map(|u| {
            u.parse::<Url>()
                .map_err(|e| UsageError(format!("bad --listen {u:?}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(url) = urls.iter().find(|u| matches!(u, Url::Mem(_))) {
        return Err(UsageError(format!(
            "cannot serve {url}: mem:// addresses are reachable only inside one process"
        ))
        .into());
    }
    let mut config = BrokerConfig::default()
        .max_message_size(usize::try_from(args.max_message_size)?)
        .max_connections(usize::try_from(args.max_connections).unwrap_or(usize::MAX))
        .frame_pool(usize::try_from(args.frame_pool).unwrap_or(usize::MAX));
    if let Some(wait) = args.wait {
        config = config.wait(wait);
    }
    if let Some(n) = args.spin_threads {
        config = config.spin_threads(usize::try_from(n)?);
    }
    let broker = Broker::new(config);
    install_builtins(&broker)?;

    // Installed before binding, so a signal sent as soon as an address is
    // printed is handled, not fatal.
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;

    let out = Printer::new(false);
    for url in &urls {
        let bound = match broker.listen(url).await {
            Ok(bound) => bound,
            Err(e) => {
                broker.shutdown().await;
                return Err(anyhow::anyhow!("cannot listen on {url}: {e}"));
            }
        };
        // A closed stdout must not stop the broker.
        let _ = out.line(format_args!("listening on {bound}"));
    }

    tokio::select! {
        _ = interrupt.recv() => tracing::info!("SIGINT received"),
        _ = terminate.recv() => tracing::info!("SIGTERM received"),
        _ = stdin_closed(), if args.exit_on_stdin_close => tracing::info!("stdin closed"),
    }
    broker.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

/// The built-in functions: `echo` answers with the request (payload,
/// mimetype, charset and subject); `ack` answers an empty `ok`, the
/// cheapest possible call (what `tubeway bench --mode call` measures).
pub fn install_builtins(broker: &Broker) -> anyhow::Result<()> {
    broker
        .create_function("echo", Ok)
        .context("cannot create the echo function")?;
    broker
        .create_function("ack", emptied)
        .context("cannot create the ack function")?;
    // `ack` as a function that may block would be: on a handler thread.
    broker
        .create_blocking_function("ack-blocking", emptied)
        .context("cannot create the ack-blocking function")?;
    Ok(())
}

/// `ack`'s handler: the request itself, emptied of what an answer takes
/// from it. The handler should cost nothing: neither a new message (an id
/// and a look at the clock) nor a copy of a kept one, which a response
/// made of it would drop again.
fn emptied(m: Message) -> Result<Message, HandlerError> {
    // Made in the answer's place from the request's fields: emptied in
    // place and then returned, the message would be copied whole right
    // after those stores, and the copy would wait for them.
    Ok(Message {
        payload: Bytes::new(),
        payload_mimetype: None,
        payload_charset: None,
        subject: None,
        ..m
    })
}

/// Completes when stdin reaches end-of-file (or fails): the parent that
/// started this server with a pipe has gone.
async fn stdin_closed() {
    let _ = tokio::task::spawn_blocking(|| {
        use std::io::Read as _;
        let mut buf = [0u8; 256];
        let mut stdin = std::io::stdin();
        while let Ok(n) = stdin.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}
