use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::WaitStrategy;

/// A transport address.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Url {
    /// `tcp://host:port`. The host is a name or an IP literal (IPv6 in brackets).
    Tcp {
        /// Host name or IP literal, brackets removed.
        host: String,
        /// Port; 0 asks the OS for a free port when listening.
        port: u16,
    },
    /// `unix:///absolute/path` or `unix://relative/path`.
    Unix(PathBuf),
    /// `mem://name`: in-process, for embedding and tests.
    Mem(String),
    /// `fifo:///path`: a pair of named pipes, `PATH.up` and `PATH.down`;
    /// for point-to-point channels only.
    Fifo(PathBuf),
    /// `shm://name[?ring=SIZE]`: shared memory between processes of one
    /// machine. `name` is a plain name (a socket in the user's private
    /// directory) or an absolute socket path (`shm:///run/app/bus.sock`);
    /// `ring` asks for rings of that many bytes per direction (rounded up to
    /// a power of two, at most 64 MiB; default 4 MiB).
    Shm {
        /// The name, or an absolute socket path.
        name: String,
        /// Ring bytes per direction asked for; `None` takes the listener's default.
        ring: Option<usize>,
    },
}

/// Why a URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// No `scheme://`.
    #[error(
        "{0:?} is not a URL; expected tcp://host:port, unix:///path, shm://name or mem://name"
    )]
    NoScheme(String),
    /// A scheme this build does not know.
    #[error("unknown scheme {0:?}; expected tcp, unix, shm, mem or fifo")]
    UnknownScheme(String),
    /// The address part is malformed.
    #[error("bad address in {url:?}: {reason}")]
    BadAddress {
        /// The URL given.
        url: String,
        /// What is wrong.
        reason: &'static str,
    },
}

impl FromStr for Url {
    type Err = UrlError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (scheme, rest) = s
            .split_once("://")
            .ok_or_else(|| UrlError::NoScheme(s.to_owned()))?;
        let bad = |reason| UrlError::BadAddress {
            url: s.to_owned(),
            reason,
        };
        match scheme.to_ascii_lowercase().as_str() {
            "tcp" => {
                let rest = rest.trim_end_matches('/');
                let (host, port) = rest.rsplit_once(':').ok_or_else(|| bad("missing :port"))?;
                let port: u16 = port
                    .parse()
                    .map_err(|_| bad("port is not a number 0-65535"))?;
                let host = host
                    .strip_prefix('[')
                    .and_then(|h| h.strip_suffix(']'))
                    .unwrap_or(host);
                if host.is_empty() {
                    return Err(bad("missing host"));
                }
                Ok(Url::Tcp {
                    host: host.to_owned(),
                    port,
                })
            }
            "unix" => {
                if rest.is_empty() {
                    return Err(bad("missing socket path"));
                }
                Ok(Url::Unix(PathBuf::from(rest)))
            }
            "mem" => {
                if rest.is_empty() {
                    return Err(bad("missing name"));
                }
                Ok(Url::Mem(rest.to_owned()))
            }
            "shm" => parse_shm(rest).map_err(bad),
            "fifo" => {
                if rest.is_empty() {
                    return Err(bad("missing path"));
                }
                Ok(Url::Fifo(PathBuf::from(rest)))
            }
            other => Err(UrlError::UnknownScheme(other.to_owned())),
        }
    }
}

impl Url {
    /// How a reader on this transport waits unless told otherwise. Over
    /// shared memory it spins about as long as a wake-up costs, then sleeps:
    /// a peer that answers within that never pays for a wake-up. Over a
    /// socket or a pipe it sleeps at once, since every look costs a system
    /// call.
    pub fn default_wait(&self) -> WaitStrategy {
        match self {
            Url::Shm { .. } => WaitStrategy::default(),
            _ => WaitStrategy::PARK,
        }
    }
}

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Url::Tcp { host, port } if host.contains(':') => write!(f, "tcp://[{host}]:{port}"),
            Url::Tcp { host, port } => write!(f, "tcp://{host}:{port}"),
            Url::Unix(p) => write!(f, "unix://{}", p.display()),
            Url::Mem(n) => write!(f, "mem://{n}"),
            Url::Fifo(p) => write!(f, "fifo://{}", p.display()),
            Url::Shm { name, ring: None } => write!(f, "shm://{name}"),
            Url::Shm {
                name,
                ring: Some(r),
            } => write!(f, "shm://{name}?ring={r}"),
        }
    }
}

/// Longest plain shm name (a socket path must fit in about 100 bytes).
const MAX_SHM_NAME: usize = 64;

fn parse_shm(rest: &str) -> Result<Url, &'static str> {
    let (name, query) = match rest.split_once('?') {
        Some((n, q)) => (n, Some(q)),
        None => (rest, None),
    };
    if name.is_empty() {
        return Err("missing name");
    }
    if name.starts_with('/') {
        if name.contains('\0') {
            return Err("a socket path cannot contain NUL");
        }
    } else if name.len() > MAX_SHM_NAME
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        || name.starts_with('.')
    {
        return Err("a shm name is 1-64 of A-Z a-z 0-9 . _ - (not starting with .), or an absolute socket path");
    }
    let mut ring = None;
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        match pair.split_once('=') {
            Some(("ring", v)) => {
                let size: bytesize::ByteSize =
                    v.parse().map_err(|_| "ring= takes a size like 4MiB")?;
                ring = Some(usize::try_from(size.as_u64()).map_err(|_| "ring size too large")?);
            }
            _ => return Err("unknown shm option; the one option is ring=SIZE"),
        }
    }
    Ok(Url::Shm {
        name: name.to_owned(),
        ring,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_spins_before_it_sleeps_and_sockets_sleep_at_once() {
        let wait = |u: &str| u.parse::<Url>().unwrap().default_wait();
        assert_eq!(wait("shm://bus"), WaitStrategy::default());
        assert!(wait("shm://bus").spin().is_some_and(|s| !s.is_zero()));
        for u in ["tcp://127.0.0.1:1", "unix:///a.sock", "mem://x"] {
            assert_eq!(wait(u), WaitStrategy::PARK, "{u}");
        }
    }

    #[test]
    fn parse_and_display() {
        for s in [
            "tcp://127.0.0.1:33333",
            "tcp://[::1]:80",
            "tcp://localhost:0",
            "unix:///tmp/a.sock",
            "mem://x",
            "shm://bus",
            "shm:///run/app/bus.sock",
            "shm://bus?ring=4194304",
            "fifo:///tmp/pipe",
        ] {
            assert_eq!(s.parse::<Url>().unwrap().to_string(), s);
        }
        assert!(matches!(
            "tcp://host".parse::<Url>(),
            Err(UrlError::BadAddress { .. })
        ));
        assert!(matches!(
            "udp://h:1".parse::<Url>(),
            Err(UrlError::UnknownScheme(_))
        ));
        assert!(matches!(
            "localhost:1".parse::<Url>(),
            Err(UrlError::NoScheme(_))
        ));
        assert!(matches!(
            "tcp://h:99999".parse::<Url>(),
            Err(UrlError::BadAddress { .. })
        ));
        assert_eq!(
            "shm://bus?ring=4MiB".parse::<Url>().unwrap(),
            Url::Shm {
                name: "bus".into(),
                ring: Some(4 << 20)
            }
        );
        for bad in [
            "shm://",
            "shm://a/b",
            "shm://../x",
            "shm://.hidden",
            "shm://bus?ring=lots",
            "shm://bus?size=1",
        ] {
            assert!(
                matches!(bad.parse::<Url>(), Err(UrlError::BadAddress { .. })),
                "{bad}"
            );
        }
    }
}
