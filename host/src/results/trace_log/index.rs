//! The trace log's index, kept in a file rather than in memory: an open-addressing hash table
//! (linear probing, at most half full) of fixed 20-byte slots in an unnamed file in `$TMPDIR`
//! ([`Records`]), read and written with `pread`/`pwrite`. Memory keeps one byte a slot, a tag from the key's
//! hash (0 for an empty slot), so that a probe reads from the file only the slots whose tag
//! matches: an insert is one write, a look-up of a key the table has is one read, and one of a
//! key it lacks is almost always none.
//!
//! Held in memory the index cost about 33 bytes a trial for as long as the process ran, the
//! largest single thing a coordinator kept at 100,000 trials (issue 16: memory flat in N). Now
//! it costs about 2.6 bytes a trial (the tags, the table a third full or more) and the page
//! cache's pages, which the kernel may drop.

use crate::files::{Pack, Records, Unpack};
use std::io;

/// Where one trial's last line is in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Line {
    pub offset: u64,
    pub len: u32,
}

/// A slot: the key (0 when empty), the line's offset, its length; little-endian.
const SLOT: usize = 20;

/// The smallest table made.
const MIN_SLOTS: u64 = 1024;

/// A map from a trial's 64-bit key hash to its line, in a file.
#[derive(Default)]
pub(super) struct LineIndex {
    /// The table; made on the first insert.
    file: Option<Records<SLOT>>,
    /// Its slots: a power of two, or 0 before the first insert.
    slots: u64,
    /// Each slot's tag ([`tag`]), 0 when it is empty.
    tags: Vec<u8>,
    /// Slots in use.
    len: u64,
}

/// The key as stored: 0 marks an empty slot, so a hash of 0 is kept as 1 (the log's readers
/// check that the line they find is the trial's, as they do for any collision).
fn stored(hash: u64) -> u64 {
    hash.max(1)
}

/// A key's tag: its top byte, never 0 (which marks an empty slot). The slot is chosen by the
/// key's low bits, so the tag tells apart most keys that probe the same slots.
fn tag(key: u64) -> u8 {
    ((key >> 56) as u8).max(1)
}

fn decode(slot: &[u8; SLOT]) -> (u64, Line) {
    let mut fields = Unpack::new(slot);
    let key = fields.u64();
    let line = Line {
        offset: fields.u64(),
        len: fields.u32(),
    };
    (key, line)
}

fn encode(key: u64, line: Line) -> [u8; SLOT] {
    (Pack::new().u64(key).u64(line.offset).u32(line.len)).done()
}

impl LineIndex {
    /// The line of `hash`, if indexed.
    pub fn get(&self, hash: u64) -> io::Result<Option<Line>> {
        Ok(self.probe(stored(hash))?.1)
    }

    /// Indexes `line` as `hash`'s, replacing the line it had.
    pub fn insert(&mut self, hash: u64, line: Line) -> io::Result<()> {
        self.reserve(1)?;
        let key = stored(hash);
        let (slot, had) = self.probe(key)?;
        self.write(slot, key, line)?;
        if had.is_none() {
            self.len += 1;
        }
        Ok(())
    }

    /// Makes the table big enough for `more` keys beyond those it has, at most half full: one
    /// rehash up front rather than one at each doubling.
    pub fn reserve(&mut self, more: usize) -> io::Result<()> {
        let wanted = (self.len + more as u64)
            .saturating_mul(2)
            .next_power_of_two()
            .max(MIN_SLOTS);
        if wanted > self.slots {
            self.rehash(wanted)?;
        }
        Ok(())
    }

    /// Forgets every key (the log was replaced).
    pub fn clear(&mut self) {
        *self = LineIndex::default();
    }

    /// The slot where `key` is, with its line, or the empty slot where it would go.
    fn probe(&self, key: u64) -> io::Result<(u64, Option<Line>)> {
        let Some(file) = &self.file else {
            return Ok((0, None));
        };
        let mask = self.slots - 1;
        let tag = tag(key);
        let mut at = key & mask;
        // At most half full: an empty slot is always found.
        loop {
            match self.tags[at as usize] {
                0 => return Ok((at, None)),
                held if held == tag => {
                    let (held, line) = decode(&file.get(at as usize)?);
                    if held == key {
                        return Ok((at, Some(line)));
                    }
                }
                _ => {}
            }
            at = (at + 1) & mask;
        }
    }

    fn write(&mut self, slot: u64, key: u64, line: Line) -> io::Result<()> {
        let file = self.file.as_mut().expect("a table before a write");
        file.set(slot as usize, &encode(key, line))?;
        self.tags[slot as usize] = tag(key);
        Ok(())
    }

    /// Moves every key into a new table of `slots` slots. The new table takes this one's place
    /// only once every key is in it: a failure leaves this one as it was.
    fn rehash(&mut self, slots: u64) -> io::Result<()> {
        let mut file = Records::temp("the trace log's index file")?;
        // A sparse file: every slot reads as empty until written.
        file.resize(slots as usize)?;
        let mut moved = LineIndex {
            file: Some(file),
            slots,
            tags: vec![0; slots as usize],
            len: 0,
        };
        if let Some(old) = &self.file {
            for slot in old.iter() {
                let (key, line) = decode(&slot?);
                if key != 0 {
                    let (at, _) = moved.probe(key)?;
                    moved.write(at, key, line)?;
                    moved.len += 1;
                }
            }
        }
        *self = moved;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(n: u64) -> Line {
        Line {
            offset: n * 1000,
            len: n as u32 + 1,
        }
    }

    #[test]
    fn keys_are_found_replaced_and_kept_through_growth() {
        let mut index = LineIndex::default();
        assert_eq!(index.get(7).unwrap(), None);
        // Spread keys (0 among them, which stands for "empty" on disk), and a few that share
        // their low bits, so collide in the table and probe past each other.
        let keys: Vec<u64> = (0..5000u64)
            .map(|n| n.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .chain((1..=12u64).map(|n| n << 40))
            .collect();
        for (n, &key) in keys.iter().enumerate() {
            index.insert(key, line(n as u64)).unwrap();
        }
        assert!(
            index.slots >= 2 * keys.len() as u64,
            "grew to stay half empty"
        );
        for (n, &key) in keys.iter().enumerate() {
            assert_eq!(index.get(key).unwrap(), Some(line(n as u64)), "key {key}");
        }
        index.insert(5 << 40, line(9999)).unwrap();
        assert_eq!(index.get(5 << 40).unwrap(), Some(line(9999)));
        assert_eq!(
            index.len,
            keys.len() as u64,
            "a replaced key is not counted twice"
        );
        assert_eq!(index.get(3).unwrap(), None);
        index.clear();
        assert_eq!(index.get(5 << 40).unwrap(), None);
    }

    #[test]
    fn a_reserved_table_is_made_once_and_wraps_at_its_end() {
        let mut index = LineIndex::default();
        index.reserve(3000).unwrap();
        let slots = index.slots;
        assert_eq!(slots, 8192);
        // Keys that all land in the table's last slot: the probe wraps to its start.
        let keys: Vec<u64> = (1..=20u64).map(|n| (n << 32) | (slots - 1)).collect();
        for (n, &key) in keys.iter().enumerate() {
            index.insert(key, line(n as u64)).unwrap();
        }
        for (n, &key) in keys.iter().enumerate() {
            assert_eq!(index.get(key).unwrap(), Some(line(n as u64)));
        }
        assert_eq!(index.slots, slots, "no rehash within what was reserved");
    }
}
