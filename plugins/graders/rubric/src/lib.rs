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

use mst_sdk::grader::{
    self, Capability, CompletionRequest, ErrorCode, Grader, Message, PluginError, PluginInfo,
    Score, Trial,
};
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

/// The verdict in the judge's text, its score in range.
fn verdict(text: &str) -> Option<Verdict> {
    mst_sdk::json_object(text, |v: &Verdict| (0.0..=1.0).contains(&v.score))
}

/// What the judge is asked.
fn prompt(options: &Options, trial: &Trial) -> String {
    let expected = match &trial.case.expected {
        Some(expected) => format!("\nA reference answer: {expected}\n"),
        None => String::new(),
    };
    format!(
        "Rubric:\n{}\n\nThe task given:\n{}\n{expected}\nThe answer to grade:\n{}\n",
        options.rubric,
        trial.case.input,
        grader::final_text(trial)
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
        let completion = grader::complete(&CompletionRequest {
            provider: options.provider.clone(),
            model: options.model.clone(),
            system: Some(SYSTEM.to_string()),
            messages: vec![Message {
                role: "user".to_string(),
                text: prompt(&options, &trial),
            }],
            max_tokens: options.max_tokens,
            temperature: Some(0.0),
        })?;
        let Some(verdict) = verdict(&completion.text) else {
            let shown: String = completion.text.chars().take(200).collect();
            return Err(grader::error(
                ErrorCode::Unavailable,
                format!(
                    "the judge ({}/{}) did not reply with {{\"score\", \"reason\"}}: {shown:?}",
                    options.provider, options.model
                ),
            ));
        };
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
    fn verdicts_are_found_in_prose_and_fences_and_checked() {
        let v = verdict("Sure.\n```json\n{\"score\": 0.8, \"reason\": \"close\"}\n```").unwrap();
        assert_eq!(v.score, 0.8);
        assert_eq!(v.reason, "close");
        assert!(verdict("{\"score\": 3, \"reason\": \"too high\"}").is_none());
        assert!(verdict("{\"grade\": 1} then {\"score\": 1, \"reason\": \"ok\"}").is_some());
        assert!(verdict("no json here").is_none());
        assert!(
            verdict("{\"score\": 0.5}").is_none(),
            "a reason is required"
        );
    }
}
