//! MST datasets and cases → mst cases: `{"name", "cases"}` files of 2.0 and 1.x; each case's
//! prompt (or 1.x direct-mode tool call), expected answer, trials and checks.

use super::assertions::{self, split_label};
use super::format::v2::{self, Assertions};
use super::format::{shape, v1};
use super::Source;
use crate::import::Change;
use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};

/// What every case of an eval shares: the config's judges and template, the server labels.
#[derive(Default)]
pub(super) struct CaseDefaults {
    /// Converted judges of the config's `judges`: MST adds them to each case's own.
    pub extra_judges: Vec<Value>,
    /// The config's `inputTemplate` (`{{input}}` replaced by each case's input).
    pub input_template: Option<String>,
    /// Server labels, to read `LABEL.tool` names.
    pub servers: Vec<String>,
    /// The provider and model of LLM judges that name none: the eval's own.
    pub judge_model: Option<(String, String)>,
}

/// A converted dataset.
pub(super) struct Dataset {
    /// The dataset's `name` (or the file's stem).
    pub name: String,
    /// Cases for a client (an `input` text).
    pub client_cases: Vec<Value>,
    /// 1.x direct-mode cases (a tool call), for the `mcp` client.
    pub direct_cases: Vec<Value>,
}

/// Reads and converts MST dataset `file` (relative paths from the current directory).
pub(super) fn read(src: &mut Source, defaults: &CaseDefaults) -> Result<Dataset> {
    let value = super::read_json(&src.path)?;
    if !value.is_object() {
        bail!(
            "{} is not an MST dataset: expected an object with `name` and `cases`",
            src.file
        );
    }
    convert(src, &value, defaults)
}

/// Converts a dataset object already read.
pub(super) fn convert(src: &mut Source, value: &Value, defaults: &CaseDefaults) -> Result<Dataset> {
    let dataset: v2::Dataset = shape(value);
    let Some(cases) = dataset.cases else {
        bail!(
            "{} is not an MST dataset: `cases` must be an array of cases",
            src.file
        );
    };
    for (key, value) in &dataset.rest {
        match key.as_str() {
            "$schema" => src.note("$schema", Change::Rewritten, "removed: mst reads no schema pointer"),
            "description" | "metadata" => src.note(
                key,
                Change::Dropped,
                format!("the dataset's {key} has no place in mst's case files (one case per line): {value}"),
            ),
            other => src.note(other, Change::Dropped, "not a key of MST's dataset schema"),
        }
    }
    let mut converted = Dataset {
        name: dataset.name.unwrap_or_else(|| src.stem()),
        client_cases: Vec::new(),
        direct_cases: Vec::new(),
    };
    for (index, case) in cases.iter().enumerate() {
        if !case.is_object() {
            bail!("{}: case #{} is not an object", src.file, index + 1);
        }
        match convert_case(src, &shape(case), index, defaults)? {
            Some(Converted::Direct(case)) => converted.direct_cases.push(case),
            Some(Converted::Client(case)) => converted.client_cases.push(case),
            None => {}
        }
    }
    Ok(converted)
}

/// A converted case.
enum Converted {
    /// A case with a text input, for the eval's client.
    Client(Value),
    /// A 1.x direct-mode case (a tool call), for the `mcp` client.
    Direct(Value),
}

/// Converts one case; `None` when it cannot run in mst at all (reported).
fn convert_case(
    src: &mut Source,
    case: &v2::Case,
    index: usize,
    defaults: &CaseDefaults,
) -> Result<Option<Converted>> {
    let id = match case.id.as_deref() {
        Some(id) if !id.is_empty() => id.to_string(),
        _ => {
            let id = format!("case-{}", index + 1);
            let text = format!("no `id`: named `{id}`");
            src.note(&format!("cases[{index}]"), Change::Rewritten, text);
            id
        }
    };
    let mut draft = Draft {
        at: format!("cases[{id}]"),
        out: Map::new(),
        metadata: case.metadata.clone().unwrap_or_default(),
        judges: Vec::new(),
        source_checks: defaults.extra_judges.len(),
        direct: case.v1.mode.as_ref().and_then(Value::as_str) == Some("direct"),
        tool_call: None,
        input: None,
        defaults,
    };
    draft.out.insert("id".into(), json!(id));
    draft.read(src, case)?;
    Ok(draft.finish(src, &id))
}

/// A case as it converts: what its keys made of it so far.
struct Draft<'a> {
    /// `cases[ID]`.
    at: String,
    /// The mst case.
    out: Map<String, Value>,
    metadata: Map<String, Value>,
    judges: Vec<Value>,
    /// How many checks the source gave the case, the config's included: one that had some
    /// and has no judge left would pass whatever the client does.
    source_checks: usize,
    /// A 1.x direct-mode case (a tool call).
    direct: bool,
    /// A direct-mode case's tool and arguments.
    tool_call: Option<(String, Value)>,
    /// The prompt.
    input: Option<String>,
    defaults: &'a CaseDefaults,
}

impl Draft<'_> {
    fn here(&self, key: &str) -> String {
        format!("{}.{key}", self.at)
    }

    /// Reads the case's keys, 2.0's and 1.x's alike, in their alphabetical order: the order
    /// the notes and judges have always come in (and which of two spellings of one key wins:
    /// the later). Keys that are neither come last.
    fn read(&mut self, src: &mut Source, case: &v2::Case) -> Result<()> {
        // 1.x's keys come in their places among 2.0's.
        let v1 = &case.v1;
        self.share(src, "accuracyThreshold", v1.accuracy_threshold.as_ref())?;
        self.checks(src, "assertions", case.assertions.as_ref())?;
        if let Some(answer) = &v1.canonical_answer {
            self.out.insert("expected".into(), answer.clone());
            let text = "1.x `canonicalAnswer` → `expected`";
            src.note(&self.here("canonicalAnswer"), Change::Rewritten, text);
        }
        self.per_case_client(src, "client", &case.client);
        self.per_case_client(src, "clientOptions", &case.client_options);
        if let Some(description) = &case.description {
            self.metadata
                .insert("description".into(), description.clone());
            src.note(
                &self.here("description"),
                Change::Rewritten,
                "→ `metadata.description`",
            );
        }
        self.checks(src, "expect", v1.expect.as_ref())?;
        if let Some(expected) = &case.expected {
            let expected = expected_of(src, &self.here("expected"), expected);
            self.out.insert("expected".into(), expected);
        }
        self.flat_checks(src, v1);
        self.prompt(src, "input", case.input.as_ref())?;
        self.trials(src, "iterations", v1.iterations.as_ref());
        if case.judge_reps.is_some() {
            let text = "mst runs each judge once per trial (no averaged repeats)";
            src.note(&self.here("judgeReps"), Change::Dropped, text);
        }
        self.judge_entries(src, case.judges.as_ref());
        self.per_case_client(src, "mcpHostConfig", &v1.mcp_host_config);
        if let Some(mode) = &v1.mode {
            self.mode(src, mode);
        }
        self.per_case_client(src, "model", &case.model);
        self.share(src, "passThreshold", case.pass_threshold.as_ref())?;
        if v1.request.is_some() {
            src.note(&self.here("request"), Change::Dropped, "a raw MCP request has no mst case form; only tool calls (`toolName`, `args`) convert");
        }
        self.prompt(src, "scenario", v1.scenario.as_ref())?;
        if let Some(tags) = &case.tags {
            self.out.insert("tags".into(), tags.clone());
        }
        if let Some(tool) = &v1.tool_name {
            self.direct = true;
            let name = tool.as_str().unwrap_or_default().to_string();
            let args = v1.args.clone().unwrap_or_else(|| json!({}));
            self.tool_call = Some((name, args));
        }
        self.trials(src, "trials", case.trials.as_ref());
        for key in case.rest.keys() {
            let text = format!("`{key}` is not a key of MST's case schema");
            src.note(&self.here(key), Change::Dropped, text);
        }
        Ok(())
    }

    /// `passThreshold` (1.x `accuracyThreshold`): the share of trials that must pass.
    fn share(&mut self, src: &mut Source, key: &str, value: Option<&Value>) -> Result<()> {
        let Some(value) = value else {
            return Ok(());
        };
        let here = self.here(key);
        let share = value
            .as_f64()
            .with_context(|| format!("{}: `{here}` must be a number from 0 to 1", src.file))?;
        self.out.insert("casePass".into(), json!({"share": share}));
        src.note(
            &here,
            Change::Rewritten,
            format!("the share of trials that must pass → `casePass: {{\"share\": {share}}}`"),
        );
        Ok(())
    }

    /// `assertions` (1.x `expect`) → the case's judges.
    fn checks(&mut self, src: &mut Source, key: &str, value: Option<&Value>) -> Result<()> {
        let Some(value) = value else {
            return Ok(());
        };
        let here = self.here(key);
        let Some(block) = value.as_object() else {
            bail!("{}: `{here}` must be an object of assertions", src.file);
        };
        if key == "expect" {
            src.note(&here, Change::Rewritten, "1.x `expect` → the case's judges");
        }
        self.source_checks += block.len();
        let block: Assertions = shape(value);
        let judges = assertions::assertions(src, &here, &block, self.defaults);
        self.judges.extend(judges);
        Ok(())
    }

    /// 1.x's flat `expected*` checks, in their alphabetical order.
    fn flat_checks(&mut self, src: &mut Source, keys: &v1::CaseKeys) {
        for (key, value) in [
            ("expectedExact", &keys.expected_exact),
            ("expectedRegex", &keys.expected_regex),
            ("expectedSchemaName", &keys.expected_schema_name),
            ("expectedTextContains", &keys.expected_text_contains),
        ] {
            if let Some(value) = value {
                self.source_checks += 1;
                let judges = assertions::flat_check(src, &self.here(key), key, value);
                self.judges.extend(judges);
            }
        }
    }

    /// `judges`: the case's own judge entries.
    fn judge_entries(&mut self, src: &mut Source, value: Option<&Value>) {
        let Some(value) = value else {
            return;
        };
        let list = value.as_array().cloned().unwrap_or_default();
        self.source_checks += list.len();
        for (n, judge) in list.iter().enumerate() {
            let at = format!("{}[{n}]", self.here("judges"));
            let judges = assertions::judge_entry(src, &at, judge, self.defaults);
            self.judges.extend(judges);
        }
    }

    /// `input` (1.x `scenario`): the client's prompt, a string.
    fn prompt(&mut self, src: &mut Source, key: &str, value: Option<&Value>) -> Result<()> {
        let Some(value) = value else {
            return Ok(());
        };
        let here = self.here(key);
        let Some(text) = value.as_str() else {
            bail!(
                "{}: `{here}` must be a string (the client's prompt)",
                src.file
            );
        };
        self.input = Some(text.to_string());
        if key == "scenario" {
            src.note(&here, Change::Rewritten, "1.x `scenario` → `input`");
        }
        Ok(())
    }

    /// `trials` (1.x `iterations`).
    fn trials(&mut self, src: &mut Source, key: &str, value: Option<&Value>) {
        let Some(value) = value else {
            return;
        };
        self.out.insert("trials".into(), value.clone());
        if key == "iterations" {
            let text = "1.x `iterations` → `trials`";
            src.note(&self.here(key), Change::Rewritten, text);
        }
    }

    /// A client, its options or model given for this case alone, which mst does not have.
    fn per_case_client(&self, src: &mut Source, key: &str, value: &Option<Value>) {
        if value.is_some() {
            src.note(
                &self.here(key),
                Change::Dropped,
                "mst has no per-case client or model: put such cases in their own eval or variant",
            );
        }
    }

    /// 1.x `mode`.
    fn mode(&self, src: &mut Source, mode: &Value) {
        let here = self.here("mode");
        match mode.as_str() {
            Some("direct") => src.note(
                &here,
                Change::Rewritten,
                "direct mode → the `mcp` client's tool-call input",
            ),
            Some("mcp_host" | "llm_host") => src.note(
                &here,
                Change::Rewritten,
                "removed: a case with a text input runs on the eval's client",
            ),
            _ => src.note(
                &here,
                Change::Dropped,
                format!("mode {mode} has no mst equivalent; the case runs on the eval's client"),
            ),
        }
    }

    /// The case's input (the prompt, or a direct-mode case's tool call), metadata and
    /// judges; `None` (reported) when it has no input mst can run.
    fn finish(mut self, src: &mut Source, id: &str) -> Option<Converted> {
        let input = if self.direct {
            let Some((tool, arguments)) = self.tool_call.take() else {
                let text = "a direct-mode case without `toolName` cannot run in mst: case dropped";
                return self.dropped(src, id, text);
            };
            let (server, tool) = split_label(&tool, &self.defaults.servers);
            let mut call = json!({"tool": tool, "arguments": arguments});
            if let Some(server) = server {
                call["server"] = json!(server);
            }
            call
        } else {
            let Some(text) = self.input.take() else {
                let text = "a case without `input` (or 1.x `scenario`/`toolName`) cannot run: case dropped";
                return self.dropped(src, id, text);
            };
            match &self.defaults.input_template {
                Some(template) => json!(template.replace("{{input}}", &text)),
                None => json!(text),
            }
        };
        self.out.insert("input".into(), input);
        if !self.metadata.is_empty() {
            self.out
                .insert("metadata".into(), Value::Object(self.metadata));
        }
        if !self.judges.is_empty() {
            // A case's judges replace the eval's in mst; MST adds the config's on top.
            self.judges
                .extend(self.defaults.extra_judges.iter().cloned());
            self.out.insert("judges".into(), Value::Array(self.judges));
        } else if self.source_checks > 0 && self.defaults.extra_judges.is_empty() {
            src.lost_all_checks(id);
        }
        let case = Value::Object(self.out);
        Some(if self.direct {
            Converted::Direct(case)
        } else {
            Converted::Client(case)
        })
    }

    fn dropped(&self, src: &mut Source, id: &str, text: &str) -> Option<Converted> {
        src.note(&self.at, Change::Dropped, text);
        src.lost_all_checks(id);
        None
    }
}

/// `expected`: `{"answer": A}` alone becomes `A`; anything richer is kept whole (the rubric
/// judge sees it as it is).
fn expected_of(src: &mut Source, at: &str, value: &Value) -> Value {
    match value.as_object() {
        Some(object) if object.len() == 1 && object.contains_key("answer") => {
            src.note(at, Change::Rewritten, "`expected.answer` → `expected`");
            object["answer"].clone()
        }
        _ => value.clone(),
    }
}
