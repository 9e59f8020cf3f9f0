//! How much of the CPUs other work took during a run: the machine's busy
//! time (`/proc/stat`, time stolen by the hypervisor included) less this
//! process's and its reaped children's (`/proc/self/stat`). The load average
//! cannot tell: the bench's own spinning threads raise it.

/// CPU time counters at one moment, in clock ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTimes {
    /// Every CPU's time, idle included.
    total: u64,
    /// Every CPU's busy time.
    busy: u64,
    /// This process's and its reaped children's CPU time.
    ours: u64,
}

impl CpuTimes {
    /// The counters now; `None` where `/proc` cannot be read.
    pub fn now() -> Option<CpuTimes> {
        let (total, busy) = machine_times(&std::fs::read_to_string("/proc/stat").ok()?)?;
        let ours = own_ticks(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
        Some(CpuTimes { total, busy, ours })
    }

    /// The share of all CPUs (0 to 1) that other work used between `self`
    /// and `later`. Children still running at `later` count as other work.
    pub fn others_share(&self, later: &CpuTimes) -> Option<f64> {
        let total = later.total.checked_sub(self.total)?;
        let busy = later.busy.checked_sub(self.busy)?;
        let ours = later.ours.checked_sub(self.ours)?;
        (total > 0).then(|| busy.saturating_sub(ours) as f64 / total as f64)
    }
}

/// Total and busy ticks of the first line of `/proc/stat`: `cpu user nice
/// system idle iowait irq softirq steal ...` (guest time is already in user).
fn machine_times(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let f: Vec<u64> = line
        .split_whitespace()
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let [user, nice, system, idle, iowait, irq, softirq, steal] = f.try_into().ok()?;
    let busy = user + nice + system + irq + softirq + steal;
    Some((busy + idle + iowait, busy))
}

/// utime + stime + cutime + cstime of `/proc/self/stat` (fields 14 to 17;
/// the name in parentheses before them may hold spaces).
fn own_ticks(stat: &str) -> Option<u64> {
    let after_name = stat.rsplit_once(')')?.1;
    // Field 3 (the state) is the first after the name.
    let f: Vec<u64> = after_name
        .split_whitespace()
        .skip(14 - 3)
        .take(4)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    (f.len() == 4).then(|| f.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_parse() {
        let stat = "cpu  100 5 50 800 10 3 2 30 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n";
        assert_eq!(machine_times(stat), Some((1000, 190)));
        assert_eq!(machine_times("intr 1 2"), None);
        let me = "4242 (tubeway bench) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17";
        assert_eq!(own_ticks(me), Some(11 + 12 + 13 + 14));
        assert_eq!(own_ticks("4242 (x) S 1 2"), None);
        let now = CpuTimes::now().expect("/proc is readable");
        let a = CpuTimes {
            total: 1000,
            busy: 300,
            ours: 50,
        };
        let b = CpuTimes {
            total: 2000,
            busy: 800,
            ours: 350,
        };
        assert_eq!(a.others_share(&b), Some(0.2));
        assert_eq!(b.others_share(&a), None);
        assert!(now.others_share(&now).is_none());
    }
}
