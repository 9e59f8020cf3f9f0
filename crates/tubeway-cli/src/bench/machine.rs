//! Facts about the machine, for the report.

use serde::Serialize;

/// The machine a run happened on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// CPUs available to this process (`nproc`).
    pub nproc: usize,
    /// CPUs of the machine.
    pub cpus: usize,
    /// CPU model name.
    pub cpu_model: String,
    /// Kernel release.
    pub kernel: String,
    /// Load average (1, 5, 15 minutes) when the run started.
    pub load_before: Option<[f64; 3]>,
    /// Load average when it ended (the bench's own threads count in it).
    pub load_after: Option<[f64; 3]>,
    /// The share of all CPUs (0 to 1) that other work used during the run.
    pub other_cpu: Option<f64>,
}

impl Machine {
    /// Reads the machine's facts now; the load after is filled in later.
    pub fn now() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Machine {
            nproc: std::thread::available_parallelism().map_or(0, usize::from),
            cpus: cpuinfo
                .lines()
                .filter(|l| l.starts_with("processor"))
                .count(),
            cpu_model: cpuinfo
                .lines()
                .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
                .map_or_else(|| "unknown".to_owned(), |(_, v)| v.trim().to_owned()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned()),
            load_before: load_average(),
            load_after: None,
            other_cpu: None,
        }
    }
}

/// The load averages of `/proc/loadavg`.
pub fn load_average() -> Option<[f64; 3]> {
    parse_loadavg(&std::fs::read_to_string("/proc/loadavg").ok()?)
}

fn parse_loadavg(s: &str) -> Option<[f64; 3]> {
    let mut it = s.split_whitespace().map(str::parse::<f64>);
    Some([it.next()?.ok()?, it.next()?.ok()?, it.next()?.ok()?])
}

/// `0.52 0.40 0.31`, or `unknown`.
pub fn show_load(l: Option<[f64; 3]>) -> String {
    l.map_or_else(
        || "unknown".to_owned(),
        |[a, b, c]| format!("{a:.2} {b:.2} {c:.2}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_averages() {
        assert_eq!(
            parse_loadavg("0.52 0.40 0.31 1/123 4567\n"),
            Some([0.52, 0.40, 0.31])
        );
        assert_eq!(parse_loadavg("garbage"), None);
        assert_eq!(show_load(Some([1.0, 0.5, 0.25])), "1.00 0.50 0.25");
        assert_eq!(show_load(None), "unknown");
        let m = Machine::now();
        assert!(m.nproc >= 1);
    }
}
