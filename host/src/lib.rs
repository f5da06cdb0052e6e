//! `mst`: run evaluations of agents, tools and MCP servers, with everything that varies between
//! organisations shipped as sandboxed WebAssembly components.
//!
//! The crate is organised one folder per concept (see `docs/architecture.md`):
//! - [`plugin`]: the plugin host: engine, artifact cache, ABI check, sandbox, per-world calls,
//!   and the install store.
//! - [`cli`]: the `mst` command line.
//! - [`eval`]: cases, trials and traces.
//! - [`files`]: careful reads of untrusted files and atomic writes.
//! - [`grade`]: judges, trial grades and case outcomes.
//! - [`home`]: where mst keeps its state (`$MST_HOME`).
//! - [`results`]: the run directory, summaries and reports.
//! - [`runner`]: runners, machines and their channels (`local`).
//! - [`secrets`]: secrets files and worker token directories.
//! - [`shard`]: the `mst.shard/v1` protocol between coordinator and workers.

pub mod cli;
pub mod eval;
pub mod files;
pub mod grade;
pub mod home;
pub mod plugin;
pub mod results;
pub mod runner;
pub mod secrets;
pub mod shard;
