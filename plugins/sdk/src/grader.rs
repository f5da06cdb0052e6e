//! The `grader` world: score one trial.

/// Generated bindings for the `grader` world. Plugin code rarely needs them directly.
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "grader",
        generate_all,
        pub_export_macro: true,
        export_macro_name: "__export_grader_world",
        default_bindings_module: "mst_sdk::grader::bindings",
        runtime_path: "mst_sdk::__wit_bindgen::rt",
    });
}

pub use bindings::mst::plugin::types::{
    Capability, Case, CustomEvent, ErrorCode, EventKind, ExecRequest, Message, PluginError,
    PluginInfo, Score, ToolCall, ToolResult, Trace, TraceEvent, Trial, TrialStatus,
};

/// A grader: implement this and name the type in [`export_grader!`](crate::export_grader).
pub trait Grader {
    /// Name, version, description, capabilities and options schema. Must be pure and fast.
    fn info() -> PluginInfo;

    /// Scores one trial. `options` is the grader's JSON configuration from the eval.
    fn grade(options: &str, trial: Trial) -> Result<Score, PluginError>;
}

crate::world_helpers!();
crate::model_helpers!();

/// A score of `value` (clamped to 0..=1) with a reason.
pub fn score(value: f64, reason: impl Into<String>) -> Score {
    Score {
        value: value.clamp(0.0, 1.0),
        pass: None,
        reason: reason.into(),
        details: None,
    }
}

/// The text a grader looks at by default: the trial's final answer, or empty when there is none.
pub fn final_text(trial: &Trial) -> &str {
    trial.trace.final_text.as_deref().unwrap_or("")
}

/// Exports `$ty` (which implements [`Grader`]) as this component's `grader` world.
#[macro_export]
macro_rules! export_grader {
    ($ty:ty) => {
        #[doc(hidden)]
        pub struct __MstGraderExport;

        impl $crate::grader::bindings::exports::mst::plugin::plugin::Guest for __MstGraderExport {
            fn info() -> $crate::grader::PluginInfo {
                <$ty as $crate::grader::Grader>::info()
            }
        }

        impl $crate::grader::bindings::exports::mst::plugin::grading::Guest for __MstGraderExport {
            fn grade_trial(
                options: String,
                trial: $crate::grader::Trial,
            ) -> Result<$crate::grader::Score, $crate::grader::PluginError> {
                <$ty as $crate::grader::Grader>::grade(&options, trial)
            }
        }

        // Exported symbol names like `mst:plugin/grading@0.1.0#grade-trial` exist only in the
        // component; a native build (for unit tests) must not try to link them.
        #[cfg(target_arch = "wasm32")]
        $crate::grader::bindings::__export_grader_world!(__MstGraderExport with_types_in $crate::grader::bindings);
    };
}

/// Builders for trials in a grader's native unit tests.
pub mod testing {
    use super::*;

    /// A completed trial of case `id` whose final answer is `final_text`.
    pub fn trial(id: &str, final_text: &str) -> Trial {
        Trial {
            case: Case {
                id: id.to_string(),
                input: "{}".to_string(),
                expected: None,
                tags: Vec::new(),
                metadata: None,
            },
            variant: "default".to_string(),
            trial: 0,
            trace: Trace {
                status: TrialStatus::Completed,
                final_text: Some(final_text.to_string()),
                events: Vec::new(),
                exit_code: Some(0),
                duration_ms: 1,
            },
        }
    }
}
