//! The mst binary a runner places on a machine that has no mst of the coordinator's version.
//! It must run on any Linux, so it must be statically linked (a musl build): the running mst
//! when it is static, else `mst-static` beside it (`cargo xtask worker` builds it), else the
//! path the user gives.

use anyhow::{bail, Context, Result};
use object::read::elf::{ElfFile64, ProgramHeader};
use std::path::{Path, PathBuf};

/// The file name `cargo xtask worker` gives the static build, next to `mst`.
pub const STATIC_NAME: &str = "mst-static";

/// Finds the static worker binary: `explicit`, the running mst, or `mst-static` beside it.
pub fn find(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(path) = explicit {
        if !is_static(path)? {
            bail!(
                "{} is dynamically linked: a worker placed into an image must be static \
                 (`cargo xtask worker` builds one)",
                path.display()
            );
        }
        return Ok(path.to_path_buf());
    }
    let exe = std::env::current_exe().context("cannot find the running mst binary")?;
    if is_static(&exe)? {
        return Ok(exe);
    }
    let beside = exe.with_file_name(STATIC_NAME);
    if beside.is_file() && is_static(&beside)? {
        return Ok(beside);
    }
    bail!(
        "this mst ({}) is dynamically linked and there is no {} beside it, so it cannot be \
         placed into an image: build one with `cargo xtask worker`, or pass \
         --runner-option worker=PATH (the docker runner and every runner plugin take it) to a \
         static (musl) mst of the same version",
        exe.display(),
        STATIC_NAME
    )
}

/// Whether the ELF file at `path` needs no dynamic loader.
pub fn is_static(path: &Path) -> Result<bool> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let elf = ElfFile64::<object::Endianness>::parse(&*bytes)
        .with_context(|| format!("{} is not a 64-bit ELF executable", path.display()))?;
    let endian = elf.endian();
    Ok(!elf
        .elf_program_headers()
        .iter()
        .any(|h| h.p_type(endian) == object::elf::PT_INTERP))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_binaries_are_told_apart() {
        // The test binary itself is dynamically linked on the gnu target and static on musl
        // (where `cargo xtask test` builds it).
        let exe = std::env::current_exe().unwrap();
        if cfg!(target_env = "musl") {
            assert!(is_static(&exe).unwrap());
            assert_eq!(find(Some(&exe)).unwrap(), exe);
            assert_eq!(find(None).unwrap(), exe, "a static mst places itself");
        } else {
            assert!(!is_static(&exe).unwrap());
            let err = find(Some(&exe)).unwrap_err();
            assert!(err.to_string().contains("dynamically linked"), "{err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("script");
        std::fs::write(&text, "#!/bin/sh\n").unwrap();
        assert!(is_static(&text)
            .unwrap_err()
            .to_string()
            .contains("not a 64-bit ELF"));
    }
}
