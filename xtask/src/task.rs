//! What `cargo xtask …` was asked to do: its arguments parsed into a [`Task`] before anything
//! runs, so an unknown task, benchmark or option is refused with the usage, never taken for
//! another one.

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// Every task, with what it takes: [`usage`] and [`Task::parse`]'s refusals read it.
const TASKS: [(&str, &str); 11] = [
    ("quickstart", ""),
    ("plugins", ""),
    ("test", ""),
    ("lint", " [--no-clippy]"),
    ("layers", ""),
    ("wit", " [DIR]"),
    ("bench", " [run|docker|serve|report|peers|tools|scale [--trials N --shards S --kill RATE --latency-ms L --json]]"),
    ("worker", ""),
    ("engines", ""),
    ("seccomp", ""),
    ("__measure", " MST DIR"),
];

/// The usage line printed with a refused command (`__measure` is xtask's own).
pub fn usage() -> String {
    let tasks: Vec<String> = TASKS
        .iter()
        .filter(|(name, _)| !name.starts_with("__"))
        .map(|(name, takes)| format!("{name}{takes}"))
        .collect();
    format!("usage: cargo xtask <{}>", tasks.join("|"))
}

/// A benchmark of `cargo xtask bench`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bench {
    /// No name: the plugin host's load and call times.
    PluginHost,
    /// `run`: end-to-end eval throughput, overhead and peak RSS.
    Run,
    /// `docker`: shard start-up on Docker.
    Docker,
    /// `serve`: the playground's latency and throughput.
    Serve,
    /// `report`: `mst report` and its page in headless Chromium.
    Report,
    /// `peers`: mst against promptfoo, Inspect AI and a bash floor.
    Peers,
    /// `tools`: the tool proxy's cost per MCP call.
    Tools,
}

impl Bench {
    /// Each benchmark by the name it is asked for with.
    const NAMED: [(&'static str, Bench); 6] = [
        ("run", Bench::Run),
        ("docker", Bench::Docker),
        ("serve", Bench::Serve),
        ("report", Bench::Report),
        ("peers", Bench::Peers),
        ("tools", Bench::Tools),
    ];
}

/// One `cargo xtask` command.
#[derive(Debug, Clone, PartialEq)]
pub enum Task {
    /// `quickstart`: the quick-start eval, building only what it runs.
    Quickstart,
    /// `plugins`: every plugin and example to `plugins/dist/`.
    Plugins,
    /// `test`: every test, with the services they use.
    Test,
    /// `lint`: layers, WIT policy, rustfmt, and clippy unless `clippy` is false.
    Lint { clippy: bool },
    /// `layers`: the layering of `host/src` alone.
    Layers,
    /// `wit [DIR]`: the WIT versioning policy on `wit/` or a copy.
    Wit(PathBuf),
    /// `bench [NAME]`.
    Bench(Bench),
    /// `bench scale [OPTIONS]`: the coordinator over many simulated machines.
    BenchScale(crate::bench_scale::ScaleArgs),
    /// `worker`: the static mst runners place on machines.
    Worker,
    /// `engines`: the test Docker engines, until Enter.
    Engines,
    /// `seccomp`: regenerate `docker/seccomp.json`.
    Seccomp,
    /// `__measure MST DIR`: one measured run (`bench run`'s own child).
    Measure { mst: String, dir: String },
}

impl Task {
    /// Parses `cargo xtask`'s arguments (without the program name); `wit` with no directory
    /// checks `root`'s `wit/`.
    pub fn parse(args: &[String], root: &Path) -> Result<Task> {
        let words: Vec<&str> = args.iter().map(String::as_str).collect();
        let task = match words.as_slice() {
            ["quickstart"] => Task::Quickstart,
            ["plugins"] => Task::Plugins,
            ["test"] => Task::Test,
            ["lint"] => Task::Lint { clippy: true },
            ["lint", "--no-clippy"] => Task::Lint { clippy: false },
            ["lint", other, ..] => bail!("`lint` takes only --no-clippy, not {other:?}"),
            ["layers"] => Task::Layers,
            ["wit"] => Task::Wit(root.join("wit")),
            ["wit", dir] => Task::Wit(PathBuf::from(dir)),
            ["bench"] => Task::Bench(Bench::PluginHost),
            ["bench", "scale", options @ ..] => {
                Task::BenchScale(crate::bench_scale::ScaleArgs::parse(options)?)
            }
            ["bench", name] => match Bench::NAMED.iter().find(|(n, _)| n == name) {
                Some((_, bench)) => Task::Bench(*bench),
                None => bail!(
                    "there is no benchmark {name:?}; the benchmarks: {} (and none: the plugin host)",
                    Bench::NAMED.map(|(n, _)| n).join(", ")
                ),
            },
            ["worker"] => Task::Worker,
            ["engines"] => Task::Engines,
            ["seccomp"] => Task::Seccomp,
            ["__measure", mst, dir] => Task::Measure {
                mst: mst.to_string(),
                dir: dir.to_string(),
            },
            [] => bail!("no task given"),
            [name, ..] if Task::known(name) => {
                bail!("{:?} does not take {:?}", name, &words[1..])
            }
            [name, ..] => bail!("there is no task {name:?}"),
        };
        Ok(task)
    }

    fn known(name: &str) -> bool {
        [
            "quickstart",
            "plugins",
            "test",
            "lint",
            "layers",
            "wit",
            "bench",
            "worker",
            "engines",
            "seccomp",
            "__measure",
        ]
        .contains(&name)
    }

    /// The optional feature of xtask this task needs, if any (see xtask's Cargo.toml).
    pub fn feature(&self) -> Option<&'static str> {
        match self {
            Task::Lint { .. } | Task::Wit(_) => Some("wit"),
            Task::Bench(Bench::Report) => Some("browser"),
            _ => None,
        }
    }
}

/// Whether this xtask was built with `feature`.
pub fn compiled_in(feature: &str) -> bool {
    (feature == "wit" && cfg!(feature = "wit"))
        || (feature == "browser" && cfg!(feature = "browser"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Task> {
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        Task::parse(&args, Path::new("/repo"))
    }

    #[test]
    fn every_task_parses_to_itself() {
        assert_eq!(parse("quickstart").unwrap(), Task::Quickstart);
        assert_eq!(parse("lint").unwrap(), Task::Lint { clippy: true });
        assert_eq!(
            parse("lint --no-clippy").unwrap(),
            Task::Lint { clippy: false }
        );
        assert_eq!(parse("wit").unwrap(), Task::Wit("/repo/wit".into()));
        assert_eq!(parse("wit /tmp/w").unwrap(), Task::Wit("/tmp/w".into()));
        assert_eq!(parse("bench").unwrap(), Task::Bench(Bench::PluginHost));
        assert_eq!(parse("bench peers").unwrap(), Task::Bench(Bench::Peers));
        assert_eq!(parse("bench report").unwrap().feature(), Some("browser"));
        assert_eq!(parse("lint").unwrap().feature(), Some("wit"));
        assert_eq!(parse("quickstart").unwrap().feature(), None);
    }

    #[test]
    fn an_unknown_benchmark_is_refused_not_run_as_the_default() {
        let error = parse("bench speed --trials 5").unwrap_err().to_string();
        assert!(error.contains("\"bench\" does not take"), "{error}");
        let error = parse("bench speed").unwrap_err().to_string();
        assert!(
            error.contains("no benchmark \"speed\"") && error.contains("run, docker, serve"),
            "{error}"
        );
    }

    #[test]
    fn bench_scale_takes_its_flags_and_refuses_others() {
        use crate::bench_scale::ScaleArgs;
        assert_eq!(
            parse("bench scale").unwrap(),
            Task::BenchScale(ScaleArgs::default())
        );
        let args = ScaleArgs {
            trials: 100_000,
            shards: 50,
            kill: 0.1,
            latency_ms: 5,
            json: true,
        };
        let line = "bench scale --trials 100000 --shards 50 --kill 0.1 --latency-ms 5 --json";
        assert_eq!(parse(line).unwrap(), Task::BenchScale(args));
        let error = parse("bench scale --kill 1.5").unwrap_err().to_string();
        assert!(error.contains("--kill 1.5"), "{error}");
        let error = parse("bench scale --trials").unwrap_err().to_string();
        assert!(error.contains("needs a value"), "{error}");
        let error = parse("bench scale --fast 1").unwrap_err().to_string();
        assert!(error.contains("not \"--fast\""), "{error}");
    }

    #[test]
    fn the_usage_names_every_task_but_xtasks_own() {
        let usage = usage();
        assert!(usage.contains("|lint [--no-clippy]|"), "{usage}");
        assert!(
            usage.contains("bench [run|docker|serve|report|peers|tools|scale [--trials N"),
            "{usage}"
        );
        assert!(!usage.contains("__measure"), "{usage}");
    }

    #[test]
    fn unknown_tasks_and_options_are_refused() {
        assert!(parse("").unwrap_err().to_string().contains("no task"));
        assert!(parse("tset")
            .unwrap_err()
            .to_string()
            .contains("no task \"tset\""));
        assert!(parse("lint --fix")
            .unwrap_err()
            .to_string()
            .contains("--no-clippy"));
        assert!(parse("test extra")
            .unwrap_err()
            .to_string()
            .contains("does not take"));
    }
}
