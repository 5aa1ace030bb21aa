//! Exact percentiles over every sample (sorted), and the JSON report.

use serde::Serialize;

/// Milliseconds at the usual percentiles of one set of samples.
#[derive(Debug, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Percentiles {
    /// `None` without samples: a percentile of nothing is not zero.
    pub fn of(mut samples_ms: Vec<f64>) -> Option<Self> {
        if samples_ms.is_empty() {
            return None;
        }
        samples_ms.sort_by(f64::total_cmp);
        let mean = samples_ms.iter().sum::<f64>() / samples_ms.len() as f64;
        Some(Self {
            p50: nearest_rank(&samples_ms, 50.0),
            p90: nearest_rank(&samples_ms, 90.0),
            p99: nearest_rank(&samples_ms, 99.0),
            max: samples_ms[samples_ms.len() - 1],
            mean,
        })
    }
}

/// The nearest-rank percentile: the smallest sample with at least `p`% of samples at or below it.
fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// What one invocation prints: the same shape as bench/pyload.py's, so the harness reads both.
#[derive(Debug, Serialize)]
pub struct Report {
    pub tool: &'static str,
    pub scenario: String,
    pub clients: usize,
    /// How many base URLs (server processes) the clients were spread over.
    pub urls: usize,
    pub duration_s: f64,
    pub runs: usize,
    pub errors: u64,
    pub runs_per_s: f64,
    pub latency_ms: Option<Percentiles>,
    pub first_event_ms: Option<Percentiles>,
    pub first_error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::Percentiles;

    #[test]
    fn nearest_rank_percentiles() {
        let p = Percentiles::of((1..=100).map(f64::from).collect()).unwrap();
        assert_eq!((p.p50, p.p90, p.p99, p.max), (50.0, 90.0, 99.0, 100.0));
        let one = Percentiles::of(vec![7.0]).unwrap();
        assert_eq!((one.p50, one.p99), (7.0, 7.0));
        assert!(Percentiles::of(Vec::new()).is_none());
    }
}
