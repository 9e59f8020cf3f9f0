//! `tubeway call`: call a function and print its response.

use serde_json::json;

use crate::cli::CallArgs;
use crate::output::Printer;

/// Calls the function; prints the response, or a status for `--oneway`.
pub async fn run(args: CallArgs) -> anyhow::Result<()> {
    let mut msg = args.payload.to_message()?;
    msg.subject = args.subject;
    msg.request_id = args.request_id;
    let out = Printer::new(args.client.json);
    let client = args.client.connect().await?;
    if args.oneway {
        let id = msg.id;
        client.send_oneway(&args.function, msg).await?;
        // The broker reads a connection's frames in order, so the answer to
        // this ping confirms it received the call before we report "sent".
        client.ping().await?;
        client.close().await;
        return Ok(out.status(
            format_args!("sent to {} (oneway)", args.function),
            json!({"status": "ok", "function": args.function, "oneway": true, "id": id.to_string()}),
        )?);
    }
    let response = client.send(&args.function, msg).await?;
    out.message(&response)?;
    Ok(())
}
