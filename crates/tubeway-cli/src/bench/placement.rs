//! Where the bench and its child processes run: wherever the scheduler puts
//! them, all on CPU 0 (`--one-cpu`), or the bench on CPU 0 and its children
//! on CPU 1 (`--split-cpus`). A pinned bench is the same command run again
//! under `taskset -c 0`; its children inherit that mask or are given theirs.
//!
//! Why it matters: on a machine whose idle CPUs sleep (a virtual machine's
//! especially), a blocking wake-up across CPUs costs tens of microseconds
//! and one on the waker's own CPU a few. The scheduler decides which one a
//! ping-pong pays, and may decide differently for a bare ping-pong and for
//! a call through a broker in the same run
//! (docs/performance/investigations.md, "Where the scheduler puts the two
//! ends"). Pinned, both pay the same.

use std::path::Path;
use std::process::Command;

use rustix::process::Pid;
use rustix::thread::{sched_getaffinity, CpuSet};

use crate::cli::UsageError;

/// Set in the environment of a bench run again under `taskset`: how it is
/// placed.
const PINNED: &str = "TUBEWAY_BENCH_PINNED";

/// Where the bench's threads and its child processes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Wherever the scheduler puts them.
    Free,
    /// Everything on CPU 0.
    OneCpu,
    /// The bench on CPU 0, its children on CPU 1.
    Split,
}

impl Placement {
    /// What the options ask for.
    pub fn asked(one_cpu: bool, split_cpus: bool) -> Placement {
        match (one_cpu, split_cpus) {
            (true, _) => Placement::OneCpu,
            (false, true) => Placement::Split,
            (false, false) => Placement::Free,
        }
    }

    /// How this process was placed by the run that started it again.
    pub fn current() -> Placement {
        match std::env::var_os(PINNED) {
            None => Placement::Free,
            Some(v) if v == "split" => Placement::Split,
            Some(_) => Placement::OneCpu,
        }
    }

    /// For the method line of the report.
    pub fn describe(self) -> &'static str {
        match self {
            Placement::Free => "threads placed by the scheduler on every CPU",
            Placement::OneCpu => "everything pinned to CPU 0 (--one-cpu)",
            Placement::Split => {
                "the bench pinned to CPU 0, its child processes (broker, peers) to CPU 1 \
                 (--split-cpus)"
            }
        }
    }

    /// A command that runs `exe` where this placement puts the children.
    pub fn child_command(self, exe: &Path) -> Command {
        match self {
            Placement::Split => {
                let mut cmd = Command::new("taskset");
                cmd.args(["-c", "1"]).arg(exe);
                cmd
            }
            // They inherit the bench's mask.
            Placement::Free | Placement::OneCpu => Command::new(exe),
        }
    }

    /// Runs this same command again under `taskset -c 0`, placed as `self`
    /// says, and exits with its status.
    pub async fn run_again(self) -> anyhow::Result<()> {
        let flag = match self {
            Placement::Free => return Ok(()),
            Placement::OneCpu => "one-cpu",
            Placement::Split => {
                let cpus = std::thread::available_parallelism().map_or(1, usize::from);
                if cpus < 2 {
                    return Err(UsageError(format!(
                        "--split-cpus needs two CPUs; this process may use {cpus}"
                    ))
                    .into());
                }
                "split"
            }
        };
        let exe = std::env::current_exe()?;
        let status = tokio::task::spawn_blocking(move || {
            Command::new("taskset")
                .args(["-c", "0"])
                .arg(exe)
                .args(std::env::args_os().skip(1))
                .env(PINNED, flag)
                .status()
        })
        .await?
        .map_err(|e| UsageError(format!("pinning to a CPU needs taskset (util-linux): {e}")))?;
        match status.code() {
            Some(0) => Ok(()),
            code => std::process::exit(code.unwrap_or(1)),
        }
    }
}

/// The CPUs process `pid` may run on, as `CPU 1` or `CPUs 0, 1`, when the
/// bench is pinned (unpinned, every CPU: nothing worth saying).
pub fn cpus_of(pid: u32) -> Option<String> {
    if Placement::current() == Placement::Free {
        return None;
    }
    let pid = Pid::from_raw(i32::try_from(pid).ok()?)?;
    let set = sched_getaffinity(Some(pid)).ok()?;
    Some(list_cpus(&set))
}

fn list_cpus(set: &CpuSet) -> String {
    let cpus: Vec<String> = (0..CpuSet::MAX_CPU)
        .filter(|&c| set.is_set(c))
        .map(|c| c.to_string())
        .collect();
    match cpus.as_slice() {
        [one] => format!("CPU {one}"),
        many => format!("CPUs {}", many.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_options_ask_for_one_placement() {
        assert_eq!(Placement::asked(false, false), Placement::Free);
        assert_eq!(Placement::asked(true, false), Placement::OneCpu);
        assert_eq!(Placement::asked(false, true), Placement::Split);
    }

    #[test]
    fn cpus_are_listed_as_people_write_them() {
        let mut set = CpuSet::new();
        set.set(1);
        assert_eq!(list_cpus(&set), "CPU 1");
        set.set(0);
        assert_eq!(list_cpus(&set), "CPUs 0, 1");
    }

    #[test]
    fn split_children_start_under_taskset_on_cpu_1() {
        let cmd = Placement::Split.child_command(Path::new("tubeway"));
        assert_eq!(cmd.get_program(), "taskset");
        let args: Vec<_> = cmd.get_args().collect();
        assert_eq!(args, ["-c", "1", "tubeway"]);
        let free = Placement::Free.child_command(Path::new("tubeway"));
        assert_eq!(free.get_program(), "tubeway");
    }
}
