//! The report as aligned tables, for people.

use std::fmt::Write as _;

use super::args::Group;
use super::latency::COLUMNS;
use super::machine::show_load;
use super::report::{Baseline, Figure, Report, Section, Stat};
use crate::output::table_aligned;

/// The share of the CPUs taken by other processes above which the report
/// warns that other work competed with the run.
const BUSY_SHARE: f64 = 0.1;
/// Without that share, the 1-minute load average at the start above which
/// it warns.
const BUSY_LOAD: f64 = 0.5;

/// `35,012`, `123.4`, `5.67`, `0.0123`: enough digits to compare, no more.
pub fn num(x: f64) -> String {
    if !x.is_finite() {
        return "-".to_owned();
    }
    let a = x.abs();
    if a >= 1000.0 {
        thousands(x)
    } else if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else if a == 0.0 {
        "0".to_owned()
    } else {
        format!("{x:.3}")
    }
}

fn thousands(x: f64) -> String {
    let s = format!("{:.0}", x.abs());
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if x < 0.0 {
        format!("-{out}")
    } else {
        out
    }
}

fn median(s: Option<&Stat>) -> String {
    s.map_or_else(|| "-".to_owned(), |s| num(s.median))
}

fn spread(s: Option<&Stat>) -> String {
    match s {
        Some(s) if s.runs.len() > 1 => format!("{}-{}", num(s.min), num(s.max)),
        _ => "-".to_owned(),
    }
}

fn ratio(b: Option<&Baseline>) -> String {
    b.and_then(|b| b.ratio)
        .map_or_else(|| "-".to_owned(), |r| format!("{r:.2}x"))
}

fn client(f: &Figure) -> String {
    f.client
        .map_or_else(|| "-".to_owned(), |c| c.label().to_owned())
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or_else(
        || "-".to_owned(),
        |k| format!("{:.1} MiB", k as f64 / 1024.0),
    )
}

/// Renders the whole report.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    let m = &r.machine;
    let _ = writeln!(out, "command:  {}", r.command);
    let _ = writeln!(
        out,
        "machine:  {} CPUs (nproc {}), {}, Linux {}",
        m.cpus, m.nproc, m.cpu_model, m.kernel
    );
    let _ = writeln!(
        out,
        "load:     {} before, {} after (1, 5, 15 min; the bench's own threads count in the load after)",
        show_load(m.load_before),
        show_load(m.load_after)
    );
    // The CPU time other processes took tells; the load average after the
    // run counts the bench's own (spinning) threads, so only the one
    // before it is a fallback.
    match (m.other_cpu, m.load_before) {
        (Some(share), _) => {
            let _ = writeln!(
                out,
                "others:   other processes used {:.0}% of the CPUs during the run",
                share * 100.0
            );
            if share > BUSY_SHARE {
                let _ = writeln!(
                    out,
                    "warning:  other work shared the CPUs, so absolute figures are \
                     pessimistic; compare ratios"
                );
            }
        }
        (None, Some([load, ..])) if load > BUSY_LOAD => {
            let _ = writeln!(
                out,
                "warning:  1-minute load average {load:.2} at the start: other work shared \
                 the CPUs, so absolute figures are pessimistic; compare ratios"
            );
        }
        (None, _) => {}
    }
    let _ = writeln!(out, "method:   {}", r.method.summary);
    let _ = writeln!(out, "build:    tubeway {} ({})", r.version, r.build);
    if r.build != "release" {
        let _ = writeln!(
            out,
            "warning:  a debug build; build with --release for figures that mean anything"
        );
    }
    for s in &r.sections {
        out.push('\n');
        render_section(&mut out, s);
    }
    out
}

fn render_section(out: &mut String, s: &Section) {
    let wait = if s.wait == "default" {
        String::new()
    } else {
        format!(" (wait {})", s.wait)
    };
    match s.mode {
        Some(mode) => {
            let _ = writeln!(out, "== {} {mode}{wait}: {}", s.transport, s.about);
        }
        None => {
            let _ = writeln!(out, "== {} limits{wait}: {}", s.transport, s.about);
        }
    }
    let far = if s.brokered { "broker" } else { "peer" };
    let _ = writeln!(out, "   {far}: {}", s.broker);
    let mut groups: Vec<Option<Group>> = Vec::new();
    for f in &s.figures {
        if !groups.contains(&f.group) {
            groups.push(f.group);
        }
    }
    for g in groups {
        let figs: Vec<&Figure> = s.figures.iter().filter(|f| f.group == g).collect();
        out.push('\n');
        let table = match g {
            Some(Group::Size) => {
                out.push_str("throughput by payload size, 1 connection, 1 in flight\n");
                throughput(&figs, "payload", Some(far))
            }
            Some(Group::Connections) => {
                out.push_str("throughput by connection count, 1 in flight each\n");
                throughput(&figs, "connections", None)
            }
            Some(Group::InFlight) => {
                out.push_str("throughput by requests in flight, 1 connection\n");
                throughput(&figs, "in flight", None)
            }
            Some(Group::RoundTrip) => {
                out.push_str("round-trip latency (µs), 1 in flight\n");
                latencies(&figs)
            }
            Some(Group::Rate) => {
                out.push_str(
                    "latency (µs) at a fixed offered rate, from each message's intended send time\n",
                );
                latencies(&figs)
            }
            Some(Group::Memory) | None => limits(&figs),
        };
        out.push_str(&table);
        out.push('\n');
    }
}

/// The baselines that make columns, as the figure with the most of them
/// has them; adds their headers (with the unit if `unit`) to `header`.
fn baseline_columns<'a>(
    figs: &[&'a Figure],
    header: &mut Vec<String>,
    unit: bool,
) -> Vec<&'a Baseline> {
    let names: Vec<&Baseline> = figs
        .iter()
        .max_by_key(|f| f.baselines.len())
        .map(|f| f.baselines.iter().collect())
        .unwrap_or_default();
    for b in &names {
        header.push(if unit {
            format!("{} {}", b.name, b.unit)
        } else {
            b.name.clone()
        });
        header.push("ratio".to_owned());
    }
    names
}

/// The value and ratio cells of `f`'s baselines, in the columns' order.
fn baseline_cells(f: &Figure, columns: &[&Baseline]) -> Vec<String> {
    let mut cells = Vec::with_capacity(columns.len() * 2);
    for b in columns {
        let mine = f.baselines.iter().find(|x| x.name == b.name);
        cells.push(match mine {
            Some(x) if x.value.is_none() => "not measured".to_owned(),
            Some(x) => median(x.value.as_ref()),
            None => "-".to_owned(),
        });
        cells.push(ratio(mine));
    }
    cells
}

/// A throughput table; `memory_of` (the far end's name) adds memory columns.
fn throughput(figs: &[&Figure], what: &str, memory_of: Option<&str>) -> String {
    let publish = figs.iter().any(|f| f.drops.is_some());
    let mut header: Vec<String> = [what, "msg/s", "min-max", "MB/s"]
        .map(str::to_owned)
        .to_vec();
    if publish {
        header.extend(["deliveries/s".to_owned(), "drops".to_owned()]);
    }
    let names = baseline_columns(figs, &mut header, true);
    if let Some(far) = memory_of {
        header.extend(["peak RSS bench".to_owned(), format!("peak RSS {far}")]);
    }
    header.push("client".to_owned());
    let notes = figs.iter().any(|f| f.note.is_some());
    if notes {
        header.push(String::new());
    }
    let rows: Vec<Vec<String>> = figs
        .iter()
        .map(|f| {
            let mut row = vec![
                f.label.clone(),
                median(f.msgs_per_sec.as_ref()),
                spread(f.msgs_per_sec.as_ref()),
                median(f.mb_per_sec.as_ref()),
            ];
            if publish {
                row.push(median(f.deliveries_per_sec.as_ref()));
                row.push(f.drops.map_or_else(|| "-".to_owned(), |d| d.to_string()));
            }
            row.extend(baseline_cells(f, &names));
            if memory_of.is_some() {
                let rss = f.rss.unwrap_or_default();
                row.push(mib(rss.bench_kib));
                row.push(mib(rss.broker_kib));
            }
            row.push(client(f));
            if notes {
                row.push(f.note.clone().unwrap_or_default());
            }
            row
        })
        .collect();
    let refs: Vec<&str> = header.iter().map(String::as_str).collect();
    // Numbers right, the label, the client and the note left.
    let client_col = header.len() - 1 - usize::from(notes);
    let right: Vec<bool> = (0..header.len()).map(|i| i > 0 && i < client_col).collect();
    table_aligned(&refs, &rows, &right)
}

fn latencies(figs: &[&Figure]) -> String {
    let mut header: Vec<String> = vec!["".to_owned(), "msg/s".to_owned()];
    header.extend(COLUMNS.iter().map(|(n, _)| (*n).to_owned()));
    header.push("samples".to_owned());
    let names = baseline_columns(figs, &mut header, false);
    header.push("client".to_owned());
    header.push("".to_owned());
    let rows = figs
        .iter()
        .map(|f| {
            let l = f.latency.as_ref().map(|l| l.median).unwrap_or_default();
            let mut row = vec![f.label.clone(), median(f.msgs_per_sec.as_ref())];
            row.extend(COLUMNS.iter().map(|(_, get)| num(get(&l))));
            row.push(thousands(l.count as f64));
            row.extend(baseline_cells(f, &names));
            row.push(client(f));
            let rate = f.latency.as_ref().and_then(|l| {
                Some(format!(
                    "achieved {} msg/s; sender at most {} µs behind schedule",
                    num(l.achieved_rate?),
                    num(l.sender_lag_us?)
                ))
            });
            let notes: Vec<String> = rate.into_iter().chain(f.note.clone()).collect();
            row.push(notes.join("; "));
            row
        })
        .collect::<Vec<_>>();
    let refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let right: Vec<bool> = (0..header.len())
        .map(|i| i > 0 && i + 2 < header.len())
        .collect();
    table_aligned(&refs, &rows, &right)
}

fn limits(figs: &[&Figure]) -> String {
    let mut out = String::new();
    for f in figs {
        let value = if let Some(m) = f.memory {
            let cpu = match m.idle_cpu_ms {
                Some(ms) => format!(
                    "; CPU while they idle {ms:.1} ms in {:.1} s ({:.2}% of a CPU)",
                    m.idle_ms as f64 / 1e3,
                    ms / m.idle_ms.max(1) as f64 * 100.0
                ),
                None => String::new(),
            };
            format!(
                "idle {}, with 1 connection {}, with {} more {}: {:.1} KiB per idle connection{cpu}",
                mib(Some(m.idle_kib)),
                mib(Some(m.one_connection_kib)),
                m.connections,
                mib(Some(m.loaded_kib)),
                m.per_connection_kib
            )
        } else if let Some(l) = &f.latency {
            let p50: Vec<f64> = l.runs.iter().map(|r| r.p50_us).collect();
            format!(
                "{} µs round trip p50 (min-max {}), {} round trips/s",
                num(l.median.p50_us),
                spread(Stat::of(p50).as_ref()),
                median(f.msgs_per_sec.as_ref())
            )
        } else if let Some(mb) = &f.mb_per_sec {
            format!("{} MB/s (min-max {})", num(mb.median), spread(Some(mb)))
        } else {
            f.note.clone().unwrap_or_else(|| "-".to_owned())
        };
        let _ = writeln!(out, "{:<58}  {value}", f.label);
    }
    out.pop();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(num(35_012.4), "35,012");
        assert_eq!(num(1_234_567.0), "1,234,567");
        assert_eq!(num(123.4), "123");
        assert_eq!(num(12.34), "12.3");
        assert_eq!(num(1.234), "1.23");
        assert_eq!(num(0.01234), "0.012");
        assert_eq!(num(0.0), "0");
        assert_eq!(num(f64::NAN), "-");
        assert_eq!(thousands(-1234.0), "-1,234");
        assert_eq!(mib(Some(2048)), "2.0 MiB");
        assert_eq!(mib(None), "-");
    }

    #[test]
    fn a_throughput_table_lines_up() {
        let fig = |label: &str, rate: f64| Figure {
            label: label.into(),
            msgs_per_sec: Stat::of(vec![rate, rate * 1.1, rate * 0.9]),
            baselines: vec![Baseline::measured(
                "bare",
                "msg/s",
                Stat::of(vec![rate * 2.0]),
                Some(rate),
            )],
            ..Figure::default()
        };
        let a = fig("64 B", 35_000.0);
        let b = fig("200 MB", 2.5);
        let t = throughput(&[&a, &b], "payload", None);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert!(lines[0].starts_with("payload"), "{t}");
        assert!(
            lines[1].contains("35,000") && lines[1].contains("0.50x"),
            "{t}"
        );
        assert!(
            lines[2].contains("2.50") && lines[2].contains("2.25-2.75"),
            "{t}"
        );
        // Numbers right-aligned: the ratios end where their header does.
        let end = |l: &str, cell: &str| l.find(cell).map(|i| i + cell.len());
        let ratio = end(lines[0], "ratio");
        assert!(ratio.is_some(), "{t}");
        assert!(lines[1..].iter().all(|l| end(l, "0.50x") == ratio), "{t}");
        // The client column comes last, left-aligned.
        assert!(lines[0].trim_end().ends_with("client"), "{t}");
    }
}
