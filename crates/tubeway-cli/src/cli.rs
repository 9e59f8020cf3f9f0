//! Command-line definitions (clap) and the argument types shared by the
//! subcommands: client connection settings, payloads, sizes and durations.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tubeway::{AsyncClient, ClientOptions, Message};

/// The largest message size a broker may be configured with (1 GiB).
pub const MAX_MESSAGE_SIZE_LIMIT: u64 = 1024 * 1024 * 1024;
/// The smallest maximum message size a broker may be configured with (64 KiB).
pub const MIN_MESSAGE_SIZE_LIMIT: u64 = 64 * 1024;
/// The broker address used when neither `--url` nor `TUBEWAY_URL` is given.
pub const DEFAULT_URL: &str = "tcp://127.0.0.1:33333";

/// Exit status: success.
pub const EXIT_OK: u8 = 0;
/// Exit status: the broker answered with an error status, or the command failed.
pub const EXIT_FAILED: u8 = 1;
/// Exit status: bad arguments or input.
pub const EXIT_USAGE: u8 = 2;
/// Exit status: the broker could not be reached, or the connection was lost.
pub const EXIT_CONNECTION: u8 = 3;

const LONG_ABOUT: &str = "\
Tubeway: request/reply functions, point-to-point queues and pub/sub topics
through one broker.

`tubeway server` runs a broker; every other command is a client of one,
found with --url or the TUBEWAY_URL environment variable (default
tcp://127.0.0.1:33333; unix:///path/to/socket works too).

Payloads: a positional TEXT is sent as text/plain UTF-8; --data JSON sends
structured data (application/json); --file PATH sends the file's bytes as
binary (application/octet-stream). --mimetype overrides the mimetype.

Output: messages are printed as their payload (text as is, data as pretty
JSON, binary as <N bytes binary MIMETYPE>). With --json, each message, status
or list entry is printed as exactly one compact JSON object per line
(messages in the JSON form of docs/protocol.md section 11).

Sizes are written like 512KB, 20MB (powers of 1000) or 64KiB, 2MiB, 1GiB
(powers of 1024); a plain number is bytes. Durations are written like 300ms,
5s, 1m, 1h 30m.

Errors are reported as one line on stderr: `error: <status>: <reason>`
when the broker refused the operation.

Exit status:
  0  success
  1  the broker answered with an error status (queue_empty, queue_full,
     function_not_found, too_large, timeout, ...), a subscription was ended
     by the broker, or the command failed otherwise
  2  usage or input error: bad arguments, invalid --data JSON, unreadable
     --file, malformed URL
  3  the broker could not be reached, refused the connection, or the
     connection was lost

Logging goes to stderr: --log-level LEVEL or RUST_LOG (default: info for
`server`, warn for the client commands).";

const EXAMPLES: &str = "\
Examples:
  tubeway server --listen tcp://0.0.0.0:33333 --listen unix:///tmp/tubeway.sock
  tubeway call echo 'hello'
  tubeway call echo --data '{\"n\": 1}' --json
  tubeway serve upper --command 'tr a-z A-Z' &
  tubeway call upper 'shout'
  tubeway queue create jobs --capacity 1000
  tubeway offer jobs 'resize image 42' --ttl 1m
  tubeway poll jobs --count 10 --wait 5s
  tubeway topic create news
  tubeway subscribe news --count 2 &
  tubeway publish news 'extra, extra'
  TUBEWAY_URL=unix:///tmp/tubeway.sock tubeway stats
  tubeway bench --quick";

const SUBSCRIBE_ABOUT: &str = "\
Subscribe to a topic and print each message as it arrives.

Stops after --count messages; without --count, runs until Ctrl-C (exit 0).
If the broker ends the subscription (the topic was removed, the broker is
shutting down) the command fails with status 1; if the connection is lost,
with status 3.";

const SERVE_ABOUT: &str = "\
Serve a function from this process, as a worker the broker forwards calls
to, until --count calls are answered, Ctrl-C or SIGTERM. Each call is
printed as it arrives (as `subscribe` prints messages; --quiet prints
nothing), and answered with one of:

  TEXT, --file PATH or --data JSON   that payload, for every call
  --echo                             the request's payload, mimetype and subject
  --command CMD                      what `sh -c CMD` prints on stdout

A command gets the request's payload on stdin, and TUBEWAY_FUNCTION,
TUBEWAY_SUBJECT, TUBEWAY_REQUEST_ID and TUBEWAY_MIMETYPE in its environment
(those the request has). Its output is answered as text/plain UTF-8 when it
is valid UTF-8, binary otherwise, or as --mimetype. A command that exits
non-zero, or is killed, answers `handler_error` with the last line of its
stderr; one still running when its call's timeout passes is killed.

The broker holds calls beyond --max-calls (for --command, 1 by default:
one command at a time) until an answer makes room, or gives them to
another worker of the same function. On --count, Ctrl-C or SIGTERM the
worker stops taking calls and answers those it has before it exits, so
no call is lost; a second Ctrl-C exits at once.";

/// The `tubeway` command line.
#[derive(Debug, Parser)]
#[command(
    name = "tubeway",
    version,
    about = "Tubeway broker and command-line client: functions, queues and topics",
    long_about = LONG_ABOUT,
    after_long_help = EXAMPLES,
    propagate_version = true
)]
pub struct Cli {
    /// Log level or filter, overriding RUST_LOG (default: info for `server`, warn otherwise).
    ///
    /// error, warn, info, debug, trace, or a RUST_LOG-style directive such
    /// as `tubeway_broker=debug,info`. Logs go to stderr.
    #[arg(long, global = true, value_name = "LEVEL", display_order = 100)]
    pub log_level: Option<String>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a broker, with the built-in functions `echo` and `ack`, until SIGINT or SIGTERM.
    #[command(long_about = "\
Run a broker until SIGINT (Ctrl-C) or SIGTERM, then shut it down gracefully:
stop accepting, let in-flight requests finish (at most 5 s), close every
connection.

As soon as each address is bound, prints `listening on URL` on stdout, one
line per address, with the real port when port 0 was asked for.

The broker serves two built-in functions: `echo`, which answers each request
with its payload (and mimetype and charset) unchanged, and `ack`, which
answers each request with an empty `ok` (the cheapest call, as measured by
`tubeway bench`).")]
    Server(ServerArgs),

    /// Call a function and print its response.
    Call(CallArgs),

    /// Create, remove, inspect and list queues.
    #[command(subcommand)]
    Queue(QueueCommand),

    /// Put a message on a queue.
    Offer(OfferArgs),

    /// Take messages from a queue and print them.
    Poll(PollArgs),

    /// Create, remove and list topics.
    #[command(subcommand)]
    Topic(TopicCommand),

    /// Inspect, list and remove functions (workers register themselves).
    #[command(subcommand)]
    Function(FunctionCommand),

    /// Serve a function from this process: answer each call with a fixed
    /// reply, the request itself, or the output of a command.
    #[command(long_about = SERVE_ABOUT)]
    Serve(ServeArgs),

    /// Publish a message to a topic.
    Publish(PublishArgs),

    /// Subscribe to a topic and print each message as it arrives.
    #[command(long_about = SUBSCRIBE_ABOUT)]
    Subscribe(SubscribeArgs),

    /// Show broker statistics: connections, messages, queues, topics, functions.
    Stats(StatsArgs),

    /// Measure throughput, latency and memory against the machine's bare limits.
    #[command(long_about = crate::bench::LONG_ABOUT, after_long_help = crate::bench::EXAMPLES)]
    Bench(crate::bench::BenchArgs),

    /// The far end of `bench`'s bare socket limits (run by `bench` itself).
    #[command(hide = true)]
    BenchPeer(crate::bench::PeerArgs),
}

/// `tubeway server`.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Address to serve: tcp://HOST:PORT (port 0 picks a free port) or
    /// unix:///path/to/socket. Repeat to serve several.
    #[arg(long = "listen", value_name = "URL", default_value = DEFAULT_URL)]
    pub listen: Vec<String>,

    /// Largest message the broker accepts or sends, from 64KiB to 1GiB.
    #[arg(long, value_name = "SIZE", default_value = "20MiB", value_parser = parse_message_size)]
    pub max_message_size: u64,

    /// Live connections allowed at once; further ones are refused with `unavailable`.
    #[arg(long, value_name = "N", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub max_connections: u64,

    // The help text names optional parts in brackets, which rustdoc would
    // take for links.
    #[allow(rustdoc::broken_intra_doc_links)]
    /// How connections wait for requests: park (sleep in the kernel; the
    /// default for sockets), spin-park[:DURATION] (poll, then sleep),
    /// spin-yield[:DURATION] or busy-spin. Any spinning strategy is latency
    /// mode: connections are served by the threads of --spin-threads, which
    /// poll instead of sleeping; that saves a wake-up (tens of microseconds)
    /// per request and keeps a core busy while a connection is active.
    #[arg(long, value_name = "STRATEGY")]
    pub wait: Option<tubeway::WaitStrategy>,

    /// Threads serving the connections that spin (shared memory, and every
    /// connection in latency mode); default half the CPUs. A connection alone
    /// on its thread spins in place; connections sharing a thread are
    /// polled in turn.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub spin_threads: Option<u64>,

    /// Memory kept, at most, from the buffers of large messages (64KiB and
    /// up) once they are done, for the next ones to be read into; 0 keeps
    /// none. A buffer unused for 5s goes back to the system.
    #[arg(long, value_name = "SIZE", default_value = "256MiB", value_parser = parse_size)]
    pub frame_pool: u64,

    /// Stop, as on SIGTERM, when stdin closes: for a parent process that
    /// must not leave its broker behind (`tubeway bench`).
    #[arg(long, hide = true)]
    pub exit_on_stdin_close: bool,
}

/// Where the broker is and how long to wait for it; taken by every client command.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Broker address: tcp://HOST:PORT or unix:///path/to/socket.
    #[arg(long, env = "TUBEWAY_URL", value_name = "URL", default_value = DEFAULT_URL)]
    pub url: String,

    /// How long to wait for the broker's answer (and at most 5 s for the connection).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_positive_duration)]
    pub timeout: Duration,

    /// Print messages and statuses as JSON, one compact object per line.
    #[arg(long)]
    pub json: bool,
}

impl ClientArgs {
    /// Connects to the broker.
    pub async fn connect(&self) -> tubeway::Result<AsyncClient> {
        AsyncClient::connect_with(&self.url, self.options()).await
    }

    /// The options of a connection of the command line's.
    pub fn options(&self) -> ClientOptions {
        ClientOptions {
            timeout: self.timeout,
            connect_timeout: self.timeout.min(Duration::from_secs(5)),
            // Accept whatever the broker may send; it announces its own limit.
            max_message_size: usize::try_from(MAX_MESSAGE_SIZE_LIMIT).unwrap_or(usize::MAX),
            name: concat!("tubeway-cli/", env!("CARGO_PKG_VERSION")).to_owned(),
            ..ClientOptions::default()
        }
    }
}

/// The payload of a message: `[TEXT] | --file PATH | --data JSON`.
#[derive(Debug, Clone, Args)]
pub struct PayloadArgs {
    /// Text payload, as text/plain UTF-8.
    #[arg(value_name = "TEXT", conflicts_with_all = ["file", "data"])]
    pub text: Option<String>,

    /// The bytes of this file as a binary payload (application/octet-stream).
    #[arg(long, value_name = "PATH", conflicts_with = "data")]
    pub file: Option<PathBuf>,

    /// Structured data: a JSON document, as application/json.
    #[arg(long, value_name = "JSON")]
    pub data: Option<String>,

    /// Mimetype of the payload, instead of the default of its form.
    #[arg(long, value_name = "MIMETYPE")]
    pub mimetype: Option<String>,
}

impl PayloadArgs {
    /// Builds a message carrying the payload (a `request`; callers set the type).
    pub fn to_message(&self) -> Result<Message, UsageError> {
        let mime = self.mimetype.as_deref();
        if let Some(text) = &self.text {
            return Ok(Message::text(
                text.as_str(),
                mime.unwrap_or(tubeway::MIME_TEXT),
                "utf-8",
            ));
        }
        if let Some(path) = &self.file {
            let bytes = std::fs::read(path)
                .map_err(|e| UsageError(format!("cannot read {}: {e}", path.display())))?;
            return Ok(Message::binary(bytes, mime));
        }
        if let Some(data) = &self.data {
            let value: serde_json::Value = serde_json::from_str(data)
                .map_err(|e| UsageError(format!("--data is not valid JSON: {e}")))?;
            let mut msg = Message::data(&value);
            if let Some(m) = mime {
                msg.payload_mimetype = Some(m.to_owned());
            }
            return Ok(msg);
        }
        if mime.is_some() {
            return Err(UsageError(
                "--mimetype needs a payload: TEXT, --file or --data".into(),
            ));
        }
        Ok(Message::request())
    }
}

/// `tubeway call`.
#[derive(Debug, Args)]
pub struct CallArgs {
    /// The function to call.
    #[arg(value_name = "FUNCTION")]
    pub function: String,

    #[command(flatten)]
    pub payload: PayloadArgs,

    /// Send without waiting for (or getting) a response.
    #[arg(long)]
    pub oneway: bool,

    /// Subject of the request.
    #[arg(long, value_name = "SUBJECT")]
    pub subject: Option<String>,

    /// Request id, echoed in the response.
    #[arg(long, value_name = "ID")]
    pub request_id: Option<String>,

    #[command(flatten)]
    pub client: ClientArgs,
}

/// `tubeway queue ...`.
#[derive(Debug, Subcommand)]
pub enum QueueCommand {
    /// Create a queue (succeeds if it exists with the same settings; `conflict` otherwise).
    Create {
        /// Queue name.
        #[arg(value_name = "NAME")]
        name: String,
        /// Most messages the queue holds.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        capacity: u64,
        /// When full, drop the oldest message to take a new one (default:
        /// a full queue makes offers wait, then fail with `queue_full`).
        #[arg(long)]
        circular: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Remove a queue and the messages it holds.
    Remove {
        /// Queue name.
        #[arg(value_name = "NAME")]
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show a queue's kind, capacity and size.
    Status {
        /// Queue name.
        #[arg(value_name = "NAME")]
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List every queue.
    List {
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// `tubeway offer`.
#[derive(Debug, Args)]
pub struct OfferArgs {
    /// The queue.
    #[arg(value_name = "QUEUE")]
    pub queue: String,

    #[command(flatten)]
    pub payload: PayloadArgs,

    /// Queue where an answer should be offered.
    #[arg(long, value_name = "QUEUE")]
    pub reply_to: Option<String>,

    /// Time to live: the message is never handed out after this.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub ttl: Option<Duration>,

    /// Subject of the message.
    #[arg(long, value_name = "SUBJECT")]
    pub subject: Option<String>,

    /// Request id of the message.
    #[arg(long, value_name = "ID")]
    pub request_id: Option<String>,

    /// How long to wait for room when a bounded queue is full, before
    /// failing with `queue_full`.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = parse_duration)]
    pub wait: Duration,

    #[command(flatten)]
    pub client: ClientArgs,
}

/// `tubeway poll`.
#[derive(Debug, Args)]
pub struct PollArgs {
    /// The queue.
    #[arg(value_name = "QUEUE")]
    pub queue: String,

    /// How many messages to take; fails with `queue_empty` if fewer arrive in time.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub count: u64,

    /// How long to wait for each message (default: --timeout).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub wait: Option<Duration>,

    #[command(flatten)]
    pub client: ClientArgs,
}

/// `tubeway topic ...`.
#[derive(Debug, Subcommand)]
pub enum TopicCommand {
    /// Create a topic (succeeds if it exists).
    Create {
        /// Topic name.
        #[arg(value_name = "NAME")]
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Remove a topic; its subscriptions end.
    Remove {
        /// Topic name.
        #[arg(value_name = "NAME")]
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List every topic.
    List {
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// `tubeway function ...`.
#[derive(Debug, Subcommand)]
pub enum FunctionCommand {
    /// Show a function: where it runs, its workers, its calls and errors,
    /// and the calls waiting at the broker for a worker with room.
    Status {
        /// Function name.
        #[arg(value_name = "NAME")]
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Remove a function: its handler inside the broker, or every
    /// worker's registration.
    Remove {
        /// Function name.
        #[arg(value_name = "NAME")]
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List every function.
    List {
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// `tubeway publish`.
#[derive(Debug, Args)]
pub struct PublishArgs {
    /// The topic.
    #[arg(value_name = "TOPIC")]
    pub topic: String,

    #[command(flatten)]
    pub payload: PayloadArgs,

    /// Subject of the message.
    #[arg(long, value_name = "SUBJECT")]
    pub subject: Option<String>,

    #[command(flatten)]
    pub client: ClientArgs,
}

/// `tubeway subscribe`.
#[derive(Debug, Args)]
pub struct SubscribeArgs {
    /// The topic.
    #[arg(value_name = "TOPIC")]
    pub topic: String,

    /// Stop after this many messages.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,

    #[command(flatten)]
    pub client: ClientArgs,
}

/// `tubeway serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The function to serve.
    #[arg(value_name = "FUNCTION")]
    pub function: String,

    #[command(flatten)]
    pub reply: PayloadArgs,

    /// Answer each call with its own payload, mimetype and subject.
    #[arg(long, conflicts_with_all = ["text", "file", "data", "command", "mimetype"])]
    pub echo: bool,

    /// Answer each call with the output of this shell command (`sh -c CMD`),
    /// given the request's payload on stdin.
    #[arg(long, value_name = "CMD", conflicts_with_all = ["text", "file", "data"])]
    pub command: Option<String>,

    /// The most calls this worker runs at once; the broker holds the rest
    /// (default: 1 with --command, no limit otherwise).
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_calls: Option<u64>,

    /// Stop after answering this many calls (and those that came meanwhile).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,

    /// Print nothing for each call.
    #[arg(long)]
    pub quiet: bool,

    #[command(flatten)]
    pub client: ClientArgs,
}

/// `tubeway stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    #[command(flatten)]
    pub client: ClientArgs,
}

/// A usage or input error: exit status 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

const SIZE_HELP: &str =
    "expected a number of bytes with an optional unit, e.g. 512KB, 20MB (powers of 1000), 64KiB, 2MiB, 1GiB (powers of 1024)";

/// Parses a size: `1048576`, `512KB`, `20MB`, `64KiB`, `2MiB`, `1.5GiB`, `5 KB`.
///
/// Units are case-insensitive; `K`, `M`, `G` alone mean KB, MB, GB.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let bad = || format!("invalid size {s:?}: {SIZE_HELP}");
    if !t.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(bad());
    }
    let size: bytesize::ByteSize = t.parse().map_err(|_| bad())?;
    // bytesize saturates on overflow instead of failing.
    if size.as_u64() == u64::MAX {
        return Err(format!("invalid size {s:?}: too large"));
    }
    Ok(size.as_u64())
}

/// Parses `--max-message-size`: a size from 64 KiB to 1 GiB.
pub fn parse_message_size(s: &str) -> Result<u64, String> {
    let n = parse_size(s)?;
    if n > MAX_MESSAGE_SIZE_LIMIT {
        return Err(format!(
            "{s} ({n} bytes) is more than the largest maximum message size, 1GiB ({MAX_MESSAGE_SIZE_LIMIT} bytes)"
        ));
    }
    if n < MIN_MESSAGE_SIZE_LIMIT {
        return Err(format!(
            "{s} ({n} bytes) is less than the smallest maximum message size, 64KiB ({MIN_MESSAGE_SIZE_LIMIT} bytes)"
        ));
    }
    Ok(n)
}

/// Parses a duration: `300ms`, `5s`, `1m`, `1h 30m`, `0`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("invalid duration \"\": expected e.g. 300ms, 5s, 1m".into());
    }
    humantime::parse_duration(t)
        .map_err(|e| format!("invalid duration {s:?}: {e}; expected e.g. 300ms, 5s, 1m"))
}

/// Parses a duration that must not be zero.
pub fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("invalid duration {s:?}: must be more than 0"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definitions_are_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("5KB"), Ok(5_000));
        assert_eq!(parse_size("5kb"), Ok(5_000));
        assert_eq!(parse_size("5KiB"), Ok(5 * 1024));
        assert_eq!(parse_size("2MiB"), Ok(2 * 1024 * 1024));
        assert_eq!(parse_size("20MB"), Ok(20_000_000));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1.5MiB"), Ok(1_572_864));
        assert_eq!(parse_size("5 KB"), Ok(5_000));
        assert_eq!(parse_size(" 64KiB "), Ok(65_536));
        assert_eq!(parse_size("1048576"), Ok(1_048_576));
        assert_eq!(parse_size("0"), Ok(0));
    }

    #[test]
    fn bad_sizes() {
        for bad in [
            "",
            " ",
            "KB",
            "-5KB",
            "5XB",
            "5 K B",
            "five",
            "1e3",
            "99999999999999999999",
            "20000000EiB",
        ] {
            let err = parse_size(bad).expect_err(bad);
            assert!(err.starts_with("invalid size"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn message_sizes() {
        assert_eq!(parse_message_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_message_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_message_size("64KiB"), Ok(64 << 10));
        let err = parse_message_size("2GiB").unwrap_err();
        assert!(err.contains("more than"), "{err}");
        assert!(parse_message_size("1025MiB").is_err());
        assert!(parse_message_size("1KB").unwrap_err().contains("less than"));
        assert!(parse_message_size("lots").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_positive_duration("2s"), Ok(Duration::from_secs(2)));
    }

    #[test]
    fn bad_durations() {
        for bad in ["", "5", "five", "5 parsecs", "-1s", "1.5.3s"] {
            let err = parse_duration(bad).expect_err(bad);
            assert!(err.starts_with("invalid duration"), "{bad:?}: {err}");
        }
        assert!(parse_positive_duration("0s")
            .unwrap_err()
            .contains("more than 0"));
    }

    #[test]
    fn payloads() {
        let p = |text: Option<&str>, data: Option<&str>, mime: Option<&str>| PayloadArgs {
            text: text.map(str::to_owned),
            file: None,
            data: data.map(str::to_owned),
            mimetype: mime.map(str::to_owned),
        };
        let m = p(Some("hi"), None, None).to_message().unwrap();
        assert_eq!(m.text_payload().unwrap(), "hi");
        assert_eq!(m.payload_mimetype.as_deref(), Some("text/plain"));
        let m = p(None, Some(r#"{"a":[1,2]}"#), None).to_message().unwrap();
        assert_eq!(m.data_payload().unwrap(), serde_json::json!({"a": [1, 2]}));
        let m = p(None, Some("1"), Some("application/x+json"))
            .to_message()
            .unwrap();
        assert_eq!(m.payload_mimetype.as_deref(), Some("application/x+json"));
        let err = p(None, Some("{nope"), None).to_message().unwrap_err();
        assert!(err.0.contains("not valid JSON"), "{err}");
        assert!(p(None, None, Some("text/x")).to_message().is_err());
        assert!(p(None, None, None).to_message().unwrap().payload.is_empty());
        let missing = PayloadArgs {
            text: None,
            file: Some("/nonexistent/tubeway-test-file".into()),
            data: None,
            mimetype: None,
        };
        assert!(missing.to_message().unwrap_err().0.contains("cannot read"));
    }

    #[test]
    fn parses_a_command_line() {
        let cli = Cli::try_parse_from([
            "tubeway",
            "offer",
            "q",
            "hello",
            "--ttl",
            "5s",
            "--url",
            "unix:///tmp/x.sock",
            "--json",
        ])
        .unwrap();
        let Command::Offer(o) = cli.command else {
            panic!("not offer")
        };
        assert_eq!(o.ttl, Some(Duration::from_secs(5)));
        assert_eq!(o.client.url, "unix:///tmp/x.sock");
        assert!(o.client.json);
        assert!(Cli::try_parse_from(["tubeway", "call", "f", "x", "--data", "1"]).is_err());
        assert!(Cli::try_parse_from(["tubeway", "server", "--max-message-size", "2GiB"]).is_err());
    }
}
