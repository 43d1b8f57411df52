//! The Linux CPU list syntax (`0-3,8,10-11`) used by `reservedSystemCPUs` and by
//! `/sys/devices/system/cpu/online`, parsed as `k8s.io/utils/cpuset.Parse` does: comma-separated
//! CPU ids or inclusive `low-high` ranges, no spaces inside, the empty string is the empty set.
use std::collections::BTreeSet;

/// A CPU list that is not in the `0-3,8` syntax; carries the offending text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuListError {
    #[error("CPU list {list:?}: {element:?} is not a CPU id or a low-high range")]
    Malformed { list: String, element: String },
    #[error("CPU list {list:?}: invalid range {element:?} ({low} > {high})")]
    ReversedRange {
        list: String,
        element: String,
        low: u32,
        high: u32,
    },
}

/// Parses a CPU list. Surrounding whitespace (the newline ending a sysfs file) is ignored.
pub fn parse_cpu_list(text: &str) -> Result<BTreeSet<u32>, CpuListError> {
    let list = text.trim();
    let mut cpus = BTreeSet::new();
    if list.is_empty() {
        return Ok(cpus);
    }
    for element in list.split(',') {
        let malformed = || CpuListError::Malformed {
            list: list.to_owned(),
            element: element.to_owned(),
        };
        let parse_id = |s: &str| -> Result<u32, CpuListError> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(malformed());
            }
            s.parse().map_err(|_| malformed())
        };
        match element.split_once('-') {
            None => {
                cpus.insert(parse_id(element)?);
            }
            Some((low, high)) => {
                let (low, high) = (parse_id(low)?, parse_id(high)?);
                if low > high {
                    return Err(CpuListError::ReversedRange {
                        list: list.to_owned(),
                        element: element.to_owned(),
                        low,
                        high,
                    });
                }
                cpus.extend(low..=high);
            }
        }
    }
    Ok(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows mirror `k8s.io/utils/cpuset` `TestParse` (valid and invalid inputs).
    #[test]
    fn parses_like_cpuset_parse() {
        let valid: &[(&str, &[u32])] = &[
            ("", &[]),
            ("5", &[5]),
            ("1,2,3,4,5", &[1, 2, 3, 4, 5]),
            ("1-5", &[1, 2, 3, 4, 5]),
            ("1-2,3-5", &[1, 2, 3, 4, 5]),
            ("5,4,3,2,1", &[1, 2, 3, 4, 5]),
            ("3-6,1-5", &[1, 2, 3, 4, 5, 6]),
            ("3-3,5-5", &[3, 5]),
            ("0-3\n", &[0, 1, 2, 3]),
        ];
        for (text, want) in valid {
            let got = parse_cpu_list(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(got.into_iter().collect::<Vec<_>>(), *want, "{text:?}");
        }
        for bad in [
            "nonnumeric",
            "non-numeric",
            "no,numbers",
            "0-a",
            "a-0",
            ",",
            "1,",
            "1-",
            "-1",
            "1- 2",
        ] {
            let err = parse_cpu_list(bad).expect_err(bad);
            assert!(
                matches!(err, CpuListError::Malformed { .. }),
                "{bad}: {err}"
            );
        }
        let err = parse_cpu_list("5-3").expect_err("reversed");
        assert_eq!(
            err.to_string(),
            "CPU list \"5-3\": invalid range \"5-3\" (5 > 3)"
        );
    }
}
