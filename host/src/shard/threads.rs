//! The worker's trial threads: at most `concurrency` of them, started as trials need them and
//! reused for the next, so a trial does not pay for a thread (a `clone3`, a stack mapped and
//! unmapped) or for the runtime its client keeps on its thread (see `client::mcp::drive`).
//!
//! Trials block (on processes, sockets, model calls), so this is a plain pool of OS threads, not
//! a work-stealing one for CPU work.

use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// One trial's work.
type Job = Box<dyn FnOnce() + Send + 'static>;

/// Threads that run jobs, started on demand up to a limit.
pub struct TrialThreads {
    jobs: mpsc::Sender<Job>,
    queue: Arc<Mutex<mpsc::Receiver<Job>>>,
    /// Threads started, and jobs given and not yet ended.
    shared: Arc<Shared>,
    limit: usize,
}

/// What the pool and its threads share.
#[derive(Default)]
struct Shared {
    counts: Mutex<Counts>,
    /// Told when the last busy thread ends its job.
    idle: Condvar,
}

#[derive(Default)]
struct Counts {
    started: usize,
    busy: usize,
}

impl TrialThreads {
    /// A pool that starts at most `limit` threads (at least one).
    pub fn new(limit: usize) -> Self {
        let (jobs, queue) = mpsc::channel();
        TrialThreads {
            jobs,
            queue: Arc::new(Mutex::new(queue)),
            shared: Arc::default(),
            limit: limit.max(1),
        }
    }

    /// Runs `job` on an idle thread, or on a new one while fewer than the limit run. The
    /// worker never has more jobs in flight than the limit, so a job never waits for a thread
    /// behind another trial.
    pub fn run(&self, job: impl FnOnce() + Send + 'static) {
        {
            let mut counts = self.shared.counts.lock().expect("trial thread counts");
            // Every thread has a job (or is just ending one): one more, while the limit allows.
            if counts.busy >= counts.started && counts.started < self.limit {
                counts.started += 1;
                let (queue, shared) = (self.queue.clone(), self.shared.clone());
                std::thread::Builder::new()
                    .name("mst-trial".into())
                    .spawn(move || serve(&queue, &shared))
                    .expect("start a trial thread");
            }
            counts.busy += 1;
        }
        // The receiver lives as long as any thread; threads end only when this pool is dropped.
        let _ = self.jobs.send(Box::new(job));
    }

    /// Waits, at most `limit`, until every job given has ended, what it held included (a
    /// job's captures are dropped before its thread counts it ended); whether they all had.
    /// The worker waits so before it ends: what the jobs shared with it (the scratch
    /// directories, a grade shard's compiled-code cache) is then dropped by the worker itself,
    /// not by a trial thread racing the process's exit.
    pub fn wait_idle(&self, limit: Duration) -> bool {
        let counts = self.shared.counts.lock().expect("trial thread counts");
        let (counts, _) = (self.shared.idle)
            .wait_timeout_while(counts, limit, |counts| counts.busy > 0)
            .expect("trial thread counts");
        counts.busy == 0
    }
}

/// A trial thread's life: take a job, run it, count it ended; until the pool is gone.
fn serve(queue: &Mutex<mpsc::Receiver<Job>>, shared: &Shared) {
    loop {
        let job = match queue.lock().expect("trial queue").recv() {
            Ok(job) => job,
            Err(mpsc::RecvError) => return,
        };
        job();
        let mut counts = shared.counts.lock().expect("trial thread counts");
        counts.busy -= 1;
        if counts.busy == 0 {
            shared.idle.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Barrier;

    #[test]
    fn threads_are_reused_and_never_more_than_the_limit() {
        let pool = TrialThreads::new(2);
        let (done, finished) = mpsc::channel();
        // Two jobs at once need two threads; the barrier proves they ran side by side.
        let barrier = Arc::new(Barrier::new(2));
        for _ in 0..2 {
            let (barrier, done) = (barrier.clone(), done.clone());
            pool.run(move || {
                barrier.wait();
                done.send(std::thread::current().id()).unwrap();
            });
        }
        let first: HashSet<_> = (0..2).map(|_| finished.recv().unwrap()).collect();
        assert_eq!(first.len(), 2);
        // Later jobs, one at a time, run on those same threads.
        for _ in 0..20 {
            let done = done.clone();
            pool.run(move || done.send(std::thread::current().id()).unwrap());
            let id = finished.recv().unwrap();
            assert!(first.contains(&id), "a third thread was started");
        }
        assert_eq!(pool.shared.counts.lock().unwrap().started, 2);
    }

    /// Waits until every job given to `pool` has ended and its thread is idle again.
    fn wait_idle(pool: &TrialThreads) {
        assert!(pool.wait_idle(Duration::from_secs(10)));
    }

    #[test]
    fn waiting_for_idle_threads_waits_for_what_their_jobs_hold() {
        let pool = TrialThreads::new(2);
        let (started, running) = mpsc::channel();
        let held = Arc::new(());
        for _ in 0..2 {
            let (held, started) = (held.clone(), started.clone());
            pool.run(move || {
                started.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(50));
                drop(held);
            });
        }
        (0..2).for_each(|_| running.recv().unwrap());
        assert!(!pool.wait_idle(Duration::ZERO), "both jobs still run");
        assert!(pool.wait_idle(Duration::from_secs(10)));
        assert_eq!(
            Arc::strong_count(&held),
            1,
            "the jobs' captures are dropped"
        );
    }

    #[test]
    fn trials_one_after_another_share_a_thread_whatever_the_limit() {
        let pool = TrialThreads::new(8);
        let (done, finished) = mpsc::channel();
        let mut seen = HashSet::new();
        for _ in 0..50 {
            let done = done.clone();
            pool.run(move || done.send(std::thread::current().id()).unwrap());
            seen.insert(finished.recv().unwrap());
            // In the worker the next grant is a round trip away; here, wait for the thread.
            wait_idle(&pool);
        }
        assert_eq!(pool.shared.counts.lock().unwrap().started, 1);
        assert_eq!(seen.len(), 1);
    }
}
