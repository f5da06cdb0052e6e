//! Durations counted in fixed exponential buckets: bucket `i` holds durations up to `1.1^i`
//! ms (rounded up), so a percentile read from them is at most 10% above the true one, in 160
//! counters whatever the number of durations. Server latencies (`tool_health`) and the
//! charts' duration distributions count with it, so neither holds a value per call or trial.

/// The buckets; the last holds everything past about an hour.
const BUCKETS: usize = 160;
const RATIO: f64 = 1.1;

/// The upper bound of bucket `i`, in milliseconds.
fn bucket_bound(i: usize) -> u64 {
    RATIO.powi(i as i32).ceil() as u64
}

/// The bucket of a duration: the first whose bound holds it.
fn bucket_of(ms: u64) -> usize {
    if ms <= 1 {
        return 0;
    }
    // The logarithm's guess, then a step either way for its rounding.
    let mut i = ((ms as f64).ln() / RATIO.ln()).floor() as usize;
    i = i.min(BUCKETS - 1);
    while i < BUCKETS - 1 && bucket_bound(i) < ms {
        i += 1;
    }
    while i > 0 && bucket_bound(i - 1) >= ms {
        i -= 1;
    }
    i
}

/// Durations in milliseconds, counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Durations {
    counts: [u64; BUCKETS],
}

impl Default for Durations {
    fn default() -> Self {
        Durations {
            counts: [0; BUCKETS],
        }
    }
}

impl Durations {
    /// Counts one duration.
    pub fn add(&mut self, ms: u64) {
        self.counts[bucket_of(ms)] += 1;
    }

    /// Adds another's counts.
    pub fn merge(&mut self, other: &Durations) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts) {
            *mine += theirs;
        }
    }

    /// How many were counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The duration at or below which `share` of them came, to within 10% above; `None` when
    /// none was counted.
    pub fn percentile(&self, share: f64) -> Option<u64> {
        let count = self.count();
        if count == 0 {
            return None;
        }
        let wanted = (share * count as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        self.counts.iter().enumerate().find_map(|(i, n)| {
            seen += n;
            (seen >= wanted).then(|| bucket_bound(i))
        })
    }

    /// Each non-empty bucket: its upper bound in ms and its count, shortest first.
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        (self.counts.iter().enumerate())
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| (bucket_bound(i), *n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_bounds_are_within_ten_percent_and_the_first_that_holds() {
        for ms in [0u64, 1, 2, 7, 50, 999, 12_345, 60_000, 3_600_000] {
            let i = bucket_of(ms);
            let bound = bucket_bound(i);
            assert!(
                bound >= ms && bound as f64 <= (ms as f64 * 1.1).max(1.0) + 1.0,
                "{ms} → {bound}"
            );
            assert!(
                i == 0 || bucket_bound(i - 1) < ms,
                "{ms}: not the first bucket"
            );
        }
    }

    #[test]
    fn percentiles_and_buckets_of_counted_durations() {
        let mut durations = Durations::default();
        for ms in [1u64, 2, 3, 4, 5, 6, 7, 8, 9, 100] {
            durations.add(ms);
        }
        assert!((5..=6).contains(&durations.percentile(0.5).unwrap()));
        assert!((100..=110).contains(&durations.percentile(0.95).unwrap()));
        assert_eq!(durations.count(), 10);
        assert_eq!(durations.buckets().map(|(_, n)| n).sum::<u64>(), 10);
        let mut twice = durations.clone();
        twice.merge(&durations);
        assert_eq!(twice.count(), 20);
        assert_eq!(Durations::default().percentile(0.5), None);
    }
}
