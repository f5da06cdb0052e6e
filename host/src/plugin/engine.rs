//! The plugin host's one wasmtime `Engine`, its epoch ticker, and the shared `Linker`.
//!
//! This module and [`super::sandbox`] are the only places that configure wasmtime, so that a
//! wasmtime upgrade touches one corner of the code base.

use super::cache::{ArtifactCache, CacheOutcome};
use super::sandbox::{State, TICK};
use anyhow::Result;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// Owns the engine, the linker with every host import, and the compiled-artifact caches.
pub struct PluginHost {
    engine: Engine,
    linker: Linker<State>,
    cache: ArtifactCache,
    /// Components already compiled or deserialized by this process, by digest.
    compiled: Mutex<HashMap<String, Component>>,
}

impl PluginHost {
    /// A host whose artifact cache lives in `cache_dir`; an error if someone else could have
    /// written that cache.
    pub fn new(cache_dir: PathBuf) -> Result<Self> {
        let engine = new_engine()?;
        spawn_epoch_ticker(&engine);

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(anyhow::Error::from)?;
        // The grader world imports every host interface, so its generated `add_to_linker`
        // provides the imports of all worlds.
        super::bindings::grader::Grader::add_to_linker::<State, HasSelf<State>>(
            &mut linker,
            |state| state,
        )
        .map_err(anyhow::Error::from)?;

        let cache = ArtifactCache::new(cache_dir, &engine);
        cache.check()?;
        Ok(Self {
            engine,
            linker,
            cache,
            compiled: Mutex::new(HashMap::new()),
        })
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The linker holding every host import.
    pub(crate) fn linker(&self) -> &Linker<State> {
        &self.linker
    }

    /// The compiled component for `bytes` (sha256 `digest`): from memory, the disk cache, or
    /// compiled now.
    pub fn compile(&self, digest: &str, bytes: &[u8]) -> Result<(Component, CacheOutcome)> {
        if let Some(component) = self.compiled.lock().expect("cache lock").get(digest) {
            return Ok((component.clone(), CacheOutcome::Hit));
        }
        let (component, outcome) = self.cache.load_or_compile(&self.engine, digest, bytes)?;
        self.compiled
            .lock()
            .expect("cache lock")
            .insert(digest.to_string(), component.clone());
        Ok((component, outcome))
    }
}

/// Instances the pool holds at once: far more than one process runs in parallel.
const POOLED_INSTANCES: u32 = 256;

/// The engine: component model, epoch interruption (which stops wasm code that never calls
/// out; calls are async, so one blocked in a host function is dropped at its limit instead),
/// and a pooling allocator, because every
/// call instantiates afresh and the pool turns that from mmap/munmap per call into reusing
/// a slot. Falls back to on-demand allocation where the pool's address space cannot be reserved.
fn new_engine() -> Result<Engine> {
    let base = || {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        config
    };
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(POOLED_INSTANCES)
        .total_core_instances(4 * POOLED_INSTANCES)
        .total_memories(2 * POOLED_INSTANCES)
        .total_tables(4 * POOLED_INSTANCES)
        .max_memories_per_component(16)
        .max_tables_per_component(64)
        // The per-plugin cap is the store's limiter; this is only the pool's slot size.
        .max_memory_size(4 << 30)
        // Reset the first pages of a memory (where a Rust guest's data and hot heap live) with
        // memset instead of madvise, and return slots in batches: fewer syscalls and page faults.
        .linear_memory_keep_resident(64 << 10)
        .table_keep_resident(16 << 10)
        .decommit_batch_size(16);
    let mut pooled = base();
    pooled.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    match Engine::new(&pooled) {
        Ok(engine) => Ok(engine),
        Err(e) => {
            tracing::debug!("pooling allocator unavailable ({e}); allocating instances on demand");
            Engine::new(&base()).map_err(anyhow::Error::from)
        }
    }
}

/// Advances the engine's epoch every [`TICK`] until the engine is dropped.
fn spawn_epoch_ticker(engine: &Engine) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("mst-epoch".into())
        .spawn(move || loop {
            std::thread::sleep(TICK);
            match weak.upgrade() {
                Some(engine) => engine.increment_epoch(),
                None => return,
            }
        })
        .expect("spawn the epoch ticker thread");
}
