//! What an LLM judge is asked, and reading its structured verdict out of its free text.

use serde::de::DeserializeOwned;

/// The first JSON object in `text` that deserializes as `T` and passes `check`. Models wrap
/// their JSON in prose or code fences, and may write other objects first, so each `{` is
/// tried in turn.
pub fn json_object<T: DeserializeOwned>(text: &str, check: impl Fn(&T) -> bool) -> Option<T> {
    text.match_indices('{').find_map(|(start, _)| {
        let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter();
        match stream.next() {
            Some(Ok(serde_json::Value::Object(object))) => {
                serde_json::from_value::<T>(serde_json::Value::Object(object))
                    .ok()
                    .filter(&check)
            }
            _ => None,
        }
    })
}

/// The prompt of a judge grading against `rubric`: the rubric, the task (`input`), the
/// reference answer when there is one, and each answer under its label (e.g. `The answer to
/// grade`, or `The first answer` and `The second answer`).
pub fn rubric_prompt(
    rubric: &str,
    input: &str,
    expected: Option<&str>,
    answers: &[(&str, &str)],
) -> String {
    let expected = match expected {
        Some(expected) => format!("\nA reference answer: {expected}\n"),
        None => String::new(),
    };
    let answers: Vec<String> = answers
        .iter()
        .map(|(label, text)| format!("{label}:\n{text}"))
        .collect();
    format!(
        "Rubric:\n{rubric}\n\nThe task given:\n{input}\n{expected}\n{}\n",
        answers.join("\n\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Verdict {
        score: f64,
        reason: String,
    }

    fn verdict(text: &str) -> Option<Verdict> {
        json_object(text, |v: &Verdict| (0.0..=1.0).contains(&v.score))
    }

    #[test]
    fn a_prompt_shows_the_rubric_task_reference_and_labelled_answers() {
        assert_eq!(
            rubric_prompt("Be right.", "2+2?", Some("4"), &[("A", "4"), ("B", "5")]),
            "Rubric:\nBe right.\n\nThe task given:\n2+2?\n\nA reference answer: 4\n\nA:\n4\n\nB:\n5\n"
        );
        assert_eq!(
            rubric_prompt("R", "T", None, &[("The answer", "x")]),
            "Rubric:\nR\n\nThe task given:\nT\n\nThe answer:\nx\n"
        );
    }

    #[test]
    fn objects_are_found_in_prose_and_fences_and_checked() {
        let v = verdict("Sure.\n```json\n{\"score\": 0.8, \"reason\": \"close\"}\n```").unwrap();
        assert_eq!((v.score, v.reason.as_str()), (0.8, "close"));
        assert!(verdict("{\"score\": 3, \"reason\": \"too high\"}").is_none());
        assert!(verdict("{\"grade\": 1} then {\"score\": 1, \"reason\": \"ok\"}").is_some());
        assert!(verdict("no json here").is_none());
        assert!(
            verdict("{\"score\": 0.5}").is_none(),
            "a reason is required"
        );
    }
}
