//! [`Slots`]: where each trial's grade line is in a file of grades, kept in a second file of
//! fixed slots, one for each trial of the run's plan, at the trial's position. Grading while
//! collecting writes them (`run::grading`'s spill), and [`super::Grades`] reads grades through
//! them: memory holds one bit a trial (which slots are written), where a list of where each
//! grade is held 16 bytes (issue 16: memory flat in N).

use crate::files::{Pack, Records, Unpack};
use fixedbitset::FixedBitSet;
use std::io;

/// Where one trial's grade is: `len` bytes at `at` of the grades file. Grading while
/// collecting also notes the grade's trace's `order` of arrival (a later version of a trace
/// replaces an earlier one's grade) and whether the line carries tallies of its trace (the
/// agent's model usage, its tool calls by server), which the run's totals are summed from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slot {
    pub at: u64,
    pub len: u32,
    pub order: u32,
    pub tallied: bool,
}

/// A slot's size in the slots file: `at`, then `len` with [`TALLIED`] as its top bit,
/// then `order`; little-endian.
pub const SLOT: usize = 16;

/// The bit of a slot's `len` word that says the agent made model calls.
const TALLIED: u32 = 1 << 31;

impl Slot {
    /// The slot of a grade line `len` bytes long at `at`; refused when a slot cannot hold
    /// its length.
    pub fn new(at: u64, len: usize) -> io::Result<Self> {
        let len = u32::try_from(len)
            .ok()
            .filter(|len| len & TALLIED == 0)
            .ok_or_else(|| {
                io::Error::other(format!("a grade is {len} bytes, more than a grade may be"))
            })?;
        Ok(Slot {
            at,
            len,
            order: 0,
            tallied: false,
        })
    }

    fn encode(self) -> [u8; SLOT] {
        let flagged = self.len | if self.tallied { TALLIED } else { 0 };
        (Pack::new().u64(self.at).u32(flagged).u32(self.order)).done()
    }

    fn decode(bytes: &[u8; SLOT]) -> Self {
        let mut fields = Unpack::new(bytes);
        let (at, flagged, order) = (fields.u64(), fields.u32(), fields.u32());
        Slot {
            at,
            len: flagged & !TALLIED,
            order,
            tallied: flagged & TALLIED != 0,
        }
    }
}

/// One [`Slot`] per trial of a plan, at its position, in a sparse file (its unwritten slots
/// cost nothing), and which of them are written.
#[derive(Debug)]
pub struct Slots {
    records: Records<SLOT>,
    filled: FixedBitSet,
}

impl Slots {
    /// Empty slots for a plan of `trials` trials, in an unnamed file in `dir`.
    pub fn new_in(dir: &std::path::Path, trials: usize) -> io::Result<Self> {
        let mut records = Records::temp_in(dir, "the grade slots file")?;
        records.resize(trials)?;
        Ok(Slots {
            records,
            filled: FixedBitSet::with_capacity(trials),
        })
    }

    /// Whether the trial at `trial` has a slot written.
    pub fn contains(&self, trial: usize) -> bool {
        self.filled.contains(trial)
    }

    /// How many slots are written.
    pub fn count(&self) -> usize {
        self.filled.count_ones(..)
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.filled.is_clear()
    }

    /// The slot of the trial at `trial`, if it is written.
    pub fn get(&self, trial: usize) -> io::Result<Option<Slot>> {
        if !self.contains(trial) {
            return Ok(None);
        }
        Ok(Some(Slot::decode(&self.records.get(trial)?)))
    }

    /// Writes `slot` as the trial at `trial`'s.
    pub fn set(&mut self, trial: usize, slot: Slot) -> io::Result<()> {
        self.records.set(trial, &slot.encode())?;
        self.filled.insert(trial);
        Ok(())
    }

    /// Every written slot, by the trial's position, read in order in large reads.
    pub fn each(&self) -> impl Iterator<Item = io::Result<(usize, Slot)>> + '_ {
        (self.records.iter().enumerate()).filter_map(|(trial, bytes)| match bytes {
            Err(e) => Some(Err(e)),
            Ok(bytes) => (self.contains(trial)).then(|| Ok((trial, Slot::decode(&bytes)))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_reads_back_as_written_its_flag_apart_from_its_length() {
        for slot in [
            Slot {
                at: u64::MAX - 3,
                len: TALLIED - 1,
                order: u32::MAX,
                tallied: true,
            },
            Slot {
                at: 0,
                len: 0,
                order: 0,
                tallied: false,
            },
        ] {
            assert_eq!(Slot::decode(&slot.encode()), slot);
        }
        let error = Slot::new(0, TALLIED as usize).unwrap_err().to_string();
        assert!(error.contains("more than a grade may be"), "{error}");
    }

    #[test]
    fn slots_are_read_back_one_at_a_time_and_all_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut slots = Slots::new_in(dir.path(), 5).unwrap();
        assert!(slots.is_empty());
        let slot = |at| Slot::new(at, 7).unwrap();
        slots.set(3, slot(30)).unwrap();
        slots.set(0, slot(0)).unwrap();
        slots.set(3, slot(31)).unwrap();
        assert_eq!(slots.count(), 2);
        assert_eq!(slots.get(3).unwrap(), Some(slot(31)));
        assert_eq!(slots.get(1).unwrap(), None);
        let each: Vec<(usize, Slot)> = slots.each().map(Result::unwrap).collect();
        assert_eq!(each, [(0, slot(0)), (3, slot(31))]);
        // Read again from the start.
        assert_eq!(slots.each().count(), 2);
    }
}
