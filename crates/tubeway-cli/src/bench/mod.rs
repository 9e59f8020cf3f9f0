//! `tubeway bench`: throughput, latency and memory, each beside the bare
//! limit of the machine measured in the same run.
//!
//! One file per concern: [`args`] (options), [`transport`] (the transports,
//! in one list), [`wait`] (latency mode), [`modes`] (what an operation is,
//! one file per mode), [`target`] (the broker under test), [`channel_peer`]
//! (the echoing far end of channels), [`runner`], [`threads`] and [`rate`]
//! (closed and open loops, on tasks or plain threads), [`latency`]
//! (histograms), [`baselines`], [`bare`], [`socket`], [`shm`], [`fdpass`]
//! and [`peer`] (the bare limits, with a child process at the far end),
//! [`memory`] and [`idle`] (resident memory), [`figures`] and [`suite`]
//! (what is measured in which order), [`report`], [`table`], [`plot`]
//! (output), [`machine`] and [`cpu`] (the machine and how busy it was),
//! [`progress`], [`child`] (child processes) and [`placement`] (which CPUs
//! they run on).

mod args;
mod bare;
mod baselines;
mod channel_peer;
mod child;
mod cpu;
mod fdpass;
mod figures;
mod idle;
mod latency;
mod machine;
mod memory;
mod modes;
pub mod peer;
mod placement;
mod plot;
mod progress;
mod rate;
mod report;
mod runner;
mod shm;
mod socket;
mod suite;
mod table;
mod target;
mod threads;
mod transport;
mod wait;

pub use args::{BenchArgs, PeerArgs, EXAMPLES, LONG_ABOUT};

use std::time::Duration;

use anyhow::Context as _;

use crate::cli::UsageError;
use crate::output::Printer;
use args::Settings;
use cpu::CpuTimes;
use machine::{load_average, Machine};
use placement::Placement;
use progress::Progress;
use report::{Method, Report};

/// Runs the benchmark and prints the report.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let settings = Settings::resolve(&args)?;
    let asked = Placement::asked(args.one_cpu, args.split_cpus);
    if asked != Placement::Free && Placement::current() == Placement::Free {
        return asked.run_again().await;
    }
    if let Some(plot) = &args.plot {
        let parent = plot.parent().filter(|p| !p.as_os_str().is_empty());
        if parent.is_some_and(|p| !p.is_dir()) {
            return Err(
                UsageError(format!("bad --plot {}: no such directory", plot.display())).into(),
            );
        }
    }
    let mut machine = Machine::now();
    let cpu_before = CpuTimes::now();
    let progress = Progress::new(suite::planned(&settings), args.json);
    let sections = suite::run(&settings, &progress).await;
    progress.finish();
    let sections = sections?;
    machine.load_after = load_average();
    machine.other_cpu = cpu_before
        .zip(CpuTimes::now())
        .and_then(|(before, after)| before.others_share(&after));
    let report = Report {
        command: command_line(),
        version: env!("CARGO_PKG_VERSION"),
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        machine,
        method: method(&settings),
        sections,
    };
    let out = Printer::new(args.json);
    if args.json {
        out.line(serde_json::to_string_pretty(&report)?)?;
    } else {
        out.line(table::render(&report))?;
    }
    if let Some(path) = &args.plot {
        plot::draw(&report, path).context("--plot")?;
        if !args.json {
            out.line(format_args!("plot: {}", path.display()))?;
        }
    }
    Ok(())
}

/// The command line as typed, program name as `tubeway`.
fn command_line() -> String {
    let mut words = vec!["tubeway".to_owned()];
    for a in std::env::args().skip(1) {
        if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '\'' || c == '"') {
            words.push(format!("'{}'", a.replace('\'', r"'\''")));
        } else {
            words.push(a);
        }
    }
    words.join(" ")
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Worker threads of the runtime this runs on; 1 outside a multi-threaded one.
fn runtime_workers() -> usize {
    tokio::runtime::Handle::try_current().map_or(1, |h| h.metrics().num_workers())
}

fn method(s: &Settings) -> Method {
    let show = |d: Duration| humantime::format_duration(d).to_string();
    let workers = runtime_workers();
    let placement = Placement::current();
    Method {
        warmup_ms: ms(s.warmup),
        duration_ms: ms(s.duration),
        runs: s.runs,
        latency_duration_ms: ms(s.latency_duration),
        rate: s.rate,
        quick: s.quick,
        one_cpu: placement == Placement::OneCpu,
        split_cpus: placement == Placement::Split,
        runtime_workers: workers,
        summary: format!(
            "each figure warmed up for {}, then measured in {} run{} of {}, its bare limits \
             measured in the same runs, interleaved, and the points of a sweep in turn; figures \
             are medians (min-max across runs); ratio = median over the runs of figure / bare \
             limit (or the sweep's first point) of the same run; the fixed-rate latency is one \
             run of {} after a warm-up at that rate; {}; AsyncClient tasks on a runtime of {} \
             worker{}",
            show(s.warmup),
            s.runs,
            if s.runs == 1 { "" } else { "s" },
            show(s.duration),
            show(s.latency_duration),
            placement.describe(),
            workers,
            if workers == 1 { "" } else { "s" },
        ),
    }
}
