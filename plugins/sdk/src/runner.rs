//! The `runner` world: describe machines that run shards.

/// Generated bindings for the `runner` world. Plugin code rarely needs them directly.
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "runner",
        generate_all,
        pub_export_macro: true,
        export_macro_name: "__export_runner_world",
        default_bindings_module: "mst_sdk::runner::bindings",
        runtime_path: "mst_sdk::__wit_bindgen::rt",
    });
}

pub use bindings::exports::mst::plugin::machines::{
    CommandChannel, ContainerSpec, Machine, MachineSpec, RunnerInfo, Shard,
};
pub use bindings::mst::plugin::types::{
    Capability, ErrorCode, ExecRequest, PluginError, PluginInfo,
};

/// A runner: implement this and name the type in [`export_runner!`](crate::export_runner).
pub trait Runner {
    /// Name, version, description, capabilities and options schema. Must be pure and fast.
    fn info() -> PluginInfo;

    /// Static facts: the most shards this runner supports.
    fn runner_info() -> RunnerInfo {
        RunnerInfo { max_shards: None }
    }

    /// Validates runner options (JSON) before any machine exists.
    fn check_options(options: &str) -> Result<(), PluginError>;

    /// Creates or reserves the machine for one shard.
    fn create_machine(shard: Shard, options: &str) -> Result<Machine, PluginError>;

    /// Releases a machine; with `keep`, leaves it for inspection.
    fn dispose_machine(id: &str, keep: bool) -> Result<(), PluginError>;
}

crate::world_helpers!();

/// Exports `$ty` (which implements [`Runner`]) as this component's `runner` world.
#[macro_export]
macro_rules! export_runner {
    ($ty:ty) => {
        #[doc(hidden)]
        pub struct __MstRunnerExport;

        impl $crate::runner::bindings::exports::mst::plugin::plugin::Guest for __MstRunnerExport {
            fn info() -> $crate::runner::PluginInfo {
                <$ty as $crate::runner::Runner>::info()
            }
        }

        impl $crate::runner::bindings::exports::mst::plugin::machines::Guest for __MstRunnerExport {
            fn info() -> $crate::runner::RunnerInfo {
                <$ty as $crate::runner::Runner>::runner_info()
            }
            fn check_options(options: String) -> Result<(), $crate::runner::PluginError> {
                <$ty as $crate::runner::Runner>::check_options(&options)
            }
            fn create_machine(
                shard: $crate::runner::Shard,
                options: String,
            ) -> Result<$crate::runner::Machine, $crate::runner::PluginError> {
                <$ty as $crate::runner::Runner>::create_machine(shard, &options)
            }
            fn dispose_machine(id: String, keep: bool) -> Result<(), $crate::runner::PluginError> {
                <$ty as $crate::runner::Runner>::dispose_machine(&id, keep)
            }
        }

        // Exported symbol names like `mst:plugin/grading@0.1.0#grade-trial` exist only in the
        // component; a native build (for unit tests) must not try to link them.
        #[cfg(target_arch = "wasm32")]
        $crate::runner::bindings::__export_runner_world!(__MstRunnerExport with_types_in $crate::runner::bindings);
    };
}
