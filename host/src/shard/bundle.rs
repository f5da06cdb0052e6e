//! The bundle: everything a worker needs to collect its shard's trials, copied to the machine
//! before the worker starts. It never holds a secret: tokens travel only on the worker's stdin.
//! Nor does it hold the answers: its cases carry only an id and an input
//! ([`CaseRecord::for_client`]), since the agent under test runs on the same machine.
//!
//! [`Bundle::for_eval`] makes the bundle of one shard of an eval's run; its callers adjust it
//! (a playground turn, a grade shard). A bundle directory holds `bundle.json` (the shard's
//! settings, [`Bundle`]) and [`WORK_FILE`] (its trials, each case once with the trials of it),
//! which the worker reads a line at a time as it starts trials ([`WorkReader`]): its memory
//! does not grow with the shard.

use super::artifacts::BundleArtifacts;
use super::protocol::PROTOCOL;
use crate::eval::config::{EvalConfig, VariantSpec};
use crate::eval::plan::Plan;
use crate::eval::positions::Positions;
use crate::eval::trial::{CaseRecord, TrialKey};
use anyhow::{Context, Result};
use arcstr::ArcStr;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

/// The bundle's settings file inside the bundle directory.
pub const BUNDLE_FILE: &str = "bundle.json";

/// The bundle's work file inside the bundle directory: one [`WorkLine`] per line, a case and
/// the trials of it to collect, in the order of the bundle's trials.
pub const WORK_FILE: &str = "work.jsonl";

/// The largest bundle file (settings or work) a worker reads.
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
    /// The trials to collect, in order: the coordinator's list, written to [`WORK_FILE`] with
    /// their cases (never to `bundle.json`), and empty in the worker's copy, which reads them
    /// from there ([`WorkReader`]).
    #[serde(skip)]
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
    pub artifacts: Option<BundleArtifacts>,
    /// The checks of the shard's cases that have their own (they replace the variant's), by
    /// case id. Added within `mst.shard/v1`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub case_checks: BTreeMap<String, Vec<crate::eval::config::CheckSpec>>,
    /// The workspace each trial gets laid into its work directory before its client starts,
    /// by digest; each archive is `workspaces/<hex>.tar` in the bundle directory
    /// ([`WORKSPACES_DIR`]). Added within `mst.shard/v1` (see docs/protocol.md).
    #[serde(default, skip_serializing_if = "BundleWorkspaces::is_empty")]
    pub workspaces: BundleWorkspaces,
    /// Set when the runner allows egress by name but can bind no socket into the machine (a
    /// container): each trial's proxy port reaches the coordinator's egress proxy over this
    /// protocol (`egress-open`, `egress-data`, `egress-close`). Added within `mst.shard/v1`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub egress: bool,
    /// Set for a grade shard (`mst grade RUN --runner …`): the worker runs the stored trials'
    /// judges instead of a client, and each trial's answer is their calls. Added within
    /// `mst.shard/v1` (see docs/protocol.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grading: Option<crate::grade::remote::GradeWork>,
}

/// The bundle directory's folder of workspace archives, each named by its digest
/// ([`crate::workspace::archive_name`]).
pub const WORKSPACES_DIR: &str = "workspaces";

/// Which workspace each of a bundle's trials gets, by digest: its case's own, else its
/// variant's.
pub type BundleWorkspaces = crate::eval::per_trial::CaseOrVariant<String>;

impl BundleWorkspaces {
    /// Every digest named, once.
    pub fn digests(&self) -> BTreeSet<&str> {
        (self.variants.values().chain(self.cases.values()))
            .map(String::as_str)
            .collect()
    }
}

/// Which shard of a run a bundle is: the `index`th of `of`, counting from 0 (a
/// playground task's one-trial bundle is shard 0 of 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardIndex {
    /// 0-based, below `of`.
    pub index: u32,
    /// How many shards the run has.
    pub of: u32,
}

impl Bundle {
    /// The bundle of `shard` of `config`'s run `run_id` that collects `trials`: the specs of
    /// the variants they name, and the eval's concurrency, timeout and artefacts. Its cases are
    /// not in it: [`write`] writes them beside it.
    pub fn for_eval(
        config: &EvalConfig,
        run_id: &str,
        trials: Vec<TrialKey>,
        shard: ShardIndex,
        heartbeat_ms: u64,
    ) -> Bundle {
        Bundle {
            protocol: PROTOCOL.to_string(),
            mst: env!("CARGO_PKG_VERSION").to_string(),
            run_id: run_id.to_string(),
            eval: config.name.clone(),
            shard: shard.index,
            shards: shard.of,
            concurrency: config.concurrency,
            timeout_ms: (config.timeout * 1000.0) as u64,
            heartbeat_ms,
            variants: variants_of(config, trials.iter().cloned()),
            trials,
            workdir: None,
            conversation: None,
            token_budget: None,
            artifacts: config.artifacts.enabled.then(|| BundleArtifacts {
                max_trial_bytes: config.artifacts.max_trial_bytes(),
            }),
            case_checks: BTreeMap::new(),
            workspaces: BundleWorkspaces::default(),
            egress: false,
            grading: None,
        }
    }

    /// The bundle's own list of trials.
    pub fn own_trials(&self) -> ShardTrials<'_> {
        ShardTrials::Keys(&self.trials)
    }
}

/// The specs of the variants `trials` name.
pub fn variants_of(
    config: &EvalConfig,
    trials: impl Iterator<Item = TrialKey>,
) -> BTreeMap<String, VariantSpec> {
    // Inserted one at a time: collecting into a set first gathers every trial's name into a
    // list and sorts it (3.7 MB at 100,000 trials, once the peak of a whole run).
    let mut names: BTreeSet<arcstr::ArcStr> = BTreeSet::new();
    for key in trials {
        names.insert(key.variant);
    }
    (names.into_iter())
        .map(|name| (name.to_string(), config.variant(&name)))
        .collect()
}

/// A shard's trials as the coordinator holds them while the shard runs: the bundle's own list
/// of keys, or positions in the run's plan ([`Positions`]: about a byte and a half a trial
/// where a key takes 24; a run's shards together hold one per trial).
#[derive(Debug, Clone, Copy)]
pub enum ShardTrials<'a> {
    Keys(&'a [TrialKey]),
    InPlan { plan: &'a Plan, at: &'a Positions },
}

impl<'a> ShardTrials<'a> {
    /// How many trials the shard has.
    pub fn len(&self) -> usize {
        match self {
            ShardTrials::Keys(keys) => keys.len(),
            ShardTrials::InPlan { at, .. } => at.len(),
        }
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shard's trial at `index`, if it has one: a plan's shares the plan's variant name.
    pub fn get(&self, index: usize) -> Option<TrialKey> {
        match *self {
            ShardTrials::Keys(keys) => keys.get(index).cloned(),
            ShardTrials::InPlan { plan, at } => at.get(index).map(|at| plan.key(at as usize)),
        }
    }

    /// `key`, the shard's trial at `index`, as the shard holds it: its own list's key
    /// (sharing the list's names), or `key` with the plan's name of its variant (a key made
    /// from the plan would copy the case's id).
    pub fn planned(&self, index: usize, key: TrialKey) -> TrialKey {
        match *self {
            ShardTrials::Keys(keys) => keys.get(index).cloned().unwrap_or(key),
            ShardTrials::InPlan { plan, at } => match at.get(index) {
                Some(at) => TrialKey {
                    variant: plan.parts(at as usize).0.clone(),
                    ..key
                },
                None => key,
            },
        }
    }

    /// The shard's trials, in order.
    pub fn iter(&self) -> Box<dyn Iterator<Item = TrialKey> + 'a> {
        match *self {
            ShardTrials::Keys(keys) => Box::new(keys.iter().cloned()),
            ShardTrials::InPlan { plan, at } => Box::new(at.iter().map(|at| plan.key(at as usize))),
        }
    }
}

/// A shard's trials with what finds a key among them: the positions of the bundle's own keys
/// sorted by key (4 bytes a trial, where a map took 30), or nothing for positions in a plan
/// (the plan finds a key's position).
pub struct FoundTrials<'a> {
    trials: ShardTrials<'a>,
    by_key: Vec<u32>,
}

impl<'a> FoundTrials<'a> {
    /// Indexes `trials`.
    pub fn new(trials: ShardTrials<'a>) -> Self {
        let by_key = match trials {
            ShardTrials::Keys(keys) => crate::eval::trial::sorted_positions(keys, |key| key),
            ShardTrials::InPlan { .. } => Vec::new(),
        };
        FoundTrials { trials, by_key }
    }

    /// The trials.
    pub fn trials(&self) -> ShardTrials<'a> {
        self.trials
    }

    /// The index of trial `key` in the shard, if it has it.
    pub fn find(&self, key: &TrialKey) -> Option<usize> {
        match self.trials {
            ShardTrials::Keys(keys) => {
                crate::eval::trial::find_position(keys, &self.by_key, |key| key, key)
            }
            ShardTrials::InPlan { plan, at } => at.find(plan.position(key)? as u32),
        }
    }
}

/// One line of [`WORK_FILE`]: a case as its client sees it (`id` and `input`), and the trials
/// of it to collect, in order.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkLine<'a, C> {
    pub case: C,
    #[serde(borrow)]
    pub trials: Vec<WorkTrial<'a>>,
}

/// One trial of a [`WorkLine`]'s case: its variant and repetition.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkTrial<'a> {
    #[serde(borrow)]
    pub variant: Cow<'a, str>,
    pub trial: u32,
}

/// Writes `bundle` into the directory `dir`: [`WORK_FILE`] with its trials (`in_plan`, or the
/// bundle's own list when `None`), a line per run of consecutive trials of one case (a plan's
/// trials of a case are consecutive: each case is written once), with the case `case_of`
/// gives: what its client may see, never the answers; then `bundle.json`, its
/// [`Bundle::case_checks`] those of the cases written that have their own (each case is read
/// once, for both). A grade shard's bundle gets none: its machine runs judges, never a case's
/// programs.
pub fn write<'c>(
    dir: &Path,
    bundle: &mut Bundle,
    in_plan: Option<ShardTrials<'_>>,
    case_of: impl Fn(&str) -> Result<Option<Cow<'c, CaseRecord>>>,
) -> Result<()> {
    let trials = in_plan.unwrap_or(ShardTrials::Keys(&bundle.trials));
    let collects = bundle.grading.is_none();
    let mut case_checks = BTreeMap::new();
    crate::files::write_atomic_with(&dir.join(WORK_FILE), |out| {
        let mut keys = trials.iter().peekable();
        while let Some(first) = keys.next() {
            // A case's trials lie together: one line each.
            let id = first.case.clone();
            let mut trials = vec![first];
            while let Some(key) = keys.next_if(|key| key.case == id) {
                trials.push(key);
            }
            let case = case_of(&id).map_err(|e| std::io::Error::other(format!("{e:#}")))?;
            let case = case.ok_or_else(|| {
                std::io::Error::other(format!("its trials name case `{id}`, which is not planned"))
            })?;
            if let Some(own) = case.more().checks.as_ref().filter(|_| collects) {
                case_checks.insert(id.to_string(), own.clone());
            }
            let line = WorkLine {
                case: case.for_client(),
                trials: (trials.iter())
                    .map(|key| WorkTrial {
                        variant: Cow::Borrowed(&key.variant),
                        trial: key.trial,
                    })
                    .collect(),
            };
            serde_json::to_writer(&mut *out, &line)?;
            out.write_all(b"\n")?;
        }
        Ok(())
    })?;
    bundle.case_checks = case_checks;
    crate::files::write_atomic_with(&dir.join(BUNDLE_FILE), |out| {
        serde_json::to_writer(out, &*bundle).map_err(Into::into)
    })
}

/// A worker's reading of its bundle's [`WORK_FILE`]: the trials in order, each with its case,
/// one line held at a time.
pub struct WorkReader {
    lines: crate::files::LineReader,
    /// The line being handed out.
    current: Option<WorkCase>,
    /// Trials not handed out yet.
    left: u64,
}

/// A work line as a worker holds it: the case, and its trials still to hand out (variant and
/// repetition), last first.
struct WorkCase {
    case: Arc<CaseRecord>,
    trials: Vec<(ArcStr, u32)>,
}

impl WorkReader {
    /// Opens the work file of the bundle in `bundle_dir`. It is read through once first: a
    /// broken line is refused, by its number, before any trial starts, and the trials are
    /// counted; then the same open file is read again from its start, a line at a time.
    pub fn open(bundle_dir: &Path) -> Result<Self> {
        let path = bundle_dir.join(WORK_FILE);
        let cap = MAX_BUNDLE_BYTES;
        let mut lines = crate::files::LineReader::open(&path, cap, cap as usize)?;
        let mut left = 0;
        while let Some(line) = lines.next_line()? {
            let trials = serde_json::from_slice::<WorkLine<'_, CaseRecord>>(line)
                .map(|line| line.trials.len() as u64);
            left += trials.with_context(|| {
                format!(
                    "{} line {} is not a case and its trials",
                    path.display(),
                    lines.number()
                )
            })?;
        }
        Ok(WorkReader {
            lines: lines.rewound()?,
            current: None,
            left,
        })
    }

    /// The next trial to collect and its case (shared by the case's trials), or `None` when
    /// every trial has been handed out. A file that no longer holds what the first reading
    /// counted (cut short, or changed) is an error, never a shard that waits for trials.
    pub fn next_trial(&mut self) -> Result<Option<(TrialKey, Arc<CaseRecord>)>> {
        loop {
            if let Some(WorkCase { case, trials }) = &mut self.current {
                if let Some((variant, trial)) = trials.pop() {
                    self.left -= 1;
                    let key = TrialKey {
                        variant,
                        case: case.id.clone(),
                        trial,
                    };
                    return Ok(Some((key, case.clone())));
                }
            }
            self.current = None;
            if self.left == 0 {
                return Ok(None);
            }
            // A line that is not what the first reading counted: the file changed.
            let next = self.lines.next_line()?.and_then(|line| {
                let line: WorkLine<'_, CaseRecord> = serde_json::from_slice(line).ok()?;
                let trials: Vec<(ArcStr, u32)> = (line.trials.into_iter().rev())
                    .map(|t| (ArcStr::from(&*t.variant), t.trial))
                    .collect();
                Some(WorkCase {
                    case: Arc::new(line.case),
                    trials,
                })
            });
            match next {
                Some(work) if work.trials.len() as u64 <= self.left => self.current = Some(work),
                _ => anyhow::bail!(self.changed()),
            }
        }
    }

    /// Why the file cannot be read on: it no longer holds what was counted.
    fn changed(&self) -> String {
        format!(
            "{} changed while it was read (at line {}, {} trial(s) still to come)",
            self.lines.path().display(),
            self.lines.number(),
            self.left
        )
    }

    /// How many trials have not been handed out.
    pub fn left(&self) -> u64 {
        self.left
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

    fn key(variant: &str, case: &str, trial: u32) -> TrialKey {
        TrialKey::new(variant, case, trial)
    }

    #[test]
    fn the_work_file_hands_out_each_trial_in_order_with_its_case_and_never_an_answer() {
        let dir = tempfile::tempdir().unwrap();
        let mut answered = CaseRecord::new("a", "first".into());
        answered.expected = Some("answer-canary".into());
        let mut checked = CaseRecord::new("b", "second".into());
        checked.more_mut().checks = Some(
            serde_json::from_value(serde_json::json!([{"name": "own", "run": ["true"]}])).unwrap(),
        );
        let cases = [answered, checked];
        let trials = vec![
            key("v", "a", 0),
            key("w", "a", 0),
            key("v", "b", 0),
            key("v", "a", 1),
        ];
        let mut bundle = Bundle {
            trials: trials.clone(),
            ..Bundle::for_eval(
                &EvalConfig::parse(
                    r#"{"name": "t", "datasets": ["x"], "client": "command",
                        "variants": {"v": {}, "w": {}}}"#,
                    Path::new("e.json"),
                )
                .unwrap(),
                "run",
                Vec::new(),
                ShardIndex { index: 0, of: 1 },
                1000,
            )
        };
        let case_of = |id: &str| Ok(cases.iter().find(|c| &*c.id == id).map(Cow::Borrowed));
        write(dir.path(), &mut bundle, None, case_of).unwrap();
        let settings = std::fs::read_to_string(dir.path().join(BUNDLE_FILE)).unwrap();
        for held in ["trials", "cases", "first", "answer-canary"] {
            assert!(!settings.contains(held), "{held}: {settings}");
        }
        // The checks of the cases that have their own, gathered as the cases were written.
        let written: Bundle = serde_json::from_str(&settings).unwrap();
        assert_eq!(
            written.case_checks.keys().collect::<Vec<_>>(),
            ["b"],
            "{settings}"
        );
        assert_eq!(written.case_checks, bundle.case_checks);
        // A grade shard's machine runs judges: no case's programs go to it.
        let mut grading = Bundle {
            grading: Some(crate::grade::remote::GradeWork {
                variant_judges: BTreeMap::new(),
                case_judges: BTreeMap::new(),
                plugins: Vec::new(),
                plugin_memory_bytes: 1 << 20,
                plugin_timeout_ms: 1000,
            }),
            ..bundle.clone()
        };
        write(dir.path(), &mut grading, None, case_of).unwrap();
        assert!(grading.case_checks.is_empty());
        let settings = std::fs::read_to_string(dir.path().join(BUNDLE_FILE)).unwrap();
        assert!(!settings.contains("own"), "{settings}");
        let work = std::fs::read_to_string(dir.path().join(WORK_FILE)).unwrap();
        assert!(!work.contains("answer-canary"), "{work}");
        // Case `a` comes back after `b`: a line per run of one case's trials.
        assert_eq!(work.lines().count(), 3, "{work}");

        let mut reader = WorkReader::open(dir.path()).unwrap();
        assert_eq!(reader.left(), 4);
        let mut read = Vec::new();
        while let Some((key, case)) = reader.next_trial().unwrap() {
            assert_eq!(case.id, key.case);
            assert!(case.expected.is_none());
            read.push((key, case.input.clone()));
        }
        let inputs = ["first", "first", "second", "first"];
        assert_eq!(
            read.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
            trials
        );
        assert!(read
            .iter()
            .zip(inputs)
            .all(|((_, input), want)| input == want));
        assert_eq!(reader.left(), 0);

        // A case the plan does not hold stages nothing.
        let mut stray = Bundle {
            trials: vec![key("v", "zz", 0)],
            ..bundle.clone()
        };
        let error = write(dir.path(), &mut stray, None, case_of).unwrap_err();
        assert!(format!("{error:#}").contains("case `zz`"), "{error:#}");
    }

    #[test]
    fn a_broken_work_file_is_refused_by_its_line_before_any_trial() {
        let dir = tempfile::tempdir().unwrap();
        let good = r#"{"case": {"id": "a", "input": 1}, "trials": [{"variant": "v", "trial": 0}]}"#;
        let answers = r#"{"case": {"id": "b", "input": 1}, "trials": [], "expected": 2}"#;
        std::fs::write(dir.path().join(WORK_FILE), format!("{good}\n{answers}\n")).unwrap();
        let error = WorkReader::open(dir.path()).err().unwrap();
        assert!(format!("{error:#}").contains("line 2"), "{error:#}");

        // Cut short after it was counted (the agent shares the machine): an error, not a wait.
        // Each line is longer than the read buffer, so the second is not read yet.
        let good = format!(
            r#"{{"case": {{"id": "a", "input": "{}"}}, "trials": [{{"variant": "v", "trial": 0}}]}}"#,
            "y".repeat(20_000)
        );
        let path = dir.path().join(WORK_FILE);
        std::fs::write(&path, format!("{good}\n{good}\n")).unwrap();
        let mut reader = WorkReader::open(dir.path()).unwrap();
        assert_eq!(reader.left(), 2);
        assert!(reader.next_trial().unwrap().is_some());
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(good.len() as u64 + 1)
            .unwrap();
        let error = reader.next_trial().err().unwrap();
        assert!(
            format!("{error:#}").contains("changed while it was read"),
            "{error:#}"
        );
        std::fs::remove_file(dir.path().join(WORK_FILE)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join(WORK_FILE)).unwrap();
        assert!(WorkReader::open(dir.path()).is_err(), "a link is not read");
    }

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
