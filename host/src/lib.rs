//! `mst`: run evaluations of agents, tools and MCP servers, with everything that varies between
//! organisations shipped as sandboxed WebAssembly components.
//!
//! The crate is organised one folder per concept (see `docs/architecture.md`):
//! - [`plugin`]: the plugin host: engine, artifact cache, ABI check, sandbox, per-world calls,
//!   and the install store.
//! - [`cli`]: the `mst` command line.
//! - [`eval`]: cases, trials and traces.
//! - [`home`]: where mst keeps its state (`$MST_HOME`).
//! - [`shard`]: the `mst.shard/v1` protocol between coordinator and workers.

pub mod cli;
pub mod eval;
pub mod home;
pub mod plugin;
pub mod shard;
