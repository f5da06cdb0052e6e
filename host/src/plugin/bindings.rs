//! Typed bindings for each world, generated from `wit/` at compile time.
//!
//! The `grader` world's bindings own the shared interfaces (types and host imports); the other
//! worlds reuse them through `with`, so a `Case` or `PluginInfo` is one Rust type everywhere and
//! one `Linker` serves every world.
//!
//! Exports are async (calls run on a fiber under `tokio::time::timeout`, so a plugin blocked in
//! a host call is dropped at its time limit), and so are the imports that wait on the host:
//! `exec.run`, `model.complete` and `http.send`.
//!
//! One version today. These bindings come from the live `wit/` (`mst:plugin@`[`super::ABI_VERSION`])
//! and serve every version on its track, because a version on the same track only adds
//! (docs/plugins.md, "Versioning policy"; `cargo xtask lint` enforces it). When the host moves
//! to a new track it keeps the old one's bindings, structured as Zed's extension host does
//! (`crates/extension_host/src/wasm_host/wit/since_v*.rs`), so the table
//! [`super::inspect::RELEASES`] can list both tracks:
//!
//! - one module per track, `since_v0_1_0`, `since_v0_2_0`, …, each with its `MIN_VERSION` and a
//!   `bindgen!` over its frozen `wit/released/<version>/`; `latest` re-exports the newest;
//! - an older module's `with:` points every interface that did not change at `latest`'s, and
//!   its host-import traits convert their arguments to `latest`'s types and forward to
//!   `latest`'s implementation, so the host's logic exists once;
//! - `WorldPre` gains a variant per module; a load picks the module whose track the
//!   component's export names carry, and its typed calls convert results up to `latest`.

/// The `grader` world, and the shared `mst:plugin` types and host interfaces.
pub mod grader {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "grader",
        imports: {
            "mst:plugin/exec.run": async,
            "mst:plugin/model.complete": async,
            "mst:plugin/http.send": async,
        },
        exports: { default: async },
    });
}

/// Bindings for the world `$world`, reusing the `grader` world's types and host interfaces
/// (`types`, `log`, `exec`, `secrets`, `http`, and those named after them).
macro_rules! world_reusing_grader {
    ($world:tt $(, $extra:tt => $module:ident)*) => {
        wasmtime::component::bindgen!({
            path: "../wit",
            world: $world,
            exports: { default: async },
            with: {
                "mst:plugin/types": crate::plugin::bindings::grader::mst::plugin::types,
                "mst:plugin/log": crate::plugin::bindings::grader::mst::plugin::log,
                "mst:plugin/exec": crate::plugin::bindings::grader::mst::plugin::exec,
                "mst:plugin/secrets": crate::plugin::bindings::grader::mst::plugin::secrets,
                "mst:plugin/http": crate::plugin::bindings::grader::mst::plugin::http,
                $($extra: crate::plugin::bindings::grader::mst::plugin::$module,)*
            },
        });
    };
}

/// The `pairwise-grader` world.
pub mod pairwise {
    world_reusing_grader!("pairwise-grader", "mst:plugin/model" => model);
}

/// The `dataset` world.
pub mod dataset {
    world_reusing_grader!("dataset");
}

/// The `runner` world.
pub mod runner {
    world_reusing_grader!("runner");
}

pub use grader::mst::plugin::types::{
    Capability as WitCapability, Case, CustomEvent, ErrorCode, EventKind, ExecRequest, Message,
    PluginError, PluginInfo, Score, ToolCall, ToolResult, Trace, TraceEvent, Trial, TrialStatus,
};

pub use pairwise::exports::mst::plugin::pairwise::{Preference, Winner};

pub use runner::exports::mst::plugin::machines::{
    CommandChannel, ContainerSpec, Machine, MachineSpec, RunnerInfo, Shard,
};
