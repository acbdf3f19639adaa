//! Statistics of a run: the per-second IOPS series and its summary, a
//! bounded-memory log-linear latency histogram, quantiles and the
//! "X or better" curve.

use serde::{Deserialize, Serialize};

/// Sub-buckets per power of two: relative error of a recorded value is at
/// most 1/128 (< 0.8 %).
const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;
/// Enough buckets for every u64.
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB as usize;

/// A log-linear histogram of `u64` values (latencies in nanoseconds): exact
/// below 128, then 128 equal sub-buckets per power of two. Fixed size
/// (~59 KiB), mergeable, whatever the number of samples.
#[derive(Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    count: u64,
    sum: u128,
    min: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count)
            .field("min", &self.min)
            .field("max", &self.max)
            .finish()
    }
}

fn bucket_index(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let h = 63 - v.leading_zeros(); // >= SUB_BITS
    let shift = h - SUB_BITS;
    let group = (shift + 1) as usize;
    group * SUB as usize + ((v >> shift) - SUB) as usize
}

/// Smallest and largest value that land in bucket `i`.
fn bucket_bounds(i: usize) -> (u64, u64) {
    if i < SUB as usize {
        return (i as u64, i as u64);
    }
    let group = (i / SUB as usize) as u32;
    let sub = (i % SUB as usize) as u64;
    let shift = group - 1;
    let lo = (SUB + sub) << shift;
    let hi = lo + ((1u64 << shift) - 1);
    (lo, hi)
}

impl Histogram {
    pub fn new() -> Self {
        Self {
            counts: vec![0; BUCKETS],
            count: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }

    pub fn record(&mut self, v: u64) {
        self.counts[bucket_index(v)] += 1;
        self.count += 1;
        self.sum += u128::from(v);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += *b;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    pub fn count(&self) -> u64 {
        self.count
    }
    pub fn min(&self) -> Option<u64> {
        (self.count > 0).then_some(self.min)
    }
    pub fn max(&self) -> Option<u64> {
        (self.count > 0).then_some(self.max)
    }
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum as f64 / self.count as f64)
    }

    /// The value at quantile `q` (0..=1): the midpoint of the bucket holding
    /// the sample of rank ceil(q * count), clamped to the observed min/max.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let q = q.clamp(0.0, 1.0);
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, hi) = bucket_bounds(i);
                let mid = lo + (hi - lo) / 2;
                return Some(mid.clamp(self.min, self.max));
            }
        }
        Some(self.max)
    }

    /// Non-empty buckets as `(low, high, count)`.
    pub fn buckets(&self) -> Vec<(u64, u64, u64)> {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| {
                let (lo, hi) = bucket_bounds(i);
                (lo, hi, c)
            })
            .collect()
    }

    /// A serialisable summary (percentiles plus the non-empty buckets).
    pub fn summary(&self) -> LatencySummary {
        let p = |q| self.quantile(q).unwrap_or(0);
        LatencySummary {
            count: self.count,
            min_ns: self.min().unwrap_or(0),
            mean_ns: self.mean().unwrap_or(0.0),
            p50_ns: p(0.50),
            p90_ns: p(0.90),
            p95_ns: p(0.95),
            p99_ns: p(0.99),
            p999_ns: p(0.999),
            max_ns: self.max().unwrap_or(0),
            buckets: self.buckets(),
        }
    }
}

/// Latency percentiles in nanoseconds, with the histogram buckets they came from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub min_ns: u64,
    pub mean_ns: f64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p95_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
    /// `[low, high, count]` of every non-empty bucket.
    #[serde(default)]
    pub buckets: Vec<(u64, u64, u64)>,
}

/// Quantile of sorted data by linear interpolation between order
/// statistics (R type 7, as numpy's default).
pub fn quantile_sorted(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let h = (n - 1) as f64 * q.clamp(0.0, 1.0);
            let lo = h.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
        }
    }
}

/// The largest sample value `v` such that at least a fraction `confidence`
/// of the samples are `>= v`: the rate one node reaches or beats with that
/// confidence in the empirical distribution. Conservative (no interpolation).
pub fn level_reached_with(sorted: &[f64], confidence: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let m = sorted.len();
    // P(X >= x[k]) >= (m - k) / m >= confidence  <=>  k <= m (1 - confidence)
    let k = ((m as f64) * (1.0 - confidence.clamp(0.0, 1.0)) + 1e-9).floor() as usize;
    sorted[k.min(m - 1)]
}

/// Summary of the per-second IOPS series.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SeriesSummary {
    pub seconds: usize,
    pub mean: f64,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub p1: f64,
    pub p5: f64,
    pub p95: f64,
    pub p99: f64,
    /// Sample standard deviation (n - 1).
    pub stddev: f64,
    /// Coefficient of variation: stddev / mean.
    pub cv: f64,
}

impl SeriesSummary {
    pub fn of(samples: &[f64]) -> Self {
        let mut s: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let mean = if n > 0 {
            s.iter().sum::<f64>() / n as f64
        } else {
            f64::NAN
        };
        let var = if n > 1 {
            s.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        let stddev = var.sqrt();
        Self {
            seconds: n,
            mean,
            median: quantile_sorted(&s, 0.5),
            min: s.first().copied().unwrap_or(f64::NAN),
            max: s.last().copied().unwrap_or(f64::NAN),
            p1: quantile_sorted(&s, 0.01),
            p5: quantile_sorted(&s, 0.05),
            p95: quantile_sorted(&s, 0.95),
            p99: quantile_sorted(&s, 0.99),
            stddev,
            cv: if mean > 0.0 { stddev / mean } else { f64::NAN },
        }
    }
}

/// The "X or better" curve: for each distinct level `x` among the samples,
/// how many samples reached at least `x`. Points ascend in `x` and their
/// counts fall (a step function, falling to the right).
pub fn x_or_better(samples: &[f64]) -> Vec<(f64, usize)> {
    let mut s: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let mut out = Vec::new();
    let mut i = 0;
    while i < n {
        let v = s[i];
        out.push((v, n - i));
        while i < n && s[i] == v {
            i += 1;
        }
    }
    out
}

/// Mean after dropping `floor(n * frac)` samples at each end.
pub fn trimmed_mean(samples: &[f64], frac: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let k = ((s.len() as f64) * frac).floor() as usize;
    let kept = &s[k.min(s.len() / 2)..s.len() - k.min((s.len() - 1) / 2)];
    kept.iter().sum::<f64>() / kept.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_roundtrip() {
        let mut prev_hi: Option<u64> = None;
        for i in 0..BUCKETS {
            let (lo, hi) = bucket_bounds(i);
            assert!(lo <= hi);
            assert_eq!(bucket_index(lo), i, "lo of {i}");
            assert_eq!(bucket_index(hi), i, "hi of {i}");
            if let Some(p) = prev_hi {
                assert_eq!(lo, p + 1, "contiguous at {i}");
            }
            prev_hi = Some(hi);
        }
        assert_eq!(bucket_bounds(BUCKETS - 1).1, u64::MAX);
    }

    #[test]
    fn histogram_quantiles_within_one_percent() {
        let mut h = Histogram::new();
        for v in 1..=100_000u64 {
            h.record(v * 10);
        }
        assert_eq!(h.count(), 100_000);
        for q in [0.01, 0.5, 0.9, 0.99, 0.999] {
            let exact = (q * 100_000.0_f64).ceil() * 10.0;
            let got = h.quantile(q).unwrap() as f64;
            assert!(
                (got - exact).abs() / exact < 0.01,
                "q={q} exact={exact} got={got}"
            );
        }
        assert_eq!(h.quantile(0.0), Some(10));
        assert_eq!(h.quantile(1.0), Some(1_000_000));
        let mut h2 = Histogram::new();
        h2.record(5);
        h2.merge(&h);
        assert_eq!(h2.count(), 100_001);
        assert_eq!(h2.min(), Some(5));
    }

    #[test]
    fn series_summary_and_curve() {
        let s = SeriesSummary::of(&[10.0, 20.0, 30.0, 40.0]);
        assert_eq!(s.mean, 25.0);
        assert_eq!(s.median, 25.0);
        assert_eq!(s.min, 10.0);
        assert!((s.cv - s.stddev / 25.0).abs() < 1e-12);
        let c = x_or_better(&[5.0, 3.0, 5.0, 9.0]);
        assert_eq!(c, vec![(3.0, 4), (5.0, 3), (9.0, 1)]);
        assert_eq!(level_reached_with(&[1.0, 2.0, 3.0, 4.0], 0.75), 2.0);
        assert_eq!(level_reached_with(&[1.0, 2.0, 3.0, 4.0], 1.0), 1.0);
        assert_eq!(level_reached_with(&[7.0; 10], 0.99), 7.0);
        assert_eq!(
            trimmed_mean(&[1.0, 2.0, 3.0, 4.0, 100.0, 0.0, 2.0, 3.0, 2.0, 3.0], 0.1),
            2.5
        );
    }
}
