//! Cases, traces and trials in their stored JSON form, and their conversion to and from the
//! plugin ABI's types. JSON values (inputs, expected values, tool arguments) stay JSON here and
//! travel to plugins as JSON text.

use crate::plugin::bindings as wit;
use anyhow::{Context, Result};
use arcstr::ArcStr;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;

/// Identifies one trial: a case under a variant, and the repetition number.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrialKey {
    /// Shared by every trial of the variant: a run of 100,000 trials holds each name once.
    pub variant: ArcStr,
    /// Shared by the trials of the case a list holds (the keys a plan lists, the ones a
    /// worker reads from its bundle).
    pub case: ArcStr,
    /// 0-based repetition.
    pub trial: u32,
}

// A shard's own list, the grades held in memory and every message name trials by key: the
// names are thin shared strings ([`ArcStr`], one word each; `Arc<str>` is two), so a key is
// 24 bytes rather than 40. (A run's plan holds no keys: it makes them.)
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<TrialKey>() == 24);

impl TrialKey {
    /// Repetition `trial` of `case` under `variant`.
    pub fn new(variant: impl Into<ArcStr>, case: impl Into<ArcStr>, trial: u32) -> Self {
        TrialKey {
            variant: variant.into(),
            case: case.into(),
            trial,
        }
    }
}

impl fmt::Display for TrialKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.variant, self.case, self.trial)
    }
}

/// One evaluation case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "CaseFields", into = "CaseFields")]
pub struct CaseRecord {
    /// Unique within the eval. Shared with the keys of the case's trials.
    pub id: ArcStr,
    /// What the client under test receives.
    pub input: Value,
    /// What a good answer looks like.
    pub expected: Option<Value>,
    /// The fields few cases have, boxed together: a case without them costs eight bytes for
    /// them all. Read with [`Self::more`].
    pub more: Option<Box<CaseMore>>,
}

/// Cases by id, searched by halves: a list held in memory, with its positions sorted by id
/// (a map would cost a run of 100,000 cases about 4 MB more), or the eval's [`Cases`], kept
/// in their file and read back by id. The coordinator finds a trace's case here.
///
/// [`Cases`]: super::dataset::Cases
#[derive(Debug)]
pub enum CaseIndex<'a> {
    Held {
        cases: &'a [CaseRecord],
        by_id: Vec<u32>,
    },
    Kept(&'a super::dataset::Cases),
}

/// The positions of `items` sorted by `key`: an index searched by halves, four bytes an item
/// (the plan's trials, a shard's, the cases, where a map would cost several times that).
pub fn sorted_positions<T, K: Ord + ?Sized>(items: &[T], key: impl Fn(&T) -> &K) -> Vec<u32> {
    let mut sorted: Vec<u32> = (0..items.len() as u32).collect();
    sorted.sort_unstable_by(|a, b| key(&items[*a as usize]).cmp(key(&items[*b as usize])));
    sorted
}

/// The position in `items` of the item whose key is `wanted`, through `sorted`, made from
/// `items` by [`sorted_positions`] with the same `key`.
pub fn find_position<T, K: Ord + ?Sized>(
    items: &[T],
    sorted: &[u32],
    key: impl Fn(&T) -> &K,
    wanted: &K,
) -> Option<usize> {
    let at = sorted
        .binary_search_by(|at| key(&items[*at as usize]).cmp(wanted))
        .ok()?;
    Some(sorted[at] as usize)
}

impl<'a> CaseIndex<'a> {
    /// Indexes `cases`, whose ids are unique (the datasets' loader sees to it).
    pub fn new(cases: &'a [CaseRecord]) -> Self {
        let by_id = sorted_positions(cases, |case| &*case.id);
        CaseIndex::Held { cases, by_id }
    }

    /// The eval's cases, read from their file when asked for.
    pub fn kept(cases: &'a super::dataset::Cases) -> Self {
        CaseIndex::Kept(cases)
    }

    /// The case whose id is `id`: borrowed when held, read back when kept in a file (which
    /// can fail).
    pub fn get(&self, id: &str) -> anyhow::Result<Option<Cow<'a, CaseRecord>>> {
        match self {
            CaseIndex::Held { cases, by_id } => {
                let at = find_position(cases, by_id, |case| &*case.id, id);
                Ok(at.map(|at| Cow::Borrowed(&cases[at])))
            }
            CaseIndex::Kept(cases) => Ok(cases.get(id)?.map(Cow::Owned)),
        }
    }

    /// Whether a case's id is `id`.
    pub fn contains(&self, id: &str) -> bool {
        match self {
            CaseIndex::Held { cases, by_id } => {
                find_position(cases, by_id, |case| &*case.id, id).is_some()
            }
            CaseIndex::Kept(cases) => cases.contains(id),
        }
    }
}

/// A case's rarer fields ([`CaseRecord::more`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CaseMore {
    pub tags: Vec<String>,
    pub metadata: Option<Value>,
    /// Repetitions of this case, overriding the eval's `trials`.
    pub trials: Option<u32>,
    /// Pass threshold for this case, overriding the eval's `passThreshold`.
    pub pass_threshold: Option<f64>,
    /// Judges for this case, replacing the eval's `judges`.
    pub judges: Option<Vec<crate::eval::config::JudgeConfig>>,
    /// How this case's trials make its verdict, overriding the eval's `casePass`.
    pub case_pass: Option<crate::eval::config::CasePassConfig>,
    /// Checks run in the machine after this case's trials, replacing the variant's.
    pub checks: Option<Vec<crate::eval::config::CheckSpec>>,
    /// The files laid into this case's trials' work directories, replacing the variant's:
    /// anchored to the dataset file's directory as it is read.
    pub workspace: Option<crate::eval::config::WorkspaceSpec>,
    /// The Docker image this case's trials run in, replacing the variant's and the runner's.
    pub image: Option<String>,
}

/// What a case without any of the rarer fields has of them.
static NO_MORE: CaseMore = CaseMore {
    tags: Vec::new(),
    metadata: None,
    trials: None,
    pass_threshold: None,
    judges: None,
    case_pass: None,
    checks: None,
    workspace: None,
    image: None,
};

/// A case as datasets, bundles and traces spell it: every field at the top level.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseFields {
    id: ArcStr,
    input: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expected: Option<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    metadata: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    trials: Option<u32>,
    #[serde(
        default,
        rename = "passThreshold",
        skip_serializing_if = "Option::is_none"
    )]
    pass_threshold: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    judges: Option<Vec<crate::eval::config::JudgeConfig>>,
    #[serde(default, rename = "casePass", skip_serializing_if = "Option::is_none")]
    case_pass: Option<crate::eval::config::CasePassConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    checks: Option<Vec<crate::eval::config::CheckSpec>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    workspace: Option<crate::eval::config::WorkspaceSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    image: Option<String>,
}

impl From<CaseFields> for CaseRecord {
    fn from(fields: CaseFields) -> Self {
        let CaseFields {
            id,
            input,
            expected,
            tags,
            metadata,
            trials,
            pass_threshold,
            judges,
            case_pass,
            checks,
            workspace,
            image,
        } = fields;
        let more = CaseMore {
            tags,
            metadata,
            trials,
            pass_threshold,
            judges,
            case_pass,
            checks,
            workspace,
            image,
        };
        CaseRecord {
            id,
            input,
            expected,
            more: (more != CaseMore::default()).then(|| Box::new(more)),
        }
    }
}

impl From<CaseRecord> for CaseFields {
    fn from(case: CaseRecord) -> Self {
        let more = case.more.map(|more| *more).unwrap_or_default();
        CaseFields {
            id: case.id,
            input: case.input,
            expected: case.expected,
            tags: more.tags,
            metadata: more.metadata,
            trials: more.trials,
            pass_threshold: more.pass_threshold,
            judges: more.judges,
            case_pass: more.case_pass,
            checks: more.checks,
            workspace: more.workspace,
            image: more.image,
        }
    }
}

/// What the machine may see of a case ([`CaseRecord::for_client`]), borrowed from it.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ClientCase<'a> {
    pub id: &'a str,
    pub input: &'a Value,
}

/// How a trial's collection ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrialStatus {
    /// The client ran to completion.
    #[default]
    Completed,
    /// The trial's deadline passed, or another limit stopped it (the trace's `stopped` says
    /// which).
    TimedOut,
    /// The machine, channel or client failed.
    Infra,
}

/// The `custom` event recording a tool call the tool proxy refused (a dry run's write, say):
/// `{"server", "tool", "reason"}`. The call itself is recorded too, its result an error.
pub const TOOL_BLOCKED_EVENT: &str = "tool-blocked";

/// The `custom` event the tool proxy (or the `api` client) records when it first lists a
/// server's tools to the client: `{"server", "tools": [NAME, …], "shown": [ShownTool, …]}`:
/// the server's own names, hidden ones included (so that a run can say which tools no trial
/// called), and the list as the client saw it through the variant's tool policy.
pub const TOOLS_LISTED_EVENT: &str = "tools-listed";

/// One tool as a client was shown it through its variant's tool policy (`tools`, `dryRun`):
/// what `run.json`'s `toolLists` holds per variant and server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShownTool {
    /// The name the client calls it by.
    pub name: String,
    /// The description the client read (the variant's, when it rewrites it).
    #[serde(default)]
    pub description: String,
    /// The server's own name, when the variant renames the tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renamed_from: Option<String>,
    /// Whether the variant rewrote its input schema.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub schema_rewritten: bool,
    /// Why a call to it is refused (`blocked: dry run`), when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked: Option<String>,
}

/// What happened in one trace event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum EventKind {
    Message {
        role: String,
        text: String,
    },
    #[serde(rename_all = "camelCase")]
    ToolCall {
        id: String,
        #[serde(default)]
        server: Option<String>,
        tool: String,
        arguments: Value,
    },
    #[serde(rename_all = "camelCase")]
    ToolResult {
        id: String,
        output: String,
        #[serde(default)]
        is_error: bool,
        #[serde(default)]
        duration_ms: u64,
    },
    Log {
        text: String,
    },
    Custom {
        name: String,
        data: Value,
    },
}

impl EventKind {
    /// A model call's usage, when this is a `usage` event (`custom`, `{"usage": {"inputTokens",
    /// "outputTokens"}, "costUsd"?}`, as the `api` client records and agents report): the
    /// tokens and the cost, if known. `None` for any other event or one that does not read as
    /// usage.
    pub fn usage(&self) -> Option<(crate::llm::Usage, Option<f64>)> {
        let EventKind::Custom { name, data } = self else {
            return None;
        };
        if name != "usage" {
            return None;
        }
        let tokens = |field: &str| data["usage"][field].as_u64();
        let usage = crate::llm::Usage {
            input_tokens: tokens("inputTokens")?,
            output_tokens: tokens("outputTokens")?,
        };
        Some((usage, data["costUsd"].as_f64().filter(|c| c.is_finite())))
    }
}

/// One entry of an append-only trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceEvent {
    /// Position in the trace, from 0 without gaps: a `since` cursor.
    pub seq: u64,
    /// Milliseconds since the trial started.
    pub at_ms: u64,
    #[serde(flatten)]
    pub kind: EventKind,
}

/// Everything recorded while one trial ran.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TraceRecord {
    #[serde(default)]
    pub status: TrialStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_text: Option<String>,
    #[serde(default)]
    pub events: Vec<TraceEvent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub duration_ms: u64,
    /// Why a limit other than the deadline stopped the trial (status `timed-out`): a
    /// playground turn past its token budget. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

impl TraceRecord {
    /// Why the trial failed on its machine, as far as the machine can tell: it timed out, hit
    /// an infrastructure failure, or its program exited non-zero. The judges' verdict comes
    /// later, on the coordinator; this is what the worker's diagnosis and `keep=failed` go by.
    pub fn failure(&self) -> Option<String> {
        let last_log = || {
            self.events.iter().rev().find_map(|e| match &e.kind {
                EventKind::Log { text } => Some(text.as_str()),
                _ => None,
            })
        };
        match self.status {
            TrialStatus::TimedOut => Some(match &self.stopped {
                Some(why) => format!("stopped: {why}"),
                None => format!("timed out after {} ms", self.duration_ms),
            }),
            TrialStatus::Infra => Some(format!(
                "infrastructure failure: {}",
                last_log().unwrap_or("no reason recorded")
            )),
            TrialStatus::Completed => match self.exit_code {
                Some(code) if code != 0 => Some(format!("the client exited with code {code}")),
                _ => {
                    let failed = self.failed_checks();
                    (!failed.is_empty())
                        .then(|| format!("its checks failed: {}", failed.join(", ")))
                }
            },
        }
    }

    /// The outcome of check `name`, as the trial's last `check` event for it records it
    /// (`{"check", "passed", "exitCode", "timedOut", "durationMs", "stdout", "stderr"}`).
    pub fn check_outcome(&self, name: &str) -> Option<&Value> {
        self.events
            .iter()
            .rev()
            .find_map(|event| match &event.kind {
                EventKind::Custom { name: kind, data }
                    if kind == CHECK_EVENT && data["check"].as_str() == Some(name) =>
                {
                    Some(data)
                }
                _ => None,
            })
    }

    /// The names of the trial's checks that did not pass, in the order they ran.
    pub fn failed_checks(&self) -> Vec<&str> {
        self.events
            .iter()
            .filter_map(|event| match &event.kind {
                EventKind::Custom { name, data }
                    if name == CHECK_EVENT && data["passed"] != true =>
                {
                    data["check"].as_str()
                }
                _ => None,
            })
            .collect()
    }
}

/// The name of the `custom` event a check inside the machine leaves in its trial's trace.
pub const CHECK_EVENT: &str = "check";

/// One repetition of one case under one variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrialRecord {
    pub case: CaseRecord,
    #[serde(default = "default_variant")]
    pub variant: String,
    #[serde(default)]
    pub trial: u32,
    pub trace: TraceRecord,
    /// Where the trace was collected, written by the coordinator when it accepts the trace
    /// (a worker's own claim is overwritten).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collected_by: Option<CollectedBy>,
}

/// The provenance of a collected trace: the shard and machine it came from and the client
/// identity the worker announced at `hello`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CollectedBy {
    pub shard: u32,
    pub machine: String,
    pub client: String,
    pub client_version: String,
}

/// The variant of an eval that names none, and of a stored trace that names none (written
/// before traces named their variant).
pub const DEFAULT_VARIANT: &str = "default";

/// `variant`, or [`DEFAULT_VARIANT`] when a line names none: the one rule every reader of a
/// stored trace's key follows.
pub fn variant_or_default(variant: Option<&str>) -> &str {
    variant.unwrap_or(DEFAULT_VARIANT)
}

fn default_variant() -> String {
    DEFAULT_VARIANT.to_string()
}

impl TrialRecord {
    /// The trace the coordinator writes for a trial that produced no usable trace of its own
    /// (its trace was refused, or its machine failed): status `infra`, `reason` as its log.
    pub fn infra(case: CaseRecord, key: &TrialKey, reason: &str) -> Self {
        let mut record = TrialRecord {
            case,
            variant: key.variant.to_string(),
            trial: key.trial,
            trace: TraceRecord::default(),
            collected_by: None,
        };
        record.mark_infra(reason);
        record
    }

    /// Marks the trial as an infrastructure failure caused by `reason`, which becomes its last
    /// log event (an infra trial's reason, as grading reads it).
    pub fn mark_infra(&mut self, reason: &str) {
        self.trace.status = TrialStatus::Infra;
        self.trace.events.push(TraceEvent {
            seq: self.trace.events.len() as u64,
            at_ms: self.trace.duration_ms,
            kind: EventKind::Log {
                text: reason.to_string(),
            },
        });
    }

    /// A completed trial of `case` whose final answer is `text`.
    pub fn answered(case: CaseRecord, text: &str) -> Self {
        TrialRecord {
            case,
            variant: default_variant(),
            trial: 0,
            trace: TraceRecord {
                final_text: Some(text.to_string()),
                ..TraceRecord::default()
            },
            collected_by: None,
        }
    }

    /// The ABI form, for a grader.
    pub fn to_wit(&self) -> wit::Trial {
        wit::Trial {
            case: self.case.to_wit(),
            variant: self.variant.clone(),
            trial: self.trial,
            trace: wit::Trace {
                status: match self.trace.status {
                    TrialStatus::Completed => wit::TrialStatus::Completed,
                    TrialStatus::TimedOut => wit::TrialStatus::TimedOut,
                    TrialStatus::Infra => wit::TrialStatus::Infra,
                },
                final_text: self.trace.final_text.clone(),
                events: self.trace.events.iter().map(TraceEvent::to_wit).collect(),
                exit_code: self.trace.exit_code,
                duration_ms: self.trace.duration_ms,
            },
        }
    }
}

impl TraceEvent {
    /// This event with every secret the process holds replaced, exactly as a trace file
    /// holding it is redacted (the same JSON redaction), so a streamed event equals the
    /// stored one.
    pub fn redacted(&self) -> TraceEvent {
        let json = serde_json::to_vec(self).expect("trace events serialize");
        match crate::secrets::redactor().redact_json(&json) {
            std::borrow::Cow::Borrowed(_) => self.clone(),
            std::borrow::Cow::Owned(redacted) => {
                serde_json::from_slice(&redacted).expect("redaction keeps JSON valid")
            }
        }
    }

    /// One line for a person: what happened, cut to about `max` characters.
    pub fn summary(&self, max: usize) -> String {
        let line = match &self.kind {
            EventKind::Message { role, text } => format!("{role}: {text}"),
            EventKind::ToolCall {
                server,
                tool,
                arguments,
                ..
            } => match server {
                Some(server) => format!("tool-call {server}/{tool} {arguments}"),
                None => format!("tool-call {tool} {arguments}"),
            },
            EventKind::ToolResult {
                output,
                is_error,
                duration_ms,
                ..
            } => {
                let error = if *is_error { " error" } else { "" };
                format!("tool-result{error} ({duration_ms} ms): {output}")
            }
            EventKind::Log { text } => format!("log: {text}"),
            EventKind::Custom { name, data } => format!("{name}: {data}"),
        };
        let line = line.replace('\n', " ");
        match line.char_indices().nth(max) {
            Some((cut, _)) => format!("{}…", &line[..cut]),
            None => line,
        }
    }

    fn to_wit(&self) -> wit::TraceEvent {
        let kind = match &self.kind {
            EventKind::Message { role, text } => wit::EventKind::Message(wit::Message {
                role: role.clone(),
                text: text.clone(),
            }),
            EventKind::ToolCall {
                id,
                server,
                tool,
                arguments,
            } => wit::EventKind::ToolCall(wit::ToolCall {
                id: id.clone(),
                server: server.clone(),
                tool: tool.clone(),
                arguments: arguments.to_string(),
            }),
            EventKind::ToolResult {
                id,
                output,
                is_error,
                duration_ms,
            } => wit::EventKind::ToolResult(wit::ToolResult {
                id: id.clone(),
                output: output.clone(),
                is_error: *is_error,
                duration_ms: *duration_ms,
            }),
            EventKind::Log { text } => wit::EventKind::Log(text.clone()),
            EventKind::Custom { name, data } => wit::EventKind::Custom(wit::CustomEvent {
                name: name.clone(),
                data: data.to_string(),
            }),
        };
        wit::TraceEvent {
            seq: self.seq,
            at_ms: self.at_ms,
            kind,
        }
    }
}

impl CaseRecord {
    /// A case with only an id and an input.
    pub fn new(id: impl Into<ArcStr>, input: Value) -> Self {
        CaseRecord {
            id: id.into(),
            input,
            expected: None,
            more: None,
        }
    }

    /// The case's rarer fields (all empty when it has none).
    pub fn more(&self) -> &CaseMore {
        self.more.as_deref().unwrap_or(&NO_MORE)
    }

    /// The case's rarer fields, to change.
    pub fn more_mut(&mut self) -> &mut CaseMore {
        self.more.get_or_insert_with(Box::default)
    }

    /// What the machine may see of this case: its id and input, nothing that gives the
    /// answer away (`expected`, metadata, tags, judges). Borrowed: it serialises as the
    /// [`CaseRecord`] of just those two fields, with nothing copied.
    pub fn for_client(&self) -> ClientCase<'_> {
        ClientCase {
            id: &self.id,
            input: &self.input,
        }
    }

    /// Whether this is exactly what the machine may see of `case` ([`Self::for_client`]):
    /// the same id and input, and none of the fields the machine never had.
    pub fn is_client_view_of(&self, case: &CaseRecord) -> bool {
        // Taken apart whole, so that a field added to cases must be decided on here.
        let CaseRecord {
            id,
            input,
            expected,
            more,
        } = self;
        *id == case.id && *input == case.input && expected.is_none() && more.is_none()
    }

    /// The ABI form.
    pub fn to_wit(&self) -> wit::Case {
        wit::Case {
            id: self.id.to_string(),
            input: self.input.to_string(),
            expected: self.expected.as_ref().map(Value::to_string),
            tags: self.more().tags.clone(),
            metadata: self.more().metadata.as_ref().map(Value::to_string),
        }
    }

    /// Reads a case a plugin returned; its JSON fields must be JSON.
    pub fn from_wit(case: wit::Case) -> Result<Self> {
        let json = |field: &str, text: &str| -> Result<Value> {
            serde_json::from_str(text)
                .with_context(|| format!("case `{}`: `{field}` is not JSON", case.id))
        };
        let more = CaseMore {
            metadata: case
                .metadata
                .as_deref()
                .map(|t| json("metadata", t))
                .transpose()?,
            tags: case.tags.clone(),
            ..CaseMore::default()
        };
        Ok(CaseRecord {
            input: json("input", &case.input)?,
            expected: case
                .expected
                .as_deref()
                .map(|t| json("expected", t))
                .transpose()?,
            more: (more != CaseMore::default()).then(|| Box::new(more)),
            id: case.id.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_case_index_finds_every_case_by_id_and_nothing_else() {
        let cases: Vec<CaseRecord> = ["b", "c-10", "a", "c-9"]
            .map(|id| CaseRecord::new(id, serde_json::json!(format!("input of {id}"))))
            .to_vec();
        let index = CaseIndex::new(&cases);
        let kept = super::super::dataset::Cases::from_records(cases.clone()).unwrap();
        let kept_index = CaseIndex::kept(&kept);
        for case in &cases {
            let found = index.get(&case.id).unwrap().expect("indexed");
            assert!(
                matches!(found, Cow::Borrowed(found) if std::ptr::eq(found, case)),
                "the case itself, not a copy"
            );
            let read = kept_index.get(&case.id).unwrap().expect("kept");
            assert_eq!(&*read, case);
        }
        for absent in ["", "c", "c-1", "d"] {
            assert!(!index.contains(absent), "{absent}");
            assert!(!kept_index.contains(absent), "{absent}");
            assert!(kept_index.get(absent).unwrap().is_none(), "{absent}");
        }
        assert!(CaseIndex::new(&[]).get("a").unwrap().is_none());
    }

    #[test]
    fn the_client_view_of_a_case_is_its_id_and_input_and_is_recognised() {
        let mut case = CaseRecord::new("c1", serde_json::json!({"q": "2+2"}));
        case.expected = Some(serde_json::json!("4"));
        case.more_mut().tags = vec!["math".into()];
        let sent: CaseRecord =
            serde_json::from_str(&serde_json::to_string(&case.for_client()).unwrap()).unwrap();
        assert_eq!(sent, CaseRecord::new("c1", serde_json::json!({"q": "2+2"})));
        assert!(sent.is_client_view_of(&case));
        // What the machine never had, coming back, is not the view of the case.
        assert!(!case.is_client_view_of(&case));
        let mut other = sent.clone();
        other.input = serde_json::json!({"q": "2+3"});
        assert!(!other.is_client_view_of(&case));
    }

    #[test]
    fn trial_json_round_trips_to_the_abi() {
        let text = r#"{
            "case": {"id": "c1", "input": {"q": "time?"}, "expected": "12:00"},
            "trace": {"finalText": "It is 12:00", "events": [
                {"seq": 0, "atMs": 1, "type": "tool-call", "id": "t1", "tool": "now", "arguments": {"tz": "UTC"}},
                {"seq": 1, "atMs": 5, "type": "tool-result", "id": "t1", "output": "12:00"}
            ]}
        }"#;
        let trial: TrialRecord = serde_json::from_str(text).unwrap();
        let wit = trial.to_wit();
        assert_eq!(wit.case.expected.as_deref(), Some("\"12:00\""));
        assert_eq!(wit.trace.events.len(), 2);
        match &wit.trace.events[0].kind {
            wit::EventKind::ToolCall(call) => assert_eq!(call.arguments, r#"{"tz":"UTC"}"#),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unknown_fields_are_named() {
        let err = serde_json::from_str::<TrialRecord>(
            r#"{"case": {"id": "c", "input": 1}, "trace": {}, "varient": "x"}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("varient"), "{err}");
    }

    #[test]
    fn cases_from_plugins_must_hold_json() {
        let case = wit::Case {
            id: "c".into(),
            input: "not json".into(),
            expected: None,
            tags: vec![],
            metadata: None,
        };
        let err = CaseRecord::from_wit(case).unwrap_err().to_string();
        assert!(err.contains("`input`"), "{err}");
    }
}
