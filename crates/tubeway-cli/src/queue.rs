//! `tubeway queue create|remove|status|list`.

use tubeway::ops::{QueueKind, QueueStatus};

use crate::cli::QueueCommand;
use crate::output::{table, Printer};

/// Runs one queue management command.
pub async fn run(cmd: QueueCommand) -> anyhow::Result<()> {
    match cmd {
        QueueCommand::Create {
            name,
            capacity,
            circular,
            client,
        } => {
            let out = Printer::new(client.json);
            let kind = if circular {
                QueueKind::Circular
            } else {
                QueueKind::Bounded
            };
            let status = client
                .connect()
                .await?
                .create_queue(&name, capacity, kind)
                .await?;
            print_status(out, &status)
        }
        QueueCommand::Remove { name, client } => {
            let out = Printer::new(client.json);
            client.connect().await?.remove_queue(&name).await?;
            Ok(out.removed("queue", &name)?)
        }
        QueueCommand::Status { name, client } => {
            let out = Printer::new(client.json);
            let status = client.connect().await?.queue_status(&name).await?;
            print_status(out, &status)
        }
        QueueCommand::List { client } => {
            let out = Printer::new(client.json);
            let queues = client.connect().await?.list_queues().await?;
            Ok(out.list("queues", &queues, queue_table)?)
        }
    }
}

fn print_status(out: Printer, q: &QueueStatus) -> anyhow::Result<()> {
    if out.is_json() {
        out.json_line(q)?;
    } else {
        out.line(format_args!(
            "queue {}: {}, capacity {}, size {}{}",
            q.name,
            q.kind.as_str(),
            q.capacity,
            q.size,
            if q.temporary { ", temporary" } else { "" }
        ))?;
    }
    Ok(())
}

fn queue_table(queues: &[QueueStatus]) -> String {
    let rows: Vec<Vec<String>> = queues
        .iter()
        .map(|q| {
            vec![
                q.name.clone(),
                q.kind.as_str().to_owned(),
                q.capacity.to_string(),
                q.size.to_string(),
                if q.temporary { "yes" } else { "no" }.to_owned(),
            ]
        })
        .collect();
    table(&["NAME", "KIND", "CAPACITY", "SIZE", "TEMPORARY"], &rows)
}
