//! `mst power`: how many paired cases a comparison of two variants needs.

use crate::results::stats;
use anyhow::Result;
use clap::Args;

/// `mst power --baseline-rate R --difference D`.
#[derive(Args, Debug)]
pub(crate) struct PowerArgs {
    /// The baseline variant's pass rate, between 0 and 1 (e.g. 0.6).
    #[arg(long, value_name = "RATE")]
    baseline_rate: f64,
    /// The difference in pass rate to detect, in rate (0.1 is ten points; negative for a drop).
    #[arg(long, value_name = "RATE", allow_negative_numbers = true)]
    difference: f64,
    /// The share of cases on which the two variants disagree, when known (a past run's
    /// `(won + lost) / cases`) [default: as if they failed independently, the most cases].
    #[arg(long, value_name = "SHARE")]
    discordant: Option<f64>,
    /// The chance of detecting the difference when it is there.
    #[arg(long, default_value_t = stats::POWER)]
    power: f64,
    /// The two-sided significance level of McNemar's test.
    #[arg(long, default_value_t = stats::ALPHA)]
    alpha: f64,
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
}

/// Prints how many paired cases detect the difference.
pub(crate) fn power(args: PowerArgs) -> Result<u8> {
    if let Some(share) = args.discordant {
        if !(0.0..=1.0).contains(&share) {
            return Err(super::Exit::refused(anyhow::anyhow!(
                "--discordant {share}: a share of cases, between 0 and 1"
            )));
        }
    }
    let cases = stats::cases_needed(
        args.baseline_rate,
        args.difference,
        args.discordant,
        args.alpha,
        args.power,
    )
    .map_err(|why| super::Exit::refused(anyhow::anyhow!("{why}")))?;
    if args.json {
        super::write_stdout_json(&serde_json::json!({
            "cases": cases,
            "baselineRate": args.baseline_rate,
            "difference": args.difference,
            "discordant": args.discordant,
            "power": args.power,
            "alpha": args.alpha,
            "test": "mcnemar-exact",
        }));
    } else {
        outln!(
            "{cases} paired cases (each run on both variants) detect {:+.1} pp from a baseline \
             of {:.1}% with {:.0}% power at α = {} (McNemar's test{})",
            args.difference * 100.0,
            args.baseline_rate * 100.0,
            args.power * 100.0,
            args.alpha,
            match args.discordant {
                Some(share) => format!(", {:.1}% of cases discordant", share * 100.0),
                None => ", variants assumed to fail independently: the most cases".into(),
            }
        );
    }
    Ok(super::Code::Success.into())
}
