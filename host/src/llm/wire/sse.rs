//! Server-sent events as the model APIs send them: `event: NAME` (Anthropic, Responses) and
//! `data: JSON`, each event ended by a blank line.

use super::Rendered;
use serde_json::Value;

/// An event stream being written.
#[derive(Default)]
pub(super) struct Events {
    body: String,
}

impl Events {
    /// An event named after its data's `type` (as Anthropic and the Responses API name theirs).
    pub fn typed(&mut self, data: Value) {
        let name = data["type"].as_str().unwrap_or("message").to_string();
        self.body
            .push_str(&format!("event: {name}\ndata: {data}\n\n"));
    }

    /// An event of data alone (Chat Completions).
    pub fn data(&mut self, data: &str) {
        self.body.push_str(&format!("data: {data}\n\n"));
    }

    pub fn finish(self) -> Rendered {
        Rendered {
            content_type: "text/event-stream",
            body: self.body.into_bytes(),
        }
    }
}

/// A stream read back, for tests: each event's name (if any) and data, in order.
#[cfg(test)]
pub(super) fn read(body: &[u8]) -> Vec<(Option<String>, String)> {
    let text = std::str::from_utf8(body).expect("an event stream is UTF-8");
    assert!(text.ends_with("\n\n"), "the stream ends with a blank line");
    text.split("\n\n")
        .filter(|event| !event.is_empty())
        .map(|event| {
            let mut name = None;
            let mut data = Vec::new();
            for line in event.lines() {
                match line.split_once(": ") {
                    Some(("event", value)) => name = Some(value.to_string()),
                    Some(("data", value)) => data.push(value),
                    _ => panic!("not an event line: {line:?}"),
                }
            }
            (name, data.join("\n"))
        })
        .collect()
}

/// A stream of JSON events read back, for tests: each named event's data parsed, after
/// checking that the name is the data's `type`.
#[cfg(test)]
pub(super) fn read_typed(body: &[u8]) -> Vec<Value> {
    read(body)
        .into_iter()
        .map(|(name, data)| {
            let data: Value = serde_json::from_str(&data).expect("event data is JSON");
            assert_eq!(name.as_deref(), data["type"].as_str(), "{data}");
            data
        })
        .collect()
}
