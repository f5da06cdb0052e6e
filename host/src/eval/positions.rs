//! [`Positions`]: ascending positions in a plan, about a byte and a half each.

/// Positions in a run's plan, ascending (a shard's trials), each held as its distance from the
/// one before in LEB128 (a byte below 128, two below 16,384), with every 64th position, and
/// where its block's distances start, beside them. A shard's trials over a hundred machines
/// then cost about 1.5 bytes each where a list of positions cost 4: 4 MB held while a
/// million-trial run collects. A position is found by halves over the blocks, then by reading
/// at most one block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Positions {
    distances: Vec<u8>,
    /// Each block's first position and where its distances start in `distances`.
    blocks: Vec<(u32, usize)>,
    len: usize,
    last: u32,
}

/// Positions a block.
const BLOCK: usize = 64;

impl Positions {
    /// Adds `position`, which must be greater than the last one added.
    pub fn push(&mut self, position: u32) {
        assert!(
            self.len == 0 || position > self.last,
            "positions are added in ascending order"
        );
        if self.len.is_multiple_of(BLOCK) {
            self.blocks.push((position, self.distances.len()));
        } else {
            let mut distance = position - self.last;
            while distance >= 0x80 {
                self.distances.push((distance as u8 & 0x7f) | 0x80);
                distance >>= 7;
            }
            self.distances.push(distance as u8);
        }
        self.last = position;
        self.len += 1;
    }

    /// Gives back the room made for positions not added.
    pub fn shrink_to_fit(&mut self) {
        self.distances.shrink_to_fit();
        self.blocks.shrink_to_fit();
    }

    /// How many positions it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The positions of block `block`, in order.
    fn block(&self, block: usize) -> impl Iterator<Item = u32> + '_ {
        let (first, start) = self.blocks[block];
        let count = BLOCK.min(self.len - block * BLOCK);
        let mut at = start;
        let mut position = first;
        (0..count).map(move |i| {
            if i > 0 {
                let (mut distance, mut shift) = (0u32, 0);
                loop {
                    let byte = self.distances[at];
                    at += 1;
                    distance |= u32::from(byte & 0x7f) << shift;
                    shift += 7;
                    if byte & 0x80 == 0 {
                        break;
                    }
                }
                position += distance;
            }
            position
        })
    }

    /// The position at `index`, if there is one.
    pub fn get(&self, index: usize) -> Option<u32> {
        (index < self.len).then(|| {
            (self.block(index / BLOCK).nth(index % BLOCK)).expect("a block holds its positions")
        })
    }

    /// Where `position` is among them, if it is.
    pub fn find(&self, position: u32) -> Option<usize> {
        let block =
            (self.blocks.partition_point(|(first, _)| *first <= position)).checked_sub(1)?;
        let at = (self.block(block))
            .take_while(|p| *p <= position)
            .position(|p| p == position)?;
        Some(block * BLOCK + at)
    }

    /// Every position, in order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.blocks.len()).flat_map(|block| self.block(block))
    }
}

impl FromIterator<u32> for Positions {
    fn from_iter<I: IntoIterator<Item = u32>>(positions: I) -> Self {
        let mut made = Positions::default();
        positions.into_iter().for_each(|p| made.push(p));
        made
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_got_found_and_listed_as_added_whatever_their_distances() {
        // Distances of 1, of one and two LEB128 bytes, and of five (past 2^28), over several
        // blocks and a part block.
        let mut wanted = Vec::new();
        let mut p = 3u32;
        for i in 0..300u32 {
            wanted.push(p);
            p += match i % 5 {
                0 => 1,
                1 => 100,
                2 => 200,
                3 => 20_000,
                _ => 300_000_000 / 300,
            };
        }
        wanted.push(u32::MAX);
        let positions: Positions = wanted.iter().copied().collect();
        assert_eq!(positions.len(), wanted.len());
        assert_eq!(positions.iter().collect::<Vec<_>>(), wanted);
        for (index, &position) in wanted.iter().enumerate() {
            assert_eq!(positions.get(index), Some(position), "{index}");
            assert_eq!(positions.find(position), Some(index), "{position}");
            if position > 0 && !wanted.contains(&(position - 1)) {
                assert_eq!(positions.find(position - 1), None);
            }
        }
        assert_eq!(positions.get(wanted.len()), None);
        assert_eq!(positions.find(0), None);
        assert!(Positions::default().is_empty());
        assert_eq!(Positions::default().find(7), None);
        // Far smaller than four bytes a position at a hundred shards' spacing.
        let spaced: Positions = (0..100_000u32).map(|i| i * 100 + i % 7).collect();
        assert!(
            spaced.distances.len() < 150_000,
            "{}",
            spaced.distances.len()
        );
    }

    #[test]
    #[should_panic(expected = "ascending")]
    fn a_position_out_of_order_is_refused() {
        // At a block's start too, where no distance is written.
        let mut positions: Positions = (0..BLOCK as u32).collect();
        positions.push(5);
    }
}
