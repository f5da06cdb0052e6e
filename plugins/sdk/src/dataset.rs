//! The `dataset` world: resolve a dataset reference into cases.

/// Generated bindings for the `dataset` world. Plugin code rarely needs them directly.
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "dataset",
        generate_all,
        pub_export_macro: true,
        export_macro_name: "__export_dataset_world",
        default_bindings_module: "mst_sdk::dataset::bindings",
        runtime_path: "mst_sdk::__wit_bindgen::rt",
    });
}

pub use bindings::mst::plugin::types::{
    Capability, Case, ErrorCode, ExecRequest, PluginError, PluginInfo,
};

/// A dataset resolver: implement this and name the type in
/// [`export_dataset!`](crate::export_dataset).
pub trait Dataset {
    /// Name, version, description, capabilities and options schema. Must be pure and fast.
    fn info() -> PluginInfo;

    /// Turns the dataset entry (`options`, JSON) and the file it names (`content`, read by the
    /// host) into cases.
    fn resolve(options: &str, content: Option<Vec<u8>>) -> Result<Vec<Case>, PluginError>;
}

crate::world_helpers!();

/// Exports `$ty` (which implements [`Dataset`]) as this component's `dataset` world.
#[macro_export]
macro_rules! export_dataset {
    ($ty:ty) => {
        #[doc(hidden)]
        pub struct __MstDatasetExport;

        impl $crate::dataset::bindings::exports::mst::plugin::plugin::Guest for __MstDatasetExport {
            fn info() -> $crate::dataset::PluginInfo {
                <$ty as $crate::dataset::Dataset>::info()
            }
        }

        impl $crate::dataset::bindings::exports::mst::plugin::datasets::Guest for __MstDatasetExport {
            fn resolve(
                options: String,
                content: Option<Vec<u8>>,
            ) -> Result<Vec<$crate::dataset::Case>, $crate::dataset::PluginError> {
                <$ty as $crate::dataset::Dataset>::resolve(&options, content)
            }
        }

        // Exported symbol names like `mst:plugin/grading@0.1.0#grade-trial` exist only in the
        // component; a native build (for unit tests) must not try to link them.
        #[cfg(target_arch = "wasm32")]
        $crate::dataset::bindings::__export_dataset_world!(__MstDatasetExport with_types_in $crate::dataset::bindings);
    };
}
