//! How a reader waits for bytes that have not arrived yet.

use std::time::Duration;

/// How a reader waits for data, in the spirit of Aeron's idle strategies.
///
/// Waking a thread that sleeps costs a system call on the writing side and,
/// across cores, tens of microseconds before the sleeper runs (50-70 µs on a
/// small VM); polling costs nothing but the CPU it burns. A strategy picks
/// the trade-off: spin while a reply is likely to be close, sleep otherwise.
///
/// Spinning strategies poll inline, on the thread that reads; they are meant
/// for threads that do nothing else while they wait (the blocking client's
/// calling thread, a broker session on a thread of its own, a channel end).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WaitStrategy {
    /// Never sleep: poll without pause. The lowest latency; burns a whole
    /// core for as long as it waits.
    BusySpin,
    /// Poll for `spin`, then keep polling but yield the thread between polls,
    /// so another runnable thread on the same core gets its turn.
    SpinYield {
        /// How long to poll before yielding.
        spin: Duration,
    },
    /// Poll for `spin`, then sleep until woken. With a zero `spin` this is
    /// plain blocking I/O: no CPU burnt, a wake-up's latency on every message
    /// that finds the reader asleep.
    SpinPark {
        /// How long to poll before sleeping.
        spin: Duration,
    },
}

impl WaitStrategy {
    /// Sleep at once: the default for sockets, whose every poll is a system call.
    pub const PARK: WaitStrategy = WaitStrategy::SpinPark {
        spin: Duration::ZERO,
    };

    /// How long to poll before giving the thread up; `None` is forever.
    pub fn spin(&self) -> Option<Duration> {
        match self {
            WaitStrategy::BusySpin => None,
            WaitStrategy::SpinYield { spin } | WaitStrategy::SpinPark { spin } => Some(*spin),
        }
    }

    /// Whether this strategy polls at all before sleeping.
    pub fn spins(&self) -> bool {
        self.spin() != Some(Duration::ZERO)
    }

    /// Whether this strategy ever sleeps.
    pub fn parks(&self) -> bool {
        matches!(self, WaitStrategy::SpinPark { .. })
    }
}

impl Default for WaitStrategy {
    fn default() -> Self {
        WaitStrategy::PARK
    }
}

impl std::fmt::Display for WaitStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WaitStrategy::BusySpin => f.write_str("busy-spin"),
            WaitStrategy::SpinYield { spin } => write!(f, "spin-yield:{}us", spin.as_micros()),
            WaitStrategy::SpinPark { spin } if spin.is_zero() => f.write_str("park"),
            WaitStrategy::SpinPark { spin } => write!(f, "spin-park:{}us", spin.as_micros()),
        }
    }
}

/// Why a wait strategy was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad wait strategy {0:?}; expected park, busy-spin, spin-yield[:DURATION] or spin-park[:DURATION] (durations like 50us, 1ms)")]
pub struct WaitStrategyError(pub String);

impl std::str::FromStr for WaitStrategy {
    type Err = WaitStrategyError;

    /// Parses `park`, `busy-spin`, `spin-yield:50us`, `spin-park:20us`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || WaitStrategyError(s.to_owned());
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        let spin = |default: Duration| -> Result<Duration, WaitStrategyError> {
            arg.map_or(Ok(default), |a| parse_micros(a).ok_or_else(bad))
        };
        match name.to_ascii_lowercase().as_str() {
            "park" if arg.is_none() => Ok(WaitStrategy::PARK),
            "busy-spin" | "spin" if arg.is_none() => Ok(WaitStrategy::BusySpin),
            "spin-yield" => Ok(WaitStrategy::SpinYield {
                spin: spin(DEFAULT_SPIN)?,
            }),
            "spin-park" => Ok(WaitStrategy::SpinPark {
                spin: spin(DEFAULT_SPIN)?,
            }),
            _ => Err(bad()),
        }
    }
}

/// The spin budget of `spin-yield` and `spin-park` when none is given:
/// about the cost of one cross-core wake-up here, so a waiter never burns
/// more than it could have saved (the classic 2-competitive spin-then-block).
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// Parses `50us`, `1ms`, `2s`, or a bare number of microseconds.
fn parse_micros(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let micros = match unit.trim() {
        "" | "us" | "µs" => n,
        "ms" => n.checked_mul(1_000)?,
        "s" => n.checked_mul(1_000_000)?,
        _ => return None,
    };
    Some(Duration::from_micros(micros))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display_round_trip() {
        for s in ["park", "busy-spin", "spin-yield:50us", "spin-park:20us"] {
            let w: WaitStrategy = s.parse().unwrap();
            assert_eq!(w.to_string(), s);
        }
        assert_eq!(
            "spin-park:1ms".parse::<WaitStrategy>().unwrap(),
            WaitStrategy::SpinPark {
                spin: Duration::from_millis(1)
            }
        );
        assert_eq!(
            "spin-park".parse::<WaitStrategy>().unwrap(),
            WaitStrategy::SpinPark { spin: DEFAULT_SPIN }
        );
        for bad in ["", "nap", "park:5us", "spin-park:5 parsecs", "spin-yield:"] {
            assert!(bad.parse::<WaitStrategy>().is_err(), "{bad}");
        }
    }

    #[test]
    fn properties() {
        assert!(!WaitStrategy::PARK.spins());
        assert!(WaitStrategy::PARK.parks());
        assert!(WaitStrategy::BusySpin.spins());
        assert_eq!(WaitStrategy::BusySpin.spin(), None);
        assert!(!WaitStrategy::SpinYield { spin: DEFAULT_SPIN }.parks());
    }
}
