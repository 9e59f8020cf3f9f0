//! `--wait`: how every waiting side of one pass of the bench waits.
//!
//! A pass with a strategy applies it to the clients (`ClientOptions::wait`),
//! the broker child (`tubeway server --wait`), both ends of every channel
//! and, when it spins, the bare socket ping-pong (which then polls a
//! non-blocking socket instead of sleeping in `read`), so that each figure
//! is still set against the floor of the same way of waiting. `default`
//! leaves every side to its transport's default.

use std::fmt;

use tubeway::WaitStrategy;

/// The way of waiting of one pass: the defaults, or one strategy for all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wait(pub Option<WaitStrategy>);

impl Wait {
    /// Every side as its transport waits by default.
    pub const DEFAULT: Wait = Wait(None);

    /// The strategy to configure; `None` configures nothing.
    pub fn strategy(self) -> Option<WaitStrategy> {
        self.0
    }

    /// Whether this is the transports' default.
    pub fn is_default(self) -> bool {
        self.0.is_none()
    }

    /// Whether the strategy polls at all before sleeping: latency mode.
    pub fn spins(self) -> bool {
        self.0.is_some_and(|w| w.spins())
    }
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            None => f.write_str("default"),
            Some(w) => write!(f, "{w}"),
        }
    }
}

/// Parses one `--wait` value: `default` or a wait strategy.
pub fn parse_wait(s: &str) -> Result<Wait, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("default") {
        return Ok(Wait::DEFAULT);
    }
    s.parse::<WaitStrategy>()
        .map(|w| Wait(Some(w)))
        .map_err(|e| format!("{e}, or default"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_parse_and_print() {
        assert_eq!(parse_wait("default"), Ok(Wait::DEFAULT));
        let spin = parse_wait("busy-spin").unwrap();
        assert_eq!(spin.to_string(), "busy-spin");
        assert!(spin.spins() && !spin.is_default());
        let park = parse_wait("park").unwrap();
        assert!(!park.spins());
        assert_eq!(
            parse_wait("spin-park:20us").unwrap().to_string(),
            "spin-park:20us"
        );
        assert!(!Wait::DEFAULT.spins());
        let err = parse_wait("nap").unwrap_err();
        assert!(err.contains("or default"), "{err}");
    }
}
