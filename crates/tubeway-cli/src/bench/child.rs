//! Child processes of the bench: the broker under test and the bare peers.
//!
//! Each child is this same executable. It prints `listening on URL` when
//! ready and stops when its stdin closes, so it never outlives the bench,
//! even one killed by SIGKILL. Every wait is bounded; a child that exits
//! early is reported with the last lines it printed.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::placement::{cpus_of, Placement};

/// How long a child may take to say where it listens.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a child may take to exit once asked.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Lines of a child's output kept for error messages.
const LOG_LINES: usize = 20;

/// Why a child could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChildError {
    /// The executable could not be started.
    #[error("cannot start the {what}: {source}")]
    Spawn {
        /// Which child.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// It never printed its address.
    #[error("the {what} did not say where it listens within {timeout:?}{log}")]
    NoAddress {
        /// Which child.
        what: String,
        /// How long we waited.
        timeout: Duration,
        /// Its last output, as `; output: ...`.
        log: String,
    },
    /// It exited while in use.
    #[error("the {what} exited ({status}){log}")]
    Exited {
        /// Which child.
        what: String,
        /// How it ended.
        status: ExitStatus,
        /// Its last output, as `; output: ...`.
        log: String,
    },
}

/// A running child; killed when dropped.
#[derive(Debug)]
pub struct ChildProc {
    child: Child,
    /// Held open: the child stops when it closes.
    stdin: Option<ChildStdin>,
    what: String,
    url: String,
    log: Arc<Mutex<VecDeque<String>>>,
}

impl ChildProc {
    /// This executable with `args`, as a child.
    pub fn command(args: &[String]) -> Result<Command, ChildError> {
        let exe = std::env::current_exe().map_err(|source| ChildError::Spawn {
            what: "bench child".into(),
            source,
        })?;
        let mut cmd = Placement::current().child_command(&exe);
        cmd.args(args).env_remove("TUBEWAY_URL");
        Ok(cmd)
    }

    /// Starts `cmd` and waits until it prints `listening on URL`.
    pub fn start(mut cmd: Command, what: &str) -> Result<ChildProc, ChildError> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| ChildError::Spawn {
                what: what.to_owned(),
                source,
            })?;
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, rx) = mpsc::channel();
        let pipes: [Option<Box<dyn Read + Send>>; 2] = [
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ];
        for pipe in pipes.into_iter().flatten() {
            let (tx, log) = (tx.clone(), log.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    if let Some(url) = line.strip_prefix("listening on ") {
                        let _ = tx.send(url.trim().to_owned());
                    }
                    let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
                    if log.len() == LOG_LINES {
                        log.pop_front();
                    }
                    log.push_back(line);
                }
            });
        }
        let mut proc = ChildProc {
            stdin: child.stdin.take(),
            child,
            what: what.to_owned(),
            url: String::new(),
            log,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(url) => {
                    proc.url = url;
                    return Ok(proc);
                }
                Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {
                    proc.check()?;
                }
                Err(_) => {
                    proc.check()?;
                    return Err(ChildError::NoAddress {
                        what: proc.what.clone(),
                        timeout: START_TIMEOUT,
                        log: proc.log_tail(),
                    });
                }
            }
        }
    }

    /// The address it printed.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `child process `NAME`, pid N`, and its CPUs when the bench is
    /// pinned, for the report.
    pub fn describe(&self, name: &str) -> String {
        let pid = self.pid();
        match cpus_of(pid) {
            Some(cpus) => format!("child process `{name}`, pid {pid}, on {cpus}"),
            None => format!("child process `{name}`, pid {pid}"),
        }
    }

    /// An error if it has exited.
    pub fn check(&mut self) -> Result<(), ChildError> {
        match self.child.try_wait() {
            Ok(Some(status)) => {
                // Let the readers catch the last lines it printed.
                std::thread::sleep(Duration::from_millis(50));
                Err(ChildError::Exited {
                    what: self.what.clone(),
                    status,
                    log: self.log_tail(),
                })
            }
            _ => Ok(()),
        }
    }

    /// Closes its stdin and waits (bounded) for it to exit, then kills it.
    pub fn stop(mut self) {
        self.stdin.take();
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn log_tail(&self) -> String {
        let log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        if log.is_empty() {
            String::new()
        } else {
            let lines: Vec<&str> = log.iter().map(String::as_str).collect();
            format!("; output: {}", lines.join(" | "))
        }
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}
