//! Plugin host benchmarks: prints figures, asserts nothing (run with `cargo xtask bench`).
//!
//! - first load: compile a first-party grader with an empty artifact cache;
//! - warm load: a new host (nothing in memory) loading from the on-disk cache;
//! - grade: instantiate + `grade-trial` on a trial whose trace is about 1 KiB.
//!
//! For the first-party Rust graders and the Python and JavaScript examples
//! (`examples/plugins/`), whose components embed an interpreter: see docs/plugins.md.

use mst::eval::trial::{CaseRecord, EventKind, TraceEvent, TrialRecord};
use mst::plugin::{Grants, Limits, LoadedPlugin, PluginHost};
use mst::secrets::Secret;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn dist(file: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins/dist")
        .join(file);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo xtask bench`",
        path.display()
    );
    path
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn fmt(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    } else {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    }
}

/// A trial whose serialized trace is about 1 KiB.
fn trial_1kib() -> TrialRecord {
    let case = CaseRecord::new(
        "bench-1",
        serde_json::json!({"q": "what time is it in Tokyo?"}),
    );
    let mut trial =
        TrialRecord::answered(case, &"The current time in Tokyo is 09:00 JST. ".repeat(8));
    for seq in 0..6u64 {
        trial.trace.events.push(TraceEvent {
            seq,
            at_ms: seq * 10,
            kind: EventKind::Message {
                role: "assistant".into(),
                text: "checking the clock for the requested zone".into(),
            },
        });
    }
    trial
}

/// How many times to measure each step of one plugin.
struct Rounds {
    cold: usize,
    warm: usize,
    calls: usize,
}

/// Rust components are small and fast; the interpreters' are large and slower to load.
const RUST: Rounds = Rounds {
    cold: 3,
    warm: 30,
    calls: 5000,
};
const INTERPRETED: Rounds = Rounds {
    cold: 2,
    warm: 10,
    calls: 300,
};

fn bench_plugin(file: &str, options: &str, secrets: &[(&str, &str)], rounds: Rounds) {
    let bytes = std::fs::read(dist(file)).unwrap();
    let limits = Limits::default();
    let mut grants = Grants::default();
    for (name, value) in secrets {
        grants.secrets.insert(name.to_string(), Secret::new(*value));
    }

    let mut cold = Vec::new();
    for _ in 0..rounds.cold {
        let cache = tempfile::tempdir().unwrap();
        let host = PluginHost::new(cache.path().to_path_buf()).unwrap();
        let start = Instant::now();
        LoadedPlugin::load(&host, &bytes, file, &grants, limits).unwrap();
        cold.push(start.elapsed());
    }

    let cache = tempfile::tempdir().unwrap();
    LoadedPlugin::load(
        &PluginHost::new(cache.path().to_path_buf()).unwrap(),
        &bytes,
        file,
        &grants,
        limits,
    )
    .unwrap();
    let mut warm = Vec::new();
    for _ in 0..rounds.warm {
        let host = PluginHost::new(cache.path().to_path_buf()).unwrap();
        let start = Instant::now();
        LoadedPlugin::load(&host, &bytes, file, &grants, limits).unwrap();
        warm.push(start.elapsed());
    }

    let host = PluginHost::new(cache.path().to_path_buf()).unwrap();
    let plugin = LoadedPlugin::load(&host, &bytes, file, &grants, limits).unwrap();
    let record = trial_1kib();
    let trace_bytes = serde_json::to_vec(&record.trace).unwrap().len();
    let trial = record.to_wit();
    for _ in 0..rounds.calls / 20 {
        plugin.grade(options, &trial).unwrap();
    }
    let mut grade = Vec::with_capacity(rounds.calls);
    for _ in 0..rounds.calls {
        let start = Instant::now();
        let score = plugin.grade(options, &trial).unwrap();
        grade.push(start.elapsed());
        std::hint::black_box(score);
    }
    let p90 = {
        let mut g = grade.clone();
        g.sort();
        g[g.len() * 9 / 10]
    };
    println!(
        "{file:<26} {:>8} KiB  first load {:>10}  warm load {:>9}  grade ({trace_bytes} B trace) median {:>9}  p90 {:>9}",
        bytes.len() / 1024,
        fmt(median(cold)),
        fmt(median(warm)),
        fmt(median(grade)),
        fmt(p90),
    );
}

fn main() {
    println!("plugin host benchmarks (medians; targets: warm load <= 5 ms, grade <= 50 µs)");
    bench_plugin(
        "contains.wasm",
        r#"{"values": ["Tokyo", "09:00"]}"#,
        &[],
        RUST,
    );
    bench_plugin("regex.wasm", r#"{"pattern": "\\d{2}:\\d{2}"}"#, &[], RUST);
    bench_plugin("json.wasm", "{}", &[], RUST);
    bench_plugin(
        "examples/answer-py.wasm",
        r#"{"expected": "09:00"}"#,
        &[("EXAMPLE_SIGNING_KEY", "bench-signing-key")],
        INTERPRETED,
    );
    bench_plugin(
        "examples/keywords-js.wasm",
        "{}",
        &[("EXAMPLE_KEYWORDS", "Tokyo, 09:00")],
        INTERPRETED,
    );
}
