//! Runs the real `tubeway` binary: a server child process, and client
//! commands against it, every one bounded in time.
#![allow(dead_code)]

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_tubeway");

/// How long a server may take to print its addresses.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);

/// How long one client command may take (generous: a loaded 2-core machine).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// A `tubeway` command without the caller's environment leaking in.
pub fn tubeway() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_remove("TUBEWAY_URL").env_remove("RUST_LOG");
    cmd
}

/// A temporary directory, removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tubeway-cli-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What a finished command did.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// Asserts success and returns stdout.
    #[track_caller]
    pub fn ok(&self) -> &str {
        assert!(
            self.status.success(),
            "command failed: {:?}\nstdout: {}\nstderr: {}",
            self.status,
            self.stdout,
            self.stderr
        );
        &self.stdout
    }

    /// Asserts the exit code and returns stderr.
    #[track_caller]
    pub fn fails_with(&self, code: i32) -> &str {
        assert_eq!(
            self.status.code(),
            Some(code),
            "unexpected exit status\nstdout: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
        &self.stderr
    }

    /// stdout as JSON lines.
    #[track_caller]
    pub fn json_lines(&self) -> Vec<serde_json::Value> {
        self.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
            .collect()
    }
}

/// Reads a child's pipe to the end on a thread of its own.
fn drain(mut pipe: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// Waits for `child` at most `timeout`; kills it (and panics) past that.
#[track_caller]
pub fn wait_bounded(child: &mut Child, timeout: Duration) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait().expect("try_wait") {
            Some(status) => return status,
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("process {} still running after {timeout:?}", child.id());
            }
            None => thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Runs `cmd` to completion, bounded by [`COMMAND_TIMEOUT`].
#[track_caller]
pub fn run(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tubeway");
    let out = drain(child.stdout.take().expect("stdout"));
    let err = drain(child.stderr.take().expect("stderr"));
    let status = wait_bounded(&mut child, COMMAND_TIMEOUT);
    Output {
        status,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

/// A child process killed on drop; its stdout lines arrive on a channel.
#[derive(Debug)]
pub struct Proc {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Option<thread::JoinHandle<String>>,
}

impl Proc {
    /// Starts `cmd` with its stdout read line by line and its stderr captured.
    pub fn spawn(cmd: &mut Command) -> Proc {
        Proc::start(cmd.stderr(Stdio::piped()))
    }

    /// Starts `cmd` with its stdout read line by line; stderr as `cmd` says.
    fn start(cmd: &mut Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn tubeway");
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().map(drain);
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc {
            child,
            lines,
            stderr,
        }
    }

    /// The next stdout line, waiting at most `timeout`.
    pub fn next_line(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// Waits for the process to exit (bounded) and returns what it printed
    /// that was not read yet.
    #[track_caller]
    pub fn finish(mut self, timeout: Duration) -> Output {
        let status = wait_bounded(&mut self.child, timeout);
        let stderr = self
            .stderr
            .take()
            .map(|h| h.join().expect("stderr reader"))
            .unwrap_or_default();
        // The reader thread ends at EOF, now that the process is gone.
        let mut stdout = String::new();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            stdout.push_str(&line);
            stdout.push('\n');
        }
        Output {
            status,
            stdout,
            stderr,
        }
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// A `tubeway server` child process on a free TCP port and a Unix socket.
#[derive(Debug)]
pub struct Server {
    pub proc: Proc,
    /// `tcp://127.0.0.1:PORT`
    pub tcp: String,
    /// `unix:///.../s.sock`
    pub unix: String,
    pub dir: TempDir,
}

impl Server {
    /// Starts a server with the default settings.
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// Starts a server with extra arguments (`--max-message-size 1MiB`, ...).
    #[track_caller]
    pub fn start_with(extra: &[&str]) -> Server {
        let dir = TempDir::new();
        let sock = dir.path().join("s.sock");
        let mut cmd = tubeway();
        cmd.args(["server", "--listen", "tcp://127.0.0.1:0", "--listen"])
            .arg(format!("unix://{}", sock.display()))
            .args(extra)
            .stderr(Stdio::from(
                File::create(dir.path().join("server.log")).expect("log file"),
            ));
        let proc = Proc::start(&mut cmd);
        let deadline = Instant::now() + START_TIMEOUT;
        let mut urls = Vec::new();
        while urls.len() < 2 {
            let left = deadline.saturating_duration_since(Instant::now());
            match proc.next_line(left) {
                Some(line) => {
                    if let Some(url) = line.strip_prefix("listening on ") {
                        urls.push(url.to_owned());
                    }
                }
                None => panic!(
                    "server did not print its addresses within {START_TIMEOUT:?}; log:\n{}",
                    std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default()
                ),
            }
        }
        let unix = urls.pop().expect("unix url");
        let tcp = urls.pop().expect("tcp url");
        assert!(tcp.starts_with("tcp://127.0.0.1:"), "{tcp}");
        assert!(!tcp.ends_with(":0"), "{tcp}");
        assert!(unix.starts_with("unix://"), "{unix}");
        Server {
            proc,
            tcp,
            unix,
            dir,
        }
    }

    /// A client command against this server (over TCP, by `--url`).
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = tubeway();
        cmd.args(args).args(["--url", &self.tcp]);
        cmd
    }

    /// Runs a client command against this server.
    #[track_caller]
    pub fn run(&self, args: &[&str]) -> Output {
        run(&mut self.cmd(args))
    }

    /// `stats --json`, parsed.
    #[track_caller]
    pub fn stats(&self) -> serde_json::Value {
        let out = self.run(&["stats", "--json"]);
        out.ok();
        let mut lines = out.json_lines();
        assert_eq!(lines.len(), 1, "{}", out.stdout);
        lines.remove(0)
    }

    /// Waits (bounded) until `check` holds for `stats --json`.
    #[track_caller]
    pub fn wait_for_stats(
        &self,
        what: &str,
        check: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let stats = self.stats();
            if check(&stats) {
                return stats;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; stats: {stats}"
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

/// The entry of `name` in a list of `stats --json` (`queues`, `topics`, `functions`).
pub fn entry<'a>(stats: &'a serde_json::Value, list: &str, name: &str) -> &'a serde_json::Value {
    stats[list]
        .as_array()
        .and_then(|l| l.iter().find(|e| e["name"] == name))
        .unwrap_or_else(|| panic!("no {list} entry {name:?} in {stats}"))
}
