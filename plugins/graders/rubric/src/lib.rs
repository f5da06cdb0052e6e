//! `mst/grader/rubric`: an LLM judge. It asks a model (through the host's `model` import, so
//! the key stays with the host) to score the trial's answer against a rubric, and reads back a
//! structured verdict.
//!
//! Options: `provider` and `model` (required: a provider the eval configures, or `mock`),
//! `rubric` (required: what a good answer does), `threshold` (the score that passes, default
//! 0.5), `maxTokens` (default 512). The judge sees the case's input, its expected value when
//! there is one, and the final answer. It must reply with a JSON object
//! `{"score": 0..1, "reason": "…"}` (anywhere in its text); a reply without one is this
//! plugin's error, so the trial is not graded rather than failed.

use mst_sdk::grader::{self, Capability, Grader, PluginError, PluginInfo, Score, Trial};
use serde::Deserialize;

/// The rubric grader.
pub struct Rubric;

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Options {
    provider: String,
    model: String,
    rubric: String,
    #[serde(default = "half")]
    threshold: f64,
    #[serde(default = "default_max_tokens")]
    max_tokens: u32,
}

fn half() -> f64 {
    0.5
}

fn default_max_tokens() -> u32 {
    512
}

const SCHEMA: &str = r#"{
  "type": "object",
  "additionalProperties": false,
  "required": ["provider", "model", "rubric"],
  "properties": {
    "provider": {"type": "string"},
    "model": {"type": "string"},
    "rubric": {"type": "string"},
    "threshold": {"type": "number", "minimum": 0, "maximum": 1},
    "maxTokens": {"type": "integer", "minimum": 1}
  }
}"#;

const SYSTEM: &str = "You grade one answer against a rubric. Reply with only a JSON object: \
                      {\"score\": a number from 0 to 1, \"reason\": one sentence}.";

/// The judge's verdict.
#[derive(Deserialize, Debug, PartialEq)]
struct Verdict {
    score: f64,
    reason: String,
}

/// Whether a verdict's score is in range.
fn in_range(verdict: &Verdict) -> bool {
    (0.0..=1.0).contains(&verdict.score)
}

/// What the judge is asked.
fn prompt(options: &Options, trial: &Trial) -> String {
    mst_sdk::rubric_prompt(
        &options.rubric,
        &trial.case.input,
        trial.case.expected.as_deref(),
        &[("The answer to grade", grader::final_text(trial))],
    )
}

impl Grader for Rubric {
    fn info() -> PluginInfo {
        PluginInfo {
            // Any provider the operator grants: the eval picks the judge's model.
            capabilities: vec![Capability::Model("*".to_string())],
            options_schema: Some(SCHEMA.to_string()),
            ..grader::info(
                "mst/grader/rubric",
                env!("CARGO_PKG_VERSION"),
                "An LLM judge: a model scores the answer against a rubric",
            )
        }
    }

    fn grade(options: &str, trial: Trial) -> Result<Score, PluginError> {
        let options: Options = grader::options(options)?;
        let verdict: Verdict = grader::ask_judge(
            (&options.provider, &options.model),
            options.max_tokens,
            SYSTEM,
            prompt(&options, &trial),
            "{\"score\", \"reason\"}",
            in_range,
        )?;
        Ok(Score {
            pass: Some(verdict.score >= options.threshold),
            ..grader::score(verdict.score, verdict.reason)
        })
    }
}

mst_sdk::export_grader!(Rubric);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_score_out_of_range_is_no_verdict() {
        let verdict = |text| mst_sdk::json_object(text, in_range);
        assert_eq!(
            verdict("Sure: {\"score\": 0.8, \"reason\": \"close\"}"),
            Some(Verdict {
                score: 0.8,
                reason: "close".into()
            })
        );
        assert!(verdict("{\"score\": 3, \"reason\": \"too high\"}").is_none());
    }
}
