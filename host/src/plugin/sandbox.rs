//! The sandbox each plugin call runs in: a fresh `Store` with a deny-by-default WASI context,
//! a memory cap on the store's total, a wall-time cap, and captured stderr.
//!
//! The wall-time cap is enforced twice, because neither way alone covers everything: epoch
//! interruption traps wasm code that computes without end, and the caller drops the call's
//! future at the limit (see [`super::loaded`]), which ends a call blocked in a host function
//! (a WASI sleep or poll, or a program run through `exec`), where epochs are never checked.

use super::capabilities::Effective;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::component::ResourceTable;
use wasmtime::{ResourceLimiter, Store, UpdateDeadline};
use wasmtime_wasi::p2::pipe::{ClosedInputStream, MemoryOutputPipe};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

/// How often the epoch advances: how often running wasm code checks its call's deadline.
pub const TICK: Duration = Duration::from_millis(5);

/// How much stderr a call may write before further writes fail.
const STDERR_CAPACITY: usize = 64 * 1024;

/// Resource caps for every call into a plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most linear memory, summed over all of the instance's memories.
    pub memory_bytes: usize,
    /// The most wall time one call may take, host calls included.
    pub call_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 256 * 1024 * 1024,
            call_timeout: Duration::from_secs(10),
        }
    }
}

/// Who a store belongs to, for error messages and log lines.
#[derive(Debug, Clone)]
pub struct Identity {
    /// `name version` once known, else the file name.
    pub label: String,
}

/// Caps the total linear memory of a store; remembers whether it refused growth so that the
/// resulting trap can be reported as "out of memory" rather than a bare `unreachable`.
pub(crate) struct MemoryCap {
    limit: usize,
    used: usize,
    pub(crate) refused: bool,
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Called with `current == 0` when a memory is created, so the sum covers every memory.
        let growth = desired.saturating_sub(current);
        if self.used.saturating_add(growth) > self.limit {
            self.refused = true;
            return Ok(false);
        }
        self.used += growth;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }

    fn instances(&self) -> usize {
        64
    }

    fn memories(&self) -> usize {
        16
    }

    fn tables(&self) -> usize {
        64
    }
}

/// The data of one call's `Store`.
pub struct State {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) memory: MemoryCap,
    stderr: MemoryOutputPipe,
    pub(crate) identity: Arc<Identity>,
    pub(crate) grants: Arc<Effective>,
    /// How the `model` import reaches the providers `grants` allow: the run's, or a grade
    /// machine's gateway.
    pub(crate) models: Option<Arc<crate::llm::ModelAccess>>,
    /// When the call's wall-time cap runs out; host calls never wait past it.
    pub(crate) deadline: Instant,
    /// Log lines written during this call, to cap the volume.
    pub(crate) log_lines: u32,
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl State {
    /// What the plugin wrote to stderr during this call, lossily decoded.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.contents()).into_owned()
    }
}

/// Builds the store for one call: no environment, no arguments, no network, stdin empty,
/// stdout discarded, stderr captured, and only the granted directories preopened (read-only).
pub(crate) fn new_store(
    engine: &wasmtime::Engine,
    identity: Arc<Identity>,
    grants: Arc<Effective>,
    models: Option<Arc<crate::llm::ModelAccess>>,
    limits: Limits,
) -> anyhow::Result<Store<State>> {
    let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
    let mut wasi = WasiCtxBuilder::new();
    // Closed, so a read returns end-of-file at once: a plugin can never wait on mst's stdin.
    wasi.stdin(ClosedInputStream);
    wasi.stderr(stderr.clone());
    for dir in &grants.read_dirs {
        let guest = dir.to_string_lossy();
        wasi.preopened_dir(dir, guest.as_ref(), FsPerms::ReadOnly)
            .map_err(|e| anyhow::anyhow!("cannot open granted directory {}: {e}", dir.display()))?;
    }
    let state = State {
        wasi: wasi.build(),
        table: ResourceTable::new(),
        memory: MemoryCap {
            limit: limits.memory_bytes,
            used: 0,
            refused: false,
        },
        stderr,
        identity,
        grants,
        models,
        deadline: Instant::now() + limits.call_timeout,
        log_lines: 0,
    };
    let mut store = Store::new(engine, state);
    store.limiter(|state| &mut state.memory);
    // Each tick, the clock decides: ticks come from a timer thread that runs late on a busy
    // host, so counting them would stop a plugin late.
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|store| {
        Ok(match Instant::now() >= store.data().deadline {
            true => UpdateDeadline::Interrupt,
            false => UpdateDeadline::Continue(1),
        })
    });
    Ok(store)
}
