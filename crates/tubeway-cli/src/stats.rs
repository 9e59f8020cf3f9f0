//! `tubeway stats`: broker statistics.

use std::time::Duration;

use tubeway::ops::Stats;

use crate::cli::StatsArgs;
use crate::function::function_table;
use crate::output::{table, Printer};
use crate::topic::topic_table;

/// Prints the statistics: a summary and tables, or the `ops::Stats` JSON.
pub async fn run(args: StatsArgs) -> anyhow::Result<()> {
    let out = Printer::new(args.client.json);
    let stats = args.client.connect().await?.stats().await?;
    if out.is_json() {
        out.json_line(&stats)?;
    } else {
        out.line(summary(&stats))?;
    }
    Ok(())
}

/// The human form of the statistics.
fn summary(s: &Stats) -> String {
    // Whole seconds, or milliseconds while younger than a second.
    let uptime = if s.uptime_ms < 1000 {
        Duration::from_millis(s.uptime_ms)
    } else {
        Duration::from_secs(s.uptime_ms / 1000)
    };
    let mut text = format!(
        "uptime       {}\n\
         connections  {} live, {} total, {} rejected\n\
         messages     {} in, {} out\n\
         errors       {}\n\
         kept memory  {} for large messages\n",
        humantime::format_duration(uptime),
        s.connections,
        s.connections_total,
        s.connections_rejected,
        s.messages_in,
        s.messages_out,
        s.errors,
        bytesize::ByteSize::b(s.frame_pool_bytes).display().iec(),
    );

    text.push_str("\nqueues\n");
    if s.queues.is_empty() {
        text.push_str("  (none)\n");
    } else {
        let rows: Vec<Vec<String>> = s
            .queues
            .iter()
            .map(|q| {
                vec![
                    q.status.name.clone(),
                    q.status.kind.as_str().to_owned(),
                    q.status.capacity.to_string(),
                    q.status.size.to_string(),
                    q.offered.to_string(),
                    q.polled.to_string(),
                    q.expired.to_string(),
                    q.overwritten.to_string(),
                    q.rejected.to_string(),
                ]
            })
            .collect();
        push_indented(
            &mut text,
            &table(
                &[
                    "NAME",
                    "KIND",
                    "CAPACITY",
                    "SIZE",
                    "OFFERED",
                    "POLLED",
                    "EXPIRED",
                    "OVERWRITTEN",
                    "REJECTED",
                ],
                &rows,
            ),
        );
    }

    text.push_str("\ntopics\n");
    if s.topics.is_empty() {
        text.push_str("  (none)\n");
    } else {
        push_indented(&mut text, &topic_table(&s.topics));
    }

    text.push_str("\nfunctions\n");
    if s.functions.is_empty() {
        text.push_str("  (none)\n");
    } else {
        push_indented(&mut text, &function_table(&s.functions));
    }
    text.pop();
    text
}

fn push_indented(text: &mut String, block: &str) {
    for line in block.lines() {
        text.push_str("  ");
        text.push_str(line);
        text.push('\n');
    }
}
