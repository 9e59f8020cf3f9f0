//! Latency histograms (HdrHistogram) and the percentiles the report shows.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// The longest latency a histogram holds exactly; longer ones are clamped.
const HIGHEST_NS: u64 = 3_600_000_000_000;

/// An empty histogram of nanoseconds, 3 significant digits, 1 ns to 1 h.
pub fn histogram() -> Histogram<u64> {
    // The bounds are constants that `new_with_bounds` accepts; fall back to
    // an auto-resizing histogram rather than fail if that ever changes.
    Histogram::new_with_bounds(1, HIGHEST_NS, 3).unwrap_or_else(|_| {
        let mut h = Histogram::new(3).unwrap_or_else(|_| unreachable!("3 digits is valid"));
        h.auto(true);
        h
    })
}

/// Records one latency; values past the histogram's range are clamped.
pub fn record(h: &mut Histogram<u64>, latency: Duration) {
    let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
    h.saturating_record(ns.max(1));
}

/// The percentiles of one latency distribution, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Latency {
    /// Samples.
    pub count: u64,
    /// Mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// 99.99th percentile.
    pub p9999_us: f64,
    /// Largest sample.
    pub max_us: f64,
}

/// A column of the report: its name, and how to read it off a [`Latency`].
pub type Column = (&'static str, fn(&Latency) -> f64);

/// The columns of [`Latency`], in order, with their names in the report.
pub const COLUMNS: [Column; 7] = [
    ("mean", |l| l.mean_us),
    ("p50", |l| l.p50_us),
    ("p90", |l| l.p90_us),
    ("p99", |l| l.p99_us),
    ("p99.9", |l| l.p999_us),
    ("p99.99", |l| l.p9999_us),
    ("max", |l| l.max_us),
];

impl Latency {
    /// The percentiles of `h`.
    pub fn of(h: &Histogram<u64>) -> Latency {
        if h.is_empty() {
            return Latency::default();
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        let q = |p: f64| us(h.value_at_quantile(p));
        Latency {
            count: h.len(),
            mean_us: h.mean() / 1000.0,
            p50_us: q(0.50),
            p90_us: q(0.90),
            p99_us: q(0.99),
            p999_us: q(0.999),
            p9999_us: q(0.9999),
            max_us: us(h.max()),
        }
    }

    /// Field by field, the median of several runs.
    pub fn median(runs: &[Latency]) -> Latency {
        let m = |f: fn(&Latency) -> f64| {
            let v: Vec<f64> = runs.iter().map(f).collect();
            super::report::median(&v).unwrap_or(0.0)
        };
        Latency {
            count: runs.iter().map(|l| l.count).sum(),
            mean_us: m(|l| l.mean_us),
            p50_us: m(|l| l.p50_us),
            p90_us: m(|l| l.p90_us),
            p99_us: m(|l| l.p99_us),
            p999_us: m(|l| l.p999_us),
            p9999_us: m(|l| l.p9999_us),
            max_us: m(|l| l.max_us),
        }
    }
}

/// Of several runs, the one whose p50 is the median: the lower middle one
/// for an even count. So a plotted curve passes through the p50 the table
/// prints (for an odd count), whichever regime each run met.
pub fn median_run(runs: &[Latency]) -> Option<usize> {
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by(|&a, &b| {
        let p50 = |i: usize| runs.get(i).map_or(0.0, |l| l.p50_us);
        p50(a).total_cmp(&p50(b))
    });
    order.get(runs.len().checked_sub(1)? / 2).copied()
}

/// One point of a percentile curve.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CurvePoint {
    /// Percentile, 0 to 100.
    pub percentile: f64,
    /// Latency at that percentile, in microseconds.
    pub us: f64,
}

/// Percentiles drawn on the curve: evenly spaced in "nines".
const CURVE: [f64; 13] = [
    0.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 99.995, 99.999, 100.0,
];

/// The latency at each percentile of [`CURVE`].
pub fn curve(h: &Histogram<u64>) -> Vec<CurvePoint> {
    if h.is_empty() {
        return Vec::new();
    }
    CURVE
        .iter()
        .map(|&p| CurvePoint {
            percentile: p,
            us: h.value_at_percentile(p) as f64 / 1000.0,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_distribution() {
        let mut h = histogram();
        // 1..=10_000 µs, once each.
        for us in 1..=10_000u64 {
            record(&mut h, Duration::from_micros(us));
        }
        let l = Latency::of(&h);
        assert_eq!(l.count, 10_000);
        let close = |got: f64, want: f64| (got - want).abs() <= want * 0.002;
        assert!(close(l.p50_us, 5_000.0), "{l:?}");
        assert!(close(l.p90_us, 9_000.0), "{l:?}");
        assert!(close(l.p99_us, 9_900.0), "{l:?}");
        assert!(close(l.p999_us, 9_990.0), "{l:?}");
        assert!(close(l.max_us, 10_000.0), "{l:?}");
        assert!(close(l.mean_us, 5_000.5), "{l:?}");
        let values: Vec<f64> = COLUMNS.iter().skip(1).map(|(_, f)| f(&l)).collect();
        assert!(values.windows(2).all(|w| w[0] <= w[1]), "{values:?}");
    }

    #[test]
    fn an_outlier_shows_only_in_the_tail() {
        let mut h = histogram();
        // 0.02% of samples are 5000 times slower.
        for _ in 0..99_980 {
            record(&mut h, Duration::from_micros(10));
        }
        for _ in 0..20 {
            record(&mut h, Duration::from_millis(50));
        }
        let l = Latency::of(&h);
        assert!(l.p999_us < 11.0, "{l:?}");
        assert!(l.p9999_us > 49_000.0, "{l:?}");
        assert!(l.max_us > 49_000.0, "{l:?}");
    }

    #[test]
    fn medians_and_curves() {
        let a = Latency {
            p50_us: 1.0,
            count: 1,
            ..Latency::default()
        };
        let b = Latency {
            p50_us: 3.0,
            count: 1,
            ..Latency::default()
        };
        let c = Latency {
            p50_us: 2.0,
            count: 1,
            ..Latency::default()
        };
        let m = Latency::median(&[a, b, c]);
        assert_eq!(m.p50_us, 2.0);
        assert_eq!(m.count, 3);
        assert_eq!(
            median_run(&[a, b, c]),
            Some(2),
            "the run with the median p50"
        );
        assert_eq!(median_run(&[b, a]), Some(1), "the lower middle of two");
        assert_eq!(median_run(&[b]), Some(0));
        assert_eq!(median_run(&[]), None);
        let mut h = histogram();
        assert!(curve(&h).is_empty());
        assert_eq!(Latency::of(&h), Latency::default());
        record(&mut h, Duration::from_micros(7));
        let pts = curve(&h);
        assert_eq!(pts.len(), CURVE.len());
        assert!(pts.iter().all(|p| (p.us - 7.0).abs() < 0.01), "{pts:?}");
    }
}
