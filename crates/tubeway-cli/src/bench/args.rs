//! `tubeway bench` options, and the settings they resolve to.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::modes::{self, Mode};
use super::transport::{parse_transport, Transport};
use super::wait::{parse_wait, Wait};
use crate::cli::{parse_duration, parse_positive_duration, parse_size, UsageError};

/// Payload sizes of the size sweep when none are given.
pub const DEFAULT_PAYLOADS: [u64; 7] = [
    64,
    5_000,
    50_000,
    500_000,
    5_000_000,
    50_000_000,
    200_000_000,
];
/// Connection counts of the connection sweep when none are given.
pub const DEFAULT_CONNECTIONS: [u64; 6] = [1, 2, 3, 4, 10, 100];
/// Requests in flight per connection of the in-flight sweep.
pub const DEFAULT_IN_FLIGHT: [u64; 3] = [1, 16, 256];
/// The largest payload the bench sends: the broker's largest message size
/// less room for the header.
pub const MAX_PAYLOAD: u64 = crate::cli::MAX_MESSAGE_SIZE_LIMIT - 64 * 1024;

/// `tubeway bench --help`: what the command measures.
pub const LONG_ABOUT: &str = "\
Measure Tubeway against the limits of the machine, in one run.

For each transport and mode: throughput by payload size on one connection,
by connection count and by requests in flight per connection; round-trip
latency with one message in flight; latency at a fixed offered rate (measured
from each message's intended send time, so a stalled sender cannot hide
queueing: no coordinated omission); peak resident memory of the bench and the
broker; the broker's memory idle and per idle connection.

Beside each figure stand the bare limits measured in the same runs, and
the ratio to each (the median of the runs' ratios): a std socket ping-pong
moving the same bytes between two processes, bare socket streaming (for
messages over 1 MiB also through buffers of the message's size), memcpy
bandwidth; with shared memory, a cache-line ping-pong and a ping-pong with
a small payload between two processes. Their buffers from 4 MiB up are in huge pages, as the
transport's are.

One operation in flight is measured with the blocking tubeway::Client (it
drives its connection from the calling thread); anything pipelined with the
AsyncClient. The report names the client of each figure, and its method line
the workers of the runtime the AsyncClient runs on (one per CPU, or
TOKIO_WORKER_THREADS).

Every figure is warmed up, then measured --runs times; the report shows the
median with the min-max across runs, because a shared machine is noisy.
The points of a sweep (--connections, --in-flight) are measured in turn
within each run, each on connections of its own, and every point after the
first stands beside its ratio to the first: --connections 4,100 gives 100
connections against 4, taken run by run.

The broker under test is a `tubeway server` child process (mem: inside this
process), or the one at --url. --wait STRATEGY applies a wait strategy to
every side (clients, broker, channels, the bare ping-pong); a list such as
--wait default,busy-spin measures each in turn and relates the round trips
of latency mode to the default ones.

Modes:
  call     a function call through the broker; the built-in `ack` answers an empty ok
  call-blocking
           the same, to the built-in `ack-blocking`, which the broker runs as a
           function that may block (on one of its handler threads)
  echo     a function call; the built-in `echo` sends the payload back
  worker   a function call the broker forwards to a worker connection of this
           process (one per connection), whose async handler answers an empty ok
  worker-sync
           the same, the worker's handler synchronous (run on a handler thread)
  oneway   a oneway call to `ack`: no response; counted once the broker has read it
  queue    an offer, then a poll of that queue by another connection
  publish  a publish to a topic with --subscribers subscribers on their own
           connections; every delivery and every drop is counted
  channel  a raw point-to-point channel, no broker: the payload to a peer
           process and back; also over fifo (named pipes)";

/// `tubeway bench --help`: examples.
pub const EXAMPLES: &str = "\
Examples:
  tubeway bench                                   # the full suite: a few minutes
  tubeway bench --quick                           # a few seconds
  tubeway bench --transport tcp --mode call,echo --payload 64B,5KB,5MB
  tubeway bench --mode publish --subscribers 4 --figures size,round-trip
  tubeway bench --mode channel --transport shm,unix,fifo --wait busy-spin
  tubeway bench --transport unix,tcp --figures round-trip --wait default,busy-spin
  tubeway bench --rate 50000 --latency-duration 1m --figures rate
  tubeway bench --url unix:///tmp/tubeway.sock --json > bench.json
  tubeway bench --plot bench.svg";

/// The client of the figures with one operation in flight on one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LoneClient {
    /// `tubeway::Client`, driving its connection from the calling thread.
    Blocking,
    /// A task of `tubeway::AsyncClient` on the bench's runtime.
    Async,
}

/// A group of figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Group {
    /// Throughput by payload size, one connection, one request in flight.
    Size,
    /// Throughput by connection count, one request in flight each.
    Connections,
    /// Throughput by requests in flight on one connection.
    InFlight,
    /// Round-trip latency, one request in flight.
    RoundTrip,
    /// Latency at a fixed offered rate.
    Rate,
    /// The broker's memory idle and per idle connection.
    Memory,
}

/// `tubeway bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Transports to measure, a comma list (default: every one of this build).
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_transport,
          conflicts_with = "url")]
    pub transport: Vec<Transport>,

    /// Modes to measure, a comma list of call, echo, oneway, queue, publish,
    /// channel, or `all`.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "call"
    )]
    pub mode: Vec<String>,

    /// Figures to measure, a comma list (default: all).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub figures: Vec<Group>,

    /// Payload sizes of the size sweep, a comma list like 64B,5KB,2MiB
    /// (default 64B,5KB,50KB,500KB,5MB,50MB,200MB).
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_size)]
    pub payload: Vec<u64>,

    /// Connection counts of the connection sweep (default 1,2,3,4,10,100).
    #[arg(long, value_name = "LIST", value_delimiter = ',',
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub connections: Vec<u64>,

    /// Requests in flight per connection of the in-flight sweep (default 1,16,256).
    #[arg(long, value_name = "LIST", value_delimiter = ',',
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub in_flight: Vec<u64>,

    /// Payload of the connection and in-flight sweeps.
    #[arg(long, value_name = "SIZE", default_value = "5KB", value_parser = parse_size)]
    pub sweep_payload: u64,

    /// Offered rate of the latency figure, in messages per second (default 100000).
    #[arg(long, value_name = "MSG/S",
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub rate: Option<u64>,

    /// Payload of the latency figures.
    #[arg(long, value_name = "SIZE", default_value = "64B", value_parser = parse_size)]
    pub latency_payload: u64,

    /// How long the fixed-rate latency figure runs (default 30s).
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    pub latency_duration: Option<Duration>,

    /// Measuring time of each run of each figure (default 500ms).
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    pub duration: Option<Duration>,

    /// Warm-up before each figure, not measured (default 300ms).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub warmup: Option<Duration>,

    /// Runs of each figure; the report shows the median and the min-max (default 3).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100))]
    pub runs: Option<u64>,

    /// Subscribers of the publish mode, each on its own connection.
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub subscribers: u64,

    /// Idle connections of the memory figure (default 200).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub idle_connections: Option<u64>,

    // The help text names optional parts in brackets, which rustdoc would
    // take for links.
    #[allow(rustdoc::broken_intra_doc_links)]
    /// How every side waits, a comma list measured in turn: default (each
    /// transport's own), park, busy-spin, spin-yield[:D], spin-park[:D].
    /// Spinning strategies are latency mode.
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_wait)]
    pub wait: Vec<Wait>,

    /// Bench the broker already running at this URL instead of starting one.
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,

    /// A run of a few seconds: short runs, fewer sizes and counts, a low rate.
    /// Options given explicitly still apply.
    #[arg(long)]
    pub quick: bool,

    /// Run everything (bench, broker, peers) on CPU 0, under `taskset -c 0`:
    /// no cross-CPU wake-ups, so figures measure CPU cost and vary far less
    /// between runs on a small or busy machine.
    #[arg(long)]
    pub one_cpu: bool,

    /// Run the bench on CPU 0 and every child process (broker, peers) on
    /// CPU 1, under `taskset`: each figure and its bare limits cross between
    /// the same two CPUs, as a client and a broker on separate cores do,
    /// instead of wherever the scheduler puts them (which may be one CPU for a
    /// bare ping-pong and two for a call). Needs two CPUs.
    #[arg(long, conflicts_with = "one_cpu")]
    pub split_cpus: bool,

    /// The client of the figures with one operation in flight on one
    /// connection (the size sweep, the round trip, the first figure of each
    /// sweep). Pipelined figures always use the AsyncClient.
    #[arg(long, value_name = "CLIENT", value_enum, default_value_t = LoneClient::Blocking)]
    pub client: LoneClient,

    /// Print one JSON document instead of the table (no progress line).
    #[arg(long)]
    pub json: bool,

    /// Also draw throughput against payload size and the latency percentile
    /// curves to this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// The hidden `tubeway bench-peer`: the far end of the bare limits, or of
/// the channels of `--mode channel`.
#[derive(Debug, Args)]
pub struct PeerArgs {
    /// Where to listen: tcp://127.0.0.1:0 or unix:///path (with --channel,
    /// any channel address).
    #[arg(long, value_name = "URL")]
    pub listen: String,

    /// Echo every message of every channel accepted, instead of serving
    /// the bare limits.
    #[arg(long)]
    pub channel: bool,

    /// How the channel ends wait (default: the transport's).
    #[arg(long, value_name = "STRATEGY")]
    pub wait: Option<tubeway::WaitStrategy>,

    /// The largest message a channel end accepts.
    #[arg(long, value_name = "BYTES", default_value_t = tubeway::channel::DEFAULT_MAX_MESSAGE)]
    pub max_message_size: usize,
}

/// Everything a bench run needs, defaults resolved.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Transports, in report order.
    pub transports: Vec<Transport>,
    /// Ways of waiting, one pass each, in order.
    pub waits: Vec<Wait>,
    /// Modes, in report order.
    pub modes: Vec<&'static dyn Mode>,
    /// Figure groups to measure.
    pub groups: Vec<Group>,
    /// Size sweep.
    pub payloads: Vec<usize>,
    /// Connection sweep.
    pub connections: Vec<usize>,
    /// In-flight sweep.
    pub in_flight: Vec<usize>,
    /// Payload of the connection and in-flight sweeps.
    pub sweep_payload: usize,
    /// Offered rate, msg/s.
    pub rate: u64,
    /// Payload of the latency figures.
    pub latency_payload: usize,
    /// Length of the fixed-rate run.
    pub latency_duration: Duration,
    /// Measuring time of each run.
    pub duration: Duration,
    /// Warm-up of each figure.
    pub warmup: Duration,
    /// Runs of each figure.
    pub runs: usize,
    /// Subscribers in publish mode.
    pub subscribers: usize,
    /// Idle connections of the memory figure.
    pub idle_connections: usize,
    /// A running broker to bench.
    pub url: Option<String>,
    /// Whether `--quick` chose the defaults.
    pub quick: bool,
    /// The client of one operation in flight on one connection.
    pub lone_client: LoneClient,
}

impl Settings {
    /// Resolves `args`, or explains in one line what is wrong with them.
    pub fn resolve(args: &BenchArgs) -> Result<Settings, UsageError> {
        let quick = args.quick;
        let modes = modes::parse_list(&args.mode)?;
        let channel = modes.iter().any(|m| !m.needs_broker());
        let transports = match &args.url {
            Some(_) if channel => return Err(UsageError(
                "--mode channel measures channels to a peer the bench starts; it takes no --url"
                    .into(),
            )),
            Some(url) => {
                let t = Transport::of_url(url)
                    .filter(|t| t.is_available())
                    .ok_or_else(|| UsageError(format!("bad --url {url:?}: unknown transport")))?;
                if t.in_process() {
                    return Err(UsageError(format!(
                        "bad --url {url:?}: a mem:// broker is reachable only inside its own process"
                    )));
                }
                vec![t]
            }
            None if args.transport.is_empty() => Transport::available()
                .into_iter()
                .filter(|t| t.brokered() || channel)
                .collect(),
            None => dedup(args.transport.clone()),
        };
        if let Some(t) = transports.iter().find(|t| !t.brokered() && !channel) {
            return Err(UsageError(format!(
                "{t} carries channels only: measure it with --mode channel"
            )));
        }
        let payloads = pick(
            &args.payload,
            &DEFAULT_PAYLOADS,
            &[64, 5_000, 50_000],
            quick,
        );
        let payloads: Vec<usize> = dedup(payloads)
            .into_iter()
            .map(|p| payload_size("--payload", p))
            .collect::<Result<_, _>>()?;
        let connections = pick(&args.connections, &DEFAULT_CONNECTIONS, &[1, 4], quick);
        let in_flight = pick(&args.in_flight, &DEFAULT_IN_FLIGHT, &[1, 16], quick);
        let groups = if args.figures.is_empty() {
            vec![
                Group::Size,
                Group::Connections,
                Group::InFlight,
                Group::RoundTrip,
                Group::Rate,
                Group::Memory,
            ]
        } else {
            dedup(args.figures.clone())
        };
        let or = |given: Option<Duration>, full: Duration, short: Duration| {
            given.unwrap_or(if quick { short } else { full })
        };
        Ok(Settings {
            transports,
            waits: if args.wait.is_empty() {
                vec![Wait::DEFAULT]
            } else {
                dedup(args.wait.clone())
            },
            modes,
            groups,
            payloads,
            connections: counts(&connections),
            in_flight: counts(&in_flight),
            sweep_payload: payload_size("--sweep-payload", args.sweep_payload)?,
            rate: args.rate.unwrap_or(if quick { 5_000 } else { 100_000 }),
            latency_payload: payload_size("--latency-payload", args.latency_payload)?,
            latency_duration: or(
                args.latency_duration,
                Duration::from_secs(30),
                Duration::from_millis(500),
            ),
            duration: or(
                args.duration,
                Duration::from_millis(500),
                Duration::from_millis(150),
            ),
            warmup: or(
                args.warmup,
                Duration::from_millis(300),
                Duration::from_millis(50),
            ),
            runs: usize::try_from(args.runs.unwrap_or(if quick { 1 } else { 3 })).unwrap_or(1),
            subscribers: usize::try_from(args.subscribers).unwrap_or(1),
            idle_connections: usize::try_from(args.idle_connections.unwrap_or(if quick {
                20
            } else {
                200
            }))
            .unwrap_or(1),
            url: args.url.clone(),
            quick,
            lone_client: args.client,
        })
    }

    /// Whether `group` is to be measured.
    pub fn wants(&self, group: Group) -> bool {
        self.groups.contains(&group)
    }

    /// The largest payload any figure sends.
    pub fn largest_payload(&self) -> usize {
        self.payloads
            .iter()
            .copied()
            .chain([self.sweep_payload, self.latency_payload])
            .max()
            .unwrap_or(0)
    }
}

/// The given list, else the default (full or `--quick`).
fn pick(given: &[u64], full: &[u64], short: &[u64], quick: bool) -> Vec<u64> {
    match (given.is_empty(), quick) {
        (false, _) => given.to_vec(),
        (true, false) => full.to_vec(),
        (true, true) => short.to_vec(),
    }
}

fn counts(list: &[u64]) -> Vec<usize> {
    dedup(list.to_vec())
        .into_iter()
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
        .collect()
}

fn payload_size(option: &str, n: u64) -> Result<usize, UsageError> {
    if n > MAX_PAYLOAD {
        return Err(UsageError(format!(
            "{option} {n} bytes is more than the largest payload a broker takes ({MAX_PAYLOAD} bytes)"
        )));
    }
    usize::try_from(n).map_err(|_| UsageError(format!("{option} {n} bytes is too large here")))
}

/// `list` without repeats, first occurrence kept.
fn dedup<T: PartialEq>(list: Vec<T>) -> Vec<T> {
    let mut out = Vec::with_capacity(list.len());
    for x in list {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn settings(args: &[&str]) -> Result<Settings, String> {
        let cli = Cli::try_parse_from(["tubeway", "bench"].iter().chain(args))
            .map_err(|e| e.to_string())?;
        let Command::Bench(b) = cli.command else {
            panic!("not bench")
        };
        Settings::resolve(&b).map_err(|e| e.0)
    }

    #[test]
    fn defaults_are_the_full_suite() {
        let s = settings(&[]).unwrap();
        assert_eq!(
            s.payloads,
            DEFAULT_PAYLOADS.map(|p| usize::try_from(p).unwrap())
        );
        assert_eq!(s.connections, counts(&DEFAULT_CONNECTIONS));
        assert_eq!(s.in_flight, counts(&DEFAULT_IN_FLIGHT));
        assert_eq!(s.rate, 100_000);
        assert_eq!(s.latency_payload, 64);
        assert_eq!(s.sweep_payload, 5_000);
        assert_eq!(s.latency_duration, Duration::from_secs(30));
        assert_eq!(s.runs, 3);
        assert_eq!(s.duration, Duration::from_millis(500));
        let brokered: Vec<Transport> = Transport::available()
            .into_iter()
            .filter(|t| t.brokered())
            .collect();
        assert_eq!(s.transports, brokered);
        assert_eq!(s.modes.len(), 1);
        assert_eq!(s.modes[0].name(), "call");
        assert_eq!(s.largest_payload(), 200_000_000);
        assert_eq!(s.waits, [Wait::DEFAULT]);
        // fifo carries channels only: not in the default list of a broker mode.
        assert!(!s.transports.contains(&Transport::Fifo));
        let c = settings(&["--mode", "channel", "--wait", "default,busy-spin"]).unwrap();
        assert!(c.transports.contains(&Transport::Fifo));
        assert_eq!(c.waits.len(), 2);
        assert!(c.waits[1].spins());
    }

    #[test]
    fn quick_shortens_what_is_not_given() {
        let s = settings(&["--quick", "--runs", "2", "--payload", "1KiB,5KB,1KiB"]).unwrap();
        assert_eq!(s.runs, 2);
        assert_eq!(s.payloads, [1024, 5000]);
        assert_eq!(s.connections, [1, 4]);
        assert!(s.duration < Duration::from_millis(500));
    }

    #[test]
    fn lists_reuse_the_size_and_duration_parsers() {
        let s = settings(&[
            "--transport",
            "tcp,unix",
            "--mode",
            "all",
            "--duration",
            "300ms",
            "--payload",
            "5KB,2MiB",
            "--figures",
            "size,in-flight",
        ])
        .unwrap();
        assert_eq!(s.transports, [Transport::Tcp, Transport::Unix]);
        assert_eq!(s.payloads, [5_000, 2 * 1024 * 1024]);
        assert_eq!(s.duration, Duration::from_millis(300));
        assert!(s.modes.len() >= 5);
        assert!(s.wants(Group::InFlight) && !s.wants(Group::Rate));
    }

    #[test]
    fn bad_options_are_one_line_errors() {
        for (args, expect) in [
            (&["--payload", "5XB"][..], "invalid size"),
            (&["--transport", "udp"], "unknown transport"),
            (&["--mode", "carrier-pigeon"], "unknown mode"),
            (&["--duration", "0s"], "more than 0"),
            (&["--runs", "0"], "0"),
            (&["--payload", "2GiB"], "largest payload"),
            (&["--url", "udp://x:1"], "unknown transport"),
            (&["--url", "mem://x"], "only inside"),
            (
                &["--url", "tcp://h:1", "--transport", "tcp"],
                "cannot be used",
            ),
            (&["--transport", "fifo"], "channels only"),
            (&["--mode", "channel", "--url", "tcp://h:1"], "no --url"),
            (&["--wait", "nap"], "bad wait strategy"),
        ] {
            let err = settings(args).expect_err(expect);
            assert!(err.contains(expect), "{args:?}: {err}");
        }
    }
}
