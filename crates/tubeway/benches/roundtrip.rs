//! Round trips through the broker, against the bare socket limit.
//!
//! ```text
//! cargo bench -p tubeway --bench roundtrip [-- --duration 3 --runs 3]
//! ```
//!
//! Not a timed test but a program that prints a table. For tcp:// and
//! unix:// it measures, in one run:
//!
//! - a 5 KiB request answered by an empty `ok` from the function `ack`, one
//!   request in flight, with the blocking `Client` (the headline) and with
//!   `AsyncClient`;
//! - the bare limit: a std socket ping-pong moving the same bytes per round
//!   trip (the encoded request frame one way, the encoded ack frame back);
//! - 16 requests in flight on one `AsyncClient` connection;
//! - the broker's memory: its RSS idle and per idle connection.
//!
//! The broker for the round trips runs in this process on a runtime of its
//! own (`tubeway::Server`, 2 worker threads). Each figure is warmed up, then
//! measured `--runs` times for `--duration` seconds, bare and tubeway runs
//! interleaved so that noise hits both; the table shows medians.
//!
//! One request in flight is latency-bound: on a small VM, where a thread
//! woken on an idle CPU waits for that CPU to wake up, the figures depend on
//! where the scheduler puts the threads and vary a lot between runs.
//! `--one-cpu` pins the whole program to one CPU, which measures the CPU
//! cost of a round trip instead and is far more repeatable. `--help` lists
//! the options.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::cast_precision_loss
)]

use std::hint::black_box;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::runtime::Runtime;
use tubeway::{AsyncClient, BrokerConfig, Client, Message, MessageType, Server};

/// The request payload.
const REQUEST_PAYLOAD: usize = 5 * 1024;
/// Targets.
const TARGET_BARE_RATIO: f64 = 0.70;
const TARGET_PIPELINE_RATIO: f64 = 3.0;

/// The figures measured on each transport, in this order.
const FIGURES: [&str; 4] = ["bare", "blocking", "async", "pipelined"];

const USAGE: &str = "\
usage: cargo bench -p tubeway --bench roundtrip -- [options]
  --duration SECS     measuring time of each figure in each run (default 3)
  --runs N            runs; the table shows the median (default 3)
  --warmup SECS       warm-up of each figure before the first run (default 1)
  --in-flight N       requests in flight for the pipelined figure (default 16)
  --connections N     idle connections for the memory figure (default 200)
  --server-bin PATH   broker binary for the memory figure
                      (default: target/release/tubeway if it exists)
  --only LIST         figures to measure, of bare,blocking,async,pipelined
                      (default: all); prints the round trips done, for profiling
  --transport T       tcp or unix (default: both)
  --no-memory         skip the memory figure
  --one-cpu           run everything on CPU 0 (re-executes under `taskset -c 0`):
                      no cross-CPU wake-ups, so it measures CPU cost per round
                      trip and varies far less between runs";

#[derive(Debug)]
struct Args {
    duration: Duration,
    runs: usize,
    warmup: Duration,
    in_flight: usize,
    connections: usize,
    server_bin: Option<PathBuf>,
    only: Option<Vec<String>>,
    transport: Option<String>,
    memory: bool,
    one_cpu: bool,
    /// What the user passed, to print the command back.
    given: Vec<String>,
}

fn parse_args() -> Args {
    let mut a = Args {
        duration: Duration::from_secs(3),
        runs: 3,
        warmup: Duration::from_secs(1),
        in_flight: 16,
        connections: 200,
        server_bin: None,
        only: None,
        transport: None,
        memory: true,
        one_cpu: false,
        given: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    let secs = |v: Option<String>, name: &str| -> Duration {
        let s: f64 = v
            .and_then(|v| v.parse().ok())
            .filter(|s: &f64| s.is_finite() && *s > 0.0)
            .unwrap_or_else(|| fail(&format!("{name} takes a number of seconds > 0")));
        Duration::from_secs_f64(s)
    };
    let count = |v: Option<String>, name: &str| -> usize {
        v.and_then(|v| v.parse().ok())
            .filter(|n| *n > 0)
            .unwrap_or_else(|| fail(&format!("{name} takes a whole number > 0")))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            // Cargo passes --bench to every bench target.
            "--bench" => continue,
            "--duration" => a.duration = secs(it.next(), "--duration"),
            "--runs" => a.runs = count(it.next(), "--runs"),
            "--warmup" => a.warmup = secs(it.next(), "--warmup"),
            "--in-flight" => a.in_flight = count(it.next(), "--in-flight"),
            "--connections" => a.connections = count(it.next(), "--connections"),
            "--server-bin" => {
                a.server_bin = Some(
                    it.next()
                        .map(PathBuf::from)
                        .unwrap_or_else(|| fail("--server-bin takes a path")),
                );
            }
            "--only" => {
                let list: Vec<String> = it
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .map(str::to_owned)
                    .collect();
                if list.iter().any(|f| !FIGURES.contains(&f.as_str())) {
                    fail(&format!("--only takes figures of {}", FIGURES.join(",")));
                }
                a.only = Some(list);
            }
            "--transport" => match it.next().as_deref() {
                Some(t @ ("tcp" | "unix")) => a.transport = Some(t.to_owned()),
                _ => fail("--transport takes tcp or unix"),
            },
            "--no-memory" => a.memory = false,
            "--one-cpu" => a.one_cpu = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => fail(&format!("unknown argument {other:?}")),
        }
    }
    a.given = std::env::args()
        .skip(1)
        .filter(|x| x != "--bench" && x != CHILD_FLAG)
        .collect();
    a
}

fn fail(msg: &str) -> ! {
    eprintln!("roundtrip: {msg}\n{USAGE}");
    std::process::exit(2)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(*x), hi.max(*x))
        })
}

/// Round trips completed, and the time they took.
#[derive(Clone, Copy, Debug)]
struct Count {
    n: u64,
    secs: f64,
}

impl Count {
    fn rate(self) -> f64 {
        self.n as f64 / self.secs
    }
}

/// Calls `one` repeatedly for `d`.
fn repeat(d: Duration, mut one: impl FnMut()) -> Count {
    let start = Instant::now();
    let mut n = 0u64;
    loop {
        one();
        n += 1;
        let t = start.elapsed();
        if t >= d {
            return Count {
                n,
                secs: t.as_secs_f64(),
            };
        }
    }
}

// ----- the bare limit -----

/// A std socket ping-pong: the client writes `req` bytes and reads `ack`
/// bytes; a server thread does the opposite.
struct Bare<S: Read + Write> {
    stream: S,
    req: Vec<u8>,
    ack: Vec<u8>,
}

impl<S: Read + Write> Bare<S> {
    fn one(&mut self) {
        self.stream.write_all(black_box(&self.req)).unwrap();
        self.stream.read_exact(&mut self.ack).unwrap();
        black_box(&self.ack);
    }
}

fn bare_server<S: Read + Write>(mut s: S, req_len: usize, ack_len: usize) {
    let mut req = vec![0u8; req_len];
    let ack = vec![0x41u8; ack_len];
    while s.read_exact(&mut req).is_ok() {
        black_box(&req);
        if s.write_all(&ack).is_err() {
            return;
        }
    }
}

fn bare_tcp(req_len: usize, ack_len: usize) -> Bare<TcpStream> {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::Builder::new()
        .name("bare-tcp".into())
        .spawn(move || {
            let (s, _) = l.accept().unwrap();
            s.set_nodelay(true).unwrap();
            bare_server(s, req_len, ack_len);
        })
        .unwrap();
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_nodelay(true).unwrap();
    Bare {
        stream,
        req: vec![0x5a; req_len],
        ack: vec![0; ack_len],
    }
}

fn bare_unix(path: &Path, req_len: usize, ack_len: usize) -> Bare<UnixStream> {
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path).unwrap();
    std::thread::Builder::new()
        .name("bare-unix".into())
        .spawn(move || {
            let (s, _) = l.accept().unwrap();
            bare_server(s, req_len, ack_len);
        })
        .unwrap();
    let stream = UnixStream::connect(path).unwrap();
    Bare {
        stream,
        req: vec![0x5a; req_len],
        ack: vec![0; ack_len],
    }
}

// ----- tubeway -----

fn request(payload: &Bytes) -> Message {
    Message::binary(payload.clone(), None)
}

/// `n` tasks on `rt`, each sending requests one after the other on `client`
/// until `d` is over; all tasks together.
fn async_repeat(
    rt: &Runtime,
    client: &AsyncClient,
    payload: &Bytes,
    n: usize,
    d: Duration,
) -> Count {
    rt.block_on(async {
        let start = Instant::now();
        let deadline = start + d;
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let client = client.clone();
                let payload = payload.clone();
                tokio::spawn(async move {
                    let mut done = 0u64;
                    while Instant::now() < deadline {
                        let r = client.send("ack", request(&payload)).await.unwrap();
                        black_box(r);
                        done += 1;
                    }
                    done
                })
            })
            .collect();
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        Count {
            n: total,
            secs: start.elapsed().as_secs_f64(),
        }
    })
}

/// Sizes of the frames one round trip moves, as the broker encodes them.
fn frame_sizes(payload: &Bytes) -> (usize, usize) {
    // What `Client::send` puts on the wire: type, destination and timeout set.
    let req = request(payload)
        .with_type(MessageType::Request)
        .with_destination("ack")
        .with_timeout(Duration::from_secs(30));
    let ack = req.response(tubeway::ResponseStatus::Ok);
    let len = |m: &Message| tubeway_proto::codec::encode(m, usize::MAX).unwrap().len();
    (len(&req), len(&ack))
}

// ----- memory -----

const CHILD_FLAG: &str = "--child-broker";

/// Child mode: an embedded broker on a tcp port, until stdin closes.
fn child_broker() {
    let server = Server::start(BrokerConfig::default(), &["tcp://127.0.0.1:0"]).unwrap();
    println!("listening on {}", server.url());
    std::io::stdout().flush().unwrap();
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    server.shutdown();
}

fn kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

struct Memory {
    how: String,
    idle_kib: u64,
    one_conn_kib: u64,
    loaded_kib: u64,
    per_conn_kib: f64,
    connections: usize,
}

/// The workspace root.
fn workspace() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// `p` relative to the workspace when it is inside it.
fn shown(p: &Path) -> String {
    let p = p.canonicalize().unwrap_or_else(|_| p.to_owned());
    p.strip_prefix(workspace())
        .unwrap_or(&p)
        .display()
        .to_string()
}

fn default_server_bin() -> Option<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace().join("target"), PathBuf::from);
    let p = target.join("release/tubeway");
    p.is_file().then_some(p)
}

/// Starts the broker as a child process and returns it with its URL.
fn spawn_broker(bin: Option<&Path>) -> (Child, String, String) {
    let (mut cmd, how) = match bin {
        Some(bin) => {
            let mut c = Command::new(bin);
            c.args(["server", "--listen", "tcp://127.0.0.1:0"]);
            (c, format!("child process `{} server`", shown(bin)))
        }
        None => {
            let mut c = Command::new(std::env::current_exe().unwrap());
            c.arg(CHILD_FLAG);
            (
                c,
                "child process: this bench re-executed as an embedded \
                 tubeway::Server (CLI binary not built)"
                    .to_owned(),
            )
        }
    };
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The URL may be announced on stdout or stderr; read both.
    let (tx, rx) = mpsc::channel::<String>();
    for out in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                let _ = tx.send(line);
            }
        });
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the broker ({how}) never said where it listens");
        };
        if let Some(url) = line
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
        {
            return (child, url.to_owned(), how);
        }
    }
}

fn measure_memory(rt: &Runtime, bin: Option<&Path>, connections: usize) -> Memory {
    let (mut child, url, how) = spawn_broker(bin);
    let pid = child.id();
    let idle_kib = kib(pid, "VmRSS");
    let result = rt.block_on(async {
        let first = AsyncClient::connect(&url).await.unwrap();
        first.ping().await.unwrap();
        let one_conn_kib = kib(pid, "VmRSS");
        let mut idle = Vec::with_capacity(connections);
        for _ in 0..connections {
            let c = AsyncClient::connect(&url).await.unwrap();
            idle.push(c);
        }
        // Every handshake is done; the broker sees them all.
        let stats = first.stats().await.unwrap();
        assert_eq!(stats.connections, connections as u64 + 1);
        first.ping().await.unwrap();
        let loaded_kib = kib(pid, "VmRSS");
        for c in &idle {
            c.close().await;
        }
        Memory {
            how,
            idle_kib,
            one_conn_kib,
            loaded_kib,
            per_conn_kib: loaded_kib.saturating_sub(one_conn_kib) as f64 / connections as f64,
            connections,
        }
    });
    drop(child.stdin.take());
    // Our own child: a bounded wait for a clean exit, then a kill.
    let deadline = Instant::now() + Duration::from_secs(5);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.wait();
    result
}

// ----- the report -----

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// CPUs of the machine (`nproc` without any affinity mask, as --one-cpu sets).
fn cpu_count() -> usize {
    std::fs::read_to_string("/proc/cpuinfo")
        .map(|s| s.lines().filter(|l| l.starts_with("processor")).count())
        .ok()
        .filter(|n| *n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(0, usize::from))
}

/// The 1-minute load average: other work competing for the CPUs.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// One figure: measures for the given time.
type Figure<'a> = Box<dyn FnMut(Duration) -> Count + 'a>;

struct Row {
    transport: &'static str,
    case: String,
    runs: Vec<f64>,
    /// (ratio, baseline name, target), if compared.
    compare: Option<(f64, &'static str, Option<f64>)>,
}

fn thousands(x: f64) -> String {
    let s = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn print_table(rows: &[Row]) {
    let header = [
        "transport",
        "case",
        "msg/s (median)",
        "min-max across runs",
        "ratio",
        "vs",
        "target",
        "result",
    ];
    let cells: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            let (lo, hi) = min_max(&r.runs);
            let (ratio, vs, target, result) = match r.compare {
                Some((x, vs, Some(t))) => (
                    format!("{x:.2}x"),
                    vs.to_owned(),
                    format!(">= {t:.2}x"),
                    if x >= t { "PASS" } else { "MISS" }.to_owned(),
                ),
                Some((x, vs, None)) => (format!("{x:.2}x"), vs.to_owned(), "-".into(), "-".into()),
                None => ("-".into(), "-".into(), "-".into(), "-".into()),
            };
            [
                r.transport.to_owned(),
                r.case.clone(),
                thousands(median(&r.runs)),
                format!("{}-{}", thousands(lo), thousands(hi)),
                ratio,
                vs,
                target,
                result,
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |row: &[String]| {
        let mut s = String::new();
        for (i, (c, w)) in row.iter().zip(widths).enumerate() {
            // Numbers right-aligned, text left-aligned.
            if (2..=4).contains(&i) {
                s.push_str(&format!("{c:>w$}  "));
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        println!("{}", s.trim_end());
    };
    line(&header.map(str::to_owned));
    line(&widths.map(|w| "-".repeat(w)));
    for row in &cells {
        line(row);
    }
}

fn main() {
    if std::env::args().any(|a| a == CHILD_FLAG) {
        child_broker();
        return;
    }
    let args = parse_args();
    const PINNED: &str = "TUBEWAY_BENCH_PINNED";
    if args.one_cpu && std::env::var_os(PINNED).is_none() {
        let status = Command::new("taskset")
            .args(["-c", "0"])
            .arg(std::env::current_exe().unwrap())
            .args(std::env::args().skip(1))
            .env(PINNED, "1")
            .status()
            .unwrap_or_else(|e| fail(&format!("--one-cpu needs taskset: {e}")));
        std::process::exit(status.code().unwrap_or(1));
    }
    let load_at_start = load();
    let payload = Bytes::from(vec![0x5au8; REQUEST_PAYLOAD]);
    let (req_len, ack_len) = frame_sizes(&payload);

    let mut cmd = "cargo bench -p tubeway --bench roundtrip".to_owned();
    if !args.given.is_empty() {
        cmd.push_str(" -- ");
        cmd.push_str(&args.given.join(" "));
    }
    println!("command:  {cmd}");
    println!(
        "machine:  {} CPUs (nproc), {}, Linux {}",
        cpu_count(),
        cpu_model(),
        kernel()
    );
    println!(
        "method:   {:.1} s warm-up per figure, then {} runs of {:.1} s per figure, bare and \
         tubeway interleaved; medians",
        args.warmup.as_secs_f64(),
        args.runs,
        args.duration.as_secs_f64()
    );
    println!(
        "traffic:  {REQUEST_PAYLOAD}-byte payload to function `ack`, which answers an empty \
         message: {req_len}-byte request frame, {ack_len}-byte response frame; the bare \
         ping-pong moves the same byte counts"
    );
    println!(
        "cpus:     {}",
        if args.one_cpu {
            "pinned to CPU 0 (--one-cpu): everything shares one CPU"
        } else {
            "all; threads placed by the scheduler"
        }
    );
    println!(
        "broker:   in this process (tubeway::Server: its own multi-thread runtime, 2 workers); \
         blocking Client on its built-in 2-thread runtime; AsyncClient tasks on a separate \
         2-worker runtime"
    );
    println!();

    let unix = format!(
        "unix://{}",
        std::env::temp_dir()
            .join(format!("tw-bench-{}.sock", std::process::id()))
            .display()
    );
    let server = Server::start(BrokerConfig::default(), &["tcp://127.0.0.1:0", &unix]).unwrap();
    server
        .broker()
        // Cloned, not built per call: the handler itself should cost nothing.
        .create_function("ack", {
            let empty = Message::new(MessageType::Response);
            move |_| Ok(empty.clone())
        })
        .unwrap();
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench-client")
        .enable_all()
        .build()
        .unwrap();

    let bare_sock = std::env::temp_dir().join(format!("tw-bare-{}.sock", std::process::id()));
    let mut rows = Vec::new();
    let urls: Vec<(&'static str, String)> = server
        .urls()
        .iter()
        .map(|u| {
            let name = if u.to_string().starts_with("tcp") {
                "tcp"
            } else {
                "unix"
            };
            (name, u.to_string())
        })
        .collect();

    let mut totals: Vec<(String, u64)> = Vec::new();
    for (transport, url) in &urls {
        if args.transport.as_deref().is_some_and(|t| t != *transport) {
            continue;
        }
        let wanted = |f: &str| args.only.as_ref().is_none_or(|o| o.iter().any(|x| x == f));
        let mut bare: Box<dyn FnMut()> = if *transport == "tcp" {
            let mut b = bare_tcp(req_len, ack_len);
            Box::new(move || b.one())
        } else {
            let mut b = bare_unix(&bare_sock, req_len, ack_len);
            Box::new(move || b.one())
        };
        let blocking = Client::connect(url).unwrap();
        let asynch = client_rt.block_on(AsyncClient::connect(url)).unwrap();
        let inflight = args.in_flight;

        let all: Vec<(&str, String, Figure<'_>)> = vec![
            (
                "bare",
                "bare std socket ping-pong".into(),
                Box::new(|d| repeat(d, &mut *bare)),
            ),
            (
                "blocking",
                "tubeway Client (blocking), 1 in flight".into(),
                Box::new(|d| {
                    repeat(d, || {
                        black_box(blocking.send("ack", request(&payload)).unwrap());
                    })
                }),
            ),
            (
                "async",
                "tubeway AsyncClient, 1 in flight".into(),
                Box::new(|d| async_repeat(&client_rt, &asynch, &payload, 1, d)),
            ),
            (
                "pipelined",
                format!("tubeway AsyncClient, {inflight} in flight"),
                Box::new(|d| async_repeat(&client_rt, &asynch, &payload, inflight, d)),
            ),
        ];
        let mut figures: Vec<_> = all.into_iter().filter(|(k, _, _)| wanted(k)).collect();
        let mut done = vec![0u64; figures.len()];
        eprint!("{transport}: warm-up");
        for (i, (_, _, f)) in figures.iter_mut().enumerate() {
            done[i] += f(args.warmup).n;
        }
        let mut results = vec![Vec::new(); figures.len()];
        for run in 0..args.runs {
            eprint!(", run {}/{}", run + 1, args.runs);
            for (i, (_, _, f)) in figures.iter_mut().enumerate() {
                let c = f(args.duration);
                done[i] += c.n;
                results[i].push(c.rate());
            }
        }
        eprintln!();
        let keys: Vec<&str> = figures.iter().map(|(k, _, _)| *k).collect();
        let med = |key: &str| {
            keys.iter()
                .position(|k| *k == key)
                .map(|i| median(&results[i]))
        };
        let ratio = |a: &str, b: &str| Some(med(a)? / med(b)?);
        for (i, (key, name, _)) in figures.iter().enumerate() {
            let compare = match *key {
                "blocking" => {
                    ratio("blocking", "bare").map(|x| (x, "bare", Some(TARGET_BARE_RATIO)))
                }
                "async" => ratio("async", "bare").map(|x| (x, "bare", None)),
                "pipelined" => ratio("pipelined", "async")
                    .map(|x| (x, "Async 1 in flight", Some(TARGET_PIPELINE_RATIO))),
                _ => None,
            };
            rows.push(Row {
                transport,
                case: name.clone(),
                runs: results[i].clone(),
                compare,
            });
            totals.push((format!("{transport} {key}"), done[i]));
        }
        drop(figures);
        drop(blocking);
        drop(asynch);
    }
    let _ = std::fs::remove_file(&bare_sock);
    println!();
    print_table(&rows);
    println!(
        "(1-minute load average {load_at_start} at start, {} at end; above ~0.5 other \
         processes compete with the benchmark for the CPUs)",
        load()
    );
    if args.only.is_some() {
        println!();
        for (figure, n) in &totals {
            println!("round trips done ({figure}, warm-up included): {n}");
        }
    }

    if !args.memory {
        return;
    }
    eprintln!("memory: {} idle connections", args.connections);
    let bin = args.server_bin.clone().or_else(default_server_bin);
    let mem = measure_memory(&client_rt, bin.as_deref(), args.connections);
    println!();
    println!("memory (tcp, broker as a {})", mem.how);
    println!(
        "  idle broker RSS, no connection:   {:>8} KiB",
        mem.idle_kib
    );
    println!(
        "  with 1 connection:                 {:>8} KiB",
        mem.one_conn_kib
    );
    println!(
        "  with {} more idle connections:   {:>8} KiB  ->  {:.1} KiB per idle connection",
        mem.connections, mem.loaded_kib, mem.per_conn_kib
    );
    drop(server);
}
