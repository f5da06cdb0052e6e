//! `mst`: run evaluations of agents, tools and MCP servers, with everything that varies between
//! organisations shipped as sandboxed WebAssembly components.
//!
//! The crate is organised one folder per concept, in layers that import only downwards (see
//! `docs/architecture.md` and ADR 0006), top first:
//! - [`cli`]: the `mst` command line: parsing, progress, output, exit codes.
//! - [`import`]: converting evals written for other harnesses (MST) into mst's files.
//! - [`serve`]: the playground (`mst serve`): sessions on a runner's machines, tasks one at a
//!   time, live traces, and its HTTP API and web UI.
//! - [`view`]: results for people: the self-contained HTML report and the web UI's pages.
//! - [`run`]: orchestration: one run end to end, resume, regrade, the runner dry run.
//! - [`shard`]: `mst.shard/v1`: protocol, bundle, the coordinator's `ShardSession` and the
//!   worker.
//! - [`runner`], [`grade`], [`results`]: machines and their channels; judges and grades; the run
//!   directory, summaries and reports.
//! - [`client`]: what runs one trial on a machine (`command`, `mcp`, `api`).
//! - [`eval`]: the data model: config, cases, trial keys, traces, the plan.
//! - [`plugin`]: the WebAssembly host: engine, artifact cache, ABI check, sandbox, imports,
//!   typed calls, the install store and a run's plugin set.
//! - [`model`]: what the `api` client's agent loop calls: one request and reply shape, the
//!   built-in `mock` provider.
//! - [`secrets`]: secret values, secrets files and worker token directories.
//! - [`files`], [`process`], [`owner`], [`home`], [`clock`], [`net`], [`diagnosis`]: careful
//!   file access; host processes (groups, deadlines, capped reads); which mst process owns a
//!   container, a machine or a run, and whether it is gone; where mst keeps its state
//!   (`$MST_HOME`); wall-clock time; the HTTP client and its capped body reads; a failed
//!   trial's evidence on its machine (output tails, memory, load, disk, processes).

pub mod cli;
pub mod client;
pub mod clock;
pub mod diagnosis;
pub mod eval;
pub mod files;
pub mod grade;
pub mod home;
pub mod import;
pub mod model;
pub mod net;
pub mod owner;
pub mod plugin;
pub mod process;
pub mod results;
pub mod run;
pub mod runner;
pub mod secrets;
pub mod serve;
pub mod shard;
pub mod view;
