//! [`Cpus`]: a set of CPU ids as a bitset, the working set type of the CPU manager.
//!
//! The allocation algorithms intersect and count sets of CPUs (free CPUs of a core, of a NUMA
//! node, ...) many times per request; a bitset makes each of those a few word operations
//! (4 words for 256 CPUs) instead of tree walks. [`Cpus`] converts to and from the cgroup
//! layer's [`CpuSet`] (the list format written to `cpuset.cpus`) and prints the same list
//! format.
use std::fmt;

use crate::cgroup::cpuset::{CpuListError, CpuSet};

/// A set of CPU ids. Equality is by set (trailing empty words are never stored).
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Cpus {
    words: Vec<u64>,
}

impl Cpus {
    /// The empty set.
    #[must_use]
    pub const fn new() -> Self {
        Self { words: Vec::new() }
    }

    /// Parses the list format (`0-3,7`).
    pub fn parse(text: &str) -> Result<Self, CpuListError> {
        Ok(Self::from(&CpuSet::parse(text)?))
    }

    fn word_bit(id: u32) -> (usize, u64) {
        ((id / 64) as usize, 1u64 << (id % 64))
    }

    fn trim(&mut self) {
        while self.words.last() == Some(&0) {
            self.words.pop();
        }
    }

    /// Adds `id`.
    pub fn insert(&mut self, id: u32) {
        let (w, bit) = Self::word_bit(id);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= bit;
    }

    /// Removes `id`.
    pub fn remove(&mut self, id: u32) {
        let (w, bit) = Self::word_bit(id);
        if let Some(word) = self.words.get_mut(w) {
            *word &= !bit;
        }
        self.trim();
    }

    /// True when `id` is in the set.
    #[must_use]
    pub fn contains(&self, id: u32) -> bool {
        let (w, bit) = Self::word_bit(id);
        self.words.get(w).is_some_and(|word| word & bit != 0)
    }

    /// The number of CPUs.
    #[must_use]
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// True when empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// The CPUs in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &word)| {
            let mut bits = word;
            let base = (i as u32) * 64;
            std::iter::from_fn(move || {
                if bits == 0 {
                    return None;
                }
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                Some(base + b)
            })
        })
    }

    /// The CPUs in increasing order, as a vector.
    #[must_use]
    pub fn to_vec(&self) -> Vec<u32> {
        self.iter().collect()
    }

    /// The smallest CPU id.
    #[must_use]
    pub fn first(&self) -> Option<u32> {
        self.iter().next()
    }

    /// `self ∪ other`.
    #[must_use]
    pub fn union(&self, other: &Self) -> Self {
        let mut out = self.clone();
        out.union_with(other);
        out
    }

    /// `self ∩ other`.
    #[must_use]
    pub fn intersection(&self, other: &Self) -> Self {
        let mut words: Vec<u64> = self
            .words
            .iter()
            .zip(&other.words)
            .map(|(a, b)| a & b)
            .collect();
        while words.last() == Some(&0) {
            words.pop();
        }
        Self { words }
    }

    /// `self \ other`.
    #[must_use]
    pub fn difference(&self, other: &Self) -> Self {
        let mut out = self.clone();
        out.subtract(other);
        out
    }

    /// Adds every CPU of `other`.
    pub fn union_with(&mut self, other: &Self) {
        if self.words.len() < other.words.len() {
            self.words.resize(other.words.len(), 0);
        }
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a |= b;
        }
    }

    /// Removes every CPU of `other`.
    pub fn subtract(&mut self, other: &Self) {
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a &= !b;
        }
        self.trim();
    }

    /// `|self ∩ other|` without building the intersection.
    #[must_use]
    pub fn intersection_len(&self, other: &Self) -> usize {
        self.words
            .iter()
            .zip(&other.words)
            .map(|(a, b)| (a & b).count_ones() as usize)
            .sum()
    }

    /// True when the sets share a CPU.
    #[must_use]
    pub fn intersects(&self, other: &Self) -> bool {
        self.words.iter().zip(&other.words).any(|(a, b)| a & b != 0)
    }

    /// True when every CPU of `self` is in `other`.
    #[must_use]
    pub fn is_subset(&self, other: &Self) -> bool {
        self.words.len() <= other.words.len()
            && self
                .words
                .iter()
                .zip(&other.words)
                .all(|(a, b)| a & !b == 0)
    }

    /// The cgroup layer's list type.
    #[must_use]
    pub fn to_cpuset(&self) -> CpuSet {
        self.iter().collect()
    }
}

impl FromIterator<u32> for Cpus {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut out = Self::new();
        for id in iter {
            out.insert(id);
        }
        out
    }
}

impl From<&CpuSet> for Cpus {
    fn from(set: &CpuSet) -> Self {
        set.iter().collect()
    }
}

impl From<&Cpus> for CpuSet {
    fn from(set: &Cpus) -> Self {
        set.to_cpuset()
    }
}

/// The kernel's list format (`0-3,7`), empty for the empty set.
impl fmt::Display for Cpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids = self.iter().peekable();
        let mut first = true;
        while let Some(start) = ids.next() {
            let mut end = start;
            while ids.peek() == Some(&(end + 1)) {
                end += 1;
                ids.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Cpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cpus({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn set_operations_and_list_format() {
        let a = Cpus::parse("0-3,64,130").unwrap();
        let b = Cpus::parse("2-5,130").unwrap();
        assert_eq!(a.len(), 6);
        assert_eq!(a.union(&b).to_string(), "0-5,64,130");
        assert_eq!(a.intersection(&b).to_string(), "2-3,130");
        assert_eq!(a.difference(&b).to_string(), "0-1,64");
        assert_eq!(a.intersection_len(&b), 3);
        assert!(Cpus::parse("2,3").unwrap().is_subset(&a));
        assert!(!b.is_subset(&a));
        assert_eq!(a.first(), Some(0));
        assert_eq!(Cpus::new().to_string(), "");
    }

    #[test]
    fn equality_ignores_how_the_set_was_built() {
        let mut a = Cpus::parse("1,200").unwrap();
        a.remove(200);
        assert_eq!(a, Cpus::parse("1").unwrap());
        let c = Cpus::parse("0-127")
            .unwrap()
            .difference(&Cpus::parse("64-127").unwrap());
        assert_eq!(c, Cpus::parse("0-63").unwrap());
        assert!(
            Cpus::parse("5")
                .unwrap()
                .difference(&Cpus::parse("5").unwrap())
                .is_empty()
        );
    }

    proptest! {
        #[test]
        fn matches_the_cgroup_list_type(ids in proptest::collection::btree_set(0u32..600, 0..80)) {
            let cpus: Cpus = ids.iter().copied().collect();
            let list: CpuSet = ids.iter().copied().collect();
            prop_assert_eq!(cpus.to_string(), list.to_string());
            prop_assert_eq!(cpus.len(), ids.len());
            prop_assert_eq!(&Cpus::parse(&cpus.to_string()).unwrap(), &cpus);
            prop_assert_eq!(cpus.to_cpuset(), list);
        }
    }
}
