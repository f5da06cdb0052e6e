//! `limits` and `artifacts`: how many trials run at once per provider and server, and how
//! much of a trial's artefacts comes back.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most trials at once, per model provider and per MCP server, across all shards.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimits {
    #[serde(default)]
    pub providers: BTreeMap<String, u32>,
    #[serde(default)]
    pub servers: BTreeMap<String, u32>,
}

/// The eval's `artifacts`: whether trials keep artefacts (the files a client writes into
/// `$MST_ARTIFACTS`, and the worker's diagnosis of a failed trial), and how much of them comes
/// back. Off for evals whose transcripts must not be stored: a diagnosis holds the end of the
/// client's output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ArtifactsConfig {
    /// Whether trials keep artefacts (default true).
    #[serde(default = "super::yes")]
    pub enabled: bool,
    /// The most MiB one trial's artefacts bring back (default 16).
    #[serde(default = "super::sixteen", rename = "maxTrialMiB")]
    pub max_trial_mib: u64,
    /// The most MiB all of a run's artefacts bring back (default 1024).
    #[serde(default = "super::gibibyte", rename = "maxRunMiB")]
    pub max_run_mib: u64,
}

impl Default for ArtifactsConfig {
    fn default() -> Self {
        ArtifactsConfig {
            enabled: true,
            max_trial_mib: super::sixteen(),
            max_run_mib: super::gibibyte(),
        }
    }
}

impl ArtifactsConfig {
    /// The per-trial cap in bytes.
    pub fn max_trial_bytes(&self) -> u64 {
        self.max_trial_mib.saturating_mul(1 << 20)
    }
    /// The per-run cap in bytes.
    pub fn max_run_bytes(&self) -> u64 {
        self.max_run_mib.saturating_mul(1 << 20)
    }
}
