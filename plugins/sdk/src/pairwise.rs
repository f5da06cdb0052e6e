//! The `pairwise-grader` world: compare two variants' traces of one case.
//!
//! The host calls [`Pairwise::compare`] twice per case, once in each order, with the variant
//! names blinded in everything the plugin sees, and records a winner only when both orders
//! agree.

/// Generated bindings for the `pairwise-grader` world. Plugin code rarely needs them directly.
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "pairwise-grader",
        generate_all,
        pub_export_macro: true,
        export_macro_name: "__export_pairwise_world",
        default_bindings_module: "mst_sdk::pairwise::bindings",
        runtime_path: "mst_sdk::__wit_bindgen::rt",
    });
}

pub use bindings::exports::mst::plugin::pairwise::{Preference, Winner};
pub use bindings::mst::plugin::types::{
    Capability, Case, CustomEvent, ErrorCode, EventKind, ExecRequest, Message, PluginError,
    PluginInfo, ToolCall, ToolResult, Trace, TraceEvent, TrialStatus,
};

/// A pairwise grader: implement this and name the type in
/// [`export_pairwise!`](crate::export_pairwise).
pub trait Pairwise {
    /// Name, version, description, capabilities and options schema. Must be pure and fast.
    fn info() -> PluginInfo;

    /// Which of two traces of `case` is better. `options` is the grader's JSON configuration
    /// from the eval.
    fn compare(
        options: &str,
        case: Case,
        first: Trace,
        second: Trace,
    ) -> Result<Preference, PluginError>;
}

crate::world_helpers!();
crate::model_helpers!();

/// The text a grader looks at by default: the trace's final answer, or empty when there is none.
pub fn final_text(trace: &Trace) -> &str {
    trace.final_text.as_deref().unwrap_or("")
}

/// Exports `$ty` (which implements [`Pairwise`]) as this component's `pairwise-grader` world.
#[macro_export]
macro_rules! export_pairwise {
    ($ty:ty) => {
        #[doc(hidden)]
        pub struct __MstPairwiseExport;

        impl $crate::pairwise::bindings::exports::mst::plugin::plugin::Guest for __MstPairwiseExport {
            fn info() -> $crate::pairwise::PluginInfo {
                <$ty as $crate::pairwise::Pairwise>::info()
            }
        }

        impl $crate::pairwise::bindings::exports::mst::plugin::pairwise::Guest
            for __MstPairwiseExport
        {
            fn compare(
                options: String,
                case: $crate::pairwise::Case,
                first: $crate::pairwise::Trace,
                second: $crate::pairwise::Trace,
            ) -> Result<$crate::pairwise::Preference, $crate::pairwise::PluginError> {
                <$ty as $crate::pairwise::Pairwise>::compare(&options, case, first, second)
            }
        }

        // As for graders: the exported symbols exist only in the component.
        #[cfg(target_arch = "wasm32")]
        $crate::pairwise::bindings::__export_pairwise_world!(__MstPairwiseExport with_types_in $crate::pairwise::bindings);
    };
}
