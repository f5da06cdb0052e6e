//! The mst plugin SDK: write graders, dataset resolvers and runners as WebAssembly components.
//!
//! A plugin is a Rust library crate built for `wasm32-wasip2` with `crate-type = ["cdylib"]`.
//! It enables exactly one SDK feature (`grader`, `pairwise`, `dataset` or `runner`), implements that world's
//! trait, and names its type in the world's export macro:
//!
//! ```ignore
//! use mst_sdk::grader::{Grader, PluginInfo, PluginError, Score, Trial};
//!
//! struct Exact;
//!
//! impl Grader for Exact {
//!     fn info() -> PluginInfo { mst_sdk::grader::info("acme/grader/exact", env!("CARGO_PKG_VERSION"), "Exact match") }
//!     fn grade(options: &str, trial: Trial) -> Result<Score, PluginError> { todo!() }
//! }
//!
//! mst_sdk::export_grader!(Exact);
//! ```
//!
//! The SDK embeds nothing the host cannot verify: the component's imports and exports come from
//! the WIT package in `wit/`, and everything a plugin says about itself comes from its `info`
//! export, which the host reads and checks against what the component actually imports.

// Lets the bindings refer to the runtime through a path that also resolves in plugin crates,
// where the export macros expand.
extern crate self as mst_sdk;

#[doc(hidden)]
pub use wit_bindgen as __wit_bindgen;

pub use serde_json;

/// How the host matches the argv a plugin runs against its `exec` declarations: declare argv
/// templates ([`argv::TEMPLATE`] first), and test the argv the plugin builds with
/// [`argv::Declaration::admits`], the host's own matcher.
pub use mst_argv_patterns as argv;

mod options;
pub use options::{parse_options, OptionsError};

mod verdict;
pub use verdict::{json_object, rubric_prompt};

#[cfg(feature = "dataset")]
pub mod dataset;
#[cfg(feature = "grader")]
pub mod grader;
#[cfg(feature = "pairwise")]
pub mod pairwise;
#[cfg(feature = "runner")]
pub mod runner;

#[cfg(any(
    feature = "grader",
    feature = "pairwise",
    feature = "dataset",
    feature = "runner"
))]
/// Code shared by every world module: the generated types are distinct per world (each world
/// has its own bindings), so the helpers are written once as a macro over the module's types.
macro_rules! world_helpers {
    () => {
        pub use bindings::mst::plugin::exec::ExecOutput;
        pub use bindings::mst::plugin::http::{Request as HttpRequest, Response as HttpResponse};
        pub use bindings::mst::plugin::log::Level;

        /// Builds a [`PluginInfo`] with no capabilities and no options schema.
        pub fn info(name: &str, version: &str, description: &str) -> PluginInfo {
            PluginInfo {
                name: name.to_string(),
                version: version.to_string(),
                description: description.to_string(),
                capabilities: Vec::new(),
                options_schema: None,
            }
        }

        /// A [`PluginError`] with `code` and `message`.
        pub fn error(code: ErrorCode, message: impl Into<String>) -> PluginError {
            PluginError {
                code,
                message: message.into(),
            }
        }

        /// Parses the plugin's JSON options into `T`; the error names the offending field.
        pub fn options<T: serde::de::DeserializeOwned>(options: &str) -> Result<T, PluginError> {
            crate::parse_options(options)
                .map_err(|e| error(ErrorCode::InvalidOptions, e.to_string()))
        }

        /// Writes a line to the host's log, tagged with the plugin's name.
        pub fn log(level: Level, message: &str) {
            bindings::mst::plugin::log::log(level, message)
        }

        /// The value of a secret the operator granted (see the `secret` capability).
        pub fn secret(name: &str) -> Result<String, PluginError> {
            bindings::mst::plugin::secrets::get(name)
        }

        /// Sends one HTTP request through the host to a host the operator granted (see the
        /// `http` capability): public addresses only unless the grant is the address, redirects
        /// followed only on the same host, bodies capped at 16 MiB.
        pub fn http_send(request: &HttpRequest) -> Result<HttpResponse, PluginError> {
            bindings::mst::plugin::http::send(request)
        }

        /// An `exec` capability for one way of calling `program`: an argv template (see
        /// [`crate::argv`]), `words` matched one per argument, in order, `[word]` optional.
        pub fn exec_template(program: &str, words: &[&str]) -> Capability {
            let mut args = vec![crate::argv::TEMPLATE.to_string()];
            args.extend(words.iter().map(|w| w.to_string()));
            Capability::Exec(ExecRequest {
                program: program.to_string(),
                args,
            })
        }

        /// Whether one of the `exec` declarations of `program` in `capabilities`, pinned to the
        /// runner options `options` as the host pins them (`{option:NAME}`), admits `args`:
        /// the host's own verdict, for a plugin's tests to prove every call it builds.
        pub fn exec_admitted(
            capabilities: &[Capability],
            options: &[(&str, &str)],
            program: &str,
            args: &[String],
        ) -> bool {
            let options = options
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect();
            capabilities.iter().any(|capability| match capability {
                Capability::Exec(e) if e.program == program => crate::argv::pin(&e.args, &options)
                    .is_ok_and(|pinned| {
                        crate::argv::Declaration::parse(&pinned)
                            .is_ok_and(|declaration| declaration.admits(args).is_ok())
                    }),
                _ => false,
            })
        }

        /// Runs a host program the operator granted (see the `exec` capability).
        pub fn exec(
            program: &str,
            args: &[&str],
            stdin: &[u8],
            timeout_ms: u32,
        ) -> Result<ExecOutput, PluginError> {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            bindings::mst::plugin::exec::run(program, &args, stdin, timeout_ms)
        }
    };
}
#[cfg(any(
    feature = "grader",
    feature = "pairwise",
    feature = "dataset",
    feature = "runner"
))]
pub(crate) use world_helpers;

#[cfg(any(feature = "grader", feature = "pairwise"))]
/// The `model` import, for the worlds that have it (graders judge with a model).
macro_rules! model_helpers {
    () => {
        pub use bindings::mst::plugin::model::{Completion, CompletionRequest};

        /// Asks a model through the host (the `model` capability for the request's provider).
        /// The host holds the provider's key and counts the call against the run's limits; the
        /// plugin never sees the key.
        pub fn complete(request: &CompletionRequest) -> Result<Completion, PluginError> {
            bindings::mst::plugin::model::complete(request)
        }

        /// Asks a judge model (`provider`/`model`) once, at temperature 0, with `system` and
        /// then `prompt`, and reads its verdict: the first JSON object in the reply that is a
        /// `T` passing `check` ([`crate::json_object`]). A reply without one is an
        /// `unavailable` error naming the model and `shape` (the reply expected), so the trial
        /// is not graded rather than decided.
        pub fn ask_judge<T: serde::de::DeserializeOwned>(
            (provider, model): (&str, &str),
            max_tokens: u32,
            system: &str,
            prompt: String,
            shape: &str,
            check: impl Fn(&T) -> bool,
        ) -> Result<T, PluginError> {
            let completion = complete(&CompletionRequest {
                provider: provider.to_string(),
                model: model.to_string(),
                system: Some(system.to_string()),
                messages: vec![bindings::mst::plugin::types::Message {
                    role: "user".to_string(),
                    text: prompt,
                }],
                max_tokens,
                temperature: Some(0.0),
            })?;
            crate::json_object(&completion.text, check).ok_or_else(|| {
                let shown: String = completion.text.chars().take(200).collect();
                error(
                    ErrorCode::Unavailable,
                    format!("the judge ({provider}/{model}) did not reply with {shape}: {shown:?}"),
                )
            })
        }
    };
}
#[cfg(any(feature = "grader", feature = "pairwise"))]
pub(crate) use model_helpers;
