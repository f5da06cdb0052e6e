//! Views of results for people: the self-contained HTML report (`mst report`) and the web UI of
//! `mst serve`. Both draw one data shape, [`RunView`], with one page script
//! (`assets/report.js`), so a run looks the same in a file opened offline and in the browser tab
//! of a server.

pub mod charts;
pub mod html;

use crate::eval::trial::TrialKey;
use crate::grade::pairwise::PairResult;
use crate::grade::{JudgeScores, TrialGrade};
use crate::results::stored::StoredRun;
use crate::results::{RunDir, Summary};
use anyhow::Result;
use serde::Serialize;

/// The data format a page reads; a page refuses another.
pub const VIEW_FORMAT: &str = "mst.view/v1";

/// How one trial ended, the four outcomes of a run kept apart (`passed` and `failed` are both
/// graded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrialOutcome {
    Passed,
    Failed,
    NotGraded,
    Infra,
    Missing,
}

/// One trial as a row of the page: what the tables, filters and search read. Its whole trace is
/// fetched apart, when the row is opened.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TrialRow<'a> {
    pub variant: &'a str,
    pub case: &'a str,
    pub trial: u32,
    pub outcome: TrialOutcome,
    /// The weighted score, when graded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// Every judge's score and reason, when graded.
    #[serde(skip_serializing_if = "JudgeScores::is_empty")]
    pub judges: JudgeScores,
    /// Why it is not graded (the judge and its error) or an infrastructure failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// The case's tags, from its trace.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub tags: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// How many events its trace holds (0 when missing).
    pub events: usize,
    /// Whether a trace came back (a missing trial has none to open).
    pub has_trace: bool,
}

/// A run as the pages show it: its provenance, its summary exactly as `summary.json` holds it,
/// one row per planned trial (in plan order) and the pairwise verdicts.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunView<'a> {
    pub format: &'static str,
    /// `run.json` without its list of trials (the rows carry them).
    pub run: &'a serde_json::Value,
    pub summary: &'a Summary,
    pub trials: TrialRows<'a>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub pairs: &'a [PairResult],
    /// The comparison with `--baseline`, when one was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<crate::results::diff::RunDiff>,
    /// The run's charts as SVG markup ([`charts::run_charts`]), for a page that draws itself
    /// from the view; the report file carries them as static markup instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub charts: Option<String>,
}

/// A view's rows, one per planned trial in plan order, each made as it is written out: a view
/// of 100,000 trials never holds them all.
pub struct TrialRows<'a> {
    run: &'a LoadedRun,
    /// Where each trace is read, and handed on, as its row is written (a run loaded without its
    /// traces' facts): the report reads every trace once, and keeps nothing of it.
    reading: Option<(&'a RunDir, &'a TraceSink<'a>)>,
    /// What the charts draw of each row, gathered as the rows are written.
    samples: Option<&'a std::cell::RefCell<charts::Samples>>,
}

/// What each trace's compact JSON is handed to, with its index in the plan, as its row is
/// written.
pub type TraceSink<'a> = std::cell::RefCell<&'a mut dyn FnMut(usize, &[u8]) -> std::io::Result<()>>;

impl Serialize for TrialRows<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeSeq};
        let run = self.run;
        let trials = &run.run.record.trials;
        let mut rows = serializer.serialize_seq(Some(trials.len()))?;
        for (index, key) in trials.keys().enumerate() {
            let read: Option<TraceFacts>;
            let facts = match self.reading {
                Some((dir, sink)) => {
                    read = match run.run.read_trace_line::<RowLine>(dir, &key) {
                        Some((trace, line)) => {
                            (sink.borrow_mut())(index, &line).map_err(S::Error::custom)?;
                            Some(TraceFacts::of(trace))
                        }
                        None => None,
                    };
                    read.as_ref()
                }
                None => run.facts.get(index).and_then(Option::as_ref),
            };
            let row = run.row(&key, facts);
            if let Some(samples) = self.samples {
                samples
                    .borrow_mut()
                    .add(row.variant, row.score, row.duration_ms);
            }
            rows.serialize_element(&row)?;
        }
        rows.end()
    }
}

impl std::fmt::Debug for TrialRows<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TrialRows({} trials)", self.run.run.record.trials.len())
    }
}

/// What a row shows of a trial's trace, kept instead of the trace by a served view, which
/// reads a trace again only when it is opened. 32 bytes: the tags, which few cases have, are
/// boxed.
struct TraceFacts {
    // A thin pointer on purpose: 8 bytes for a list few trials have (a boxed slice is 16).
    #[allow(clippy::box_collection)]
    tags: Option<Box<Vec<String>>>,
    duration_ms: u64,
    exit_code: Option<i32>,
    events: u32,
}

/// A trace line as a row reads it: which trial it is, and the row's facts; the events are
/// counted, not parsed, and the rest is skipped.
#[derive(serde::Deserialize)]
struct RowLine {
    case: RowCase,
    variant: Option<String>,
    #[serde(default)]
    trial: u32,
    trace: RowTrace,
}

#[derive(serde::Deserialize)]
struct RowCase {
    id: String,
    #[serde(default)]
    tags: Vec<String>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct RowTrace {
    #[serde(default)]
    duration_ms: u64,
    #[serde(default)]
    exit_code: Option<i32>,
    #[serde(default)]
    events: Vec<serde::de::IgnoredAny>,
}

impl crate::results::trace_log::TraceLine for RowLine {
    fn is_of(&self, key: &TrialKey) -> bool {
        crate::eval::trial::variant_or_default(self.variant.as_deref()) == &*key.variant
            && self.case.id == *key.case
            && self.trial == key.trial
    }
}

impl TraceFacts {
    fn of(line: RowLine) -> Self {
        let tags = line.case.tags;
        TraceFacts {
            tags: (!tags.is_empty()).then(|| Box::new(tags)),
            duration_ms: line.trace.duration_ms,
            exit_code: line.trace.exit_code,
            events: line.trace.events.len().try_into().unwrap_or(u32::MAX),
        }
    }
}

/// A stored run read for a view: the run, and what its rows show of each trace.
pub struct LoadedRun {
    pub run: StoredRun,
    /// Each planned trial's facts, in plan order (none for a missing trace); empty when the
    /// rows read the traces as they are written.
    facts: Vec<Option<TraceFacts>>,
    /// `run.json` as the view shows it: without its trial list (the rows are the trials), made
    /// once, without ever turning 100,000 trial keys into a JSON tree.
    record: serde_json::Value,
}

impl LoadedRun {
    /// Reads the run in `dir`, and its traces one at a time, keeping what the rows show of each:
    /// for a view served many times.
    pub fn read(dir: &RunDir) -> Result<Self> {
        let mut run = Self::without_traces(StoredRun::read(dir)?);
        run.facts = (run.run.record.trials.keys())
            .map(|key| {
                let (line, _) = run.run.read_trace_line::<RowLine>(dir, &key)?;
                Some(TraceFacts::of(line))
            })
            .collect();
        Ok(run)
    }

    /// `run` with none of its traces read: for a view written once ([`Self::view_reading`]),
    /// whose rows read them.
    pub fn without_traces(mut run: StoredRun) -> Self {
        let trials = std::mem::take(&mut run.record.trials);
        let mut record = serde_json::to_value(&run.record).unwrap_or_default();
        run.record.trials = trials;
        if let Some(map) = record.as_object_mut() {
            map.remove("trials");
        }
        LoadedRun {
            run,
            facts: Vec::new(),
            record,
        }
    }

    /// The view of this run, its rows made from the facts read with it, and its charts.
    pub fn view(&self) -> RunView<'_> {
        let mut view = self.view_with(None, None);
        view.charts = Some(charts::run_charts(&self.run.summary, &self.samples()));
        view
    }

    /// The view of this run, its rows made as they are written from the traces in `dir`, each
    /// trace then handed to `sink`, and dropped: a trace is read once, and nothing of it kept.
    /// What the charts draw of each row goes to `samples`.
    pub fn view_reading<'a>(
        &'a self,
        dir: &'a RunDir,
        sink: &'a TraceSink<'a>,
        samples: &'a std::cell::RefCell<charts::Samples>,
    ) -> RunView<'a> {
        self.view_with(Some((dir, sink)), Some(samples))
    }

    fn view_with<'a>(
        &'a self,
        reading: Option<(&'a RunDir, &'a TraceSink<'a>)>,
        samples: Option<&'a std::cell::RefCell<charts::Samples>>,
    ) -> RunView<'a> {
        RunView {
            format: VIEW_FORMAT,
            run: &self.record,
            summary: &self.run.summary,
            trials: TrialRows {
                run: self,
                reading,
                samples,
            },
            pairs: &self.run.pairs,
            diff: None,
            charts: None,
        }
    }

    /// What the charts draw of the rows, from the facts read with the run.
    fn samples(&self) -> charts::Samples {
        let mut samples = charts::Samples::default();
        for (index, key) in self.run.record.trials.keys().enumerate() {
            let facts = self.facts.get(index).and_then(Option::as_ref);
            let row = self.row(&key, facts);
            samples.add(row.variant, row.score, row.duration_ms);
        }
        samples
    }

    /// The row of `key`, whose trace has `trace`'s facts (none when missing).
    fn row<'a>(&'a self, key: &'a TrialKey, trace: Option<&'a TraceFacts>) -> TrialRow<'a> {
        // Owned: the grade may have been read from a file for this row alone.
        let grade = self.run.grades.get(key).map(std::borrow::Cow::into_owned);
        let none = JudgeScores::new();
        let (outcome, score, judges, cause) = match grade {
            Some(TrialGrade::Graded {
                score,
                pass,
                judges,
            }) => (
                match pass {
                    true => TrialOutcome::Passed,
                    false => TrialOutcome::Failed,
                },
                Some(score),
                judges,
                None,
            ),
            Some(TrialGrade::NotGraded { judge, error }) => (
                TrialOutcome::NotGraded,
                None,
                none,
                Some(format!("{judge}: {error}")),
            ),
            Some(TrialGrade::Infra { reason }) => (TrialOutcome::Infra, None, none, Some(reason)),
            None => (TrialOutcome::Missing, None, none, None),
        };
        TrialRow {
            variant: &key.variant,
            case: &key.case,
            trial: key.trial,
            outcome,
            score,
            judges,
            cause,
            tags: trace
                .and_then(|t| t.tags.as_deref())
                .map_or(&[][..], Vec::as_slice),
            duration_ms: trace.map(|t| t.duration_ms),
            exit_code: trace.and_then(|t| t.exit_code),
            events: trace.map_or(0, |t| t.events as usize),
            has_trace: trace.is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::trial::{CaseRecord, TrialRecord};
    use crate::results::trace_log::TraceLine;

    #[test]
    fn a_row_reads_its_facts_and_its_trial_from_the_trace_line_alone() {
        let mut case = CaseRecord::new("c1", serde_json::json!("in"));
        case.more_mut().tags = vec!["smoke".into()];
        let mut record = TrialRecord::answered(case, "out");
        record.variant = "agent".into();
        record.trial = 2;
        record.trace.exit_code = Some(3);
        record.trace.duration_ms = 41;
        for seq in 0..2 {
            record.trace.events.push(crate::eval::trial::TraceEvent {
                seq,
                at_ms: 4,
                kind: crate::eval::trial::EventKind::ToolCall {
                    id: seq.to_string(),
                    server: None,
                    tool: "now".into(),
                    arguments: serde_json::json!({"nested": [{"deep": 1}]}),
                },
            });
        }
        let line: RowLine = serde_json::from_slice(&serde_json::to_vec(&record).unwrap()).unwrap();
        assert!(line.is_of(&TrialKey::new("agent", "c1", 2)));
        assert!(!line.is_of(&TrialKey::new("agent", "c1", 1)));
        assert!(!line.is_of(&TrialKey::new("default", "c1", 2)));
        let facts = TraceFacts::of(line);
        assert_eq!(facts.tags.as_deref(), Some(&vec!["smoke".to_string()]));
        assert_eq!(
            (facts.duration_ms, facts.exit_code, facts.events),
            (41, Some(3), 2)
        );
    }
}
