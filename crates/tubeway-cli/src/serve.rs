//! `tubeway serve`: answer a function's calls from the shell, with a fixed
//! reply, the request itself, or the output of a command run per call.

use std::os::unix::process::ExitStatusExt as _;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;

use anyhow::Context as _;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;
use tubeway::{AsyncClient, ClientOptions, HandlerError, Message, Responder};

use crate::cli::{ServeArgs, UsageError};
use crate::output::Printer;

/// What each call is answered with.
enum Reply {
    /// This message's payload, mimetype, charset and subject.
    Fixed(Box<Message>),
    /// The request's own.
    Echo,
    /// The output of `sh -c` this, answered as the mimetype if one is given.
    Command(String, Option<String>),
}

/// The most of a command's stderr kept, from its end, for its error.
const STDERR_KEPT: usize = 16 * 1024;

/// Serves the function until `--count` calls are answered, SIGINT or
/// SIGTERM; then stops taking calls and answers those it has.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let reply = reply_of(&args)?;
    // Installed first: Ctrl-C then stops the worker cleanly instead of killing us.
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let max_worker_calls = match (args.max_calls, &reply) {
        (Some(n), _) => Some(usize::try_from(n)?),
        (None, Reply::Command(..)) => Some(1),
        (None, _) => None,
    };
    let options = ClientOptions {
        max_worker_calls,
        ..args.client.options()
    };
    let client = AsyncClient::connect_with(&args.client.url, options).await?;
    let calls = TaskTracker::new();
    let (answered_tx, mut answered) = mpsc::unbounded_channel();
    let handler = Arc::new(Handler {
        reply,
        out: (!args.quiet).then(|| Printer::new(args.client.json)),
        function: args.function.clone(),
        max_size: client.max_message_size(),
        answered: answered_tx,
    });
    let tracked = calls.clone();
    let worker = client
        .serve_deferred(&args.function, move |req, responder| {
            // Taken on the reader, in the order calls come, so that a stop
            // confirmed after a call came waits for its answer.
            let token = tracked.token();
            let handler = handler.clone();
            tokio::spawn(async move {
                handler.answer(req, responder).await;
                drop(token);
            });
        })
        .await?;
    tracing::info!(function = %args.function, "serving");

    let mut count = 0u64;
    loop {
        tokio::select! {
            Some(()) = answered.recv() => {
                count += 1;
                if args.count.is_some_and(|n| count >= n) {
                    break;
                }
            }
            () = client.closed() => {
                return Err(tubeway::Error::ConnectionClosed(format!(
                    "the connection to {} was lost; stopped serving {:?}",
                    args.client.url, args.function
                ))
                .into());
            }
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
        }
    }
    // The broker gives this worker no more calls once it confirms; those
    // that came before are answered, unless a second signal says not to wait.
    let stop = async {
        let stopped = worker.stop().await;
        calls.close();
        calls.wait().await;
        stopped
    };
    tokio::select! {
        stopped = stop => stopped?,
        _ = interrupt.recv() => tracing::warn!("interrupted again: calls still running are abandoned"),
        _ = terminate.recv() => tracing::warn!("terminated: calls still running are abandoned"),
    }
    client.close().await;
    Ok(())
}

/// What the arguments say to answer with.
fn reply_of(args: &ServeArgs) -> Result<Reply, UsageError> {
    if args.echo {
        return Ok(Reply::Echo);
    }
    if let Some(command) = &args.command {
        return Ok(Reply::Command(command.clone(), args.reply.mimetype.clone()));
    }
    let r = &args.reply;
    if r.text.is_none() && r.file.is_none() && r.data.is_none() {
        return Err(UsageError(
            "say what to answer with: TEXT, --file PATH, --data JSON, --echo or --command CMD"
                .into(),
        ));
    }
    Ok(Reply::Fixed(Box::new(r.to_message()?)))
}

/// Answers the calls of one worker.
struct Handler {
    reply: Reply,
    /// Where each call is printed; none with `--quiet`.
    out: Option<Printer>,
    function: String,
    /// The largest answer the broker takes.
    max_size: usize,
    /// Told of each call answered.
    answered: mpsc::UnboundedSender<()>,
}

impl Handler {
    async fn answer(&self, req: Message, responder: Responder) {
        if let Some(out) = &self.out {
            // Whoever reads our output may have stopped; the call still counts.
            let _ = out.message(&req);
        }
        let outcome = match &self.reply {
            Reply::Fixed(m) => Ok((**m).clone()),
            Reply::Echo => Ok(req),
            Reply::Command(command, mimetype) => {
                let run = self.run(command, mimetype.as_deref(), &req);
                match req.timeout.filter(|t| !t.is_zero()) {
                    // Past it nobody waits for the answer; the child is
                    // killed as its future is dropped.
                    Some(t) => tokio::time::timeout(t, run).await.unwrap_or_else(|_| {
                        Err(format!(
                            "the command outlasted its call's timeout of {} and was killed",
                            humantime::format_duration(t)
                        )
                        .into())
                    }),
                    None => run.await,
                }
            }
        };
        responder.answer(outcome);
        let _ = self.answered.send(());
    }

    /// Runs `command` on the request: its output is the answer.
    async fn run(
        &self,
        command: &str,
        mimetype: Option<&str>,
        req: &Message,
    ) -> Result<Message, HandlerError> {
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c")
            .arg(command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .env("TUBEWAY_FUNCTION", &self.function);
        for (name, value) in [
            ("TUBEWAY_SUBJECT", req.subject.as_deref()),
            ("TUBEWAY_REQUEST_ID", req.request_id.as_deref()),
            ("TUBEWAY_MIMETYPE", req.mimetype()),
        ] {
            match value {
                Some(v) => cmd.env(name, v),
                None => cmd.env_remove(name),
            };
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot run the command: {e}"))?;
        let (stdin, stdout, stderr) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let payload = req.payload.clone();
        let feed = async move {
            if let Some(mut stdin) = stdin {
                // A command that does not read its input is no error.
                let _ = stdin.write_all(&payload).await;
            }
        };
        let (_, out, err) = tokio::join!(
            feed,
            read_head(stdout, self.max_size.saturating_add(1)),
            read_tail(stderr, STDERR_KEPT),
        );
        let out = out.map_err(|e| format!("cannot read the command's output: {e}"))?;
        if out.len() > self.max_size {
            let _ = child.start_kill();
            let _ = child.wait().await;
            return Err(format!(
                "the command's output is larger than the largest message the broker takes ({} bytes)",
                self.max_size
            )
            .into());
        }
        let status = child
            .wait()
            .await
            .map_err(|e| format!("cannot wait for the command: {e}"))?;
        if !status.success() {
            return Err(failed(status, &err.unwrap_or_default()).into());
        }
        Ok(match (mimetype, String::from_utf8(out)) {
            (None, Ok(text)) => Message::text(text, tubeway::MIME_TEXT, "utf-8"),
            (mimetype, Ok(text)) => Message::binary(text.into_bytes(), mimetype),
            (mimetype, Err(e)) => Message::binary(e.into_bytes(), mimetype),
        })
    }
}

/// Reads `from` to its end, or until `limit` bytes: what it read.
async fn read_head(from: Option<impl AsyncRead + Unpin>, limit: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    if let Some(from) = from {
        let limit = u64::try_from(limit).unwrap_or(u64::MAX);
        from.take(limit).read_to_end(&mut buf).await?;
    }
    Ok(buf)
}

/// Reads `from` to its end: the last `keep` bytes of it.
async fn read_tail(from: Option<impl AsyncRead + Unpin>, keep: usize) -> std::io::Result<Vec<u8>> {
    let mut kept = Vec::new();
    let Some(mut from) = from else {
        return Ok(kept);
    };
    let mut chunk = vec![0u8; 4096];
    loop {
        let n = from.read(&mut chunk).await?;
        if n == 0 {
            return Ok(kept);
        }
        kept.extend_from_slice(chunk.get(..n).unwrap_or_default());
        if kept.len() > keep {
            kept.drain(..kept.len() - keep);
        }
    }
}

/// Why a command that ended with `status` failed, with the last line of
/// its stderr.
fn failed(status: ExitStatus, stderr: &[u8]) -> String {
    let how = match (status.code(), status.signal()) {
        (Some(code), _) => format!("the command exited with status {code}"),
        (None, Some(signal)) => format!("the command was killed by signal {signal}"),
        (None, None) => "the command failed".to_owned(),
    };
    let text = String::from_utf8_lossy(stderr);
    match text.lines().map(str::trim).rfind(|l| !l.is_empty()) {
        Some(line) => format!("{how}: {line}"),
        None => how,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_names_the_status_and_the_last_line_of_stderr() {
        let exited = ExitStatus::from_raw(3 << 8);
        assert_eq!(
            failed(exited, b"warming up\nno such file: x.txt\n\n"),
            "the command exited with status 3: no such file: x.txt"
        );
        assert_eq!(failed(exited, b""), "the command exited with status 3");
        assert_eq!(
            failed(ExitStatus::from_raw(9), b""),
            "the command was killed by signal 9"
        );
    }

    #[tokio::test]
    async fn the_tail_of_a_long_stream_is_kept() {
        let long: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let tail = read_tail(Some(&long[..]), 100).await.unwrap();
        assert_eq!(tail, long[long.len() - 100..]);
        let head = read_head(Some(&long[..]), 100).await.unwrap();
        assert_eq!(head, long[..100]);
    }
}
