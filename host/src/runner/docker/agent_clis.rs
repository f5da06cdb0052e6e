//! The agent CLIs `mst runner setup docker --runner-option agentClis=claude-code,codex` puts in
//! the worker image, so the `claude-code` and `codex` clients run in containers. Each is the
//! program of the host's own npm install (`npm install -g @anthropic-ai/claude-code@2.1.328
//! @openai/codex@0.169.0`, the versions mst is tested with), copied into the image's
//! `/usr/local/bin`: building needs no registry, and the containers run the CLI the host runs.
//!
//! Codex's program is static (musl), so it runs in any image, the one built offline from the
//! static mst alone included. Claude Code's needs a Linux distribution's C library (glibc):
//! it goes only into an image built from `base=IMAGE`.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// The CLIs that can go into an image, by client name.
pub const AGENT_CLIS: [&str; 2] = ["claude-code", "codex"];

/// Where the CLIs go in an image, on its `PATH`.
pub const CLI_DIR: &str = "/usr/local/bin";

/// One CLI's program, found on the host, to copy into an image.
#[derive(Debug, Clone)]
pub struct CliProgram {
    /// The client's name (`codex`).
    pub client: &'static str,
    /// Its file name in [`CLI_DIR`] (`codex`), the name the client runs.
    pub file: &'static str,
    /// The program on the host.
    pub path: PathBuf,
    /// Whether it runs without a C library of the image's.
    pub is_static: bool,
}

/// Finds the programs of `clients` (names from [`AGENT_CLIS`]) in the host's npm installs;
/// with no `base` image, a program that needs a C library is refused, naming what to do.
pub fn locate(clients: &[String], base: Option<&str>) -> Result<Vec<CliProgram>> {
    let path = std::env::var_os("PATH");
    clients
        .iter()
        .map(|client| {
            let program = locate_one(client, path.as_deref())?;
            if !program.is_static && base.is_none() {
                bail!(
                    "--runner-option agentClis: {client}'s program ({}) needs a Linux \
                     distribution's C library, which the image built from the static mst alone \
                     lacks; add --runner-option base=IMAGE (e.g. debian:bookworm-slim)",
                    program.path.display()
                );
            }
            Ok(program)
        })
        .collect()
}

/// The program of one client, from the npm package its command on `path` belongs to.
fn locate_one(client: &str, path: Option<&std::ffi::OsStr>) -> Result<CliProgram> {
    let (name, file, package) = match client {
        "claude-code" => ("claude-code", "claude", "@anthropic-ai/claude-code@2.1.328"),
        "codex" => ("codex", "codex", "@openai/codex@0.169.0"),
        other => bail!(
            "--runner-option agentClis: `{other}` is not an agent CLI mst can place; it places {}",
            AGENT_CLIS.join(", ")
        ),
    };
    let missing = || {
        format!(
            "--runner-option agentClis: {client}: no `{file}` on this host's PATH; install it \
             first (`npm install -g {package}`), and mst copies its program into the image"
        )
    };
    let command = crate::process::resolve_program(file, path);
    if !command.is_absolute() {
        bail!(missing());
    }
    let command = command.canonicalize().with_context(missing)?;
    let (program, is_static) = match name {
        // The npm command is a Node.js launcher; the static program is in the platform
        // package beside it.
        "codex" => (codex_program(&command).with_context(missing)?, true),
        // The npm command is the native program itself.
        _ => (command, false),
    };
    if !is_elf(&program) {
        bail!(
            "--runner-option agentClis: {client}: {} is not a Linux program; reinstall it \
             (`npm install -g {package}`)",
            program.display()
        );
    }
    Ok(CliProgram {
        client: name,
        file,
        path: program,
        is_static,
    })
}

/// Codex's static program for this machine, from its launcher `bin/codex.js`: in the platform
/// package (`@openai/codex-linux-x64`) or the package's own `vendor` directory.
fn codex_program(launcher: &Path) -> Result<PathBuf> {
    let (triple, platform) = match std::env::consts::ARCH {
        "x86_64" => ("x86_64-unknown-linux-musl", "codex-linux-x64"),
        "aarch64" => ("aarch64-unknown-linux-musl", "codex-linux-arm64"),
        other => bail!("Codex publishes no program for {other}"),
    };
    let root = launcher
        .parent()
        .and_then(Path::parent)
        .context("the codex launcher is not in an npm package")?;
    let candidates = [
        root.join("node_modules/@openai")
            .join(platform)
            .join("vendor"),
        root.join("vendor"),
    ];
    candidates
        .iter()
        .map(|vendor| vendor.join(triple).join("bin/codex"))
        .find(|program| program.is_file())
        .with_context(|| format!("no {triple} program in {}", root.display()))
}

/// Whether `path` starts as an ELF file does.
fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| magic == *b"\x7fELF")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_or_missing_cli_is_refused_naming_what_to_install() {
        let err = locate(&["cursor".into()], None).unwrap_err().to_string();
        assert!(
            err.contains("`cursor` is not an agent CLI") && err.contains("codex"),
            "{err}"
        );
        let empty = tempfile::tempdir().unwrap();
        let err = locate_one("codex", Some(empty.path().as_os_str()))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("npm install -g @openai/codex@0.169.0"),
            "{err}"
        );
    }

    #[test]
    fn codex_is_found_in_its_platform_package_and_must_be_a_program() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let package = dir.path().join("lib/node_modules/@openai/codex");
        let (triple, platform) = match std::env::consts::ARCH {
            "aarch64" => ("aarch64-unknown-linux-musl", "codex-linux-arm64"),
            _ => ("x86_64-unknown-linux-musl", "codex-linux-x64"),
        };
        let vendor = package
            .join("node_modules/@openai")
            .join(platform)
            .join("vendor")
            .join(triple)
            .join("bin");
        std::fs::create_dir_all(&vendor).unwrap();
        std::fs::create_dir_all(package.join("bin")).unwrap();
        std::fs::write(package.join("bin/codex.js"), "#!/usr/bin/env node\n").unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(package.join("bin/codex.js"), bin.join("codex")).unwrap();
        let mode = std::fs::Permissions::from_mode(0o755);
        std::fs::set_permissions(package.join("bin/codex.js"), mode.clone()).unwrap();
        std::fs::write(vendor.join("codex"), "not a program").unwrap();
        let err = locate_one("codex", Some(bin.as_os_str()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("is not a Linux program"), "{err}");
        std::fs::write(vendor.join("codex"), b"\x7fELF and the rest").unwrap();
        let found = locate_one("codex", Some(bin.as_os_str())).unwrap();
        assert_eq!(found.path, vendor.join("codex").canonicalize().unwrap());
        assert!(found.is_static && found.file == "codex");
    }
}
