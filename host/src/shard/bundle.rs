//! The bundle: everything a worker needs to collect its shard's trials, copied to the machine
//! before the worker starts. It never holds a secret: tokens travel only on the worker's stdin.
//! Nor does it hold the answers: its cases carry only an id and an input
//! ([`CaseRecord::for_client`]), since the agent under test runs on the same machine.

use crate::eval::config::VariantSpec;
use crate::eval::trial::CaseRecord;
use crate::eval::trial::TrialKey;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The bundle's file name inside the bundle directory.
pub const BUNDLE_FILE: &str = "bundle.json";

/// The largest bundle a worker reads.
pub const MAX_BUNDLE_BYTES: u64 = 512 * 1024 * 1024;

/// One shard's work.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Bundle {
    /// `mst.shard/v1`.
    pub protocol: String,
    /// The coordinator's mst version; the worker must be the same.
    pub mst: String,
    pub run_id: String,
    pub eval: String,
    /// 0-based shard index, and the shard count.
    pub shard: u32,
    pub shards: u32,
    /// Most trials at once on this machine.
    pub concurrency: u32,
    /// Each trial's deadline.
    pub timeout_ms: u64,
    /// How often the worker sends `heartbeat`.
    pub heartbeat_ms: u64,
    pub variants: BTreeMap<String, VariantSpec>,
    /// The cases the trials refer to, as the client sees them (id and input only). Empty in
    /// the coordinator's copy: its file is written with them (`run::collect::write_bundle`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cases: Vec<CaseRecord>,
    /// The trials to collect, in order.
    pub trials: Vec<TrialKey>,
    /// A directory beside the results (a plain name) that every trial uses as its scratch
    /// directory, kept between bundles: a playground session's shared work directory. Without
    /// it each trial gets a fresh one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// Set for a playground conversation's turn: the worker reports the resume token its
    /// client captures (`resume-token`). Never the token itself: that travels on stdin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<Turn>,
    /// The most tokens each trial's model calls may use, as its `usage` events count them (a
    /// playground session's `turnTokens`): the worker stops a trial past it, which ends
    /// `timed-out` with the cause in its trace's `stopped`. Added within `mst.shard/v1`
    /// (see docs/protocol.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_budget: Option<u64>,
    /// Set when trials keep artefacts (the eval's `artifacts.enabled`): each gets a directory
    /// (`$MST_ARTIFACTS`), a failed one a diagnosis, and the `trial` message lists what they
    /// left. Added within `mst.shard/v1` (see docs/protocol.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifacts: Option<super::artifacts::BundleArtifacts>,
    /// The checks of the shard's cases that have their own (they replace the variant's), by
    /// case id. Added within `mst.shard/v1`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub case_checks: BTreeMap<String, Vec<crate::eval::config::CheckSpec>>,
    /// Set for a grade shard (`mst grade RUN --runner …`): the worker runs the stored trials'
    /// judges instead of a client, and each trial's answer is their calls. Added within
    /// `mst.shard/v1` (see docs/protocol.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grading: Option<GradeWork>,
}

/// The file in a grade shard's bundle directory holding the stored trials to grade, one trial
/// record (case with its answers, and trace) per line.
pub const GRADE_TRIALS_FILE: &str = "trials.jsonl";

/// The directory in a grade shard's bundle directory holding its grader plugins, each as
/// `<sha256>.wasm`.
pub const GRADE_PLUGINS_DIR: &str = "plugins";

/// What a grade shard's worker needs to run the judges: their configs, the grader plugins
/// they call with what the operator granted each, and the plugins' per-call caps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GradeWork {
    /// The judges of each variant the shard's trials name.
    pub variant_judges: BTreeMap<String, Vec<crate::eval::config::JudgeConfig>>,
    /// The judges of the cases that have their own (they replace the variant's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub case_judges: BTreeMap<String, Vec<crate::eval::config::JudgeConfig>>,
    /// The grader plugins the judges call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plugins: Vec<GradePlugin>,
    /// The most memory one plugin call may use, in bytes.
    pub plugin_memory_bytes: u64,
    /// The most time one plugin call may take, in milliseconds.
    pub plugin_timeout_ms: u64,
}

/// One grader plugin of a grade shard: found in the bundle by its digest, checked against it
/// before it is compiled, and granted what the operator granted it on the coordinator (a
/// program to `exec` is that program on the machine).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GradePlugin {
    /// The name the plugin declares.
    pub name: String,
    /// Every name the judges use for it (its declared name, a path, an installed name).
    pub references: Vec<String>,
    /// sha256 of the component, hex.
    pub digest: String,
    /// Programs it may run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exec: Vec<String>,
    /// Directories it may read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_dirs: Vec<std::path::PathBuf>,
    /// HTTP hosts it may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<String>,
}

impl GradePlugin {
    /// Where the component is in the bundle directory.
    pub fn file(&self) -> String {
        format!("{GRADE_PLUGINS_DIR}/{}.wasm", self.digest)
    }
}

/// A conversation turn, as its bundle describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Turn {
    /// The coordinator holds a resume token for this turn: the worker asks for it
    /// ([`crate::client::RESUME_TOKEN`], with `need-tokens`) before the trial, and the client
    /// continues that conversation. False on a conversation's first turn and after `fresh`.
    pub resume: bool,
    /// An `api` client's conversation so far: its completed turns, oldest first, which the
    /// model sees before this turn's message. The conversation's own content (already in its
    /// turns' traces), never a secret; capped by mst serve
    /// (docs/serve.md, Conversations). Empty on a first or fresh turn and for
    /// `command` clients, which resume by token instead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<crate::client::Exchange>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Exchange;

    #[test]
    fn a_turn_without_history_is_the_part_one_bundle_and_one_with_it_round_trips() {
        let token_only = Turn {
            resume: true,
            history: Vec::new(),
        };
        assert_eq!(
            serde_json::to_value(&token_only).unwrap(),
            serde_json::json!({"resume": true}),
            "a command client's turn carries no history field"
        );
        let with_history = Turn {
            resume: false,
            history: vec![Exchange {
                user: "remember PLUM-7".into(),
                assistant: "noted".into(),
            }],
        };
        let text = serde_json::to_string(&with_history).unwrap();
        assert_eq!(
            text,
            r#"{"resume":false,"history":[{"user":"remember PLUM-7","assistant":"noted"}]}"#
        );
        assert_eq!(serde_json::from_str::<Turn>(&text).unwrap(), with_history);
        let stray = r#"{"resume":false,"history":[{"user":"a","assistant":"b","tools":[]}]}"#;
        assert!(serde_json::from_str::<Turn>(stray).is_err());
    }
}
