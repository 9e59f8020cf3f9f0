use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

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
}

/// Why a URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// No `scheme://`.
    #[error("{0:?} is not a URL; expected tcp://host:port, unix:///path or mem://name")]
    NoScheme(String),
    /// A scheme this build does not know.
    #[error("unknown scheme {0:?}; expected tcp, unix or mem")]
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
            other => Err(UrlError::UnknownScheme(other.to_owned())),
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
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display() {
        for s in [
            "tcp://127.0.0.1:33333",
            "tcp://[::1]:80",
            "tcp://localhost:0",
            "unix:///tmp/a.sock",
            "mem://x",
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
    }
}
