//! Printing messages, statuses and errors, and choosing the exit status.

use std::fmt::Display;
use std::io::{self, Write};

use serde::Serialize;
use tubeway::{Message, PayloadKind};

use crate::cli::{UsageError, EXIT_CONNECTION, EXIT_FAILED, EXIT_OK, EXIT_USAGE};

/// Prints to stdout in the human or the JSON form.
#[derive(Debug, Clone, Copy)]
pub struct Printer {
    json: bool,
}

impl Printer {
    /// A printer for `--json` (`json = true`) or the human form.
    pub fn new(json: bool) -> Self {
        Printer { json }
    }

    /// Whether output is JSON.
    pub fn is_json(&self) -> bool {
        self.json
    }

    /// Prints one message: its JSON form on one line, or its payload.
    pub fn message(&self, msg: &Message) -> io::Result<()> {
        if self.json {
            self.line(msg.to_json())
        } else {
            self.line(human_payload(msg))
        }
    }

    /// Prints an outcome: `human` as a line, or `json` as one compact line.
    pub fn status(&self, human: impl Display, json: serde_json::Value) -> io::Result<()> {
        if self.json {
            self.line(json)
        } else {
            self.line(human)
        }
    }

    /// Confirms that the `kind` (queue, topic, function) `name` is removed.
    pub fn removed(&self, kind: &str, name: &str) -> io::Result<()> {
        self.status(
            format_args!("removed {kind} {name}"),
            serde_json::json!({"status": "ok", "removed": kind, "name": name}),
        )
    }

    /// Prints a listing of `kind`s (queues, topics, functions): a JSON line
    /// each, or `table` of them, or that there are none.
    pub fn list<T: Serialize>(
        &self,
        kind: &str,
        items: &[T],
        table: impl FnOnce(&[T]) -> String,
    ) -> io::Result<()> {
        if self.json {
            items.iter().try_for_each(|item| self.json_line(item))
        } else if items.is_empty() {
            self.line(format_args!("no {kind}"))
        } else {
            self.line(table(items))
        }
    }

    /// Prints `value` as one compact JSON line.
    pub fn json_line<T: Serialize>(&self, value: &T) -> io::Result<()> {
        let text = serde_json::to_string(value).map_err(io::Error::other)?;
        self.line(text)
    }

    /// Prints one line and flushes, so a reader of a pipe sees it at once.
    pub fn line(&self, text: impl Display) -> io::Result<()> {
        let mut out = io::stdout().lock();
        writeln!(out, "{text}")?;
        out.flush()
    }
}

/// The human form of a message: text as is, data as pretty JSON, anything
/// else as `<N bytes binary MIMETYPE>`.
pub fn human_payload(msg: &Message) -> String {
    let binary = || {
        format!(
            "<{} bytes binary {}>",
            msg.payload.len(),
            msg.mimetype().unwrap_or(tubeway::MIME_BINARY)
        )
    };
    match msg.payload_kind() {
        PayloadKind::Empty => "<empty>".to_owned(),
        PayloadKind::Data => match msg.data_payload() {
            Ok(v) => serde_json::to_string_pretty(&v).unwrap_or_else(|_| binary()),
            Err(_) => binary(),
        },
        PayloadKind::Text => match msg.text_payload() {
            Ok(t) => t.strip_suffix('\n').unwrap_or(&t).to_owned(),
            Err(_) => binary(),
        },
        _ => binary(),
    }
}

/// Formats rows as left-aligned columns separated by two spaces.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    table_aligned(header, rows, &[])
}

/// Formats rows as columns separated by two spaces; column `i` is
/// right-aligned (for numbers) when `right[i]` is true, else left-aligned.
pub fn table_aligned(header: &[&str], rows: &[Vec<String>], right: &[bool]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut push_row = |cells: &mut dyn Iterator<Item = &str>| {
        let mut line = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = std::iter::repeat_n(' ', w - cell.chars().count());
            if right.get(i).copied().unwrap_or(false) {
                line.extend(pad);
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.extend(pad);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    };
    push_row(&mut header.iter().copied());
    for row in rows {
        push_row(&mut row.iter().map(String::as_str));
    }
    out.pop();
    out
}

/// Reports `err` on stderr as one line and returns the exit status.
pub fn report(err: &anyhow::Error) -> u8 {
    let (code, line) = describe(err);
    if let Some(line) = line {
        let _ = writeln!(io::stderr().lock(), "error: {line}");
    }
    code
}

/// The exit status for `err` and the line to print (none for a closed stdout).
pub fn describe(err: &anyhow::Error) -> (u8, Option<String>) {
    for (depth, cause) in err.chain().enumerate() {
        if let Some(e) = cause.downcast_ref::<tubeway::Error>() {
            let (code, line) = describe_client_error(e);
            // Context added on the way up (`during tcp call 5 KB`) comes first.
            let context: Vec<String> = err.chain().take(depth).map(ToString::to_string).collect();
            let line = match (context.is_empty(), line) {
                (false, Some(line)) => Some(format!("{}: {line}", context.join(": "))),
                (_, line) => line,
            };
            return (code, line);
        }
        if cause.downcast_ref::<UsageError>().is_some() {
            return (EXIT_USAGE, Some(format!("{err:#}")));
        }
        if let Some(e) = cause.downcast_ref::<io::Error>() {
            if e.kind() == io::ErrorKind::BrokenPipe {
                // Whoever read our output stopped reading (`| head`): not a failure.
                return (EXIT_OK, None);
            }
        }
    }
    (EXIT_FAILED, Some(format!("{err:#}")))
}

fn describe_client_error(e: &tubeway::Error) -> (u8, Option<String>) {
    use tubeway::Error as E;
    let (code, line) = match e {
        E::Status { .. } => (EXIT_FAILED, e.to_string()),
        E::TooLarge { .. } | E::Timeout(_) => match e.status() {
            Some(status) => (EXIT_FAILED, format!("{status}: {e}")),
            None => (EXIT_FAILED, e.to_string()),
        },
        E::InvalidUrl(_) => (EXIT_USAGE, format!("bad --url: {e}")),
        E::Connect { .. } | E::Handshake(_) | E::ConnectionClosed(_) => {
            (EXIT_CONNECTION, e.to_string())
        }
        _ => (EXIT_FAILED, e.to_string()),
    };
    (code, Some(line))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tubeway::{ResponseStatus, MIME_TEXT};

    #[test]
    fn human_forms() {
        assert_eq!(human_payload(&Message::plain_text("hi")), "hi");
        assert_eq!(human_payload(&Message::plain_text("hi\n")), "hi");
        assert_eq!(
            human_payload(&Message::data(&serde_json::json!({"a": 1}))),
            "{\n  \"a\": 1\n}"
        );
        assert_eq!(
            human_payload(&Message::binary(vec![0u8; 3], None)),
            "<3 bytes binary application/octet-stream>"
        );
        assert_eq!(
            human_payload(&Message::binary(vec![1u8; 2], Some("image/png"))),
            "<2 bytes binary image/png>"
        );
        assert_eq!(human_payload(&Message::request()), "<empty>");
        let bad_text = Message::binary(vec![0xff, 0xfe], Some(MIME_TEXT));
        assert_eq!(human_payload(&bad_text), "<2 bytes binary text/plain>");
    }

    #[test]
    fn tables() {
        let t = table(
            &["NAME", "SIZE"],
            &[
                vec!["jobs".into(), "3".into()],
                vec!["x".into(), "10".into()],
            ],
        );
        assert_eq!(t, "NAME  SIZE\njobs  3\nx     10");
        let t = table_aligned(
            &["NAME", "SIZE"],
            &[
                vec!["jobs".into(), "3".into()],
                vec!["x".into(), "10".into()],
            ],
            &[false, true],
        );
        assert_eq!(t, "NAME  SIZE\njobs     3\nx       10");
    }

    #[test]
    fn exit_statuses() {
        let status = |e: tubeway::Error| describe(&anyhow::Error::new(e));
        let (code, line) = status(tubeway::Error::Status {
            status: ResponseStatus::QueueEmpty,
            reason: "queue \"q\" is empty".into(),
        });
        assert_eq!(code, 1);
        assert_eq!(line.unwrap(), "queue_empty: queue \"q\" is empty");
        let (code, line) = status(tubeway::Error::TooLarge { len: 10, max: 5 });
        assert_eq!(code, 1);
        assert!(line.unwrap().starts_with("too_large: "));
        let (code, line) = status(tubeway::Error::Timeout(Duration::from_secs(1)));
        assert_eq!(code, 1);
        assert!(line.unwrap().starts_with("timeout: "));
        let (code, _) = status(tubeway::Error::ConnectionClosed("gone".into()));
        assert_eq!(code, 3);
        let lost = anyhow::Error::new(tubeway::Error::ConnectionClosed("gone".into()))
            .context("during tcp call 5 KB");
        let (code, line) = describe(&lost);
        assert_eq!(code, 3);
        assert!(
            line.as_deref()
                .unwrap_or_default()
                .starts_with("during tcp call 5 KB: "),
            "{line:?}"
        );
        let (code, _) = describe(&anyhow::Error::new(UsageError("bad".into())));
        assert_eq!(code, 2);
        let (code, line) = describe(&anyhow::anyhow!("something else"));
        assert_eq!((code, line.as_deref()), (1, Some("something else")));
        let pipe = anyhow::Error::new(io::Error::from(io::ErrorKind::BrokenPipe));
        assert_eq!(describe(&pipe), (0, None));
    }
}
