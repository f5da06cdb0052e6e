//! `mst/grader/pairwise-rubric`: an LLM judge of two answers. It asks a model (through the
//! host's `model` import, so the key stays with the host) which of two answers to the same task
//! better meets a rubric, and reads back a structured verdict.
//!
//! Options: `provider` and `model` (required), `rubric` (required: what a good answer does),
//! `maxTokens` (default 512). The judge sees the case's input, its expected value when there
//! is one, and both final answers, labelled "first" and "second". It must reply with a JSON
//! object `{"winner": "first"|"second"|"tie", "reason": "…"}` (anywhere in its text, an
//! optional `confidence` from 0 to 1); a reply without one is this plugin's error, so the case
//! is not graded rather than decided. The host asks in both orders and hides the variant names.

use mst_sdk::pairwise::{
    self, Capability, Case, Pairwise, PluginError, PluginInfo, Preference, Trace, Winner,
};
use serde::Deserialize;

/// The pairwise rubric grader.
pub struct PairwiseRubric;

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Options {
    provider: String,
    model: String,
    rubric: String,
    #[serde(default = "default_max_tokens")]
    max_tokens: u32,
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
    "maxTokens": {"type": "integer", "minimum": 1}
  }
}"#;

const SYSTEM: &str = "You compare two answers to the same task against a rubric. Reply with only \
                      a JSON object: {\"winner\": \"first\", \"second\" or \"tie\", \
                      \"confidence\": a number from 0 to 1, \"reason\": one sentence}.";

/// The judge's verdict.
#[derive(Deserialize, Debug, PartialEq)]
struct Verdict {
    winner: String,
    #[serde(default = "sure")]
    confidence: f64,
    reason: String,
}

fn sure() -> f64 {
    1.0
}

/// Which answer the verdict names: `first`, `second` or `tie`, in any case and spacing.
fn winner(verdict: &Verdict) -> Option<Winner> {
    match verdict.winner.trim().to_ascii_lowercase().as_str() {
        "first" => Some(Winner::First),
        "second" => Some(Winner::Second),
        "tie" => Some(Winner::Tie),
        _ => None,
    }
}

/// Whether a verdict names a known winner with a confidence in range.
fn usable(verdict: &Verdict) -> bool {
    winner(verdict).is_some() && (0.0..=1.0).contains(&verdict.confidence)
}

/// What the judge is asked.
fn prompt(options: &Options, case: &Case, first: &Trace, second: &Trace) -> String {
    mst_sdk::rubric_prompt(
        &options.rubric,
        &case.input,
        case.expected.as_deref(),
        &[
            ("The first answer", pairwise::final_text(first)),
            ("The second answer", pairwise::final_text(second)),
        ],
    )
}

impl Pairwise for PairwiseRubric {
    fn info() -> PluginInfo {
        PluginInfo {
            // Any provider the operator grants: the eval picks the judge's model.
            capabilities: vec![Capability::Model("*".to_string())],
            options_schema: Some(SCHEMA.to_string()),
            ..pairwise::info(
                "mst/grader/pairwise-rubric",
                env!("CARGO_PKG_VERSION"),
                "An LLM judge of two answers: a model picks the better one against a rubric",
            )
        }
    }

    fn compare(
        options: &str,
        case: Case,
        first: Trace,
        second: Trace,
    ) -> Result<Preference, PluginError> {
        let options: Options = pairwise::options(options)?;
        let verdict: Verdict = pairwise::ask_judge(
            (&options.provider, &options.model),
            options.max_tokens,
            SYSTEM,
            prompt(&options, &case, &first, &second),
            "{\"winner\": first|second|tie, \"reason\"}",
            usable,
        )?;
        let winner = winner(&verdict).expect("a usable verdict names a winner");
        Ok(Preference {
            winner,
            confidence: verdict.confidence,
            reason: verdict.reason,
        })
    }
}

mst_sdk::export_pairwise!(PairwiseRubric);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_name_a_known_winner() {
        let verdict = |text| mst_sdk::json_object(text, usable).map(|v| (winner(&v).unwrap(), v));
        let (w, v) =
            verdict("I pick:\n```json\n{\"winner\": \" Second\", \"reason\": \"shorter\"}\n```")
                .unwrap();
        assert_eq!(
            (w, v.confidence, v.reason.as_str()),
            (Winner::Second, 1.0, "shorter")
        );
        assert!(verdict("{\"winner\": \"both\", \"reason\": \"x\"}").is_none());
        assert!(verdict("{\"winner\": \"tie\", \"confidence\": 2, \"reason\": \"x\"}").is_none());
        assert!(
            verdict("{\"winner\": \"first\"}").is_none(),
            "a reason is required"
        );
        assert!(verdict("the first one").is_none());
    }
}
