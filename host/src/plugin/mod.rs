//! The plugin host: loads WebAssembly components, checks they fit this host's ABI, runs them in
//! a sandbox, and stores installed ones.
//!
//! The pieces, each owning its own data:
//! - [`engine`]: the one wasmtime `Engine`, its epoch ticker, and compilation through the cache.
//! - [`cache`]: precompiled artifacts on disk, keyed by content and engine compatibility.
//! - [`inspect`]: the static ABI check: what a component imports and exports, decided without
//!   running it.
//! - [`capabilities`]: what a plugin declares, what the operator grants, and the intersection.
//! - [`sandbox`]: per-call limits (memory, time) and the store each call runs in.
//! - [`imports`]: the host functions a plugin may call (log, exec, secrets, http, model).
//! - [`egress`]: `http.send`: granted hosts, public addresses, same-host redirects, caps.
//! - [`manifest`]: the check of a Kubernetes manifest a plugin feeds `kubectl` on stdin.
//! - [`programs`]: host programs run for a plugin (exec import, command channels).
//! - [`bindings`]: the typed world bindings generated from `wit/`.
//! - [`bounds`]: caps on everything a plugin returns.
//! - [`loaded`]: a compiled, checked plugin and its typed calls.
//! - [`installed`]: the install store under `$MST_HOME/plugins`, and where each plugin came from.
//! - [`oci`]: plugins pushed to and installed from OCI registries, always verified.
//! - [`set`]: loading plugins by reference, and the typed set of plugins one run uses.
//! - [`check`]: the report `mst plugin check` prints.

pub mod bindings;
pub mod bounds;
pub mod cache;
pub mod capabilities;
pub mod check;
pub mod egress;
pub mod engine;
pub mod imports;
pub mod inspect;
pub mod installed;
pub mod loaded;
pub mod manifest;
pub mod oci;
pub mod programs;
pub mod sandbox;
pub mod set;

pub use capabilities::Grants;
pub use engine::PluginHost;
pub use inspect::{Kind, Surface};
pub use loaded::{CallError, LoadedPlugin};
pub use sandbox::Limits;

/// The version of the `mst:plugin` WIT package this host implements (from the release table
/// [`inspect::RELEASES`]).
pub const ABI_VERSION: &str = inspect::CURRENT.newest_abi();

/// The newest WASI 0.2 release whose interfaces this host provides to plugins (from
/// [`inspect::RELEASES`]).
pub const WASI_VERSION: &str = inspect::CURRENT.wasi;
