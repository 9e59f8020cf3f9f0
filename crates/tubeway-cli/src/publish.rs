//! `tubeway publish`: publish a message to a topic.

use serde_json::json;

use crate::cli::PublishArgs;
use crate::output::Printer;

/// Publishes and waits for the broker to accept the message.
pub async fn run(args: PublishArgs) -> anyhow::Result<()> {
    let mut msg = args.payload.to_message()?;
    msg.subject = args.subject;
    let id = msg.id;
    let out = Printer::new(args.client.json);
    let client = args.client.connect().await?;
    client.publish(&args.topic, msg).await?;
    Ok(out.status(
        format_args!("published to {}", args.topic),
        json!({"status": "ok", "topic": args.topic, "id": id.to_string()}),
    )?)
}
