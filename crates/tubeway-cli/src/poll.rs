//! `tubeway poll`: take messages from a queue and print them.

use tubeway::{Message, MessageType, ResponseStatus};

use crate::cli::PollArgs;
use crate::output::Printer;

/// Polls `--count` messages, printing each as it arrives.
pub async fn run(args: PollArgs) -> anyhow::Result<()> {
    let out = Printer::new(args.client.json);
    let wait = args.wait.unwrap_or(args.client.timeout);
    let client = args.client.connect().await?;
    for received in 0..args.count {
        // The raw operation, to report the broker's own `queue_empty` reason.
        let poll = Message::new(MessageType::Poll)
            .with_destination(&args.queue)
            .with_timeout(wait);
        let response = client.request(poll).await?;
        match response.status() {
            ResponseStatus::Ok => out.message(&response)?,
            status => {
                let mut reason = response
                    .text_payload()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                if status == ResponseStatus::QueueEmpty && args.count > 1 {
                    reason = format!("{reason} (received {received} of {})", args.count);
                }
                return Err(tubeway::Error::Status { status, reason }.into());
            }
        }
    }
    Ok(())
}
