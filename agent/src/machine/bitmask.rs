//! [`NumaMask`]: a set of NUMA node ids (0..64) with the operations kubelet's
//! `topologymanager/bitmask` offers (and, or, count, narrower-than ordering, subset
//! iteration).
//!
//! This module owns the mask type and its ordering rules only; the topology manager's merge
//! and policies live in [`crate::cm::topology`].
use std::fmt;

/// Errors building a [`NumaMask`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MaskError {
    /// A node id outside `0..NumaMask::MAX_NODES`.
    #[error("bit number must be in range 0-{max}, got {bit}", max = NumaMask::MAX_NODES - 1)]
    OutOfRange {
        /// The offending node id.
        bit: usize,
    },
}

/// A set of NUMA node ids, `0..64` (kubelet's `bitmask.BitMask` is also a `uint64`).
///
/// Equality and hashing are by set. [`Ord`] is the numeric order of the underlying word, which
/// is kubelet's `IsLessThan` (used to break ties between masks of equal width).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct NumaMask(u64);

impl NumaMask {
    /// The number of node ids a mask can hold.
    pub const MAX_NODES: usize = 64;

    /// The empty mask.
    pub const EMPTY: NumaMask = NumaMask(0);

    /// A mask with `nodes` set (kubelet's `NewBitMask`).
    pub fn new(nodes: &[usize]) -> Result<Self, MaskError> {
        let mut mask = Self::EMPTY;
        mask.add(nodes)?;
        Ok(mask)
    }

    /// A mask with the single node `node` set.
    pub fn single(node: usize) -> Result<Self, MaskError> {
        Self::new(&[node])
    }

    /// Every node in `0..count` (`count` clamped to [`Self::MAX_NODES`]).
    pub const fn first_n(count: usize) -> Self {
        if count >= Self::MAX_NODES {
            NumaMask(u64::MAX)
        } else {
            NumaMask((1u64 << count) - 1)
        }
    }

    /// A mask from its raw word (bit `i` = node `i`).
    pub const fn from_bits(bits: u64) -> Self {
        NumaMask(bits)
    }

    /// The raw word (bit `i` = node `i`).
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// Sets `nodes`; on error the mask is unchanged.
    pub fn add(&mut self, nodes: &[usize]) -> Result<(), MaskError> {
        let mut bits = self.0;
        for &node in nodes {
            if node >= Self::MAX_NODES {
                return Err(MaskError::OutOfRange { bit: node });
            }
            bits |= 1u64 << node;
        }
        self.0 = bits;
        Ok(())
    }

    /// Clears `nodes`; on error the mask is unchanged.
    pub fn remove(&mut self, nodes: &[usize]) -> Result<(), MaskError> {
        let mut bits = self.0;
        for &node in nodes {
            if node >= Self::MAX_NODES {
                return Err(MaskError::OutOfRange { bit: node });
            }
            bits &= !(1u64 << node);
        }
        self.0 = bits;
        Ok(())
    }

    /// Intersection.
    #[must_use]
    pub const fn and(self, other: NumaMask) -> NumaMask {
        NumaMask(self.0 & other.0)
    }

    /// Union.
    #[must_use]
    pub const fn or(self, other: NumaMask) -> NumaMask {
        NumaMask(self.0 | other.0)
    }

    /// True when no node is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// True when `node` is set (false for ids out of range).
    pub const fn is_set(self, node: usize) -> bool {
        node < Self::MAX_NODES && self.0 & (1u64 << node) != 0
    }

    /// True when any of `nodes` is set.
    pub fn any_set(self, nodes: &[usize]) -> bool {
        nodes.iter().any(|&n| self.is_set(n))
    }

    /// True when every node of `self` is also in `other`.
    pub const fn is_subset_of(self, other: NumaMask) -> bool {
        self.0 & !other.0 == 0
    }

    /// The number of nodes set.
    pub const fn count(self) -> usize {
        self.0.count_ones() as usize
    }

    /// The set node ids, ascending.
    pub fn nodes(self) -> impl Iterator<Item = usize> {
        let mut bits = self.0;
        std::iter::from_fn(move || {
            if bits == 0 {
                return None;
            }
            let node = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            Some(node)
        })
    }

    /// The set node ids, ascending, as a vector.
    pub fn to_vec(self) -> Vec<usize> {
        self.nodes().collect()
    }

    /// kubelet's `IsNarrowerThan`: fewer nodes, or as many nodes and numerically smaller
    /// (lower-numbered nodes win ties).
    pub fn is_narrower_than(self, other: NumaMask) -> bool {
        match self.count().cmp(&other.count()) {
            std::cmp::Ordering::Equal => self.0 < other.0,
            ord => ord == std::cmp::Ordering::Less,
        }
    }

    /// kubelet's `IsLessThan`: numerically smaller word.
    pub const fn is_less_than(self, other: NumaMask) -> bool {
        self.0 < other.0
    }

    /// kubelet's `IsGreaterThan`: numerically larger word.
    pub const fn is_greater_than(self, other: NumaMask) -> bool {
        self.0 > other.0
    }

    /// The intersection of `masks` (kubelet's `And` over a list; the empty list gives the
    /// empty mask, as kubelet's does).
    pub fn and_all(masks: impl IntoIterator<Item = NumaMask>) -> NumaMask {
        let mut iter = masks.into_iter();
        match iter.next() {
            None => Self::EMPTY,
            Some(first) => iter.fold(first, NumaMask::and),
        }
    }

    /// Calls `f` with every non-empty subset of `nodes`, in kubelet's `IterateBitMasks` order:
    /// by size (1, 2, ...), and within a size in lexicographic order of positions in `nodes`.
    pub fn for_each_subset(nodes: &[usize], mut f: impl FnMut(NumaMask)) {
        let n = nodes.len().min(Self::MAX_NODES);
        let mut idx: Vec<usize> = Vec::with_capacity(n);
        for k in 1..=n {
            idx.clear();
            idx.extend(0..k);
            loop {
                let mut bits = 0u64;
                for &i in &idx {
                    if let Some(&node) = nodes.get(i)
                        && node < Self::MAX_NODES
                    {
                        bits |= 1u64 << node;
                    }
                }
                f(NumaMask(bits));
                // Advance to the next k-combination of 0..n: the rightmost index that can
                // still move right moves by one, the ones after it follow it.
                let Some(pos) = (0..k).rev().find(|&i| idx[i] < n - k + i) else {
                    break;
                };
                idx[pos] += 1;
                for j in pos + 1..k {
                    idx[j] = idx[j - 1] + 1;
                }
            }
        }
    }
}

/// The Linux list format (`0-1,3`), as written to `cpuset.mems`; empty for the empty mask.
impl fmt::Display for NumaMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut nodes = self.nodes().peekable();
        while let Some(start) = nodes.next() {
            let mut end = start;
            while nodes.peek() == Some(&(end + 1)) {
                end += 1;
                nodes.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if end == start {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for NumaMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NumaMask({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(nodes: &[usize]) -> NumaMask {
        NumaMask::new(nodes).unwrap()
    }

    #[test]
    fn new_and_add_reject_out_of_range_bits() {
        // kubelet TestNewBitMask / TestAdd.
        assert_eq!(m(&[0]).bits(), 0b1);
        assert_eq!(m(&[1, 0]).bits(), 0b11);
        assert_eq!(m(&[63]).bits(), 1 << 63);
        assert_eq!(NumaMask::new(&[64]), Err(MaskError::OutOfRange { bit: 64 }));
        let mut mask = m(&[1]);
        assert!(mask.add(&[2, 64]).is_err());
        assert_eq!(mask, m(&[1]), "a failed add leaves the mask unchanged");
        mask.remove(&[1]).unwrap();
        assert!(mask.is_empty());
        assert_eq!(
            MaskError::OutOfRange { bit: 70 }.to_string(),
            "bit number must be in range 0-63, got 70"
        );
    }

    #[test]
    fn set_operations() {
        // kubelet TestAnd / TestOr / TestIsSet / TestAnySet / TestCount / TestGetBits.
        assert_eq!(m(&[0, 1]).and(m(&[1, 2])), m(&[1]));
        assert_eq!(m(&[0]).or(m(&[2])), m(&[0, 2]));
        assert!(m(&[5]).is_set(5) && !m(&[5]).is_set(4) && !m(&[5]).is_set(99));
        assert!(m(&[3]).any_set(&[1, 3]) && !m(&[3]).any_set(&[1, 2]));
        assert_eq!(m(&[0, 33, 63]).count(), 3);
        assert_eq!(m(&[33, 0, 63]).to_vec(), vec![0, 33, 63]);
        assert!(m(&[1]).is_subset_of(m(&[0, 1])) && !m(&[2]).is_subset_of(m(&[0, 1])));
        assert_eq!(
            NumaMask::and_all([m(&[0, 1, 2]), m(&[1, 2]), m(&[2, 3])]),
            m(&[2])
        );
        assert_eq!(NumaMask::and_all([]), NumaMask::EMPTY);
        assert_eq!(NumaMask::first_n(3), m(&[0, 1, 2]));
        assert_eq!(NumaMask::first_n(64).count(), 64);
    }

    #[test]
    fn narrower_than_mirrors_kubelet() {
        // kubelet TestIsNarrowerThan rows: fewer bits, else the numerically smaller mask.
        let rows = [
            (&[0][..], &[0, 1][..], true),
            (&[0, 1][..], &[0][..], false),
            (&[0][..], &[1][..], true),
            (&[1][..], &[0][..], false),
            (&[0, 2][..], &[1, 2][..], true),
            (&[0, 1][..], &[0, 1][..], false),
        ];
        for (a, b, expected) in rows {
            assert_eq!(m(a).is_narrower_than(m(b)), expected, "{a:?} < {b:?}");
        }
        assert!(m(&[0, 1]).is_less_than(m(&[2])));
        assert!(m(&[2]).is_greater_than(m(&[0, 1])));
    }

    #[test]
    fn subsets_come_in_kubelets_iteration_order() {
        // kubelet TestIterateBitMasks: every subset, by size, lexicographic within a size.
        let mut seen = Vec::new();
        NumaMask::for_each_subset(&[0, 1, 2], |mask| seen.push(mask.to_vec()));
        assert_eq!(
            seen,
            vec![
                vec![0],
                vec![1],
                vec![2],
                vec![0, 1],
                vec![0, 2],
                vec![1, 2],
                vec![0, 1, 2]
            ]
        );
        for n in 0..=10 {
            let nodes: Vec<usize> = (0..n).collect();
            let mut count = 0usize;
            let mut distinct = std::collections::BTreeSet::new();
            NumaMask::for_each_subset(&nodes, |mask| {
                count += 1;
                distinct.insert(mask);
            });
            assert_eq!(count, (1usize << n) - 1);
            assert_eq!(distinct.len(), count);
        }
    }

    #[test]
    fn displays_as_a_linux_list() {
        assert_eq!(m(&[0, 1, 2, 5, 7, 8]).to_string(), "0-2,5,7-8");
        assert_eq!(NumaMask::EMPTY.to_string(), "");
        assert_eq!(format!("{:?}", m(&[3])), "NumaMask(3)");
    }
}
