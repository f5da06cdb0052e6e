//! The end-to-end tests, one module per area, linked into one test binary: each binary links
//! mst and wasmtime, so one per area cost a link and a few hundred megabytes of disk apiece.
//! Run one area with `cargo test -p mst-tests --test e2e -- AREA::` (e.g. `docker::`).

mod agent_clis;
mod artifacts;
mod assertions;
mod boundaries;
mod browser;
mod budget;
mod checks;
mod claims;
mod config_errors;
mod conversation;
mod detach;
mod diff;
mod docker;
mod export;
mod foreign_plugins;
mod gateway;
mod grade_runners;
mod graders;
mod hygiene;
mod import;
mod local_isolation;
mod mcp;
mod models;
mod oci;
mod pairwise;
mod plugin_check;
mod plugin_http;
mod plugin_store;
mod run;
mod runner_plugins;
mod sandbox;
mod serve;
mod serve_mcp;
mod session;
mod slurm;
mod statistics;
mod stream;
mod tool_proxy;
mod web;
mod workspaces;
