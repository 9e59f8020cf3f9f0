//! `tubeway topic create|remove|list`.

use tubeway::ops::TopicStatus;

use crate::cli::TopicCommand;
use crate::output::{table, Printer};

/// Runs one topic management command.
pub async fn run(cmd: TopicCommand) -> anyhow::Result<()> {
    match cmd {
        TopicCommand::Create { name, client } => {
            let out = Printer::new(client.json);
            let t = client.connect().await?.create_topic(&name).await?;
            if out.is_json() {
                out.json_line(&t)?;
            } else {
                out.line(format_args!(
                    "topic {}: {} subscribers, {} published",
                    t.name, t.subscribers, t.published
                ))?;
            }
            Ok(())
        }
        TopicCommand::Remove { name, client } => {
            let out = Printer::new(client.json);
            client.connect().await?.remove_topic(&name).await?;
            Ok(out.removed("topic", &name)?)
        }
        TopicCommand::List { client } => {
            let out = Printer::new(client.json);
            let topics = client.connect().await?.list_topics().await?;
            Ok(out.list("topics", &topics, topic_table)?)
        }
    }
}

/// The topics as a table, as `tubeway stats` shows them too.
pub fn topic_table(topics: &[TopicStatus]) -> String {
    let rows: Vec<Vec<String>> = topics
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.subscribers.to_string(),
                t.published.to_string(),
                t.delivered.to_string(),
                t.dropped.to_string(),
            ]
        })
        .collect();
    table(
        &["NAME", "SUBSCRIBERS", "PUBLISHED", "DELIVERED", "DROPPED"],
        &rows,
    )
}
