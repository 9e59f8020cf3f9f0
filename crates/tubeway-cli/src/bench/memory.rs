//! Resident memory of a process, from `/proc/PID/status`.
//!
//! Peak resident memory (VmHWM) is reset before a measured run by writing 5
//! to `/proc/PID/clear_refs`, so the peak read after it belongs to that run.
//! Where that is not allowed the peak is since the process started, and the
//! report says so.

/// Whose memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proc {
    /// This process.
    This,
    /// Another process (a child).
    Pid(u32),
}

impl Proc {
    fn path(self, file: &str) -> String {
        match self {
            Proc::This => format!("/proc/self/{file}"),
            Proc::Pid(pid) => format!("/proc/{pid}/{file}"),
        }
    }

    /// Current resident memory, KiB.
    pub fn rss_kib(self) -> Option<u64> {
        self.status_kib("VmRSS")
    }

    /// Peak resident memory since start or since [`Proc::reset_peak`], KiB.
    pub fn peak_kib(self) -> Option<u64> {
        self.status_kib("VmHWM")
    }

    /// Resets the peak to the current resident memory; false if refused.
    pub fn reset_peak(self) -> bool {
        std::fs::write(self.path("clear_refs"), "5").is_ok()
    }

    /// CPU time used so far by all the process's threads, from
    /// `/proc/PID/task/*/schedstat` (nanoseconds, unlike the clock ticks of
    /// `/proc/PID/stat`). Threads that ended meanwhile are not counted.
    pub fn cpu_ns(self) -> Option<u64> {
        let mut total = 0u64;
        for task in std::fs::read_dir(self.path("task")).ok()? {
            let mut path = task.ok()?.path();
            path.push("schedstat");
            // A thread may end between the listing and the read.
            if let Ok(text) = std::fs::read_to_string(&path) {
                total += text.split_whitespace().next()?.parse::<u64>().ok()?;
            }
        }
        Some(total)
    }

    fn status_kib(self, field: &str) -> Option<u64> {
        parse_status_kib(&std::fs::read_to_string(self.path("status")).ok()?, field)
    }
}

/// The value in kB of `field` in the text of a `/proc/PID/status` file.
fn parse_status_kib(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields() {
        let status = "Name:\ttubeway\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(parse_status_kib(status, "VmHWM"), Some(20480));
        assert_eq!(parse_status_kib(status, "VmRSS"), Some(10240));
        assert_eq!(parse_status_kib(status, "VmSwap"), None);
        assert_eq!(parse_status_kib("VmRSS: lots", "VmRSS"), None);
    }

    #[test]
    fn this_process_uses_cpu() {
        // The kernel counts CPU time in ticks (10 ms): burn until one passes.
        let before = Proc::This.cpu_ns().unwrap();
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut x = 0u64;
        while Proc::This.cpu_ns().unwrap() <= before {
            assert!(std::time::Instant::now() < give_up, "no CPU time counted");
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x.wrapping_add(i));
            }
        }
    }

    #[test]
    fn this_process_has_memory() {
        assert!(Proc::This.rss_kib().expect("VmRSS") > 0);
        assert!(Proc::This.peak_kib().expect("VmHWM") > 0);
        // Compared within one read: other tests of this process allocate,
        // free and reset the peak between two.
        let status = std::fs::read_to_string(Proc::This.path("status")).unwrap();
        let rss = parse_status_kib(&status, "VmRSS").unwrap();
        let peak = parse_status_kib(&status, "VmHWM").unwrap();
        assert!(peak >= rss, "{rss} {peak}");
    }
}
