//! Typed bindings for each world, generated from `wit/` at compile time.
//!
//! The `grader` world's bindings own the shared interfaces (types and host imports); the other
//! worlds reuse them through `with`, so a `Case` or `PluginInfo` is one Rust type everywhere and
//! one `Linker` serves every world.

/// The `grader` world, and the shared `mst:plugin` types and host interfaces.
pub mod grader {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "grader",
    });
}

/// The `pairwise-grader` world.
pub mod pairwise {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "pairwise-grader",
        with: {
            "mst:plugin/types": crate::plugin::bindings::grader::mst::plugin::types,
            "mst:plugin/log": crate::plugin::bindings::grader::mst::plugin::log,
            "mst:plugin/exec": crate::plugin::bindings::grader::mst::plugin::exec,
            "mst:plugin/secrets": crate::plugin::bindings::grader::mst::plugin::secrets,
            "mst:plugin/http": crate::plugin::bindings::grader::mst::plugin::http,
            "mst:plugin/model": crate::plugin::bindings::grader::mst::plugin::model,
        },
    });
}

/// The `dataset` world.
pub mod dataset {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "dataset",
        with: {
            "mst:plugin/types": crate::plugin::bindings::grader::mst::plugin::types,
            "mst:plugin/log": crate::plugin::bindings::grader::mst::plugin::log,
            "mst:plugin/exec": crate::plugin::bindings::grader::mst::plugin::exec,
            "mst:plugin/secrets": crate::plugin::bindings::grader::mst::plugin::secrets,
            "mst:plugin/http": crate::plugin::bindings::grader::mst::plugin::http,
        },
    });
}

/// The `runner` world.
pub mod runner {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "runner",
        with: {
            "mst:plugin/types": crate::plugin::bindings::grader::mst::plugin::types,
            "mst:plugin/log": crate::plugin::bindings::grader::mst::plugin::log,
            "mst:plugin/exec": crate::plugin::bindings::grader::mst::plugin::exec,
            "mst:plugin/secrets": crate::plugin::bindings::grader::mst::plugin::secrets,
            "mst:plugin/http": crate::plugin::bindings::grader::mst::plugin::http,
        },
    });
}

pub use grader::mst::plugin::types::{
    Capability as WitCapability, Case, CustomEvent, ErrorCode, EventKind, ExecRequest, Message,
    PluginError, PluginInfo, Score, ToolCall, ToolResult, Trace, TraceEvent, Trial, TrialStatus,
};

pub use runner::exports::mst::plugin::machines::{
    CommandChannel, ContainerSpec, Machine, MachineSpec, RunnerInfo, Shard,
};
