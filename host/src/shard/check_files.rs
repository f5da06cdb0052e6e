//! Hidden check files (`checks[].files`): a check's own files, which the agent must never see,
//! travel to the machine only when the check is about to run. The worker asks for them
//! (`check-files`) after the trial's client ended and its processes are gone; the coordinator,
//! which keeps the packed archives by digest off the machine, answers in parts; the worker
//! lays them over the trial's work directory and runs the check (docs/config.md, "Hidden
//! check files"). They are never in the bundle, nor on the machine before.

use super::protocol::{ModelPart, ModelParts, MAX_MODEL_CALL_BYTES};
use crate::eval::trial::TrialKey;
use base64::Engine as _;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex};

/// The largest archive of one check's files: its base64 form must fit a part stream.
pub const MAX_CHECK_FILES_BYTES: u64 = (MAX_MODEL_CALL_BYTES as u64 / 4) * 3;

/// The coordinator's side: where each check's files were packed.
#[derive(Debug, Clone, Default)]
pub struct CheckFiles {
    /// Where the archives lie ([`crate::workspace::archive_name`]).
    pub dir: PathBuf,
    /// By a check's `files` as its bundle spells it, the digest of their archive.
    pub digests: BTreeMap<String, String>,
}

impl CheckFiles {
    /// The archive of the check whose `files` is `files`, base64-encoded in parts; or why
    /// there is none (mst's own files missing: the trial is infra).
    pub fn parts(&self, files: &str) -> Result<Vec<ModelPart>, String> {
        let digest = (self.digests.get(files))
            .ok_or_else(|| format!("mst packed no check files from {files}"))?;
        let path = self.dir.join(crate::workspace::archive_name(digest));
        let bytes =
            crate::files::read_regular(&path, MAX_CHECK_FILES_BYTES, true).map_err(|e| {
                format!(
                    "cannot read the packed check files {}: {e:#}",
                    path.display()
                )
            })?;
        let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
        Ok(ModelPart::split(&encoded))
    }
}

/// What a waiting trial gets: the archive's bytes, or why the coordinator has none.
pub type Delivery = Result<Vec<u8>, String>;

/// The worker's side: the trials waiting for check files, each with the parts so far.
#[derive(Clone, Default)]
pub struct Requests(Arc<Mutex<BTreeMap<(TrialKey, String), Waiting>>>);

struct Waiting {
    parts: ModelParts,
    answer: mpsc::Sender<Delivery>,
}

impl Requests {
    /// Registers `key`'s wait for check `check`'s files: the receiver hears once.
    pub fn wait_for(&self, key: &TrialKey, check: &str) -> mpsc::Receiver<Delivery> {
        let (answer, heard) = mpsc::channel();
        let waiting = Waiting {
            parts: ModelParts::default(),
            answer,
        };
        let mut requests = self.0.lock().expect("check files");
        requests.insert((key.clone(), check.to_string()), waiting);
        heard
    }

    /// A part (or an error) of the coordinator's answer; an unreadable answer is the
    /// coordinator breaking the protocol.
    pub fn on_answer(
        &self,
        key: TrialKey,
        check: String,
        part: Option<ModelPart>,
        error: Option<String>,
    ) -> Result<(), String> {
        let mut requests = self.0.lock().expect("check files");
        let id = (key, check);
        let Some(waiting) = requests.get_mut(&id) else {
            return Ok(()); // its trial ended meanwhile
        };
        let delivery = match (part, error) {
            (_, Some(error)) => Err(error),
            (Some(part), None) => {
                let Some(encoded) = waiting.parts.add(part)? else {
                    return Ok(());
                };
                let engine = base64::engine::general_purpose::STANDARD;
                let bytes = (engine.decode(encoded))
                    .map_err(|e| format!("check files that do not decode: {e}"))?;
                Ok(bytes)
            }
            (None, None) => return Err("a `check-files` answer with neither part nor error".into()),
        };
        let waiting = requests.remove(&id).expect("present");
        let _ = waiting.answer.send(delivery);
        Ok(())
    }
}
