//! CPU and memory-node lists in the kernel's list format (`0-3,5,7-8`), as read from and written
//! to `cpuset.cpus`, `cpuset.mems` and their `effective` variants.
//!
//! [`CpuSet`] parses any well-formed list (whitespace around it, such as the trailing newline of
//! a cgroup file, is ignored; the empty list is valid) and always formats canonically: sorted,
//! consecutive ids merged into ranges. The kernel normalises what it reads back the same way, so
//! two lists are equal exactly when their sets are.
use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// Highest CPU or node id accepted. Far above any kernel's `NR_CPUS`; it bounds the memory a
/// malformed range such as `0-4294967295` could otherwise claim.
pub const MAX_ID: u32 = (1 << 16) - 1;

/// A malformed list; each names the whole text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuListError {
    #[error("malformed cpu list {text:?}: {source}")]
    Element {
        text: String,
        #[source]
        source: IdError,
    },
    #[error("malformed cpu list {text:?}: range {element:?} is reversed")]
    Reversed { text: String, element: String },
}

/// A list element that is not an id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("empty element")]
    Empty,
    #[error("{0:?} is not a decimal id")]
    NotDecimal(String),
    #[error("{0} is above the largest accepted id {MAX_ID}")]
    TooLarge(String),
}

/// A set of CPU (or NUMA node) ids.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CpuSet(BTreeSet<u32>);

impl CpuSet {
    /// The empty set.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses a list such as `0-3,5`.
    pub fn parse(text: &str) -> Result<Self, CpuListError> {
        let malformed = |source: IdError| CpuListError::Element {
            text: text.to_owned(),
            source,
        };
        let trimmed = text.trim();
        let mut ids = BTreeSet::new();
        if trimmed.is_empty() {
            return Ok(Self(ids));
        }
        for element in trimmed.split(',') {
            let (first, last) = match element.split_once('-') {
                Some((a, b)) => (
                    parse_id(a).map_err(malformed)?,
                    parse_id(b).map_err(malformed)?,
                ),
                None => {
                    let id = parse_id(element).map_err(malformed)?;
                    (id, id)
                }
            };
            if first > last {
                return Err(CpuListError::Reversed {
                    text: text.to_owned(),
                    element: element.to_owned(),
                });
            }
            ids.extend(first..=last);
        }
        Ok(Self(ids))
    }

    /// Number of ids.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when no id is in the set.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// True when `id` is in the set.
    #[must_use]
    pub fn contains(&self, id: u32) -> bool {
        self.0.contains(&id)
    }

    /// True when every id of `self` is in `other`.
    #[must_use]
    pub fn is_subset(&self, other: &Self) -> bool {
        self.0.is_subset(&other.0)
    }

    /// The ids in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    /// The ids in increasing order, as a vector.
    #[must_use]
    pub fn to_vec(&self) -> Vec<u32> {
        self.iter().collect()
    }
}

/// One id: decimal digits only, at most [`MAX_ID`].
fn parse_id(text: &str) -> Result<u32, IdError> {
    if text.is_empty() {
        return Err(IdError::Empty);
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(IdError::NotDecimal(text.to_owned()));
    }
    match text.parse::<u32>() {
        Ok(id) if id <= MAX_ID => Ok(id),
        _ => Err(IdError::TooLarge(text.to_owned())),
    }
}

impl FromStr for CpuSet {
    type Err = CpuListError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids = self.0.iter().copied().peekable();
        let mut first_range = true;
        while let Some(start) = ids.next() {
            let mut end = start;
            while ids.peek() == Some(&(end + 1)) {
                end += 1;
                ids.next();
            }
            if !first_range {
                f.write_str(",")?;
            }
            first_range = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ranges_singles_and_the_trailing_newline_of_a_cgroup_file() {
        let set = CpuSet::parse("0-3,5,7-8\n").unwrap();
        assert_eq!(set.to_vec(), vec![0, 1, 2, 3, 5, 7, 8]);
        assert_eq!(set.len(), 7);
        assert!(set.contains(5) && !set.contains(4));
    }

    #[test]
    fn formats_canonically_merging_consecutive_ids() {
        let cases = [
            ("0-3,5,7-8", "0-3,5,7-8"),
            ("3,2,1,0", "0-3"),
            ("0,1", "0-1"),
            ("5-5", "5"),
            ("0-2,1-4", "0-4"),
            ("", ""),
            ("  \n", ""),
            ("1,3,5", "1,3,5"),
        ];
        for (input, canonical) in cases {
            assert_eq!(
                CpuSet::parse(input).unwrap().to_string(),
                canonical,
                "{input:?}"
            );
        }
    }

    #[test]
    fn round_trips_through_display() {
        let set: CpuSet = [0, 2, 3, 4, 9, 10, 63].into_iter().collect();
        assert_eq!(set.to_string(), "0,2-4,9-10,63");
        assert_eq!(CpuSet::parse(&set.to_string()).unwrap(), set);
    }

    #[test]
    fn rejects_malformed_lists_naming_the_text() {
        for bad in [
            "0,,1", "1-", "-1", "3-1", "a", "0-3:2/4", "1 2", "0x1", "70000", "0-70000", ",",
        ] {
            let err = CpuSet::parse(bad).expect_err(bad);
            assert!(
                err.to_string().contains(&format!("{bad:?}")),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn subset_is_by_ids() {
        let parent = CpuSet::parse("0-3").unwrap();
        assert!(CpuSet::parse("1,3").unwrap().is_subset(&parent));
        assert!(!CpuSet::parse("3-4").unwrap().is_subset(&parent));
        assert!(CpuSet::new().is_subset(&parent));
    }
}
