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
