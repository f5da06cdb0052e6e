//! `mst.shard/v1`: one JSON object per line. The worker writes [`WorkerMessage`]s to its stdout;
//! the coordinator writes [`CoordinatorMessage`]s to the worker's stdin. Every object has a
//! `type` field naming the message; unknown types and unknown fields are protocol errors, so
//! that a worker of another version fails loudly instead of being half understood.

use crate::eval::trial::{TraceEvent, TrialKey, TrialRecord};
use crate::secrets::Secret;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// The protocol this build speaks; `hello` carries it and the coordinator refuses any other.
pub const PROTOCOL: &str = "mst.shard/v1";

/// The longest line either side accepts; a longer one is a protocol error. A trace travels in
/// its `trial` message only when the whole line fits; a larger one is a file, copied back.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// The largest trace event streamed in full: its JSON (as [`event_bytes`] counts it). A
/// worker sends a larger one as a stub (`omitted`), and the coordinator loses a shard whose
/// worker sends one in full.
pub const MAX_EVENT_BYTES: usize = 16 * 1024;

/// The most one trial may stream: the `event` lines of a trial, as [`encode`] writes them,
/// added up. A worker stops streaming a trial before it would pass this (the rest is in the
/// trace it writes), and the coordinator loses a shard whose worker goes past it.
pub const MAX_TRIAL_STREAM_BYTES: u64 = 4 * 1024 * 1024;

/// The longest resume token a worker may report (`resume-token`).
pub const MAX_RESUME_TOKEN_BYTES: usize = 1024;

/// Whether `token` may be a conversation's resume token: 1 to [`MAX_RESUME_TOKEN_BYTES`]
/// bytes, no control characters (it becomes an argument of the agent's next command).
pub fn check_resume_token(token: &str) -> Result<(), String> {
    if token.is_empty() || token.len() > MAX_RESUME_TOKEN_BYTES {
        return Err(format!(
            "a resume token of {} bytes (1 to {MAX_RESUME_TOKEN_BYTES} are allowed)",
            token.len()
        ));
    }
    if token.chars().any(char::is_control) {
        return Err("a resume token holding control characters".into());
    }
    Ok(())
}

/// The size of `event` as the per-event cap counts it: its JSON, compact.
pub fn event_bytes(event: &TraceEvent) -> usize {
    serde_json::to_vec(event).map_or(usize::MAX, |json| json.len())
}

/// The most bytes one part of a model call carries ([`ModelPart`]), counted as its `data`
/// is written in a line (JSON-escaped): a part's line then fits in [`MAX_LINE_BYTES`].
pub const MODEL_PART_BYTES: usize = 48 * 1024;

/// The largest model call either way: a request an agent sends the gateway, or an answer, as
/// JSON. An agent CLI's request carries its system prompt and every tool's schema (Claude
/// Code's first is about 90 KiB) and grows with the conversation.
pub const MAX_MODEL_CALL_BYTES: usize = 16 * 1024 * 1024;

/// The most model calls of one shard in flight at once (asked and not yet answered); past it
/// the coordinator answers "too many requests".
pub const MAX_MODEL_CALLS_IN_FLIGHT: usize = 64;

/// One part of a model call's JSON: a request going to the coordinator (`model-call`), or
/// its answer coming back (`model-reply`). A call is cut into parts so that no line passes
/// [`MAX_LINE_BYTES`]; parts come in order, from 0, the last one marked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPart {
    pub index: u32,
    pub last: bool,
    pub data: String,
}

impl ModelPart {
    /// `json` cut into parts of at most [`MODEL_PART_BYTES`] as written in a line, on
    /// character boundaries.
    pub fn split(json: &str) -> Vec<ModelPart> {
        let mut parts = Vec::new();
        let (mut start, mut size) = (0, 0);
        for (at, c) in json.char_indices() {
            let written = match c {
                '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
                c if (c as u32) < 0x20 => 6,
                c => c.len_utf8(),
            };
            if size + written > MODEL_PART_BYTES {
                parts.push(&json[start..at]);
                (start, size) = (at, 0);
            }
            size += written;
        }
        parts.push(&json[start..]);
        let count = parts.len();
        parts
            .into_iter()
            .enumerate()
            .map(|(index, data)| ModelPart {
                index: index as u32,
                last: index + 1 == count,
                data: data.to_string(),
            })
            .collect()
    }
}

/// A model call's parts put back together, as they arrive.
#[derive(Debug, Default)]
pub struct ModelParts {
    json: String,
    next: u32,
}

impl ModelParts {
    /// Adds `part`: the whole JSON once the last part came, `None` before. A part out of
    /// order, or one that takes the call past [`MAX_MODEL_CALL_BYTES`], is refused.
    pub fn add(&mut self, part: ModelPart) -> Result<Option<String>, String> {
        if part.index != self.next {
            return Err(format!(
                "part {} of a model call came where part {} was due",
                part.index, self.next
            ));
        }
        if self.json.len() + part.data.len() > MAX_MODEL_CALL_BYTES {
            return Err(format!(
                "a model call of more than {MAX_MODEL_CALL_BYTES} bytes"
            ));
        }
        self.json.push_str(&part.data);
        self.next += 1;
        Ok(part.last.then(|| std::mem::take(&mut self.json)))
    }
}

/// What the coordinator answers a model call with (the JSON of its `model-reply` parts): the
/// model's reply, or why there is none, as an HTTP status the gateway gives the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelAnswer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<crate::llm::Reply>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<ModelRefusal>,
}

/// Why a model call has no reply: the HTTP status for the agent, and a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRefusal {
    pub status: u16,
    pub message: String,
}

impl ModelAnswer {
    /// A refusal with `status` and `message`.
    pub fn refused(status: u16, message: impl Into<String>) -> Self {
        ModelAnswer {
            reply: None,
            refused: Some(ModelRefusal {
                status,
                message: message.into(),
            }),
        }
    }
}

/// The client a worker drives, as reported in `hello`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientIdentity {
    pub name: String,
    pub version: String,
}

/// Why a worker asks for tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TokenReason {
    /// Before the first trial that needs them.
    Start,
    /// The tokens it holds expire soon.
    Expiring,
}

/// How a trial's collection ended, as the worker reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Collected {
    /// A trace was written (whatever the client answered, including a timeout).
    Collected,
    /// The trial could not run for reasons outside the client's answer.
    Infra,
}

/// Whether the worker's clean-up (tokens, temporary files, child processes) succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cleanup {
    Ok,
    Failed,
}

/// Counts a worker reports when it finishes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DoneCounts {
    pub collected: u32,
    pub infra: u32,
    /// Trials not started because of `cancel`.
    pub skipped: u32,
}

/// Worker → coordinator, on the worker's stdout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
pub enum WorkerMessage {
    /// First message. The coordinator checks `protocol` and `mst` and fails the shard on any
    /// mismatch, before any trial runs.
    Hello {
        protocol: String,
        /// The worker's mst version; must equal the coordinator's.
        mst: String,
        /// The machine image's digest, when the worker is told it (`MST_IMAGE_DIGEST` in its
        /// environment, which the `docker` runner sets).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        image: Option<String>,
        client: ClientIdentity,
        /// The shard this worker runs (0-based).
        shard: u32,
    },
    /// Asks for access tokens for these MCP servers.
    NeedTokens {
        servers: Vec<String>,
        reason: TokenReason,
    },
    /// Asks for room to run a trial under the eval's server limits; the worker waits for
    /// `granted`.
    Acquire {
        key: TrialKey,
        /// MCP servers the trial will call.
        #[serde(default)]
        servers: Vec<String>,
    },
    /// A part of a model call an agent made through the machine's gateway (the JSON of an
    /// [`crate::llm::wire::GatewayRequest`]), with the gateway token the agent presented.
    /// The coordinator calls the variant's model when the last part has come and answers with
    /// `model-reply`. Added within `mst.shard/v1`.
    ModelCall {
        key: TrialKey,
        call: u32,
        #[serde(with = "secret_string")]
        token: Secret,
        part: ModelPart,
    },
    /// A trial finished. Its trace is `trace`, when the whole line fits in [`MAX_LINE_BYTES`]
    /// (the worker then wrote no file), or else the file at `path` (relative to the results
    /// directory), which the coordinator copies back. Also returns the room taken by
    /// `acquire`, and any call slot the trial still held. `trace` was added within
    /// `mst.shard/v1` (see docs/protocol.md).
    Trial {
        key: TrialKey,
        status: Collected,
        path: String,
        /// Why an `infra` trial failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// The trial's trace record, sent in the message instead of a file.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trace: Option<Box<TrialRecord>>,
        /// The files the trial left in its artefact directory, for the coordinator to copy
        /// back (a bundle with `artifacts` only). Added within `mst.shard/v1`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        artifacts: Vec<super::artifacts::ArtifactFile>,
    },
    /// One event of a running trial's trace, sent the moment the client records it: `seq`
    /// counts the trial's events from 0 without gaps, and `event` is the trace's event `seq`
    /// exactly as the trace file will hold it. An event over [`MAX_EVENT_BYTES`] is sent
    /// without `event` and with `omitted`, its size: the trace file has it. Added within
    /// `mst.shard/v1` (see docs/protocol.md, "Compatibility").
    Event {
        key: TrialKey,
        seq: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        event: Option<TraceEvent>,
        /// The size of an event too large to stream, sent instead of it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        omitted: Option<u64>,
    },
    /// In a conversation turn (the bundle's `conversation`), the resume token the running
    /// trial's client captured last; sent before the trial's `trial`. The coordinator keeps it
    /// in memory only and hands it to the next turn's worker as the token
    /// [`crate::client::RESUME_TOKEN`]. Added within `mst.shard/v1` (see docs/protocol.md).
    ResumeToken {
        key: TrialKey,
        #[serde(with = "secret_string")]
        token: Secret,
    },
    /// Asks for the hidden files of check `check` of the running trial `key`, once its
    /// client ended and its processes are gone; the coordinator answers `check-files`. Added
    /// within `mst.shard/v1`.
    CheckFiles { key: TrialKey, check: String },
    /// A trial's program opened connection `conn` to the egress proxy, which the bundle's
    /// `egress` carries over this protocol; its bytes follow as `egress-data`. Added within
    /// `mst.shard/v1`.
    EgressOpen { conn: u32 },
    /// Bytes (base64, at most [`crate::egress::TUNNEL_CHUNK`]) of egress connection `conn`.
    /// Added within `mst.shard/v1`.
    EgressData { conn: u32, data: String },
    /// The trial's side of egress connection `conn` ended. Added within `mst.shard/v1`.
    EgressClose { conn: u32 },
    /// The worker is alive; sent at least every heartbeat interval.
    Heartbeat {
        /// Milliseconds since the Unix epoch, by the worker's clock.
        at: u64,
    },
    /// Last message of a worker that ran to the end (or stopped after `cancel`).
    Done {
        counts: DoneCounts,
        cleanup: Cleanup,
        /// The worker's own peak resident memory, in bytes, when its system tells it: the
        /// machine's word, recorded with the shard and never acted on. Added within
        /// `mst.shard/v1`.
        #[serde(
            rename = "peakRssBytes",
            default,
            skip_serializing_if = "Option::is_none"
        )]
        peak_rss_bytes: Option<u64>,
    },
    /// The worker cannot go on (e.g. an unreadable bundle); the shard fails as infrastructure.
    Fatal { message: String },
}

/// One access token for an MCP server, sent only over the worker's stdin.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Token {
    #[serde(with = "secret_string")]
    pub value: Secret,
    /// Milliseconds since the Unix epoch after which the token is invalid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token")
            .field("value", &self.value)
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// Coordinator → worker, on the worker's stdin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
pub enum CoordinatorMessage {
    /// Tokens by server name; answers `need-tokens`, and may be sent unasked to renew them.
    Tokens { tokens: BTreeMap<String, Token> },
    /// The trial may start. `gateway` is the token its agent presents to the machine's model
    /// gateway, when its variant's client calls models through it (minted for this trial, and
    /// refused once it ended). `gateway` was added within `mst.shard/v1`.
    Granted {
        key: TrialKey,
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            with = "optional_secret_string"
        )]
        gateway: Option<Secret>,
    },
    /// A part of the answer to the trial's model call `call` (the JSON of a [`ModelAnswer`]).
    /// Added within `mst.shard/v1`.
    ModelReply {
        key: TrialKey,
        call: u32,
        part: ModelPart,
    },
    /// A part of the hidden files of check `check` of trial `key` (a tar archive, base64, in
    /// parts as a model answer is), or why there are none. Added within `mst.shard/v1`.
    CheckFiles {
        key: TrialKey,
        check: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        part: Option<ModelPart>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// Bytes (base64) the egress proxy answered on connection `conn`. Added within
    /// `mst.shard/v1`.
    EgressData { conn: u32, data: String },
    /// The proxy's side of egress connection `conn` ended. Added within `mst.shard/v1`.
    EgressClose { conn: u32 },
    /// Stop: finish or abandon the trial in flight, start no other, clean up, send `done`.
    Cancel { reason: String },
}

/// (De)serializes a [`Secret`] as a plain string: only the protocol line ever holds its value.
mod secret_string {
    use crate::secrets::Secret;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(secret: &Secret, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(secret.expose())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Secret, D::Error> {
        String::deserialize(deserializer).map(Secret::new)
    }
}

/// (De)serializes an optional [`Secret`] as a plain string.
mod optional_secret_string {
    use crate::secrets::Secret;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        secret: &Option<Secret>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match secret {
            Some(secret) => serializer.serialize_some(secret.expose()),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Secret>, D::Error> {
        Option::<String>::deserialize(deserializer).map(|s| s.map(Secret::new))
    }
}

/// A line that is not a valid message of this protocol.
#[derive(Debug)]
pub struct ProtocolError(pub String);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PROTOCOL} protocol error: {}", self.0)
    }
}

impl std::error::Error for ProtocolError {}

/// Encodes a message as one line (with its newline).
pub fn encode<T: Serialize>(message: &T) -> String {
    let mut line = serde_json::to_string(message).expect("protocol messages serialize");
    line.push('\n');
    line
}

/// Decodes one line. Never echoes the line into the error: a coordinator line may hold tokens.
pub fn decode<T: for<'de> Deserialize<'de>>(line: &str) -> Result<T, ProtocolError> {
    if line.len() > MAX_LINE_BYTES {
        return Err(ProtocolError(format!(
            "a line of {} bytes exceeds the {MAX_LINE_BYTES}-byte limit",
            line.len()
        )));
    }
    serde_json::from_str(line.trim_end()).map_err(|e| {
        // serde's message names the field or variant but never quotes values back.
        ProtocolError(format!(
            "bad message at column {}: {}",
            e.column(),
            classify(&e)
        ))
    })
}

/// Reads messages of type `T` from `input`, one per line, and hands each to `each`, which
/// returns `false` to stop reading. This is the one framing both ends use: blank lines are
/// skipped, and a line longer than [`MAX_LINE_BYTES`] or unreadable input is handed over as an
/// error and ends the reading (nothing after it can be trusted to be framed right). A line
/// that does not decode is handed over as an error too; `each` decides whether to go on.
/// `each` also gets the line's length in bytes, newline included (what the peer sent).
pub fn read_messages<T: for<'de> Deserialize<'de>>(
    input: impl std::io::Read,
    mut each: impl FnMut(Result<T, ProtocolError>, usize) -> bool,
) {
    use std::io::{BufRead, Read};
    let mut reader = std::io::BufReader::new(input);
    let mut line = String::new();
    loop {
        line.clear();
        // Bound what one line may cost: a peer writing a 1 GiB line is cut off.
        match (&mut reader)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_line(&mut line)
        {
            Ok(0) => return,
            Ok(_) if !line.ends_with('\n') && line.len() > MAX_LINE_BYTES => {
                each(
                    Err(ProtocolError(format!(
                        "a line longer than {MAX_LINE_BYTES} bytes"
                    ))),
                    line.len(),
                );
                return;
            }
            Ok(_) if line.trim().is_empty() => continue,
            Ok(_) => {
                if !each(decode(&line), line.len()) {
                    return;
                }
            }
            Err(e) => {
                each(
                    Err(ProtocolError(format!("unreadable output: {e}"))),
                    line.len(),
                );
                return;
            }
        }
    }
}

fn classify(error: &serde_json::Error) -> String {
    let text = error.to_string();
    // Keep serde's explanation up to its " at line" suffix.
    text.split(" at line").next().unwrap_or(&text).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::trial::EventKind;

    fn key() -> TrialKey {
        TrialKey {
            variant: "baseline".into(),
            case: "tz-1".into(),
            trial: 2,
        }
    }

    /// A trace as a client writes one: a tool call whose arguments nest objects, floats and
    /// escapes (they travel inside the tagged `trial` message).
    fn inline_trace() -> TrialRecord {
        let input = serde_json::json!({"prompt": "time in \"Tokyo\"?\n", "n": 0.1});
        let case = crate::eval::trial::CaseRecord::new("tz-1", input);
        let mut record = TrialRecord::infra(case, &key(), "placeholder");
        record.trace.status = crate::eval::trial::TrialStatus::Completed;
        record.trace.final_text = Some("12:00 ✓".into());
        record.trace.events.push(TraceEvent {
            seq: 1,
            at_ms: 4,
            kind: EventKind::ToolCall {
                id: "1".into(),
                server: Some("time".into()),
                tool: "now".into(),
                arguments: serde_json::json!({"tz": "Asia/Tokyo", "at": [1.5, -2, u64::MAX]}),
            },
        });
        record
    }

    #[test]
    fn worker_messages_round_trip_as_one_line() {
        let messages = vec![
            WorkerMessage::Hello {
                protocol: PROTOCOL.into(),
                mst: "0.1.0".into(),
                image: None,
                client: ClientIdentity {
                    name: "command".into(),
                    version: "0.1.0".into(),
                },
                shard: 0,
            },
            WorkerMessage::NeedTokens {
                servers: vec!["time".into()],
                reason: TokenReason::Start,
            },
            WorkerMessage::Acquire {
                key: key(),
                servers: vec!["time".into()],
            },
            WorkerMessage::Trial {
                key: key(),
                status: Collected::Collected,
                path: "baseline/tz-1/2.json".into(),
                error: None,
                trace: None,
                artifacts: Vec::new(),
            },
            WorkerMessage::Trial {
                key: key(),
                status: Collected::Collected,
                path: "baseline/tz-1/2.json".into(),
                error: None,
                trace: Some(Box::new(inline_trace())),
                artifacts: vec![super::super::artifacts::ArtifactFile {
                    path: "mst-diagnosis/stderr.txt".into(),
                    bytes: 12,
                }],
            },
            WorkerMessage::Event {
                key: key(),
                seq: 0,
                event: Some(TraceEvent {
                    seq: 0,
                    at_ms: 3,
                    kind: EventKind::ToolCall {
                        id: "1".into(),
                        server: Some("time".into()),
                        tool: "now".into(),
                        arguments: serde_json::json!({"tz": "UTC"}),
                    },
                }),
                omitted: None,
            },
            WorkerMessage::Event {
                key: key(),
                seq: 1,
                event: None,
                omitted: Some(70_000),
            },
            WorkerMessage::Heartbeat { at: 1 },
            WorkerMessage::ResumeToken {
                key: key(),
                token: Secret::new("resume-1"),
            },
            WorkerMessage::Done {
                counts: DoneCounts {
                    collected: 1,
                    infra: 0,
                    skipped: 0,
                },
                cleanup: Cleanup::Ok,
                peak_rss_bytes: Some(15 << 20),
            },
        ];
        for message in messages {
            let line = encode(&message);
            assert_eq!(line.matches('\n').count(), 1, "{line}");
            assert_eq!(decode::<WorkerMessage>(&line).unwrap(), message);
        }
    }

    #[test]
    fn the_wire_format_is_the_documented_one() {
        let line = encode(&WorkerMessage::Trial {
            key: key(),
            status: Collected::Infra,
            path: "p".into(),
            error: Some("x".into()),
            trace: None,
            artifacts: Vec::new(),
        });
        assert_eq!(
            line,
            "{\"type\":\"trial\",\"key\":{\"variant\":\"baseline\",\"case\":\"tz-1\",\"trial\":2},\"status\":\"infra\",\"path\":\"p\",\"error\":\"x\"}\n"
        );
        let listed = encode(&WorkerMessage::Trial {
            key: key(),
            status: Collected::Collected,
            path: "p".into(),
            error: None,
            trace: None,
            artifacts: vec![super::super::artifacts::ArtifactFile {
                path: "out/report.txt".into(),
                bytes: 42,
            }],
        });
        assert!(
            listed.ends_with(",\"artifacts\":[{\"path\":\"out/report.txt\",\"bytes\":42}]}\n"),
            "{listed}"
        );
        let event = encode(&WorkerMessage::Event {
            key: key(),
            seq: 0,
            event: Some(TraceEvent {
                seq: 0,
                at_ms: 5,
                kind: EventKind::Log { text: "hi".into() },
            }),
            omitted: None,
        });
        assert_eq!(
            event,
            "{\"type\":\"event\",\"key\":{\"variant\":\"baseline\",\"case\":\"tz-1\",\"trial\":2},\"seq\":0,\"event\":{\"seq\":0,\"atMs\":5,\"type\":\"log\",\"text\":\"hi\"}}\n"
        );
        let granted = encode(&CoordinatorMessage::Granted {
            key: key(),
            gateway: None,
        });
        assert!(granted.starts_with("{\"type\":\"granted\""), "{granted}");
    }

    #[test]
    fn a_resume_token_is_capped_and_plain() {
        assert!(check_resume_token("3f1c-9a").is_ok());
        assert!(check_resume_token(&"x".repeat(MAX_RESUME_TOKEN_BYTES)).is_ok());
        assert!(check_resume_token(&"x".repeat(MAX_RESUME_TOKEN_BYTES + 1)).is_err());
        assert!(check_resume_token("").is_err());
        assert!(check_resume_token("a\nb").is_err());
        // Its wire form carries it; its Debug never shows it.
        let message = WorkerMessage::ResumeToken {
            key: key(),
            token: Secret::new("tok-RESUME"),
        };
        assert!(!format!("{message:?}").contains("tok-RESUME"));
        assert!(encode(&message).starts_with("{\"type\":\"resume-token\""));
    }

    #[test]
    fn unknown_types_and_fields_are_errors() {
        assert!(decode::<WorkerMessage>(r#"{"type":"hello2"}"#).is_err());
        let err = decode::<WorkerMessage>(r#"{"type":"heartbeat","at":1,"extra":true}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("extra"), "{err}");
        assert!(decode::<WorkerMessage>(&"x".repeat(MAX_LINE_BYTES + 1)).is_err());
    }

    #[test]
    fn a_done_peak_memory_is_a_byte_count_or_absent() {
        let done = |peak: &str| {
            let counts = r#""counts":{"collected":0,"infra":0,"skipped":0}"#;
            decode::<WorkerMessage>(&format!(
                r#"{{"type":"done",{counts},"cleanup":"ok"{peak}}}"#
            ))
        };
        assert!(matches!(
            done(""),
            Ok(WorkerMessage::Done {
                peak_rss_bytes: None,
                ..
            })
        ));
        assert!(matches!(
            done(r#","peakRssBytes":18446744073709551615"#),
            Ok(WorkerMessage::Done {
                peak_rss_bytes: Some(u64::MAX),
                ..
            })
        ));
        for hostile in ["-1", "1.5", "\"lots\"", "null", "1e400"] {
            let peak = format!(r#","peakRssBytes":{hostile}"#);
            let decoded = done(&peak);
            // `null` reads as absent; anything else but a byte count breaks the protocol.
            match hostile {
                "null" => assert!(matches!(
                    decoded,
                    Ok(WorkerMessage::Done {
                        peak_rss_bytes: None,
                        ..
                    })
                )),
                _ => assert!(decoded.is_err(), "{hostile}"),
            }
        }
    }

    #[test]
    fn tokens_never_print_or_echo() {
        let mut tokens = BTreeMap::new();
        tokens.insert(
            "time".to_string(),
            Token {
                value: Secret::new("tok-SECRET"),
                expires_at: Some(5),
            },
        );
        let message = CoordinatorMessage::Tokens { tokens };
        assert!(!format!("{message:?}").contains("tok-SECRET"));
        let line = encode(&message);
        assert!(line.contains("tok-SECRET"), "the wire carries it");
        assert_eq!(decode::<CoordinatorMessage>(&line).unwrap(), message);
        let bad = line.replace("\"expires_at\"", "\"expiry\"");
        assert!(!decode::<CoordinatorMessage>(&bad)
            .unwrap_err()
            .to_string()
            .contains("tok-SECRET"));
    }

    #[test]
    fn a_model_call_of_any_size_travels_in_parts_that_fit_a_line() {
        // Quotes and control characters double or sextuple in a line: parts count that.
        let json = serde_json::json!({
            "system": "\"quoted\" ".repeat(20_000),
            "controls": "\u{1}\u{2}".repeat(10_000),
            "text": "ü→日本".repeat(30_000),
        })
        .to_string();
        let parts = ModelPart::split(&json);
        assert!(parts.len() > 3, "{} parts", parts.len());
        let mut whole = ModelParts::default();
        let mut got = None;
        for part in parts.clone() {
            let line = encode(&WorkerMessage::ModelCall {
                key: TrialKey {
                    variant: "v".into(),
                    case: "c".into(),
                    trial: 0,
                },
                call: 7,
                token: Secret::new("mst-gw-token"),
                part: part.clone(),
            });
            assert!(line.len() <= MAX_LINE_BYTES, "a line of {}", line.len());
            assert_eq!(got, None, "the whole came before the last part");
            got = whole.add(part).unwrap();
        }
        assert_eq!(got.as_deref(), Some(json.as_str()));
        assert!(parts.last().unwrap().last && !parts[0].last);
        // One part, when it fits.
        assert_eq!(ModelPart::split("{}").len(), 1);
    }

    #[test]
    fn model_parts_out_of_order_or_too_large_are_refused() {
        let mut parts = ModelParts::default();
        let part = |index, last, data: &str| ModelPart {
            index,
            last,
            data: data.to_string(),
        };
        assert!(parts
            .add(part(1, false, "x"))
            .unwrap_err()
            .contains("part 1"));
        assert_eq!(parts.add(part(0, false, "{")).unwrap(), None);
        assert!(parts
            .add(part(0, false, "x"))
            .unwrap_err()
            .contains("part 0"));
        assert_eq!(
            parts.add(part(1, true, "}")).unwrap().as_deref(),
            Some("{}")
        );
        let mut big = ModelParts::default();
        let chunk = "x".repeat(MODEL_PART_BYTES);
        let mut refused = None;
        for index in 0..=(MAX_MODEL_CALL_BYTES / MODEL_PART_BYTES) as u32 + 1 {
            if let Err(why) = big.add(part(index, false, &chunk)) {
                refused = Some(why);
                break;
            }
        }
        assert!(
            refused.unwrap().contains("more than"),
            "a call past the cap"
        );
    }

    #[test]
    fn a_granted_trials_gateway_token_never_prints() {
        let message = CoordinatorMessage::Granted {
            key: TrialKey {
                variant: "v".into(),
                case: "c".into(),
                trial: 0,
            },
            gateway: Some(Secret::new("mst-gw-SECRET")),
        };
        assert!(!format!("{message:?}").contains("mst-gw-SECRET"));
        let line = encode(&message);
        assert_eq!(decode::<CoordinatorMessage>(&line).unwrap(), message);
        let plain = encode(&CoordinatorMessage::Granted {
            key: TrialKey {
                variant: "v".into(),
                case: "c".into(),
                trial: 0,
            },
            gateway: None,
        });
        assert!(!plain.contains("gateway"), "{plain}");
    }
}
