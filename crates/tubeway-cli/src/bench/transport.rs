//! The transports the bench knows, in one list.
//!
//! A transport is offered only when this build's `tubeway::Url` parses its
//! scheme. `fifo` (named pipes) carries channels only, so it is measured by
//! `--mode channel` alone.

use std::fmt;
use std::path::Path;

use tubeway::Url;

/// A transport to benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// In-process pipes: the broker runs inside the bench process.
    Mem,
    /// Shared memory between processes.
    Shm,
    /// Unix domain sockets.
    Unix,
    /// TCP over the loopback interface.
    Tcp,
    /// A pair of named pipes (channels only).
    Fifo,
}

/// Every transport the bench knows, in the order the report shows them.
const KNOWN: [Transport; 5] = [
    Transport::Mem,
    Transport::Shm,
    Transport::Unix,
    Transport::Tcp,
    Transport::Fifo,
];

/// Which bare limits apply to a transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BareKind {
    /// No bare counterpart (in-process pipes).
    None,
    /// A std socket of the same kind, between two processes.
    Socket,
    /// Ping-pongs through shared memory (`tubeway_ring::PingPong`) between
    /// two processes.
    SharedMemory,
    /// The same ping-pongs between two threads of the bench (in-process
    /// transports).
    Threads,
}

impl Transport {
    /// The transports this build supports.
    pub fn available() -> Vec<Transport> {
        KNOWN.into_iter().filter(|t| t.is_available()).collect()
    }

    /// Whether this build's URL parser knows the transport.
    pub fn is_available(self) -> bool {
        self.sample_url().parse::<Url>().is_ok()
    }

    /// The scheme, which is also the name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Mem => "mem",
            Transport::Shm => "shm",
            Transport::Unix => "unix",
            Transport::Tcp => "tcp",
            Transport::Fifo => "fifo",
        }
    }

    /// A syntactically valid URL of this transport, to probe the parser.
    fn sample_url(self) -> &'static str {
        match self {
            Transport::Mem => "mem://probe",
            Transport::Shm => "shm://probe",
            Transport::Unix => "unix:///tmp/probe.sock",
            Transport::Tcp => "tcp://127.0.0.1:0",
            Transport::Fifo => "fifo:///tmp/probe",
        }
    }

    /// A fresh address for a listener of this transport: `dir` holds socket
    /// files, `tag` makes names unique within this process.
    pub fn listen_url(self, dir: &Path, tag: &str) -> String {
        let pid = std::process::id();
        match self {
            Transport::Mem => format!("mem://tubeway-bench-{pid}-{tag}"),
            // A socket path in `dir`, not a name in the user's runtime
            // directory: a peer that ends by `exit` leaves its socket file,
            // and `dir` goes with the bench.
            Transport::Shm => format!("shm://{}", dir.join(format!("{tag}.shm")).display()),
            Transport::Unix => format!("unix://{}", dir.join(format!("{tag}.sock")).display()),
            Transport::Tcp => "tcp://127.0.0.1:0".to_owned(),
            Transport::Fifo => format!("fifo://{}", dir.join(tag).display()),
        }
    }

    /// The transport of a URL, if the bench knows it.
    pub fn of_url(url: &str) -> Option<Transport> {
        let scheme = url.split_once("://")?.0.to_ascii_lowercase();
        KNOWN.into_iter().find(|t| t.name() == scheme)
    }

    /// Whether the broker (or the channel peer) must run inside the bench
    /// process.
    pub fn in_process(self) -> bool {
        self == Transport::Mem
    }

    /// Whether a broker can listen on it (every transport but `fifo`).
    pub fn brokered(self) -> bool {
        self != Transport::Fifo
    }

    /// The bare limit this transport is compared with.
    pub fn bare(self) -> BareKind {
        match self {
            Transport::Mem => BareKind::Threads,
            Transport::Shm => BareKind::SharedMemory,
            Transport::Unix | Transport::Tcp => BareKind::Socket,
            Transport::Fifo => BareKind::None,
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Parses one `--transport` value against the transports of this build.
pub fn parse_transport(s: &str) -> Result<Transport, String> {
    let wanted = s.trim().to_ascii_lowercase();
    let available = Transport::available();
    match available.iter().find(|t| t.name() == wanted) {
        Some(t) => Ok(*t),
        None => Err(format!(
            "unknown transport {s:?}; this build supports {}",
            names(&available)
        )),
    }
}

/// `a, b or c`.
pub fn names<T: fmt::Display>(items: &[T]) -> String {
    let names: Vec<String> = items.iter().map(ToString::to_string).collect();
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_transports_are_always_there() {
        let all = Transport::available();
        for t in [
            Transport::Mem,
            Transport::Unix,
            Transport::Tcp,
            Transport::Fifo,
        ] {
            assert!(all.contains(&t), "{t}");
        }
        assert_eq!(parse_transport("TCP"), Ok(Transport::Tcp));
        let err = parse_transport("udp").unwrap_err();
        assert!(err.contains("unknown transport \"udp\""), "{err}");
        assert!(err.contains("tcp"), "{err}");
    }

    #[test]
    fn shm_follows_the_url_parser() {
        let parses = "shm://x".parse::<Url>().is_ok();
        assert_eq!(Transport::Shm.is_available(), parses);
        assert_eq!(parse_transport("shm").is_ok(), parses);
    }

    #[test]
    fn urls() {
        let dir = Path::new("d");
        assert_eq!(
            Transport::Unix.listen_url(dir, "broker"),
            "unix://d/broker.sock"
        );
        assert_eq!(Transport::Tcp.listen_url(dir, "x"), "tcp://127.0.0.1:0");
        assert_eq!(Transport::Fifo.listen_url(dir, "c"), "fifo://d/c");
        assert!(!Transport::Fifo.brokered() && Transport::Shm.brokered());
        assert_eq!(Transport::of_url("unix:///a"), Some(Transport::Unix));
        assert_eq!(Transport::of_url("TCP://h:1"), Some(Transport::Tcp));
        assert_eq!(Transport::of_url("nothing"), None);
        assert_eq!(names(&["a", "b", "c"]), "a, b or c");
        assert_eq!(names(&["a"]), "a");
    }
}
