//! How many nodes reach a target IOPS, from a node's per-second IOPS
//! distribution (the samples of one saved run).
//!
//! Model: the cluster's IOPS in a second is the sum of `n` independent
//! draws from the per-second distribution of one node. We want the
//! smallest `n` with `P(sum >= target) >= confidence`, computed two ways:
//!
//! * [`monte_carlo`]: draws with replacement from the raw samples, `trials`
//!   sums per candidate `n`, seeded so a run is reproducible;
//! * [`exact`]: the samples are put into `B` equal-width buckets between the
//!   smallest and largest sample, each represented by its LOWER edge (so the
//!   result is conservative: it never over-states a node), and the bucketed
//!   distribution is convolved with itself `n` times; the probability is
//!   then read off exactly.
//!
//! Both answer the same question about the same samples; they differ only by
//! sampling noise (Monte Carlo) and bucket rounding (enumeration), so they
//! agree to within a node in practice. Also given: the best case (every node
//! at its best second) and the "all nodes dip together" bound (perfect
//! correlation: every node at the level it reaches with `confidence`).

use anyhow::{bail, ensure};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::stats::level_reached_with;

/// Largest node count any method will consider.
pub const MAX_NODES: u64 = 1_000_000;
/// Work limit (draws or multiply-adds) of one estimate, to stay interactive.
const WORK_LIMIT: f64 = 2e10;

fn check_samples(samples: &[f64], target: f64) -> anyhow::Result<()> {
    ensure!(!samples.is_empty(), "no samples");
    ensure!(
        samples.iter().all(|v| v.is_finite() && *v >= 0.0),
        "samples must be finite and non-negative"
    );
    ensure!(
        target.is_finite() && target > 0.0,
        "target must be positive"
    );
    ensure!(
        samples.iter().any(|v| *v > 0.0),
        "every sample is zero: no number of nodes reaches the target"
    );
    Ok(())
}

/// Nodes needed if every node delivered its best second: ceil(target / max).
pub fn best_case(samples: &[f64], target: f64) -> anyhow::Result<u64> {
    check_samples(samples, target)?;
    let max = samples.iter().copied().fold(0.0, f64::max);
    Ok(ceil_div(target, max))
}

/// ceil(a / b) for positive numbers, tolerant of float noise (1e-12 relative).
fn ceil_div(a: f64, b: f64) -> u64 {
    let q = a / b;
    (q - q.abs() * 1e-12).ceil().max(1.0) as u64
}

/// Nodes needed if all nodes dip together (fully correlated): ceil(target / L)
/// where L is the level one node reaches or beats with `confidence` in the
/// samples. `None` if that level is zero.
pub fn all_dip_bound(samples: &[f64], target: f64, confidence: f64) -> anyhow::Result<Option<u64>> {
    check_samples(samples, target)?;
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let level = level_reached_with(&s, confidence);
    Ok((level > 0.0).then(|| ceil_div(target, level)))
}

/// A node count found by one method, with the probability it achieves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Found {
    pub nodes: u64,
    /// P(sum of `nodes` draws >= target) as that method computes it.
    pub probability: f64,
}

fn seed_for(seed: u64, n: u64) -> u64 {
    // splitmix64 finaliser of (seed, n): independent streams per n.
    let mut z = seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Monte Carlo estimate of P(sum of `n` independent draws >= target), from
/// `trials` sums, reproducible from `seed`.
pub fn prob_monte_carlo(samples: &[f64], target: f64, n: u64, trials: u64, seed: u64) -> f64 {
    if samples.is_empty() || trials == 0 {
        return 0.0;
    }
    let mut rng = SmallRng::seed_from_u64(seed_for(seed, n));
    let m = samples.len();
    let mut hits = 0u64;
    for _ in 0..trials {
        let mut sum = 0.0;
        for _ in 0..n {
            sum += samples[rng.random_range(0..m)];
        }
        if sum >= target * (1.0 - 1e-12) {
            hits += 1;
        }
    }
    hits as f64 / trials as f64
}

/// Smallest `n` whose Monte Carlo probability reaches `confidence`: an
/// exponential search from the best case, then bisection (P grows with n,
/// since samples are non-negative).
pub fn monte_carlo(
    samples: &[f64],
    target: f64,
    confidence: f64,
    trials: u64,
    seed: u64,
) -> anyhow::Result<Found> {
    check_samples(samples, target)?;
    ensure!(trials > 0, "trials must be positive");
    ensure!(
        (0.0..=1.0).contains(&confidence),
        "confidence must be in [0, 1]"
    );
    let lo0 = best_case(samples, target)?;
    let mut work = 0f64;
    let mut p = |n: u64| -> anyhow::Result<f64> {
        work += n as f64 * trials as f64;
        if work > WORK_LIMIT {
            bail!("Monte Carlo needs too much work at {n} nodes; use fewer --trials");
        }
        Ok(prob_monte_carlo(samples, target, n, trials, seed))
    };
    // Exponential search for an n that reaches the confidence.
    let mut lo = lo0; // candidate; everything below lo0 has P = 0
    let mut p_lo = p(lo)?;
    if p_lo >= confidence {
        return Ok(Found {
            nodes: lo,
            probability: p_lo,
        });
    }
    let mut step = 1u64.max(lo / 4);
    let (mut hi, mut p_hi);
    loop {
        hi = lo + step;
        if hi > MAX_NODES {
            bail!("more than {MAX_NODES} nodes needed");
        }
        p_hi = p(hi)?;
        if p_hi >= confidence {
            break;
        }
        lo = hi;
        p_lo = p_hi;
        step *= 2;
    }
    let _ = p_lo;
    // Invariant: P(lo) < confidence <= P(hi).
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let pm = p(mid)?;
        if pm >= confidence {
            hi = mid;
            p_hi = pm;
        } else {
            lo = mid;
        }
    }
    Ok(Found {
        nodes: hi,
        probability: p_hi,
    })
}

/// The samples on a lattice: bucket `k` stands for `lo + k * width`, its
/// lower edge; `pmf[k]` is the fraction of samples in it.
#[derive(Debug, Clone)]
pub struct Bucketed {
    pub lo: f64,
    pub width: f64,
    pub pmf: Vec<f64>,
}

/// Puts samples into `buckets` equal-width buckets whose lower edges run
/// from the smallest sample to the largest (width = range / (B - 1)), so
/// both extremes sit exactly on an edge; every sample is represented by the
/// lower edge of its bucket, which is never above the sample.
pub fn bucketize(samples: &[f64], buckets: usize) -> Bucketed {
    let lo = samples.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if buckets < 2 || hi <= lo {
        return Bucketed {
            lo,
            width: 0.0,
            pmf: vec![1.0],
        };
    }
    let width = (hi - lo) / (buckets - 1) as f64;
    let mut counts = vec![0u64; buckets];
    for &x in samples {
        let k = if x >= hi {
            buckets - 1
        } else {
            let f = (x - lo) / width;
            ((f + f.abs() * 1e-12).floor() as usize).min(buckets - 1)
        };
        counts[k] += 1;
    }
    let n = samples.len() as f64;
    Bucketed {
        lo,
        width,
        pmf: counts.iter().map(|&c| c as f64 / n).collect(),
    }
}

/// Smallest K with `n * lo + K * width >= target` (0 if already met).
fn threshold(b: &Bucketed, target: f64, n: u64) -> usize {
    let need = target - n as f64 * b.lo;
    if need <= target.abs() * 1e-12 {
        return 0;
    }
    let x = need / b.width;
    (x - x.abs() * 1e-12).ceil().max(0.0) as usize
}

/// Exact P(sum of `n` draws >= target) for the bucketed distribution; for
/// each n = 1, 2, ... in turn, calls `visit(n, p)` until it returns false.
fn for_each_n(
    b: &Bucketed,
    target: f64,
    mut visit: impl FnMut(u64, f64) -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    if b.width == 0.0 {
        // One value: the sum of n draws is n * lo exactly.
        for n in 1..=MAX_NODES {
            let p = if n as f64 * b.lo >= target * (1.0 - 1e-12) {
                1.0
            } else {
                0.0
            };
            if !visit(n, p)? {
                return Ok(());
            }
        }
        bail!("more than {MAX_NODES} nodes needed");
    }
    // dist[K] = P(sum of bucket indices == K) for K < cap; dist[cap] = P(>= cap),
    // where cap = threshold(n): once the sum reaches it, it stays enough for
    // every larger n (indices only add, thresholds only fall).
    let pmf = &b.pmf;
    let mut dist: Vec<f64> = vec![1.0]; // n = 0: K = 0 surely
    let mut absorbed = 0.0;
    let mut work = 0f64;
    for n in 1..=MAX_NODES {
        let cap = threshold(b, target, n);
        // Cells K < cap of the sum of n indices; mass reaching cap is absorbed.
        let mut next = vec![0.0; (dist.len() + pmf.len() - 1).min(cap)];
        let mut gone = 0.0;
        for (i, &d) in dist.iter().enumerate() {
            if d == 0.0 {
                continue;
            }
            for (k, &q) in pmf.iter().enumerate() {
                let j = i + k;
                if j >= cap {
                    gone += d * q;
                } else {
                    next[j] += d * q;
                }
            }
        }
        work += (dist.len() * pmf.len()) as f64;
        if work > WORK_LIMIT {
            bail!("exact enumeration needs too much work at {n} nodes; use fewer --buckets");
        }
        absorbed += gone;
        if cap == 0 {
            absorbed = 1.0;
        }
        dist = next;
        if !visit(n, absorbed.min(1.0))? {
            return Ok(());
        }
    }
    bail!("more than {MAX_NODES} nodes needed");
}

/// Exact P(sum of `n` draws >= target) for the samples put into `buckets` buckets.
pub fn prob_exact(samples: &[f64], target: f64, n: u64, buckets: usize) -> anyhow::Result<f64> {
    check_samples(samples, target)?;
    let b = bucketize(samples, buckets);
    let mut out = 0.0;
    for_each_n(&b, target, |k, p| {
        out = p;
        Ok(k < n)
    })?;
    Ok(out)
}

/// Smallest `n` whose exact (bucketed, conservative) probability reaches `confidence`.
pub fn exact(
    samples: &[f64],
    target: f64,
    confidence: f64,
    buckets: usize,
) -> anyhow::Result<Found> {
    check_samples(samples, target)?;
    ensure!(
        (0.0..=1.0).contains(&confidence),
        "confidence must be in [0, 1]"
    );
    let b = bucketize(samples, buckets.max(1));
    let mut found = None;
    for_each_n(&b, target, |n, p| {
        if p >= confidence - 1e-12 {
            found = Some(Found {
                nodes: n,
                probability: p,
            });
            Ok(false)
        } else {
            Ok(true)
        }
    })?;
    found.ok_or_else(|| anyhow::anyhow!("no node count reaches the confidence"))
}

/// Parameters of [`estimate`].
#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub target: f64,
    pub confidence: f64,
    pub seed: u64,
    pub trials: u64,
    pub buckets: usize,
}

/// Everything the provision table shows for one run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Estimate {
    pub name: String,
    pub seconds: usize,
    pub max_iops: f64,
    /// Level one node reaches or beats with the confidence.
    pub level_at_confidence: f64,
    pub best_case: u64,
    pub monte_carlo: Result<(u64, f64), String>,
    pub exact: Result<(u64, f64), String>,
    pub all_dip: Option<u64>,
}

impl Estimate {
    /// Confidence-level nodes over best-case nodes (exact column, else Monte Carlo).
    pub fn ratio(&self) -> Option<f64> {
        let n = self
            .exact
            .as_ref()
            .or(self.monte_carlo.as_ref())
            .ok()
            .map(|(n, _)| *n)?;
        Some(n as f64 / self.best_case as f64)
    }
}

/// Runs every method on one run's samples.
pub fn estimate(name: &str, samples: &[f64], p: &Params) -> anyhow::Result<Estimate> {
    check_samples(samples, p.target)?;
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let mc = monte_carlo(samples, p.target, p.confidence, p.trials, p.seed)
        .map(|f| (f.nodes, f.probability))
        .map_err(|e| e.to_string());
    let ex = exact(samples, p.target, p.confidence, p.buckets)
        .map(|f| (f.nodes, f.probability))
        .map_err(|e| e.to_string());
    Ok(Estimate {
        name: name.to_string(),
        seconds: samples.len(),
        max_iops: s[s.len() - 1],
        level_at_confidence: level_reached_with(&s, p.confidence),
        best_case: best_case(samples, p.target)?,
        monte_carlo: mc,
        exact: ex,
        all_dip: all_dip_bound(samples, p.target, p.confidence)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// P(Binomial(n, p) >= k).
    fn binom_tail(n: u64, p: f64, k: i64) -> f64 {
        if k <= 0 {
            return 1.0;
        }
        let mut total = 0.0;
        for j in (k as u64)..=n {
            // C(n, j) p^j (1-p)^(n-j) via logs
            let lc: f64 = (1..=n).map(|i| (i as f64).ln()).sum::<f64>()
                - (1..=j).map(|i| (i as f64).ln()).sum::<f64>()
                - (1..=n - j).map(|i| (i as f64).ln()).sum::<f64>();
            total += (lc + j as f64 * p.ln() + (n - j) as f64 * (1.0 - p).ln()).exp();
        }
        total
    }

    #[test]
    fn constant_rate_needs_ceil_target_over_rate_everywhere() {
        for (rate, target) in [
            (12_000.0f64, 100_000.0f64),
            (10_000.0, 100_000.0),
            (7.0, 50.0),
        ] {
            let s = vec![rate; 30];
            let want = (target / rate).ceil() as u64;
            assert_eq!(best_case(&s, target).unwrap(), want);
            assert_eq!(monte_carlo(&s, target, 0.99, 1000, 1).unwrap().nodes, want);
            assert_eq!(exact(&s, target, 0.99, 64).unwrap().nodes, want);
            assert_eq!(all_dip_bound(&s, target, 0.99).unwrap(), Some(want));
        }
    }

    #[test]
    fn two_level_matches_binomial() {
        // 70 % of seconds at 10k, 30 % at 5k. Sum of n = 5k n + 5k H, H ~ Bin(n, 0.7).
        let mut s = vec![10_000.0; 70];
        s.extend(vec![5_000.0; 30]);
        let target = 100_000.0;
        let conf = 0.99;
        let want = (1..100u64)
            .find(|&n| binom_tail(n, 0.7, 20 - n as i64) >= conf)
            .unwrap();
        for n in [10u64, 11, 12, 13, 14, 15] {
            let exact_p = prob_exact(&s, target, n, 50).unwrap();
            let b = binom_tail(n, 0.7, 20 - n as i64);
            assert!((exact_p - b).abs() < 1e-9, "n={n}: {exact_p} vs {b}");
        }
        assert_eq!(exact(&s, target, conf, 50).unwrap().nodes, want);
        assert_eq!(exact(&s, target, conf, 2).unwrap().nodes, want);
        assert_eq!(
            monte_carlo(&s, target, conf, 100_000, 7).unwrap().nodes,
            want
        );
        assert_eq!(best_case(&s, target).unwrap(), 10);
        assert_eq!(all_dip_bound(&s, target, conf).unwrap(), Some(20));
    }

    fn spread_samples() -> Vec<f64> {
        // A provider that peaks at 16k but often falls to 6k.
        let mut rng = SmallRng::seed_from_u64(42);
        (0..600)
            .map(|_| {
                if rng.random_bool(0.2) {
                    rng.random_range(6_000.0..8_000.0)
                } else {
                    rng.random_range(12_000.0..16_000.0)
                }
            })
            .map(|v: f64| v.round())
            .collect()
    }

    #[test]
    fn monte_carlo_is_reproducible_and_close_to_exact() {
        let s = spread_samples();
        let target = 100_000.0;
        let a = monte_carlo(&s, target, 0.99, 20_000, 123).unwrap();
        let b = monte_carlo(&s, target, 0.99, 20_000, 123).unwrap();
        assert_eq!(a, b, "same seed, same answer");
        assert_eq!(
            prob_monte_carlo(&s, target, 9, 5000, 9),
            prob_monte_carlo(&s, target, 9, 5000, 9)
        );
        let e = exact(&s, target, 0.99, 200).unwrap();
        // Stated tolerance: the two agree within one node...
        assert!(a.nodes.abs_diff(e.nodes) <= 1, "mc {a:?} exact {e:?}");
        // ...and the probabilities at a fixed n within 0.02 (MC noise with
        // 20k trials is ~0.004; bucket rounding at 200 buckets is smaller).
        for n in [8u64, 9, 10, 11] {
            let pm = prob_monte_carlo(&s, target, n, 20_000, 5);
            let pe = prob_exact(&s, target, n, 200).unwrap();
            assert!((pm - pe).abs() < 0.02, "n={n}: mc {pm} exact {pe}");
            // bucketing at lower edges is conservative
            assert!(pe <= pm + 0.01);
        }
        let best = best_case(&s, target).unwrap();
        let dip = all_dip_bound(&s, target, 0.99).unwrap().unwrap();
        assert!(
            best <= e.nodes && e.nodes <= dip,
            "{best} <= {e:?} <= {dip}"
        );
    }

    #[test]
    fn rejects_nonsense() {
        assert!(best_case(&[], 10.0).is_err());
        assert!(best_case(&[0.0, 0.0], 10.0).is_err());
        assert!(best_case(&[1.0], -1.0).is_err());
        assert_eq!(all_dip_bound(&[0.0, 0.0, 5.0], 10.0, 0.99).unwrap(), None);
    }
}
