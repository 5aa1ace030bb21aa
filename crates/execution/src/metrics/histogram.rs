//! A histogram of durations recorded with atomic additions only.
//!
//! prometheus-client's own `Histogram` takes a mutex at every observation; the ones here are
//! observed on every run and every storage call, from every worker thread at once, so an
//! observation is three relaxed atomic additions (its bucket, the count, the sum) and the
//! library only encodes what they hold.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// A histogram of seconds over fixed bucket bounds (upper bounds, ascending); clones share it.
#[derive(Clone, Debug)]
pub struct Histogram {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative); the last one is `+Inf`'s.
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    /// In nanoseconds: an integer sum is one atomic addition.
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]), "ascending bounds");
        let buckets = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Self {
            inner: Arc::new(Inner {
                bounds,
                buckets,
                count: AtomicU64::new(0),
                sum_nanos: AtomicU64::new(0),
            }),
        }
    }

    pub fn observe(&self, elapsed: Duration) {
        let inner = &*self.inner;
        let seconds = elapsed.as_secs_f64();
        let bucket = inner.bounds.partition_point(|&bound| bound < seconds);
        inner.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        inner.count.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        inner.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.inner.count.load(Ordering::Relaxed)
    }

    /// The sum of the observations, in seconds.
    pub fn sum(&self) -> f64 {
        self.inner.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let inner = &*self.inner;
        let upper = inner.bounds.iter().copied().chain([f64::INFINITY]);
        let buckets: Vec<(f64, u64)> = upper
            .zip(inner.buckets.iter().map(|b| b.load(Ordering::Relaxed)))
            .collect();
        // The count as the buckets add up, so `_count` equals the `+Inf` bucket even while
        // observations land during the scrape.
        let count = buckets.iter().map(|(_, n)| n).sum();
        encoder.encode_histogram::<NoLabelSet>(self.sum(), count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_fall_in_the_first_bucket_whose_bound_they_do_not_pass() {
        let histogram = Histogram::new(&[0.1, 1.0]);
        histogram.observe(Duration::from_millis(50));
        histogram.observe(Duration::from_millis(100));
        histogram.observe(Duration::from_millis(500));
        histogram.observe(Duration::from_secs(3));
        let counts: Vec<u64> = histogram
            .inner
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        // `le` is inclusive: 0.1 s is in the 0.1 bucket.
        assert_eq!(counts, [2, 1, 1]);
        assert_eq!(histogram.count(), 4);
        assert!((histogram.sum() - 3.65).abs() < 1e-9, "{}", histogram.sum());
    }
}
