//! Harbor tasks (`mst import harbor`): a task directory (`task.toml`, `instruction.md`,
//! `environment/Dockerfile`, `tests/test.sh`, `solution/solve.sh`), or a directory of them,
//! converted into an eval that runs each task in its own image on the Docker runner.
//!
//! Harbor runs a task as: build `environment/` into an image, start a container, let the agent
//! work in the image's `WORKDIR`, then upload `tests/` to `/tests` and run `bash /tests/test.sh`
//! from that directory, which writes a reward to `/logs/verifier/reward.txt` (or `reward.json`).
//! The eval mst writes does the same with its own parts: the image is the case's `image` (built
//! by `mst runner setup docker --build`), each trial gets a container of its own
//! (`freshMachine`), `tests/` are the case's hidden check files, put at `/tests` by the check,
//! which hands the reward to `check-score`; Harbor's two reference agents are the variants
//! `oracle` (runs `solution/solve.sh`) and `nop` (does nothing), which `references` says must
//! pass and fail every task.

use super::{Change, Imported};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Seconds a trial may take when a task says nothing (Harbor's own default for agents).
const DEFAULT_AGENT_SECONDS: f64 = 600.0;

/// Seconds a task's tests may take when it says nothing.
const DEFAULT_VERIFIER_SECONDS: f64 = 600.0;

/// Where the copies of the tasks' tests and solutions go in the output directory.
const TASKS_DIR: &str = "harbor";

/// The check: puts the hidden `tests/` at `/tests`, runs `test.sh` from the task's working
/// directory (`$1`) as Harbor does, shows the end of its output, and hands its reward on.
const VERIFY: &str = r#"rm -rf /tests /logs/verifier && mkdir -p /logs/verifier && cp -R tests /tests || exit 1
cd "$1" || exit 1
bash /tests/test.sh > /logs/verifier/test-stdout.txt 2>&1
status=$?
tail -c 8000 /logs/verifier/test-stdout.txt
if [ -f /logs/verifier/reward.txt ]; then
  reward=$(tr -d ' \r\n' < /logs/verifier/reward.txt)
elif [ -f /logs/verifier/reward.json ]; then
  reward=$(sed -n 's/.*"reward"[^0-9.]*\([0-9.]*\).*/\1/p' /logs/verifier/reward.json | head -n 1)
else
  echo "test.sh exited with $status and wrote no reward" >&2
  exit 1
fi
printf '%s\n' "$reward" > "$MST_CHECK_REWARD""#;

/// The `oracle` agent: puts its task's solution (`$1`, the case id) at `/solution` and runs
/// `solve.sh` from the task's working directory, which its copy names.
const ORACLE: &str = r#"rm -rf /solution && cp -R "$1" /solution || exit 1
cd "$(cat /solution/.mst-workdir)" && bash /solution/solve.sh"#;

/// The file in a task's copied solution that names its working directory, for `oracle`.
const WORKDIR_FILE: &str = ".mst-workdir";

/// One task as read.
struct Task {
    /// Its directory.
    dir: PathBuf,
    /// The case id: the directory's name.
    id: String,
    instruction: String,
    /// The image its trials run in, and whether mst builds it (`environment/Dockerfile`) or
    /// it is named (`[environment].docker_image`).
    image: String,
    built: bool,
    /// The image's `WORKDIR` (the last one), where the agent and the tests work.
    workdir: String,
    agent_seconds: f64,
    verifier_seconds: f64,
    has_solution: bool,
    /// `task.toml` as read, kept in the case's metadata.
    toml: Value,
}

/// Converts the Harbor task at `dir`, or every task directly below it.
pub fn import(dir: &Path) -> Result<Imported> {
    let dirs = task_dirs(dir)?;
    let mut imported = Imported::default();
    let mut tasks = Vec::new();
    for task_dir in dirs {
        tasks.push(read_task(&task_dir, &mut imported)?);
    }
    let mut lines = Vec::new();
    for task in &tasks {
        lines.push(case_of(task, &mut imported)?.to_string());
    }
    let eval = eval_of(dir, &tasks, &mut imported);
    imported.add_file("eval.json", serde_json::to_string_pretty(&eval)? + "\n");
    imported.add_file("cases.jsonl", lines.join("\n") + "\n");
    todo_steps(&tasks, &mut imported);
    Ok(imported)
}

/// `dir` when it is a task (it holds `task.toml`), else its subdirectories that are, in name
/// order; an error when there are none.
fn task_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    if dir.join("task.toml").is_file() {
        return Ok(vec![dir.to_path_buf()]);
    }
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read the Harbor tasks directory {}", dir.display()))?;
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("task.toml").is_file())
        .collect();
    dirs.sort();
    if dirs.is_empty() {
        bail!(
            "{} holds no Harbor task: a task is a directory with task.toml, instruction.md, \
             environment/ and tests/test.sh",
            dir.display()
        );
    }
    Ok(dirs)
}

/// Reads the task at `dir`; every missing part is an error naming the file.
fn read_task(dir: &Path, imported: &mut Imported) -> Result<Task> {
    let id = dir
        .canonicalize()?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if id.is_empty() || !id.chars().all(plain) || id.starts_with('.') {
        bail!(
            "{}: name a task's directory with letters, digits, `-`, `_` and `.`",
            dir.display()
        );
    }
    let file = |name: &str| dir.join(name);
    let read = |name: &str| {
        std::fs::read_to_string(file(name))
            .with_context(|| format!("task `{id}`: cannot read {}", file(name).display()))
    };
    let toml: toml::Table = toml::from_str(&read("task.toml")?)
        .with_context(|| format!("task `{id}`: {} is not TOML", file("task.toml").display()))?;
    let toml = serde_json::to_value(&toml)?;
    let instruction = read("instruction.md")?;
    if !file("tests/test.sh").is_file() {
        bail!("task `{id}`: no tests/test.sh: Harbor's verifier is that script");
    }
    let seconds =
        |section: &str, default: f64| toml[section]["timeout_sec"].as_f64().unwrap_or(default);
    let named_image = toml["environment"]["docker_image"]
        .as_str()
        .map(str::to_string);
    let (image, built, workdir) = match named_image {
        Some(image) => (image, false, "/".to_string()),
        None => {
            let dockerfile = read("environment/Dockerfile")?;
            (image_name(&id), true, workdir_of(&dockerfile))
        }
    };
    let at = format!("{id}/task.toml");
    for key in [
        "cpus",
        "memory_mb",
        "memory",
        "storage_mb",
        "storage",
        "gpus",
    ] {
        if let Some(value) = toml["environment"].get(key) {
            imported.report.note(
                &at,
                &format!("environment.{key}"),
                Change::Approximated,
                format!(
                    "{value}: resources are the Docker runner's, for every trial of a run \
                     (--runner-option memory=…, cpus=…)"
                ),
            );
        }
    }
    Ok(Task {
        dir: dir.canonicalize()?,
        instruction,
        image,
        built,
        workdir,
        agent_seconds: seconds("agent", DEFAULT_AGENT_SECONDS),
        verifier_seconds: seconds("verifier", DEFAULT_VERIFIER_SECONDS),
        has_solution: file("solution/solve.sh").is_file(),
        toml,
        id,
    })
}

/// The image mst builds for task `id`: `mst-harbor/<id>:1`, lowercase as Docker wants.
fn image_name(id: &str) -> String {
    let repository = plain(&id.to_ascii_lowercase(), &['-', '.']);
    format!("mst-harbor/{}:1", repository.trim_matches(['-', '.']))
}

/// `name` with every character but ASCII letters, digits and `keep` made a `-`.
fn plain(name: &str, keep: &[char]) -> String {
    (name.chars())
        .map(|c| match c.is_ascii_alphanumeric() || keep.contains(&c) {
            true => c,
            false => '-',
        })
        .collect()
}

/// The last `WORKDIR` of `dockerfile` (`/` without one).
fn workdir_of(dockerfile: &str) -> String {
    dockerfile
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let (word, rest) = line.split_once(char::is_whitespace)?;
            word.eq_ignore_ascii_case("WORKDIR")
                .then(|| rest.trim().to_string())
        })
        .next_back()
        .unwrap_or_else(|| "/".to_string())
}

/// The case of `task`, and the copies of its tests (and solution) it needs.
fn case_of(task: &Task, imported: &mut Imported) -> Result<Value> {
    let verifier = format!("{TASKS_DIR}/{}/verifier", task.id);
    imported
        .copies
        .push((task.dir.join("tests"), format!("{verifier}/tests")));
    if task.has_solution {
        let solution = format!("{TASKS_DIR}/solutions/{}", task.id);
        imported
            .copies
            .push((task.dir.join("solution"), solution.clone()));
        imported.add_file(
            &format!("{solution}/{WORKDIR_FILE}"),
            format!("{}\n", task.workdir),
        );
    } else {
        imported.report.note(
            &format!("{}/solution", task.id),
            "solve.sh",
            Change::Dropped,
            "the task has no solution: `oracle` fails it, and the run lists it as broken",
        );
    }
    Ok(json!({
        "id": task.id,
        "input": task.instruction,
        "image": task.image,
        "metadata": {"harbor": task.toml},
        "checks": [{
            "name": "tests",
            "run": ["sh", "-c", VERIFY, "sh", task.workdir],
            "timeout": task.verifier_seconds,
            "files": verifier,
        }],
    }))
}

/// The eval: the two reference agents, every trial on a container of its own, graded by the
/// reward its tests left.
fn eval_of(dir: &Path, tasks: &[Task], imported: &mut Imported) -> Value {
    // The directory's name, made a plain eval name (it names the results directory).
    let name = (dir.canonicalize().ok())
        .and_then(|d| {
            d.file_name()
                .map(|n| plain(&n.to_string_lossy(), &['_', '-']))
        })
        .unwrap_or_default();
    let name = match name.trim_matches('-') {
        "" => "harbor".to_string(),
        plain => plain.to_string(),
    };
    let timeout = tasks
        .iter()
        .map(|t| t.agent_seconds)
        .fold(0.0_f64, f64::max);
    if tasks.iter().any(|t| t.agent_seconds != timeout) {
        imported.report.note(
            "task.toml",
            "agent.timeout_sec",
            Change::Approximated,
            format!("the tasks' agent timeouts differ: every trial gets the longest, {timeout} s"),
        );
    }
    json!({
        "name": name,
        "description": format!("Harbor tasks imported from {}", dir.display()),
        "datasets": ["cases.jsonl"],
        "client": "command",
        "variants": {
            // Only `oracle` gets the solutions; other agents never see them.
            "oracle": {
                "clientOptions": {"command": ["sh", "-c", ORACLE, "sh", "{case}"], "input": "none"},
                "workspace": format!("{TASKS_DIR}/solutions"),
            },
            "nop": {"clientOptions": {"command": ["true"], "input": "none"}},
        },
        "references": {"oracle": "pass", "nop": "fail"},
        "freshMachine": true,
        "timeout": timeout,
        "judges": [{"assert": "check-score", "value": "tests"}],
    })
}

/// What to do before the eval runs: build each image, and run on Docker.
fn todo_steps(tasks: &[Task], imported: &mut Imported) {
    for task in tasks {
        match task.built {
            true => imported.report.todo(format!(
                "build task `{}`'s image on each Docker context: `mst runner setup docker --build \
                 {} --runner-option image={}` (offline: its FROM images must be there)",
                task.id,
                task.dir.join("environment").display(),
                task.image
            )),
            false => imported.report.todo(format!(
                "put task `{}`'s image {} on each Docker context (`docker pull` there: mst pulls \
                 nothing)",
                task.id, task.image
            )),
        }
    }
    imported.report.todo(
        "run it on Docker with a writable root filesystem, as Harbor's containers are: `mst run \
         --config eval.json --runner docker --runner-option rootfs=writable` (add \
         `network=bridge` for tasks that need the internet)",
    );
    imported.report.todo(
        "add your agents as variants beside `oracle` and `nop`: each starts in a fresh work \
         directory, and the task's files are in the image's working directory (the case's \
         `metadata.harbor` has task.toml)",
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_workdir_is_the_tasks_and_images_are_named_as_docker_wants() {
        let dockerfile = "FROM x\nWORKDIR /build\nRUN make\nworkdir   /app\n";
        assert_eq!(workdir_of(dockerfile), "/app");
        assert_eq!(workdir_of("FROM x\n"), "/");
        assert_eq!(image_name("Fix_Add.v2"), "mst-harbor/fix-add.v2:1");
    }
}
