//! `mst`: run evaluations of agents, tools and MCP servers, with everything that varies between
//! organisations shipped as sandboxed WebAssembly components.
//!
//! The crate is organised one folder per concept, in layers that import only downwards, top
//! first (`docs/architecture.md` writes the order once; `cargo xtask lint` checks every path
//! against it, and this list too):
//! - [`cli`]: the `mst` command line: parsing, progress, output, exit codes.
//! - [`serve`], [`import`]: the playground (`mst serve`: sessions on a runner's machines, tasks
//!   one at a time, live traces, its HTTP API and web UI); converting evals written for other
//!   harnesses (MST) into mst's files.
//! - [`run`]: orchestration: one run end to end, resume, regrade, the runner dry run.
//! - [`shard`], [`view`]: `mst.shard/v1` (protocol, bundle, the coordinator's `ShardSession`
//!   and the worker); results for people (the HTML report, the web UI's pages).
//! - [`client`], [`runner`], [`results`]: what runs one trial on a machine (`command`, `mcp`,
//!   `api`); machines and their channels; the run directory, summaries and reports.
//! - [`grade`], [`diagnosis`]: judges and grades; a failed trial's evidence on its machine
//!   (output tails, memory, load, disk, processes).
//! - [`eval`]: the data model: config, cases, trial keys, traces, the plan.
//! - [`plugin`]: the WebAssembly host: engine, artifact cache, ABI check, sandbox, imports,
//!   typed calls, the install store and a run's plugin set.
//! - [`llm`]: model providers: one request and reply shape, the built-in `mock` provider.
//! - [`secrets`]: secret values, secrets files and redaction.
//! - [`sandbox`], [`egress`], [`workspace`]: bubblewrap sandboxes for a local machine and
//!   each of its trials' programs; egress by name, through a proxy outside the sandbox; a
//!   task's files packed once, checked, and unpacked into each trial's work directory.
//! - [`files`], [`process`], [`net`], [`clock`], [`home`], [`owner`]: the ground floor: careful
//!   file access; host processes (groups, deadlines, capped reads); the HTTP client and its
//!   capped body reads; wall-clock time; where mst keeps its state (`$MST_HOME`); which mst
//!   process owns a container, a machine or a run, and whether it is gone.

pub mod cli;
pub mod client;
pub mod clock;
pub mod diagnosis;
pub mod egress;
pub mod eval;
pub mod files;
pub mod grade;
pub mod home;
pub mod import;
pub mod llm;
pub mod net;
pub mod owner;
pub mod plugin;
pub mod process;
pub mod results;
pub mod run;
pub mod runner;
pub mod sandbox;
pub mod secrets;
pub mod serve;
pub mod shard;
pub mod view;
pub mod workspace;
