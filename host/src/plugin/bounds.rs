//! Caps on everything a plugin returns, applied where its results enter the host (in
//! [`super::loaded`]), so that nothing a plugin says is kept, printed or written into a run
//! whole when it is larger than a person or a result file should hold.
//!
//! Free text a person reads (a score's reason, an error message, a machine's description) is
//! cut visibly: the host keeps the start and says how much it dropped. Data the host parses or
//! acts on (details, cases, an options schema, a machine) is refused as the plugin's error
//! instead, because a cut would change its meaning. `docs/plugins.md` states each cap.

use super::bindings::{Case, Machine, MachineSpec, PluginInfo, Score};

/// Bytes kept of a score's reason.
pub const MAX_REASON: usize = 8 * 1024;
/// Bytes a score's details (JSON text) may have.
pub const MAX_DETAILS: usize = 64 * 1024;
/// Bytes kept of an error message a plugin returns.
pub const MAX_ERROR: usize = 4 * 1024;
/// Cases one `resolve` may return.
pub const MAX_CASES: usize = 1_000_000;
/// Bytes one case may have: its id, input, expected answer, tags and metadata together.
pub const MAX_CASE: usize = 1024 * 1024;
/// Bytes a case id may have.
pub const MAX_CASE_ID: usize = 256;
/// Bytes all cases of one `resolve` may have together.
pub const MAX_CASES_TOTAL: usize = 256 * 1024 * 1024;
/// Bytes a plugin's options schema (JSON text) may have.
pub const MAX_SCHEMA: usize = 64 * 1024;
/// Capabilities one plugin may declare.
pub const MAX_CAPABILITIES: usize = 256;
/// Bytes kept of a machine's description.
pub const MAX_DESCRIPTION: usize = 200;
/// Bytes a machine's id may have.
pub const MAX_MACHINE_ID: usize = 256;
/// Bytes a machine's spec may have, every string in it together.
pub const MAX_MACHINE_SPEC: usize = 64 * 1024;

/// `text` cut to at most `max` bytes (on a character boundary), with a note of how much went,
/// so that a reader sees the cut.
pub fn cut(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}… [cut by mst: {} more bytes]",
        &text[..end],
        text.len() - end
    )
}

/// A score with its reason cut to [`MAX_REASON`]; an error if its details exceed
/// [`MAX_DETAILS`].
pub fn score(mut score: Score) -> Result<Score, String> {
    if let Some(details) = &score.details {
        if details.len() > MAX_DETAILS {
            return Err(format!(
                "returned a score whose details have {} bytes; the most is {MAX_DETAILS}",
                details.len()
            ));
        }
    }
    score.reason = cut(score.reason, MAX_REASON);
    Ok(score)
}

/// The cases, or an error naming the first cap they exceed (and the case, where one does).
pub fn cases(cases: &[Case]) -> Result<(), String> {
    if cases.len() > MAX_CASES {
        return Err(format!(
            "returned {} cases; the most one dataset may have is {MAX_CASES}",
            cases.len()
        ));
    }
    let mut total = 0usize;
    for (index, case) in cases.iter().enumerate() {
        if case.id.len() > MAX_CASE_ID {
            return Err(format!(
                "case {} has an id of {} bytes; the most is {MAX_CASE_ID}",
                index + 1,
                case.id.len()
            ));
        }
        let size = case.id.len()
            + case.input.len()
            + case.expected.as_ref().map_or(0, String::len)
            + case.metadata.as_ref().map_or(0, String::len)
            + case.tags.iter().map(String::len).sum::<usize>();
        if size > MAX_CASE {
            return Err(format!(
                "case `{}` has {size} bytes; the most one case may have is {MAX_CASE}",
                case.id
            ));
        }
        total += size;
        if total > MAX_CASES_TOTAL {
            return Err(format!(
                "returned more than {MAX_CASES_TOTAL} bytes of cases (at case `{}`)",
                case.id
            ));
        }
    }
    Ok(())
}

/// The description a plugin gives of itself, or an error if its schema or capability list
/// exceeds its cap. (Its name, version and description are checked and cut where it is read.)
pub fn info(info: &PluginInfo) -> Result<(), String> {
    if let Some(schema) = &info.options_schema {
        if schema.len() > MAX_SCHEMA {
            return Err(format!(
                "declares an options schema of {} bytes; the most is {MAX_SCHEMA}",
                schema.len()
            ));
        }
    }
    if info.capabilities.len() > MAX_CAPABILITIES {
        return Err(format!(
            "declares {} capabilities; the most is {MAX_CAPABILITIES}",
            info.capabilities.len()
        ));
    }
    Ok(())
}

/// A machine with its description cut to [`MAX_DESCRIPTION`]; an error if its id or spec
/// exceeds its cap.
pub fn machine(mut machine: Machine) -> Result<Machine, String> {
    if machine.id.len() > MAX_MACHINE_ID {
        return Err(format!(
            "returned a machine id of {} bytes; the most is {MAX_MACHINE_ID}",
            machine.id.len()
        ));
    }
    let spec = match &machine.spec {
        MachineSpec::Command(channel) => {
            let words = |w: &[String]| w.iter().map(String::len).sum::<usize>();
            words(&channel.exec) + words(&channel.put) + words(&channel.get) + channel.workdir.len()
        }
        MachineSpec::Container(container) => {
            container.image.len()
                + container.context.as_ref().map_or(0, String::len)
                + container.network.as_ref().map_or(0, String::len)
                + container.env_names.iter().map(String::len).sum::<usize>()
                + container
                    .labels
                    .iter()
                    .map(|(k, v)| k.len() + v.len())
                    .sum::<usize>()
        }
    };
    if spec > MAX_MACHINE_SPEC {
        return Err(format!(
            "returned a machine spec of {spec} bytes; the most is {MAX_MACHINE_SPEC}"
        ));
    }
    machine.description = cut(machine.description, MAX_DESCRIPTION);
    Ok(machine)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_are_visible_and_on_character_boundaries() {
        assert_eq!(cut("short".into(), 10), "short");
        let cut_text = cut("ééé".into(), 3);
        assert_eq!(cut_text, "é… [cut by mst: 4 more bytes]");
    }

    #[test]
    fn schemas_capability_lists_and_machines_over_a_cap_are_refused() {
        use crate::plugin::bindings::{CommandChannel, WitCapability};
        let info = |schema: usize, capabilities: usize| PluginInfo {
            name: "a/b/c".into(),
            version: "1.0.0".into(),
            description: String::new(),
            capabilities: vec![WitCapability::Secret("X".into()); capabilities],
            options_schema: Some("x".repeat(schema)),
        };
        assert!(super::info(&info(10, 1)).is_ok());
        assert!(super::info(&info(MAX_SCHEMA + 1, 1))
            .unwrap_err()
            .contains("options schema"));
        assert!(super::info(&info(10, MAX_CAPABILITIES + 1))
            .unwrap_err()
            .contains("capabilities"));

        let channel = |workdir: usize| {
            MachineSpec::Command(CommandChannel {
                exec: vec!["sh".into()],
                put: Vec::new(),
                get: Vec::new(),
                workdir: "w".repeat(workdir),
            })
        };
        let machine = |id: usize, workdir: usize| Machine {
            id: "i".repeat(id),
            spec: channel(workdir),
            description: "d".repeat(1000),
        };
        let kept = super::machine(machine(1, 1)).unwrap();
        assert!(kept.description.ends_with("[cut by mst: 800 more bytes]"));
        assert!(super::machine(machine(MAX_MACHINE_ID + 1, 1)).is_err());
        assert!(super::machine(machine(1, MAX_MACHINE_SPEC)).is_err());
    }

    #[test]
    fn cases_over_a_cap_are_refused() {
        let case = |id: &str, input: usize| Case {
            id: id.into(),
            input: "x".repeat(input),
            expected: None,
            tags: Vec::new(),
            metadata: None,
        };
        assert!(cases(&[case("a", 10), case("b", 10)]).is_ok());
        let err = cases(&[case("a", 10), case("big", MAX_CASE)]).unwrap_err();
        assert!(err.contains("case `big`"), "{err}");
        assert!(cases(&[case(&"i".repeat(MAX_CASE_ID + 1), 1)]).is_err());
    }
}
