//! `tubeway offer`: put a message on a queue.

use serde_json::json;

use crate::cli::OfferArgs;
use crate::output::Printer;

/// Offers the message, waiting up to `--wait` for room in a full bounded queue.
pub async fn run(args: OfferArgs) -> anyhow::Result<()> {
    let mut msg = args.payload.to_message()?;
    msg.subject = args.subject;
    msg.request_id = args.request_id;
    msg.reply_to = args.reply_to;
    if let Some(ttl) = args.ttl {
        msg = msg.with_ttl(ttl);
    }
    let id = msg.id;
    let out = Printer::new(args.client.json);
    let client = args.client.connect().await?;
    client.offer(&args.queue, msg, args.wait).await?;
    Ok(out.status(
        format_args!("offered to {}", args.queue),
        json!({"status": "ok", "queue": args.queue, "id": id.to_string()}),
    )?)
}
