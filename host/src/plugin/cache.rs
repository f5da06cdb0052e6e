//! Precompiled artifacts on disk, so that a plugin is compiled once per engine, not per run.
//!
//! An artifact's file name is the sha256 of the component's bytes plus a hash of the engine's
//! compatibility key (wasmtime version and every setting that changes generated code). Files
//! are written atomically (temporary file, then rename) into an owner-only directory, and
//! artifacts are deserialized only from paths this module builds inside that directory:
//! deserializing is `unsafe` precisely because an artifact is trusted native code.

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use wasmtime::component::Component;
use wasmtime::Engine;

/// Whether a load found its artifact in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheOutcome {
    /// Deserialized from the cache.
    Hit,
    /// Compiled now (and stored for next time).
    Miss,
}

/// The on-disk artifact cache.
#[derive(Debug, Clone)]
pub struct ArtifactCache {
    dir: PathBuf,
    engine_key: String,
}

/// Feeds `Hash` output into sha256, giving a key that is stable across processes (unlike
/// `DefaultHasher`, whose seed and algorithm may change).
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn finish(&self) -> u64 {
        unreachable!("only the sha256 state is read")
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

impl ArtifactCache {
    /// A cache in `dir` for artifacts of `engine`.
    pub fn new(dir: PathBuf, engine: &Engine) -> Self {
        let mut hasher = Sha256Hasher(Sha256::new());
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_key = hex::encode(&hasher.0.finalize()[..12]);
        Self { dir, engine_key }
    }

    /// Refuses a cache that someone else could have written: the directory, or any file in
    /// it, owned by another user or writable by others (see `private`). A missing directory
    /// is fine: it is created owner-only when the first artifact is stored.
    pub fn check(&self) -> Result<()> {
        if std::fs::symlink_metadata(&self.dir).is_err() {
            return Ok(());
        }
        private(&self.dir, "directory")?;
        let entries = std::fs::read_dir(&self.dir)
            .with_context(|| format!("cannot read {}", self.dir.display()))?;
        for entry in entries.flatten() {
            private(&entry.path(), "file")?;
        }
        Ok(())
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn artifact_path(&self, digest: &str) -> PathBuf {
        debug_assert!(digest.bytes().all(|b| b.is_ascii_hexdigit()));
        self.dir.join(format!("{digest}-{}.cwasm", self.engine_key))
    }

    /// The component for `bytes` (whose sha256 is `digest`), from the cache or compiled now.
    pub fn load_or_compile(
        &self,
        engine: &Engine,
        digest: &str,
        bytes: &[u8],
    ) -> Result<(Component, CacheOutcome)> {
        let path = self.artifact_path(digest);
        if std::fs::symlink_metadata(&self.dir).is_ok() {
            private(&self.dir, "directory")?;
        }
        if std::fs::symlink_metadata(&path).is_ok() {
            private(&path, "file")?;
            // SAFETY: `path` lies in the cache directory, both checked just now to be owned by
            // this user and writable by no one else, was written by `store` below from
            // `Engine::precompile_component`, and its name binds it to the component's digest
            // and this engine's compatibility key.
            match unsafe { Component::deserialize_file(engine, &path) } {
                Ok(component) => return Ok((component, CacheOutcome::Hit)),
                Err(e) => {
                    tracing::warn!(
                        "discarding unreadable cached artifact {}: {e}",
                        path.display()
                    );
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        let artifact = engine
            .precompile_component(bytes)
            .map_err(anyhow::Error::from)?;
        // SAFETY: the artifact was produced just now, in memory, by this engine.
        let component =
            unsafe { Component::deserialize(engine, &artifact) }.map_err(anyhow::Error::from)?;
        if let Err(e) = self.store(&path, &artifact) {
            tracing::warn!("cannot cache compiled plugin (it still runs): {e:#}");
        }
        Ok((component, CacheOutcome::Miss))
    }

    fn store(&self, path: &Path, artifact: &[u8]) -> Result<()> {
        crate::home::create_private_dir(&self.dir)?;
        let mut file = tempfile::NamedTempFile::new_in(&self.dir)
            .with_context(|| format!("cannot create a file in {}", self.dir.display()))?;
        file.write_all(artifact)?;
        file.as_file().sync_all()?;
        file.persist(path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(())
    }
}

/// Refuses a cache `what` (directory or file) at `path` that someone other than this user could
/// have written: a symbolic link, one owned by another user, or one writable by its group or by
/// others. A cached artifact is native code mst maps and runs, so whoever can write it could
/// run anything as this user.
fn private(path: &Path, what: &str) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        // SAFETY: geteuid(2) has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        let why = if meta.file_type().is_symlink() {
            Some("is a symbolic link".to_string())
        } else if meta.uid() != me {
            Some(format!(
                "is owned by user id {}, not by you ({me})",
                meta.uid()
            ))
        } else if meta.mode() & 0o022 != 0 {
            Some(format!(
                "is writable by {} (mode {:o})",
                if meta.mode() & 0o002 != 0 {
                    "anyone"
                } else {
                    "its group"
                },
                meta.mode() & 0o7777
            ))
        } else {
            None
        };
        if let Some(why) = why {
            anyhow::bail!(
                "refusing the compiled-plugin cache {what} {}: it {why}. Cached plugins are \
                 native code that mst runs, so only you may be able to write them: remove it \
                 (mst compiles again) or make it yours alone (`chmod go-w`, `chown`)",
                path.display()
            );
        }
    }
    #[cfg(not(unix))]
    let _ = (path, what);
    Ok(())
}
