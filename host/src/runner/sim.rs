//! The `sim` runner: machines simulated on this host, each a local worker (as the `local`
//! runner makes one) behind a channel that misbehaves as asked: latency and bandwidth on every
//! byte and copy, machines slow or failing to be made, and machines lost mid-run (the channel
//! cut, the worker then killed by the coordinator's clean-up). Benches measure the coordinator
//! at a hundred shards with it (`cargo xtask bench scale`), and operators can watch what their
//! eval does when machines misbehave before paying for real ones.
//!
//! Which machines fail or are lost is drawn from `seed`: the same options lose the same shards,
//! and exactly the share asked for (rounded), not about it.
//!
//! The channel's delays are a process of their own on the machine's side (`mst sim-link`,
//! [`link`]), as a remote machine's network is not the coordinator's: the coordinator then
//! holds for a simulated machine what it holds for a real one (its worker's pipes and the
//! threads reading them), and its measured CPU, threads and memory are its own.

use super::channel::{Channel, KeptMachine, Process};
use super::{MachineRequest, Runner};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The options the `sim` runner takes (besides `shards` and `keep`, every runner's).
const OPTIONS: &str = "`latency-ms`, `bandwidth`, `create-ms`, `create-fail`, `kill`, \
                       `kill-after-lines`, `seed`, and the `local` runner's `isolation`, \
                       `expose`, `network` and `worker`";

/// The most shards: each is a worker process on this host.
const MAX_SHARDS: u32 = 1_000;

/// What a simulated machine does wrong.
#[derive(Debug, Clone, Default)]
struct Faults {
    /// Added to every chunk of bytes each way, and to every copy.
    latency: Duration,
    /// Bytes per second each way, when limited.
    bandwidth: Option<u64>,
    /// How long making a machine takes.
    create_delay: Duration,
    /// The share of machines whose making fails.
    create_fail: f64,
    /// The share of machines lost mid-run.
    kill: f64,
    /// A lost machine is cut after its worker has sent between 1 and this many lines.
    kill_after_lines: u64,
    seed: u64,
}

/// The built-in simulation runner.
pub struct SimRunner {
    local: super::local::LocalRunner,
    faults: Faults,
}

impl SimRunner {
    /// Validates the options: the simulation's own, and the `local` runner's it passes on
    /// (`isolation` defaults to `none`: a hundred sandboxes would measure bubblewrap).
    pub fn new(options: &BTreeMap<String, String>) -> Result<Self> {
        let mut faults = Faults {
            kill_after_lines: 1_000,
            ..Faults::default()
        };
        let mut local = BTreeMap::from([("isolation".to_string(), "none".to_string())]);
        for (key, value) in options {
            let number = || -> Result<f64> {
                value
                    .parse::<f64>()
                    .ok()
                    .filter(|n| n.is_finite() && *n >= 0.0)
                    .with_context(|| {
                        format!("--runner-option {key}={value}: a number of at least 0")
                    })
            };
            let share = || -> Result<f64> {
                number().ok().filter(|n| *n <= 1.0).with_context(|| {
                    format!("--runner-option {key}={value}: a share between 0 and 1 (0.05)")
                })
            };
            match key.as_str() {
                "latency-ms" => faults.latency = Duration::from_secs_f64(number()? / 1000.0),
                "create-ms" => faults.create_delay = Duration::from_secs_f64(number()? / 1000.0),
                "bandwidth" => {
                    let bytes = super::docker::options::parse_bytes(value)
                        .filter(|b| *b > 0)
                        .with_context(|| {
                            format!(
                                "--runner-option bandwidth={value}: bytes a second, in Docker's \
                                 size syntax (10m)"
                            )
                        })?;
                    faults.bandwidth = Some(bytes);
                }
                "create-fail" => faults.create_fail = share()?,
                "kill" => faults.kill = share()?,
                "kill-after-lines" => {
                    faults.kill_after_lines = value.parse().ok().filter(|n| *n >= 1).with_context(
                        || format!("--runner-option kill-after-lines={value}: a whole number of at least 1"),
                    )?
                }
                "seed" => {
                    faults.seed = value.parse().with_context(|| {
                        format!("--runner-option seed={value}: a whole number")
                    })?
                }
                "isolation" | "expose" | "network" | "worker" => {
                    local.insert(key.clone(), value.clone());
                }
                other => bail!("--runner-option {other}: the `sim` runner takes {OPTIONS}"),
            }
        }
        Ok(SimRunner {
            local: super::local::LocalRunner::new(&local)?,
            faults,
        })
    }
}

impl Runner for SimRunner {
    fn name(&self) -> &str {
        "sim"
    }

    fn max_shards(&self) -> u32 {
        MAX_SHARDS
    }

    fn plan(&self) -> Vec<String> {
        let f = &self.faults;
        vec![format!(
            "simulated machines: latency {} ms, bandwidth {}, made in {} ms, {:.0}% fail to be \
             made, {:.0}% lost mid-run",
            f.latency.as_millis(),
            f.bandwidth
                .map_or("unlimited".to_string(), |b| format!("{b} B/s")),
            f.create_delay.as_millis(),
            f.create_fail * 100.0,
            f.kill * 100.0
        )]
    }

    fn create_machine(&self, request: &MachineRequest<'_>) -> Result<Box<dyn Channel>> {
        let f = &self.faults;
        std::thread::sleep(f.create_delay);
        let (shard, shards) = (request.shard, request.shards);
        if chosen(f.seed, 1, shard, shards, f.create_fail) {
            bail!(
                "the simulation failed to make machine {shard} (create-fail={})",
                f.create_fail
            );
        }
        let machine = self.local.create_machine(request)?;
        let lose_after = chosen(f.seed, 2, shard, shards, f.kill)
            .then(|| 1 + mix(f.seed ^ 3, shard) % f.kill_after_lines);
        Ok(Box::new(SimMachine {
            machine,
            faults: f.clone(),
            shard,
            lose_after,
            cut: Arc::new(AtomicBool::new(false)),
        }))
    }
}

/// A well-mixed 64-bit value of `seed` and `shard` (splitmix64).
fn mix(seed: u64, shard: u32) -> u64 {
    let mut z = seed
        .wrapping_add(u64::from(shard).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Whether `shard` of `shards` is among the `rate` share drawn for `fault`: exactly
/// `round(rate × shards)` shards are, the ones ranked first by their draw.
fn chosen(seed: u64, fault: u64, shard: u32, shards: u32, rate: f64) -> bool {
    let count = (rate * f64::from(shards)).round() as usize;
    if count == 0 {
        return false;
    }
    let salt = seed ^ fault.wrapping_mul(0xA24B_AED4_963E_E407);
    let mut ranked: Vec<u32> = (0..shards).collect();
    ranked.sort_by_key(|s| mix(salt, *s));
    ranked[..count.min(ranked.len())].contains(&shard)
}

/// A local machine behind a misbehaving channel.
struct SimMachine {
    machine: Box<dyn Channel>,
    faults: Faults,
    shard: u32,
    /// For a machine to be lost: after how many lines from its worker.
    lose_after: Option<u64>,
    /// Set once the channel is cut.
    cut: Arc<AtomicBool>,
}

impl SimMachine {
    /// What moving `bytes` costs: the latency, and the time at the bandwidth.
    fn transfer(&self, bytes: u64) {
        std::thread::sleep(self.faults.latency + at_bandwidth(self.faults.bandwidth, bytes));
    }

    fn refuse_when_cut(&self) -> Result<()> {
        if self.cut.load(Ordering::SeqCst) {
            bail!("simulated machine {} was lost", self.shard);
        }
        Ok(())
    }
}

/// How long `bytes` take at `bandwidth` bytes a second.
fn at_bandwidth(bandwidth: Option<u64>, bytes: u64) -> Duration {
    bandwidth.map_or(Duration::ZERO, |b| {
        Duration::from_secs_f64(bytes as f64 / b as f64)
    })
}

impl Channel for SimMachine {
    fn describe(&self) -> String {
        format!("sim {} ({})", self.shard, self.machine.describe())
    }

    fn put(&mut self, src: &Path, dest: &str) -> Result<()> {
        self.refuse_when_cut()?;
        self.transfer(0);
        self.machine.put(src, dest)
    }

    fn exec(&mut self, argv: &[String]) -> Result<Process> {
        self.refuse_when_cut()?;
        let f = &self.faults;
        let process = if f.latency.is_zero() && f.bandwidth.is_none() {
            self.machine.exec(argv)?
        } else {
            self.machine.exec(&link_argv(f, argv))?
        };
        // Only the first program (the worker) is lost; the lines count from its start.
        let Some(lines) = self.lose_after.take() else {
            return Ok(process);
        };
        Ok(Process {
            stdin: Box::new(CutWriter {
                inner: process.stdin,
                cut: self.cut.clone(),
            }),
            stdout: Box::new(LosingReader {
                inner: process.stdout,
                lines_left: lines,
                cut: self.cut.clone(),
            }),
            stderr: process.stderr,
            handle: process.handle,
        })
    }

    fn get(&mut self, src: &str, dest: &Path, cap: u64) -> Result<()> {
        self.refuse_when_cut()?;
        self.machine.get(src, dest, cap)?;
        self.transfer(std::fs::metadata(dest).map_or(0, |m| m.len()));
        Ok(())
    }

    fn read_many(
        &mut self,
        files: &[(String, std::path::PathBuf)],
        cap: u64,
    ) -> Vec<Result<Vec<u8>>> {
        if let Err(lost) = self.refuse_when_cut() {
            return files
                .iter()
                .map(|_| Err(anyhow::anyhow!("{lost:#}")))
                .collect();
        }
        let read = self.machine.read_many(files, cap);
        let bytes: usize = read.iter().flatten().map(Vec::len).sum();
        self.transfer(bytes as u64);
        read
    }

    fn batch_copies(&self) -> bool {
        !self.faults.latency.is_zero() || self.faults.bandwidth.is_some()
    }

    fn dispose(&mut self, keep: bool) -> Result<Option<KeptMachine>> {
        self.machine.dispose(keep)
    }

    fn diagnose(&mut self) -> Option<String> {
        match self.cut.load(Ordering::SeqCst) {
            true => Some(format!(
                "the simulation lost machine {} mid-run (kill={})",
                self.shard, self.faults.kill
            )),
            false => self.machine.diagnose(),
        }
    }

    fn started_at(&self) -> Option<Instant> {
        self.machine.started_at()
    }

    fn provenance(&self) -> serde_json::Value {
        serde_json::json!({"sim": {"shard": self.shard, "lost": self.cut.load(Ordering::SeqCst)},
                           "machine": self.machine.provenance()})
    }
}

/// Bytes on their way, and when they arrive.
type InFlight = (Instant, Vec<u8>);

/// A program's output as the far end receives it: each chunk `latency` after it was sent, at
/// the bandwidth.
struct DelayedReader {
    arriving: Receiver<InFlight>,
    current: Vec<u8>,
    at: usize,
}

impl DelayedReader {
    fn new(mut inner: Box<dyn Read + Send>, faults: &Faults) -> Self {
        let (send, arriving) = sync_channel::<InFlight>(64);
        let (latency, bandwidth) = (faults.latency, faults.bandwidth);
        std::thread::spawn(move || {
            let mut buffer = vec![0u8; 8 * 1024];
            loop {
                let n = match inner.read(&mut buffer) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                std::thread::sleep(at_bandwidth(bandwidth, n as u64));
                let chunk = buffer[..n].to_vec();
                if send.send((Instant::now() + latency, chunk)).is_err() {
                    return;
                }
            }
        });
        DelayedReader {
            arriving,
            current: Vec::new(),
            at: 0,
        }
    }
}

impl Read for DelayedReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.at == self.current.len() {
            let Ok((due, bytes)) = self.arriving.recv() else {
                return Ok(0);
            };
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            (self.current, self.at) = (bytes, 0);
        }
        let n = out.len().min(self.current.len() - self.at);
        out[..n].copy_from_slice(&self.current[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// A program's input as it arrives: each write `latency` later, at the bandwidth.
struct DelayedWriter {
    sending: SyncSender<InFlight>,
    latency: Duration,
}

impl DelayedWriter {
    fn new(mut inner: Box<dyn Write + Send>, faults: &Faults) -> Self {
        let (sending, arriving) = sync_channel::<InFlight>(64);
        let bandwidth = faults.bandwidth;
        std::thread::spawn(move || {
            for (due, bytes) in arriving {
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
                std::thread::sleep(at_bandwidth(bandwidth, bytes.len() as u64));
                if inner
                    .write_all(&bytes)
                    .and_then(|()| inner.flush())
                    .is_err()
                {
                    return;
                }
            }
        });
        DelayedWriter {
            sending,
            latency: faults.latency,
        }
    }
}

impl Write for DelayedWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        (self.sending)
            .send((Instant::now() + self.latency, bytes.to_vec()))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "program ended"))?;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The worker's output on a machine to be lost: nothing after its `lines_left`th line, when
/// the channel is cut (the worker, no longer read, is killed in the coordinator's clean-up).
struct LosingReader {
    inner: Box<dyn Read + Send>,
    lines_left: u64,
    cut: Arc<AtomicBool>,
}

impl Read for LosingReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.cut.load(Ordering::SeqCst) {
            return Ok(0);
        }
        let n = self.inner.read(out)?;
        for (i, _) in out[..n].iter().enumerate().filter(|(_, b)| **b == b'\n') {
            self.lines_left -= 1;
            if self.lines_left == 0 {
                self.cut.store(true, Ordering::SeqCst);
                return Ok(i + 1);
            }
        }
        Ok(n)
    }
}

/// The coordinator's input to a machine to be lost: refused once the channel is cut.
struct CutWriter {
    inner: Box<dyn Write + Send>,
    cut: Arc<AtomicBool>,
}

impl Write for CutWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "machine lost",
            ));
        }
        self.inner.write(bytes)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// `argv` run behind [`link`] on the machine, with `faults`' latency and bandwidth.
fn link_argv(faults: &Faults, argv: &[String]) -> Vec<String> {
    let mut linked = vec![
        "mst".to_string(),
        "sim-link".to_string(),
        "--latency-ms".to_string(),
        faults.latency.as_millis().to_string(),
    ];
    if let Some(bandwidth) = faults.bandwidth {
        linked.extend(["--bandwidth".to_string(), bandwidth.to_string()]);
    }
    linked.push("--".to_string());
    linked.extend(argv.iter().cloned());
    linked
}

/// `mst sim-link`: runs `argv` (`mst` is this program), its input and output each delayed by
/// `latency` and held to `bandwidth` bytes a second, its errors passed as they come; exits as
/// it does.
pub fn link(latency: Duration, bandwidth: Option<u64>, argv: &[String]) -> Result<u8> {
    let (program, args) = argv.split_first().context("sim-link: nothing to run")?;
    let program = match program.as_str() {
        "mst" => std::env::current_exe().context("sim-link: where is mst")?,
        other => other.into(),
    };
    let mut child = std::process::Command::new(&program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("sim-link: cannot start {}", program.display()))?;
    let faults = Faults {
        latency,
        bandwidth,
        ..Faults::default()
    };
    let mut to_program = DelayedWriter::new(Box::new(child.stdin.take().expect("piped")), &faults);
    let mut from_program =
        DelayedReader::new(Box::new(child.stdout.take().expect("piped")), &faults);
    // Dropped when the coordinator closes its end: the program's input then closes too.
    std::thread::spawn(move || std::io::copy(&mut std::io::stdin().lock(), &mut to_program));
    // Line-buffered: each line goes on as soon as it has arrived.
    let _ = std::io::copy(&mut from_program, &mut std::io::stdout().lock());
    let status = child.wait().context("sim-link: waiting for the program")?;
    Ok(status.code().map_or(1, |code| code as u8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_the_share_asked_for_is_chosen_the_same_way_every_time() {
        let lost: Vec<u32> = (0..100).filter(|s| chosen(7, 2, *s, 100, 0.05)).collect();
        assert_eq!(lost.len(), 5);
        let again: Vec<u32> = (0..100).filter(|s| chosen(7, 2, *s, 100, 0.05)).collect();
        assert_eq!(lost, again);
        let other_seed: Vec<u32> = (0..100).filter(|s| chosen(8, 2, *s, 100, 0.05)).collect();
        assert_ne!(lost, other_seed);
        assert!(!(0..100).any(|s| chosen(7, 2, s, 100, 0.0)));
        assert!((0..3).all(|s| chosen(7, 2, s, 3, 1.0)));
    }

    #[test]
    fn a_lost_machines_output_ends_at_its_line_and_its_channel_is_cut() {
        let cut = Arc::new(AtomicBool::new(false));
        let mut reader = LosingReader {
            inner: Box::new(std::io::Cursor::new(b"one\ntwo\nthree\nfour\n".to_vec())),
            lines_left: 2,
            cut: cut.clone(),
        };
        let mut got = String::new();
        reader.read_to_string(&mut got).unwrap();
        assert_eq!(got, "one\ntwo\n");
        assert!(cut.load(Ordering::SeqCst));
        let mut writer = CutWriter {
            inner: Box::new(Vec::new()),
            cut,
        };
        let refused = writer.write(b"x").unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn output_arrives_late_and_input_too() {
        let faults = Faults {
            latency: Duration::from_millis(30),
            ..Faults::default()
        };
        let started = Instant::now();
        let mut reader =
            DelayedReader::new(Box::new(std::io::Cursor::new(b"one\n".to_vec())), &faults);
        let mut got = String::new();
        reader.read_to_string(&mut got).unwrap();
        assert_eq!(got, "one\n");
        assert!(started.elapsed() >= Duration::from_millis(30));

        let (pipe_out, pipe_in) = std::io::pipe().unwrap();
        let started = Instant::now();
        let mut writer = DelayedWriter::new(Box::new(pipe_in), &faults);
        writer.write_all(b"two\n").unwrap();
        drop(writer);
        let mut got = String::new();
        std::io::BufReader::new(pipe_out)
            .read_to_string(&mut got)
            .unwrap();
        assert_eq!(got, "two\n");
        assert!(started.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn bad_options_are_refused_naming_the_option() {
        let refused = |key: &str, value: &str| {
            let options = BTreeMap::from([(key.to_string(), value.to_string())]);
            SimRunner::new(&options).err().unwrap().to_string()
        };
        assert!(refused("kill", "1.5").contains("kill=1.5: a share between 0 and 1"));
        assert!(refused("latency-ms", "-3").contains("latency-ms=-3"));
        assert!(refused("bandwidth", "fast").contains("bandwidth=fast"));
        assert!(refused("speed", "1").contains("the `sim` runner takes"));
    }
}
