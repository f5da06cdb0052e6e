//! `mst`: run evaluations of agents, tools and MCP servers, with everything that varies between
//! organisations shipped as sandboxed WebAssembly components.
//!
//! The crate is organised one folder per concept (see `docs/architecture.md`):
//! - [`plugin`]: the plugin host: engine, artifact cache, ABI check, sandbox, per-world calls,
//!   and the install store.
//! - [`cli`]: the `mst` command line.
//! - [`run`]: orchestration: one run end to end, resume, regrade, the runner dry run.
//! - [`client`]: what runs one trial on a machine (`command`, `mcp`).
//! - [`clock`]: wall-clock time as mst records it.
//! - [`eval`]: the data model: config, cases, trial keys, traces, the plan.
//! - [`process`]: host processes: process groups, deadlines, capped reads.
//! - [`files`]: careful reads of untrusted files and atomic writes.
//! - [`grade`]: judges, trial grades and case outcomes.
//! - [`home`]: where mst keeps its state (`$MST_HOME`).
//! - [`results`]: the run directory, summaries and reports.
//! - [`runner`]: runners, machines and their channels (`local`).
//! - [`secrets`]: secrets files and worker token directories.
//! - [`shard`]: the `mst.shard/v1` protocol between coordinator and workers.

pub mod cli;
pub mod client;
pub mod clock;
pub mod eval;
pub mod files;
pub mod grade;
pub mod home;
pub mod plugin;
pub mod process;
pub mod results;
pub mod run;
pub mod runner;
pub mod secrets;
pub mod shard;
