//! Charts drawn by mst as inline SVG: readable with scripts off, fetched from nowhere, and
//! printed as they are. The report carries them as static markup; the web UI gets the same
//! markup from the server. Every number drawn is one of `summary.json`'s (or `mst runs list`'s),
//! read here and never recomputed: the figures themselves are `results::stats`'.
//!
//! Each chart is a `<figure class="chart" data-chart=NAME>`: an `<svg role="img">` with a
//! `<title>` and a `<desc>`, a `<title>` on every mark (a tooltip without script), and each
//! series told apart by its label and dash pattern as well as its colour.

use crate::results::markup::escape;
use crate::results::run_process::RunListing;
use crate::results::Summary;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The drawing's width in SVG units; it scales to its box.
const WIDTH: f64 = 640.0;
/// Where plots start (after the row labels) and end (before the value labels).
const PLOT_LEFT: f64 = 150.0;
const PLOT_RIGHT: f64 = 470.0;
/// One row of a bar chart.
const ROW: f64 = 30.0;
/// Series colours, in order; each also has a dash pattern ([`DASHES`]) for lines.
const COLOURS: [&str; 6] = [
    "#2563eb", "#d97706", "#059669", "#9333ea", "#dc2626", "#0891b2",
];
const DASHES: [&str; 6] = ["", "6 3", "2 3", "8 3 2 3", "1 2", "10 4"];
/// Bins of a distribution.
const BINS: usize = 10;

/// What the report's rows saw of each trial that the charts draw, counted as the rows go by:
/// a fixed few hundred counters a variant, whatever the number of trials.
#[derive(Debug, Default)]
pub struct Samples {
    variants: BTreeMap<String, VariantSamples>,
}

/// One variant's trials, counted.
#[derive(Debug, Default)]
struct VariantSamples {
    /// Graded trials by score, in ten bins from 0 to 1.
    scores: [u64; BINS],
    score_sum: f64,
    /// Trials with a trace, by duration.
    durations: crate::results::durations::Durations,
    longest_ms: u64,
}

impl Samples {
    /// Adds one trial of `variant`: its score when graded, its duration when it has a trace.
    pub fn add(&mut self, variant: &str, score: Option<f64>, duration_ms: Option<u64>) {
        // Looked up, not entered: a key is made once per variant, not once per trial.
        if !self.variants.contains_key(variant) {
            self.variants
                .insert(variant.to_string(), VariantSamples::default());
        }
        let counted = self.variants.get_mut(variant).expect("inserted above");
        if let Some(score) = score {
            counted.scores[bin_of(score, 1.0)] += 1;
            counted.score_sum += score;
        }
        if let Some(ms) = duration_ms {
            counted.durations.add(ms);
            counted.longest_ms = counted.longest_ms.max(ms);
        }
    }
}

/// The bin of `value` on a scale from 0 to `top` (`top` itself in the last bin).
fn bin_of(value: f64, top: f64) -> usize {
    ((value / top) * BINS as f64)
        .floor()
        .clamp(0.0, (BINS - 1) as f64) as usize
}

/// One variant's row of a distribution: its counts by bin and what its label says.
struct Histogram<'a> {
    variant: &'a str,
    bins: [u64; BINS],
    summary: String,
}

impl VariantSamples {
    /// Its scores as a row, when any trial was graded.
    fn scores<'a>(&self, variant: &'a str) -> Option<Histogram<'a>> {
        let n: u64 = self.scores.iter().sum();
        (n > 0).then(|| Histogram {
            variant,
            bins: self.scores,
            summary: format!("{n} trials, mean {:.2}", self.score_sum / n as f64),
        })
    }

    /// Its durations as a row on a scale from 0 to `top` ms, when any trial has a trace: each
    /// of [`Durations`](crate::results::durations::Durations)' buckets in the bin of its
    /// upper bound, so a bar may hold trials up to 10% shorter than its range.
    fn durations<'a>(&self, variant: &'a str, top: u64) -> Option<Histogram<'a>> {
        let n = self.durations.count();
        let mut bins = [0u64; BINS];
        for (bound, count) in self.durations.buckets() {
            bins[bin_of(bound.min(self.longest_ms) as f64, top.max(1) as f64)] += count;
        }
        let median = self.durations.percentile(0.5)?.min(self.longest_ms);
        (n > 0).then(|| Histogram {
            variant,
            bins,
            summary: format!("{n} trials, median {}", millis(median as f64)),
        })
    }
}

/// A variant's colour: the same in every chart of a run, by its place among the run's variants.
fn colour_of(summary: &Summary, variant: &str) -> &'static str {
    let at = summary
        .variants
        .keys()
        .position(|v| v == variant)
        .unwrap_or(0);
    COLOURS[at % COLOURS.len()]
}

/// Every chart of a run, in reading order: pass rates with intervals, wins and losses against
/// the baseline, score and duration distributions, cost and tokens.
pub fn run_charts(summary: &Summary, samples: &Samples) -> String {
    let mut out = String::new();
    let colour = |variant: &str| colour_of(summary, variant);
    let longest = (samples.variants.values())
        .map(|v| v.longest_ms)
        .max()
        .unwrap_or(0);
    for chart in [
        pass_rates(summary),
        wins_losses(summary),
        distribution(
            "scores",
            "Trial scores per variant (0 to 1, ten bins)",
            &(samples.variants.iter())
                .filter_map(|(v, counted)| counted.scores(v))
                .collect::<Vec<_>>(),
            1.0,
            |x| format!("{x:.1}"),
            &colour,
        ),
        distribution(
            "durations",
            "Trial durations per variant (the median to within 10%)",
            &(samples.variants.iter())
                .filter_map(|(v, counted)| counted.durations(v, longest))
                .collect::<Vec<_>>(),
            longest.max(1) as f64,
            millis,
            &colour,
        ),
        usage(summary),
    ]
    .into_iter()
    .flatten()
    {
        out.push_str(&chart);
    }
    out
}

/// An SVG being drawn: its marks, then wrapped with its title and description.
struct Svg {
    marks: String,
    height: f64,
}

impl Svg {
    fn new(height: f64) -> Self {
        Svg {
            marks: String::new(),
            height,
        }
    }

    /// A rectangle with a tooltip.
    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: &str, tip: &str) {
        let _ = write!(
            self.marks,
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{fill}\"><title>{}</title></rect>",
            w.max(0.0),
            h.max(0.0),
            escape(tip)
        );
    }

    fn line(&mut self, (x1, y1): (f64, f64), (x2, y2): (f64, f64), stroke: &str) {
        let _ = write!(
            self.marks,
            "<line x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\" stroke=\"{stroke}\" stroke-width=\"1.5\"/>"
        );
    }

    /// Text; `anchor` is `start`, `middle` or `end`.
    fn text(&mut self, x: f64, y: f64, anchor: &str, text: &str) {
        let _ = write!(
            self.marks,
            "<text x=\"{x:.1}\" y=\"{y:.1}\" text-anchor=\"{anchor}\">{}</text>",
            escape(text)
        );
    }

    /// One row of a bar chart at `y`: its label, a bar of `share` of the plot (0 to 1) with a
    /// tooltip, and its value after the plot.
    fn bar(&mut self, y: f64, label: &str, share: f64, fill: &str, tip: &str, value: &str) {
        self.text(PLOT_LEFT - 8.0, y + 19.0, "end", label);
        self.rect(PLOT_LEFT, y + 6.0, x_of(share) - PLOT_LEFT, 18.0, fill, tip);
        self.text(PLOT_RIGHT + 8.0, y + 19.0, "start", value);
    }

    /// The figure: the SVG with its title and description, and a caption.
    fn figure(self, name: &str, title: &str, desc: &str) -> String {
        format!(
            "<figure class=\"chart\" data-chart=\"{name}\"><svg xmlns=\"http://www.w3.org/2000/svg\" \
             role=\"img\" viewBox=\"0 0 {WIDTH} {h:.0}\" width=\"100%\" font-size=\"12\" \
             font-family=\"system-ui, sans-serif\" fill=\"currentColor\"><title>{t}</title>\
             <desc>{d}</desc>{marks}</svg><figcaption>{t}</figcaption></figure>",
            h = self.height,
            t = escape(title),
            d = escape(desc),
            marks = self.marks
        )
    }
}

/// The x of `share` (0 to 1) on a bar chart's plot.
fn x_of(share: f64) -> f64 {
    PLOT_LEFT + share.clamp(0.0, 1.0) * (PLOT_RIGHT - PLOT_LEFT)
}

/// A 0–100% axis under `rows` rows, with a grid line at each quarter.
fn percent_axis(svg: &mut Svg, rows: usize) {
    let bottom = 10.0 + rows as f64 * ROW;
    for quarter in 0..=4 {
        let share = f64::from(quarter) / 4.0;
        svg.line((x_of(share), 6.0), (x_of(share), bottom), "#d1d5db");
        svg.text(
            x_of(share),
            bottom + 14.0,
            "middle",
            &format!("{}%", quarter * 25),
        );
    }
}

/// Pass rate per variant, a bar each, with its 95% Wilson interval as a whisker.
fn pass_rates(summary: &Summary) -> Option<String> {
    let rated: Vec<(&String, f64, Option<[f64; 2]>)> = (summary.variants.iter())
        .filter_map(|(name, v)| Some((name, v.pass_rate?, v.figures.pass_rate_ci)))
        .collect();
    if rated.is_empty() {
        return None;
    }
    let mut svg = Svg::new(30.0 + rated.len() as f64 * ROW);
    percent_axis(&mut svg, rated.len());
    let mut desc = Vec::new();
    for (i, (name, rate, ci)) in rated.iter().enumerate() {
        let y = 10.0 + i as f64 * ROW;
        let label = match ci {
            Some([lo, hi]) => format!(
                "{:.1}% [{:.1}, {:.1}]",
                rate * 100.0,
                lo * 100.0,
                hi * 100.0
            ),
            None => format!("{:.1}%", rate * 100.0),
        };
        let tip = format!("{name}: {label}");
        svg.bar(y, name, *rate, colour_of(summary, name), &tip, &label);
        if let Some([lo, hi]) = ci {
            let mid = y + 15.0;
            svg.line((x_of(*lo), mid), (x_of(*hi), mid), "#111827");
            svg.line((x_of(*lo), mid - 6.0), (x_of(*lo), mid + 6.0), "#111827");
            svg.line((x_of(*hi), mid - 6.0), (x_of(*hi), mid + 6.0), "#111827");
        }
        desc.push(tip);
    }
    Some(svg.figure(
        "pass-rates",
        "Pass rate per variant, with 95% intervals",
        &desc.join("; "),
    ))
}

/// Per variant compared with the baseline: the cases it won (passed where the baseline
/// failed) to the right, the cases it lost to the left, and the paired test's verdict.
fn wins_losses(summary: &Summary) -> Option<String> {
    let compared = &summary.comparisons;
    let baseline = compared.values().next()?.baseline.clone();
    let most = (compared.values())
        .map(|c| c.won.max(c.lost))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let centre = (PLOT_LEFT + PLOT_RIGHT) / 2.0;
    // Room at each end for the counts.
    let half = (PLOT_RIGHT - PLOT_LEFT) / 2.0 - 30.0;
    let mut svg = Svg::new(20.0 + compared.len() as f64 * ROW);
    svg.line(
        (centre, 4.0),
        (centre, 10.0 + compared.len() as f64 * ROW),
        "#6b7280",
    );
    let mut desc = Vec::new();
    for (i, (name, c)) in compared.iter().enumerate() {
        let y = 10.0 + i as f64 * ROW;
        let (won, lost) = (c.won as f64 / most * half, c.lost as f64 / most * half);
        svg.text(PLOT_LEFT - 8.0, y + 19.0, "end", name);
        let tip = format!(
            "{name} against {baseline}: {} won, {} lost, {}",
            c.won,
            c.lost,
            c.line()
        );
        svg.rect(centre - lost, y + 6.0, lost, 18.0, "#dc2626", &tip);
        svg.rect(centre, y + 6.0, won, 18.0, "#059669", &tip);
        svg.text(
            centre - lost - 4.0,
            y + 19.0,
            "end",
            &format!("−{}", c.lost),
        );
        svg.text(
            centre + won + 4.0,
            y + 19.0,
            "start",
            &format!("+{}", c.won),
        );
        let verdict = if c.significant {
            format!("{:+.1} pp, p {}", c.delta * 100.0, p_text(c.p_value))
        } else {
            "not significant".to_string()
        };
        svg.text(PLOT_RIGHT + 8.0, y + 19.0, "start", &verdict);
        desc.push(tip);
    }
    Some(svg.figure(
        "wins-losses",
        &format!("Cases won (+) and lost (−) against {baseline}, paired by case"),
        &desc.join("; "),
    ))
}

/// `< 0.001` or `= 0.042`.
fn p_text(p: f64) -> String {
    if p < 0.001 {
        "< 0.001".into()
    } else {
        format!("= {p:.3}")
    }
}

/// `850 ms` or `2.4 s`.
fn millis(ms: f64) -> String {
    if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.1} s", ms / 1000.0)
    }
}

/// A histogram per variant, one row each, on a shared scale from 0 to `top`: bars' heights are
/// each variant's share of its own trials.
fn distribution(
    name: &str,
    title: &str,
    rows: &[Histogram<'_>],
    top: f64,
    label: impl Fn(f64) -> String,
    colour: &dyn Fn(&str) -> &'static str,
) -> Option<String> {
    if rows.is_empty() {
        return None;
    }
    let row = 46.0;
    let mut svg = Svg::new(24.0 + rows.len() as f64 * row);
    let width = (PLOT_RIGHT - PLOT_LEFT) / BINS as f64;
    let mut desc = Vec::new();
    for (i, histogram) in rows.iter().enumerate() {
        let variant = histogram.variant;
        let total: u64 = histogram.bins.iter().sum();
        let y = 6.0 + i as f64 * row;
        svg.text(PLOT_LEFT - 8.0, y + 26.0, "end", variant);
        svg.line((PLOT_LEFT, y + 38.0), (PLOT_RIGHT, y + 38.0), "#9ca3af");
        for (bin, count) in histogram.bins.iter().enumerate() {
            let (from, to) = (
                top * bin as f64 / BINS as f64,
                top * (bin + 1) as f64 / BINS as f64,
            );
            let tip = format!(
                "{variant}: {count} of {total} trials from {} to {}",
                label(from),
                label(to)
            );
            let h = *count as f64 / total.max(1) as f64 * 34.0;
            let x = PLOT_LEFT + bin as f64 * width;
            svg.rect(x + 1.0, y + 38.0 - h, width - 2.0, h, colour(variant), &tip);
        }
        svg.text(PLOT_RIGHT + 8.0, y + 26.0, "start", &histogram.summary);
        desc.push(format!("{variant}: {}", histogram.summary));
    }
    let bottom = 6.0 + rows.len() as f64 * row;
    svg.text(PLOT_LEFT, bottom + 12.0, "start", &label(0.0));
    svg.text(PLOT_RIGHT, bottom + 12.0, "end", &label(top));
    Some(svg.figure(name, title, &desc.join("; ")))
}

/// The agents' tokens (and cost, when priced) per variant, as bars on a shared scale.
fn usage(summary: &Summary) -> Option<String> {
    let used = &summary.usage.variants;
    if used.is_empty() {
        return None;
    }
    let most = (used.values())
        .map(|u| u.input_tokens + u.output_tokens)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let most_cost = (used.values())
        .filter_map(|u| u.cost_usd)
        .fold(0.0, f64::max);
    let rows = used.len() * if most_cost > 0.0 { 2 } else { 1 };
    let mut svg = Svg::new(10.0 + rows as f64 * ROW);
    let mut desc = Vec::new();
    let mut y = 4.0;
    for (variant, u) in used {
        let colour = colour_of(summary, variant);
        let tokens = u.input_tokens + u.output_tokens;
        let tip = format!(
            "{variant}: {tokens} tokens ({} in, {} out) in {} calls",
            u.input_tokens, u.output_tokens, u.calls
        );
        let share = tokens as f64 / most;
        svg.bar(
            y,
            &format!("{variant} tokens"),
            share,
            colour,
            &tip,
            &tokens.to_string(),
        );
        desc.push(tip);
        y += ROW;
        if most_cost > 0.0 {
            let cost = u.cost_usd.unwrap_or(0.0);
            let tip = format!("{variant}: ${cost:.4}");
            let label = format!("{variant} cost");
            svg.bar(
                y,
                &label,
                cost / most_cost,
                colour,
                &tip,
                &format!("${cost:.4}"),
            );
            desc.push(tip);
            y += ROW;
        }
    }
    Some(svg.figure(
        "usage",
        "Model tokens and cost per variant",
        &desc.join("; "),
    ))
}

/// Each eval's pass rate over its stored runs, oldest first: a line per variant, the runs'
/// commits (or dates) along the axis. `runs` as `mst runs list` lists them; evals with fewer
/// than two graded runs get none.
pub fn trends(runs: &[RunListing]) -> Vec<(String, String)> {
    let mut by_eval: BTreeMap<&str, Vec<&RunListing>> = BTreeMap::new();
    for run in runs.iter().filter(|r| !r.pass_rates.is_empty()) {
        by_eval.entry(&run.eval).or_default().push(run);
    }
    (by_eval.into_iter())
        .filter(|(_, runs)| runs.len() > 1)
        .map(|(eval, mut runs)| {
            runs.sort_by_key(|r| (r.created_at, r.run_id.clone()));
            (eval.to_string(), trend(eval, &runs))
        })
        .collect()
}

/// One eval's trend chart.
fn trend(eval: &str, runs: &[&RunListing]) -> String {
    let (left, right, top, bottom) = (50.0, WIDTH - 120.0, 10.0, 170.0);
    let mut svg = Svg::new(bottom + 40.0);
    let y_of = |rate: f64| bottom - rate.clamp(0.0, 1.0) * (bottom - top);
    let step = (right - left) / (runs.len() - 1).max(1) as f64;
    let x_of = |i: usize| left + i as f64 * step;
    for quarter in 0..=4 {
        let rate = f64::from(quarter) / 4.0;
        svg.line((left, y_of(rate)), (right, y_of(rate)), "#e5e7eb");
        svg.text(
            left - 6.0,
            y_of(rate) + 4.0,
            "end",
            &format!("{}%", quarter * 25),
        );
    }
    // Label at most about eight runs along the axis.
    let every = runs.len().div_ceil(8);
    for (i, run) in runs.iter().enumerate().filter(|(i, _)| i % every == 0) {
        let name = match &run.commit {
            Some(commit) => commit.chars().take(7).collect(),
            None => run_time(&run.run_id),
        };
        // The ends' labels run inward, so none is cut at the edge.
        let anchor = match i {
            0 => "start",
            _ if i + 1 == runs.len() => "end",
            _ => "middle",
        };
        svg.text(x_of(i), bottom + 16.0, anchor, &name);
    }
    let mut variants: Vec<&str> = (runs.iter())
        .flat_map(|r| r.pass_rates.keys().map(String::as_str))
        .collect();
    variants.sort_unstable();
    variants.dedup();
    let mut desc = Vec::new();
    for (k, variant) in variants.iter().enumerate() {
        let (colour, dash) = (COLOURS[k % COLOURS.len()], DASHES[k % DASHES.len()]);
        let points: Vec<(usize, f64)> = (runs.iter().enumerate())
            .filter_map(|(i, r)| Some((i, (*r.pass_rates.get(*variant)?)?)))
            .collect();
        let path: Vec<String> = (points.iter())
            .map(|(i, rate)| format!("{:.1},{:.1}", x_of(*i), y_of(*rate)))
            .collect();
        let _ = write!(
            svg.marks,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" stroke-dasharray=\"{dash}\" points=\"{}\"/>",
            path.join(" ")
        );
        for (i, rate) in &points {
            let tip = format!("{variant} in run {}: {:.1}%", runs[*i].run_id, rate * 100.0);
            let _ = write!(
                svg.marks,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"{colour}\"><title>{}</title></circle>",
                x_of(*i),
                y_of(*rate),
                escape(&tip)
            );
            desc.push(tip);
        }
        let legend_y = top + 8.0 + k as f64 * 18.0;
        let _ = write!(
            svg.marks,
            "<line x1=\"{:.1}\" y1=\"{legend_y:.1}\" x2=\"{:.1}\" y2=\"{legend_y:.1}\" stroke=\"{colour}\" stroke-width=\"2\" stroke-dasharray=\"{dash}\"/>",
            right + 12.0,
            right + 36.0
        );
        svg.text(right + 40.0, legend_y + 4.0, "start", variant);
    }
    svg.figure(
        &format!("trend-{}", crate::files::path_component(eval)),
        &format!("Pass rate of {eval} over its stored runs"),
        &desc.join("; "),
    )
}

/// `12-06 22:57` of run id `20261206T225741Z-ef0a` (the id itself when it is not one).
fn run_time(run_id: &str) -> String {
    match (
        run_id.get(4..6),
        run_id.get(6..8),
        run_id.get(9..11),
        run_id.get(11..13),
    ) {
        (Some(month), Some(day), Some(hour), Some(minute)) if run_id.get(8..9) == Some("T") => {
            format!("{month}-{day} {hour}:{minute}")
        }
        _ => run_id.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_distribution_counts_each_variants_share_and_escapes_its_labels() {
        let mut samples = Samples::default();
        for score in [0.0, 0.05, 0.95, 1.0] {
            samples.add("<v>", Some(score), Some(100));
        }
        let blue = |_: &str| COLOURS[0];
        let rows: Vec<Histogram<'_>> = (samples.variants.iter())
            .filter_map(|(v, counted)| counted.scores(v))
            .collect();
        let svg = distribution("scores", "t", &rows, 1.0, |x| format!("{x:.1}"), &blue).unwrap();
        assert!(
            svg.contains("&lt;v&gt;: 2 of 4 trials from 0.0 to 0.1"),
            "{svg}"
        );
        // 1.0 falls in the last bin, not past it.
        assert!(
            svg.contains("&lt;v&gt;: 2 of 4 trials from 0.9 to 1.0"),
            "{svg}"
        );
        assert!(svg.contains("4 trials, mean 0.50") && !svg.contains("<v>"));
        // Every trial took 100 ms: all in the last bin of a scale up to 100 ms.
        let durations = samples.variants["<v>"].durations("<v>", 100).unwrap();
        assert_eq!(durations.bins[BINS - 1], 4);
        assert_eq!(durations.summary, "4 trials, median 100 ms");
        assert_eq!(distribution("d", "t", &[], 1.0, millis, &blue), None);
    }
}
