//! [`CaseIds`]: a list of case ids held end to end, found by id.

/// Case ids, in the order they were added, end to end in one string, with where each ends and
/// their order by id: a case holds its id's bytes and 8 more, with no allocation of its own
/// (a shared string a case held 40 bytes, and the plan and the cases each held their own
/// list of them). A run's cases ([`super::dataset::Cases`]) and a plan of all of them
/// ([`super::plan::Plan`]) share one.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CaseIds {
    text: String,
    /// Where each id ends in `text`.
    ends: Vec<u32>,
    /// Positions sorted by id, then by position (ids added twice lie together, first to
    /// last): an id is found by halves.
    by_id: Vec<u32>,
}

/// A [`CaseIds`] being made an id at a time.
#[derive(Debug, Default)]
pub struct CaseIdsBuilder {
    text: String,
    ends: Vec<u32>,
}

impl CaseIdsBuilder {
    /// Adds `id` after the others; fails when the ids would pass 4 GiB in all, or 4 billion.
    pub fn push(&mut self, id: &str) -> Result<(), String> {
        if self.ends.len() >= u32::MAX as usize {
            return Err(format!("more than {} cases", u32::MAX));
        }
        let end = u32::try_from(self.text.len() + id.len())
            .map_err(|_| format!("the case ids pass {} bytes in all", u32::MAX))?;
        self.text.push_str(id);
        self.ends.push(end);
        Ok(())
    }

    /// Makes room for `more` ids.
    pub fn reserve(&mut self, more: usize) {
        self.ends.reserve_exact(more);
    }

    /// How many ids it has.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The ids, sorted for finding.
    pub fn finish(mut self) -> CaseIds {
        self.text.shrink_to_fit();
        self.ends.shrink_to_fit();
        let mut ids = CaseIds {
            text: self.text,
            ends: self.ends,
            by_id: Vec::new(),
        };
        let mut by_id: Vec<u32> = (0..ids.len() as u32).collect();
        by_id.sort_unstable_by(|&a, &b| (ids.id(a).cmp(ids.id(b))).then(a.cmp(&b)));
        ids.by_id = by_id;
        ids
    }
}

impl CaseIds {
    /// How many ids it has.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The id at `at` (below [`Self::len`]).
    pub fn get(&self, at: usize) -> &str {
        let start = match at {
            0 => 0,
            _ => self.ends[at - 1] as usize,
        };
        &self.text[start..self.ends[at] as usize]
    }

    fn id(&self, at: u32) -> &str {
        self.get(at as usize)
    }

    /// Every id, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.len()).map(|at| self.get(at))
    }

    /// Every id sorted, with its position.
    pub fn by_id(&self) -> impl ExactSizeIterator<Item = (usize, &str)> + '_ {
        (self.by_id.iter()).map(|&at| (at as usize, self.id(at)))
    }

    /// The position of the id that comes `rank`-th by id (below [`Self::len`]).
    pub fn by_id_at(&self, rank: usize) -> usize {
        self.by_id[rank] as usize
    }

    /// The position of `id` (its first, when added twice), if it is here.
    pub fn find(&self, id: &str) -> Option<usize> {
        let first = self.by_id.partition_point(|&at| self.id(at) < id);
        let &at = self.by_id.get(first)?;
        (self.id(at) == id).then_some(at as usize)
    }

    /// The id added twice whose second time comes first, if any: the positions of its first
    /// and second times.
    pub fn repeated(&self) -> Option<(usize, usize)> {
        (self.by_id.chunk_by(|&a, &b| self.id(a) == self.id(b)))
            .filter(|same| same.len() > 1)
            .map(|same| (same[0] as usize, same[1] as usize))
            .min_by_key(|&(_, second)| second)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_kept_in_order_found_by_id_and_repeats_named_first_second_use_first() {
        let mut made = CaseIdsBuilder::default();
        for id in ["c2", "", "c1", "c3", "c1", "c2"] {
            made.push(id).unwrap();
        }
        assert_eq!(made.len(), 6);
        let ids = made.finish();
        assert_eq!(
            ids.iter().collect::<Vec<_>>(),
            ["c2", "", "c1", "c3", "c1", "c2"]
        );
        assert_eq!(
            ids.by_id().collect::<Vec<_>>(),
            [
                (1, ""),
                (2, "c1"),
                (4, "c1"),
                (0, "c2"),
                (5, "c2"),
                (3, "c3")
            ]
        );
        assert_eq!(ids.by_id_at(0), 1);
        assert_eq!(ids.by_id_at(5), 3);
        assert_eq!(ids.find("c1"), Some(2));
        assert_eq!(ids.find("c2"), Some(0));
        assert_eq!(ids.find(""), Some(1));
        assert_eq!(ids.find("c0"), None);
        assert_eq!(ids.find("c4"), None);
        // c1's second use (4) comes before c2's (5).
        assert_eq!(ids.repeated(), Some((2, 4)));
        let mut once = CaseIdsBuilder::default();
        once.push("a").unwrap();
        assert_eq!(once.finish().repeated(), None);
        assert!(CaseIds::default().is_empty());
        assert_eq!(CaseIds::default().find("a"), None);
    }
}
