//! Every figure mst reports about a run's numbers, computed here and nowhere else: Wilson
//! intervals for pass rates, bootstrap intervals for mean scores, the unbiased pass@k, paired
//! comparisons between variants (Newcombe's interval for a paired difference and McNemar's exact
//! test), and how many paired cases a comparison needs. `summary.json`, the terminal table, the
//! report's charts and `mst runs diff` all read these.

use serde::{Deserialize, Serialize};
use statrs::distribution::{Binomial, ContinuousCDF, DiscreteCDF, Normal};
use std::collections::BTreeMap;

/// The two-sided level of every interval and test: 95%, α = 0.05.
pub const ALPHA: f64 = 0.05;

/// The power a sample size is planned for.
pub const POWER: f64 = 0.8;

/// Resamples of a bootstrap interval.
const RESAMPLES: usize = 2_000;

/// Past this many values a bootstrap interval is the normal one (mean ± z·sd/√n): at that size
/// the two agree, and resampling a million cases 2,000 times would cost seconds.
const BOOTSTRAP_LIMIT: usize = 10_000;

/// The bootstrap's seed: the same run always gets the same interval.
const SEED: u64 = 0x6d73_745f_626f_6f74;

/// The standard normal quantile of `p`.
pub fn z(p: f64) -> f64 {
    Normal::standard().inverse_cdf(p)
}

/// The 95% Wilson score interval of `successes` in `n` trials; `None` when `n` is 0.
pub fn wilson(successes: u64, n: u64) -> Option<[f64; 2]> {
    if n == 0 {
        return None;
    }
    let (k, n) = (successes as f64, n as f64);
    let z = z(1.0 - ALPHA / 2.0);
    let p = k / n;
    let centre = p + z * z / (2.0 * n);
    let spread = z * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt();
    let scale = 1.0 + z * z / n;
    Some([
        ((centre - spread) / scale).max(0.0),
        ((centre + spread) / scale).min(1.0),
    ])
}

/// The unbiased estimate of pass@k for a case with `c` passing trials of `n`: the chance that
/// at least one of `k` trials drawn without replacement passes, 1 − C(n−c, k) / C(n, k),
/// computed as a product so that large `n` does not overflow. `k` must be at most `n`.
pub fn pass_at_k(n: u64, c: u64, k: u64) -> f64 {
    debug_assert!(k <= n && c <= n);
    if n - c < k {
        return 1.0;
    }
    let all_fail: f64 = (n - c + 1..=n).map(|i| 1.0 - k as f64 / i as f64).product();
    1.0 - all_fail
}

/// The most discordant pairs whose binomial tail is summed term by term.
const EXACT_TAIL_LIMIT: u64 = 1_000;

/// McNemar's exact two-sided p-value for `won` and `lost` discordant pairs: twice the binomial
/// tail at ½ of the smaller count, at most 1. With no discordant pair, 1.
pub fn mcnemar_exact(won: u64, lost: u64) -> f64 {
    let n = won + lost;
    if n == 0 {
        return 1.0;
    }
    let smaller = won.min(lost);
    // Summed term by term while ½ⁿ is a normal float (exact to rounding); past that, the
    // regularised incomplete beta function.
    let tail = if n <= EXACT_TAIL_LIMIT {
        let mut term = 0.5f64.powi(n as i32);
        let mut tail = term;
        for i in 0..smaller {
            term *= (n - i) as f64 / (i + 1) as f64;
            tail += term;
        }
        tail
    } else {
        Binomial::new(0.5, n)
            .expect("½ is a probability")
            .cdf(smaller)
    };
    (2.0 * tail).min(1.0)
}

/// A paired 2×2 table over the cases two variants both decided: `both` passed on both,
/// `won` passed on the variant alone, `lost` on the baseline alone, `neither` on none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Paired {
    pub both: u64,
    pub won: u64,
    pub lost: u64,
    pub neither: u64,
}

impl Paired {
    /// Counts one case: whether the variant passed it, and whether the baseline did.
    pub fn add(&mut self, variant: bool, baseline: bool) {
        *match (variant, baseline) {
            (true, true) => &mut self.both,
            (true, false) => &mut self.won,
            (false, true) => &mut self.lost,
            (false, false) => &mut self.neither,
        } += 1;
    }

    /// The cases in the table.
    pub fn cases(&self) -> u64 {
        self.both + self.won + self.lost + self.neither
    }

    /// The variant's pass rate minus the baseline's; `None` without cases.
    pub fn delta(&self) -> Option<f64> {
        let n = self.cases();
        (n > 0).then(|| (self.won as f64 - self.lost as f64) / n as f64)
    }

    /// The 95% interval of [`Paired::delta`]: Newcombe's hybrid score interval for paired
    /// proportions (his method 10), built from each rate's Wilson interval and the correlation
    /// of the pairs, so it stays inside [−1, 1] and is sound at 0 or n discordant pairs.
    pub fn delta_ci(&self) -> Option<[f64; 2]> {
        let delta = self.delta()?;
        let n = self.cases();
        let (a, b, c, d) = (
            self.both as f64,
            self.won as f64,
            self.lost as f64,
            self.neither as f64,
        );
        let (p1, p2) = ((a + b) / n as f64, (a + c) / n as f64);
        let [l1, u1] = wilson(self.both + self.won, n)?;
        let [l2, u2] = wilson(self.both + self.lost, n)?;
        let margins = (a + b) * (c + d) * (a + c) * (b + d);
        let phi = if margins > 0.0 {
            (a * d - b * c) / margins.sqrt()
        } else {
            0.0
        };
        let below = ((p1 - l1).powi(2) - 2.0 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2).powi(2))
            .max(0.0)
            .sqrt();
        let above = ((u1 - p1).powi(2) - 2.0 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2).powi(2))
            .max(0.0)
            .sqrt();
        Some([(delta - below).max(-1.0), (delta + above).min(1.0)])
    }

    /// McNemar's exact p-value of the table.
    pub fn p_value(&self) -> f64 {
        mcnemar_exact(self.won, self.lost)
    }

    /// The share of cases whose verdicts differ; `None` without cases.
    pub fn discordant(&self) -> Option<f64> {
        let n = self.cases();
        (n > 0).then(|| (self.won + self.lost) as f64 / n as f64)
    }
}

/// The mean of `values` with its 95% interval, as [`Sample::mean_with_ci`] gives it.
pub fn mean_with_ci(values: &[f64]) -> Option<(f64, [f64; 2])> {
    let mut sample = Sample::default();
    values.iter().for_each(|v| sample.add(*v));
    sample.mean_with_ci()
}

/// Values whose mean and its interval are wanted, added one at a time. Each is kept while
/// there are at most [`BOOTSTRAP_LIMIT`] (a bootstrap resamples them); past that, only their
/// count, mean and spread (Welford's running sums), all the normal interval needs: a million
/// cases' scores cost a few numbers, not 8 MB.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    kept: Vec<f64>,
    n: u64,
    mean: f64,
    /// The sum of squared differences from the running mean.
    m2: f64,
}

impl Sample {
    /// Adds `value`.
    pub fn add(&mut self, value: f64) {
        self.n += 1;
        let delta = value - self.mean;
        self.mean += delta / self.n as f64;
        self.m2 += delta * (value - self.mean);
        if self.n as usize <= BOOTSTRAP_LIMIT {
            self.kept.push(value);
        } else if !self.kept.is_empty() {
            self.kept = Vec::new();
        }
    }

    /// The mean with its 95% interval: a percentile bootstrap (2,000 resamples, a fixed seed),
    /// or the normal interval past 10,000 values. `None` when there are none; a single
    /// value's interval is that value.
    pub fn mean_with_ci(&self) -> Option<(f64, [f64; 2])> {
        let n = self.n as usize;
        if n == 0 {
            return None;
        }
        if n > BOOTSTRAP_LIMIT {
            let variance = self.m2 / (n - 1) as f64;
            let half = z(1.0 - ALPHA / 2.0) * (variance / n as f64).sqrt();
            return Some((self.mean, [self.mean - half, self.mean + half]));
        }
        let values = &self.kept;
        let mean = values.iter().sum::<f64>() / n as f64;
        let mut rng = fastrand::Rng::with_seed(SEED);
        let mut means: Vec<f64> = (0..RESAMPLES)
            .map(|_| (0..n).map(|_| values[rng.usize(..n)]).sum::<f64>() / n as f64)
            .collect();
        means.sort_by(f64::total_cmp);
        let at = |q: f64| means[((q * RESAMPLES as f64) as usize).min(RESAMPLES - 1)];
        Some((mean, [at(ALPHA / 2.0), at(1.0 - ALPHA / 2.0)]))
    }
}

/// How many paired cases give a two-sided McNemar test at level `alpha` the `power` to detect
/// a `difference` in pass rate from `baseline` (Connor's formula). `discordant` is the share of
/// cases on which the two variants differ; when not known it is the value if the variants
/// failed independently, p₀(1−p₁) + p₁(1−p₀), which is the most a positive correlation between
/// them can be: correlated variants need fewer cases.
pub fn cases_needed(
    baseline: f64,
    difference: f64,
    discordant: Option<f64>,
    alpha: f64,
    power: f64,
) -> Result<u64, String> {
    let other = baseline + difference;
    if !(0.0..=1.0).contains(&baseline) {
        return Err(format!(
            "the baseline rate {baseline} is not between 0 and 1"
        ));
    }
    if difference == 0.0 || !(0.0..=1.0).contains(&other) {
        return Err(format!(
            "the difference {difference} must be non-zero and keep the rate between 0 and 1 \
             (the baseline is {baseline})"
        ));
    }
    if !(0.0 < alpha && alpha < 1.0 && 0.0 < power && power < 1.0) {
        return Err("alpha and power are between 0 and 1".into());
    }
    let psi = discordant
        .unwrap_or(baseline * (1.0 - other) + other * (1.0 - baseline))
        .max(difference.abs());
    let d = difference.abs();
    let n = (z(1.0 - alpha / 2.0) * psi.sqrt() + z(power) * (psi - d * d).max(0.0).sqrt()).powi(2)
        / (d * d);
    Ok(n.ceil() as u64)
}

/// One case under one variant, as the figures need it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CaseTally {
    /// Whether the case passed, when it was decided (passed or failed; `None` when it was
    /// incomplete, not graded or infra).
    pub passed: Option<bool>,
    /// Its graded trials, and how many of them passed.
    pub trials: u32,
    pub trials_passed: u32,
    /// The mean score of its graded trials, when any.
    pub score: Option<f64>,
}

/// A variant's figures over its decided cases (`summary.json`'s `variants.V`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VariantFigures {
    /// The 95% Wilson interval of the pass rate, over cases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_rate_ci: Option<[f64; 2]>,
    /// The mean over cases of each case's mean trial score, with its 95% bootstrap interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_score: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_score_ci: Option<[f64; 2]>,
    /// With several trials a case: pass@k for k = 1 and k = the trials, the unbiased estimate
    /// per case averaged over cases, keyed by k as text (`"1"`, `"3"`: JSON's keys are text,
    /// and a flattened map reads no other).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pass_at_k: BTreeMap<String, f64>,
    /// With several trials a case: the share of decided cases whose trials disagreed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flaky: Option<f64>,
}

/// One variant's cases, tallied as they come: what its figures need, without a tally per
/// case (a million cases held 48 MB of them).
#[derive(Debug, Clone, Default)]
pub struct VariantTally {
    decided: u64,
    passed: u64,
    /// The decided cases' mean scores.
    scores: Sample,
    /// How many decided cases had each (graded trials, trials passed): pass@k and flakiness
    /// at any k from a handful of counts.
    by_trials: BTreeMap<(u32, u32), u64>,
}

impl VariantTally {
    /// Counts `case` (an undecided one counts for nothing).
    pub fn add(&mut self, case: &CaseTally) {
        let Some(passed) = case.passed else {
            return;
        };
        self.decided += 1;
        self.passed += u64::from(passed);
        if let Some(score) = case.score {
            self.scores.add(score);
        }
        *(self.by_trials)
            .entry((case.trials, case.trials_passed))
            .or_default() += 1;
    }

    /// The figures of the cases counted.
    pub fn figures(&self) -> VariantFigures {
        let (mean_score, mean_score_ci) = match self.scores.mean_with_ci() {
            Some((mean, ci)) => (Some(mean), Some(ci)),
            None => (None, None),
        };
        let trials = self.by_trials.keys().map(|(n, _)| *n).max().unwrap_or(0);
        let mut at_k = BTreeMap::new();
        let mut flaky = None;
        if trials > 1 {
            for k in [1, trials] {
                let (mut sum, mut cases) = (0.0, 0);
                for (&(n, c), &count) in self.by_trials.range((k, 0)..) {
                    sum += count as f64 * pass_at_k(n.into(), c.into(), k.into());
                    cases += count;
                }
                if cases > 0 {
                    at_k.insert(k.to_string(), sum / cases as f64);
                }
            }
            let disagree: u64 = (self.by_trials.iter())
                .filter(|((n, c), _)| *c > 0 && c < n)
                .map(|(_, count)| count)
                .sum();
            flaky = Some(disagree as f64 / self.decided as f64);
        }
        VariantFigures {
            pass_rate_ci: wilson(self.passed, self.decided),
            mean_score,
            mean_score_ci,
            pass_at_k: at_k,
            flaky,
        }
    }
}

/// A variant against the baseline, tallied a case at a time over the cases both decided.
#[derive(Debug, Clone, Default)]
pub struct PairedTally {
    table: Paired,
    /// Over the cases both also scored: the variant's mean score minus the baseline's.
    score_diffs: Sample,
}

impl PairedTally {
    /// Counts one case: the variant's tally and the baseline's.
    pub fn add(&mut self, variant: &CaseTally, baseline: &CaseTally) {
        let (Some(mine), Some(theirs)) = (variant.passed, baseline.passed) else {
            return;
        };
        self.table.add(mine, theirs);
        if let (Some(a), Some(b)) = (variant.score, baseline.score) {
            self.score_diffs.add(a - b);
        }
    }

    /// The comparison the cases counted make, against the baseline named `against`; `None`
    /// when no case was decided by both.
    pub fn comparison(&self, against: &str) -> Option<Comparison> {
        Comparison::of_table(self.table, &self.score_diffs, against)
    }
}

/// A variant against the baseline over the cases both decided (`summary.json`'s
/// `comparisons.V`, and each variant of `mst runs diff`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Comparison {
    /// What it is compared with: the baseline variant (or, in `mst runs diff`, the earlier run).
    pub baseline: String,
    /// The cases both decided.
    pub cases: u64,
    /// Its pass rate minus the baseline's over those cases, with the 95% interval.
    pub delta: f64,
    pub delta_ci: [f64; 2],
    /// Cases it passed and the baseline failed, and the other way round.
    pub won: u64,
    pub lost: u64,
    /// McNemar's exact p-value.
    pub p_value: f64,
    /// The test that gave `pValue`: `mcnemar-exact`.
    pub test: String,
    /// Whether the difference is beyond noise at the 5% level.
    pub significant: bool,
    /// Its mean score minus the baseline's over the cases both scored, with a paired bootstrap
    /// interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score_delta: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score_delta_ci: Option<[f64; 2]>,
    /// When the difference is not significant: how many paired cases would detect one this
    /// size with 80% power at this discordance (absent when there is no difference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cases_needed: Option<u64>,
}

impl Comparison {
    /// The comparison a paired table (and the paired score differences) make.
    pub fn of_table(table: Paired, score_diffs: &Sample, against: &str) -> Option<Self> {
        let delta = table.delta()?;
        let p_value = table.p_value();
        let significant = p_value < ALPHA;
        let (score_delta, score_delta_ci) = match score_diffs.mean_with_ci() {
            Some((mean, ci)) => (Some(mean), Some(ci)),
            None => (None, None),
        };
        let baseline_rate = (table.both + table.lost) as f64 / table.cases() as f64;
        let cases_needed = (!significant && delta != 0.0)
            .then(|| cases_needed(baseline_rate, delta, table.discordant(), ALPHA, POWER).ok())
            .flatten();
        Some(Comparison {
            baseline: against.to_string(),
            cases: table.cases(),
            delta,
            delta_ci: table.delta_ci()?,
            won: table.won,
            lost: table.lost,
            p_value,
            test: "mcnemar-exact".into(),
            significant,
            score_delta,
            score_delta_ci,
            cases_needed,
        })
    }

    /// `+25.0 pp [13.7, 35.2], p < 0.001`: the difference, its interval and the p-value.
    pub fn figures(&self) -> String {
        let pp = |x: f64| x * 100.0;
        let p = if self.p_value < 0.001 {
            "p < 0.001".to_string()
        } else {
            format!("p = {:.3}", self.p_value)
        };
        format!(
            "{:+.1} pp [{:.1}, {:.1}], {p}",
            pp(self.delta),
            pp(self.delta_ci[0]),
            pp(self.delta_ci[1])
        )
    }

    /// [`Comparison::figures`], then `, not significant` when it is not.
    pub fn line(&self) -> String {
        match self.significant {
            true => self.figures(),
            false => format!("{}, not significant", self.figures()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, within: f64) -> bool {
        (a - b).abs() <= within
    }

    // The expected values below were computed apart from this code, in Python with
    // statsmodels 0.15 and scipy (`/tmp`-only, not a dependency of mst).

    /// `(successes, n, low, high)`: statsmodels `proportion_confint(method="wilson")`.
    const WILSON: [(u64, u64, f64, f64); 6] = [
        (45, 60, 0.6276792992295218, 0.8422347746994333),
        (30, 60, 0.37735024241555765, 0.6226497575844423),
        (0, 10, 0.0, 0.27753279986288926),
        (10, 10, 0.7224672001371106, 1.0),
        (1, 3, 0.06149194472039626, 0.7923403991979523),
        (123, 1000, 0.10407414325107295, 0.1448112326470356),
    ];

    /// `(n, c, k, pass@k)`: 1 − comb(n−c, k)/comb(n, k) with Python's exact `math.comb`.
    const PASS_AT_K: [(u64, u64, u64, f64); 6] = [
        (5, 2, 3, 0.9),
        (10, 0, 5, 0.0),
        (10, 10, 1, 1.0),
        (20, 3, 5, 0.6008771929824561),
        (3, 1, 3, 1.0),
        (200, 7, 50, 0.8712245647066278),
    ];

    /// `(won, lost, p)`: statsmodels `mcnemar(table, exact=True)`.
    const MCNEMAR: [(u64, u64, f64); 6] = [
        (15, 0, 6.103515625e-05),
        (8, 2, 0.109375),
        (5, 1, 0.21875),
        (30, 20, 0.20263875106454066),
        (0, 1, 1.0),
        (100, 60, 0.001953728034064355),
    ];

    /// `(both, won, lost, neither, low, high)`: Newcombe's method 10 written apart in Python over
    /// statsmodels' Wilson intervals.
    const NEWCOMBE: [(u64, u64, u64, u64, f64, f64); 5] = [
        (30, 15, 0, 15, 0.1373864945328524, 0.35240890022629645),
        (12, 2, 1, 21, -0.06493720266699209, 0.11990791307733369),
        (10, 5, 5, 10, -0.19451940192344894, 0.19451940192344894),
        (0, 3, 0, 0, 0.2059232824597782, 1.0),
        (40, 2, 9, 9, -0.2228309381173869, -0.011368546168506966),
    ];

    /// `(baseline, difference, discordant, cases)`: Connor's formula with scipy's `norm.ppf`.
    const CASES_NEEDED: [(f64, f64, Option<f64>, u64); 5] = [
        (0.5, 0.1, None, 391),
        (0.5, 0.25, Some(0.25), 29),
        (0.7, 0.05, None, 1254),
        (0.3, -0.1, None, 296),
        (0.6, 0.1, Some(0.2), 155),
    ];

    #[test]
    fn wilson_intervals_match_an_independent_computation() {
        for (k, n, lo, hi) in WILSON {
            let [l, h] = wilson(k, n).unwrap();
            assert!(close(l, lo, 1e-9) && close(h, hi, 1e-9), "{k}/{n}: {l} {h}");
        }
        assert_eq!(wilson(0, 0), None);
    }

    #[test]
    fn pass_at_k_matches_the_combinatorial_formula() {
        for (n, c, k, want) in PASS_AT_K {
            assert!(close(pass_at_k(n, c, k), want, 1e-12), "{n} {c} {k}");
        }
        // k = 1 is the share of trials that passed.
        assert!(close(pass_at_k(10, 3, 1), 0.3, 1e-12));
    }

    #[test]
    fn mcnemar_exact_p_is_twice_the_binomial_tail() {
        // 15 to 0: 2 × 0.5^15.
        assert_eq!(mcnemar_exact(15, 0), 2.0 * 0.5f64.powi(15));
        assert_eq!(mcnemar_exact(1, 0), 1.0);
        // Either side of the exact sum's limit agrees.
        let (below, above) = (mcnemar_exact(480, 520), mcnemar_exact(481, 521));
        assert!(close(below, above, 0.02), "{below} {above}");
        assert_eq!(mcnemar_exact(0, 0), 1.0);
        assert_eq!(mcnemar_exact(3, 3), 1.0);
        for (won, lost, want) in MCNEMAR {
            assert!(close(mcnemar_exact(won, lost), want, 1e-10), "{won} {lost}");
        }
    }

    #[test]
    fn the_paired_interval_holds_its_difference_and_matches_newcombe() {
        // The bar of issue 47: 30 both, 15 won, 0 lost, 15 neither.
        let table = Paired {
            both: 30,
            won: 15,
            lost: 0,
            neither: 15,
        };
        assert_eq!(table.delta(), Some(0.25));
        let [lo, hi] = table.delta_ci().unwrap();
        assert!(lo > 0.0 && hi > 0.25 && hi < 1.0, "{lo} {hi}");
        for (both, won, lost, neither, want_lo, want_hi) in NEWCOMBE {
            let table = Paired {
                both,
                won,
                lost,
                neither,
            };
            let [lo, hi] = table.delta_ci().unwrap();
            assert!(
                close(lo, want_lo, 1e-4) && close(hi, want_hi, 1e-4),
                "{table:?}: {lo} {hi}"
            );
        }
    }

    #[test]
    fn a_bootstrap_interval_holds_the_mean_and_is_the_same_every_time() {
        let values: Vec<f64> = (0..40).map(|i| f64::from(i % 7) / 6.0).collect();
        let (mean, [lo, hi]) = mean_with_ci(&values).unwrap();
        assert!(lo < mean && mean < hi, "{lo} {mean} {hi}");
        assert_eq!(mean_with_ci(&values).unwrap().1, [lo, hi]);
        // About the normal interval's width at this size.
        let sd = (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 39.0).sqrt();
        let normal = 2.0 * 1.96 * sd / 40f64.sqrt();
        assert!(close(hi - lo, normal, normal * 0.2), "{} {normal}", hi - lo);
        assert_eq!(mean_with_ci(&[0.5]).unwrap(), (0.5, [0.5, 0.5]));
        assert_eq!(mean_with_ci(&[]), None);
    }

    fn tally_of(cases: &[CaseTally]) -> VariantTally {
        let mut tally = VariantTally::default();
        cases.iter().for_each(|case| tally.add(case));
        tally
    }

    #[test]
    fn past_the_bootstrap_limit_a_sample_keeps_no_values_and_gives_the_normal_interval() {
        let values: Vec<f64> = (0..25_000).map(|i| f64::from(i % 11) / 10.0).collect();
        let mut sample = Sample::default();
        values.iter().for_each(|v| sample.add(*v));
        assert!(sample.kept.is_empty(), "memory is bounded");
        // The two-pass normal interval, computed apart.
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let sd = (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        let half = 1.959963984540054 * sd / n.sqrt();
        let (got, [lo, hi]) = sample.mean_with_ci().unwrap();
        assert!(close(got, mean, 1e-12), "{got} {mean}");
        assert!(close(lo, mean - half, 1e-9) && close(hi, mean + half, 1e-9));
    }

    #[test]
    fn a_variants_figures_count_decided_cases_and_read_back_as_written() {
        let case = |passed: Option<bool>, trials: u32, trials_passed: u32| CaseTally {
            passed,
            trials,
            trials_passed,
            score: (trials > 0).then(|| f64::from(trials_passed) / f64::from(trials)),
        };
        // Three trials a case: all pass, two of three, none; an infra case left out.
        let cases = [
            case(Some(true), 3, 3),
            case(Some(true), 3, 2),
            case(Some(false), 3, 0),
            case(None, 1, 0),
        ];
        let figures = tally_of(&cases).figures();
        let [lo, hi] = figures.pass_rate_ci.unwrap();
        assert_eq!([lo, hi], wilson(2, 3).unwrap());
        // pass@1: the mean of 1, 2/3 and 0; pass@3: 1, 1, 0.
        assert!(close(
            figures.pass_at_k["1"],
            (1.0 + 2.0 / 3.0) / 3.0,
            1e-12
        ));
        assert!(close(figures.pass_at_k["3"], 2.0 / 3.0, 1e-12));
        assert!(close(figures.flaky.unwrap(), 1.0 / 3.0, 1e-12));
        assert!(close(
            figures.mean_score.unwrap(),
            (1.0 + 2.0 / 3.0) / 3.0,
            1e-12
        ));
        // As summary.json holds them, inside a variant's counts, and back.
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct Holder {
            passed: u32,
            #[serde(flatten)]
            figures: VariantFigures,
        }
        let held = Holder { passed: 2, figures };
        let text = serde_json::to_string(&held).unwrap();
        assert_eq!(
            serde_json::from_str::<Holder>(&text).unwrap(),
            held,
            "{text}"
        );
        // One trial a case: no pass@k, no flakiness.
        let single = tally_of(&[case(Some(true), 1, 1)]).figures();
        assert!(single.pass_at_k.is_empty() && single.flaky.is_none());
    }

    #[test]
    fn cases_needed_follows_connors_formula() {
        for (p0, d, psi, want) in CASES_NEEDED {
            assert_eq!(
                cases_needed(p0, d, psi, ALPHA, POWER).unwrap(),
                want,
                "{p0} {d}"
            );
        }
        assert!(cases_needed(0.9, 0.2, None, ALPHA, POWER)
            .unwrap_err()
            .contains("between 0 and 1"));
        assert!(cases_needed(0.5, 0.0, None, ALPHA, POWER).is_err());
    }
}
