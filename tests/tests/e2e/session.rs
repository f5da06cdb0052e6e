//! `ShardSession` on a long-lived machine: one machine of the real `local` runner (the built
//! `mst` as its worker) runs task after task, each a bundle of its own, as the playground will.

use mst::eval::config::{EvalConfig, RateLimits};
use mst::eval::trial::{CaseIndex, CaseRecord, TrialKey};
use mst::results::RunDir;
use mst::runner::local::LocalRunner;
use mst::runner::{MachineRequest, Runner};
use mst::shard::bundle::{Bundle, ShardIndex};
use mst::shard::coordinator::{ShardContext, ShardEnd, ShardEvent, ShardSession, ShardSettings};
use mst::shard::limits::Limiter;
use mst::shard::tokens::ServerTokens;
use mst_tests::{mst_bin, s};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;

/// A one-trial bundle of case `task`.
fn bundle(config: &EvalConfig, task: &str) -> Bundle {
    let key = TrialKey {
        variant: "default".into(),
        case: task.into(),
        trial: 0,
    };
    Bundle {
        // As mst serve's sessions: no artefacts (their context copies none).
        artifacts: None,
        ..Bundle::for_eval(
            config,
            "session",
            vec![key],
            ShardIndex { index: 0, of: 1 },
            200,
        )
    }
}

#[test]
fn one_machine_runs_task_after_task_through_shard_sessions() {
    let config = EvalConfig::parse(
        r#"{"name": "session", "datasets": ["cases.jsonl"], "client": "command",
            "clientOptions": {"command": ["cat"]}}"#,
        Path::new("eval.json"),
    )
    .unwrap();
    let options = BTreeMap::from([("worker".to_string(), s(&mst_bin()).to_string())]);
    let runner = LocalRunner::new(&options).unwrap();
    let cancel = AtomicBool::new(false);
    let note = |_: &str| {};
    let request = MachineRequest {
        run_id: "session",
        shard: 0,
        shards: 1,
        note: &note,
        cancel: &cancel,
        image: None,
    };
    let mut machine = runner.create_machine(&request).unwrap();
    let limiter = Limiter::new(RateLimits::default());
    let tokens = ServerTokens::none();
    let seen = Mutex::new(Vec::new());
    let events = |event: ShardEvent| seen.lock().unwrap().push(event);
    let tasks = ["first", "second", "third"];
    let all_cases: Vec<CaseRecord> = tasks
        .iter()
        .map(|task| CaseRecord::new(*task, serde_json::json!(task)))
        .collect();
    let cases = CaseIndex::new(&all_cases);
    let context = ShardContext {
        limiter: &limiter,
        cases: &cases,
        tokens: &tokens,
        settings: ShardSettings::default(),
        events: &events,
        cancel: &cancel,
        resume: None,
        copied: &AtomicU64::new(0),
        artifacts: None,
        stored: None,
        models: None,
        check_files: None,
        egress: None,
    };
    let results = tempfile::tempdir().unwrap();
    let run_dir = RunDir {
        root: results.path().to_path_buf(),
    };
    for task in tasks {
        let mut bundle = bundle(&config, task);
        let staged = tempfile::tempdir().unwrap();
        // Written as a run stages it: the case whose input is `task` goes with it.
        mst::run::collect::write_bundle(staged.path(), &mut bundle, None, &cases).unwrap();
        let report = ShardSession::new(&context, &bundle, bundle.own_trials(), &run_dir)
            .run(machine.as_mut(), staged.path());
        assert_eq!(report.ended, ShardEnd::Done, "{task}: {:?}", report.ended);
        // Every trial of the bundle, by its position in it.
        let every: Vec<usize> = (0..bundle.trials.len()).collect();
        assert_eq!(report.collected.ones().collect::<Vec<_>>(), every, "{task}");
        let trace = run_dir.read_trace(&bundle.trials[0]).expect("the trace");
        assert_eq!(trace.trace.final_text.as_deref(), Some(task));
    }
    let seen = seen.into_inner().unwrap();
    let collected: Vec<&str> = seen
        .iter()
        .map(|event| match event {
            ShardEvent::TrialCollected { key, .. } => &*key.case,
            other => panic!("unexpected event {other:?}"),
        })
        .collect();
    assert_eq!(collected, ["first", "second", "third"]);
    assert_eq!(machine.dispose(false).unwrap(), None);
}
