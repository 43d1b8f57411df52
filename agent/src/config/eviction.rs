//! Hard eviction thresholds (`evictionHard`): signal names, their values (`100Mi` or `10%`) and
//! the quantity a threshold stands for on a node of a given capacity, as kubelet's
//! `pkg/kubelet/eviction/helpers.go` (`ParseThresholdConfig`) and
//! `pkg/kubelet/eviction/api/types.go` (`GetThresholdQuantity`) define them.
//!
//! qosd does not evict; it only needs the thresholds because `memory.available` is part of the
//! node allocatable reservation (and `pid.available` of qosd's pid allocatable).
use std::collections::BTreeMap;
use std::fmt;

use crate::pods::quantity::Quantity;

/// kubelet's Linux default for `evictionHard` (`pkg/kubelet/eviction/defaults_linux.go`), used
/// when the configuration does not set the field (or merged under it with
/// `mergeDefaultEvictionSettings: true`).
pub const DEFAULT_EVICTION_HARD: &[(&str, &str)] = &[
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
    ("imagefs.inodesFree", "5%"),
];

/// Errors parsing one threshold statement; the messages are kubelet's.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ThresholdError {
    #[error("unsupported eviction signal {0}")]
    UnsupportedSignal(String),
    #[error("eviction percentage threshold {signal} {value:?} is not a number")]
    MalformedPercentage { signal: Signal, value: String },
    #[error("eviction percentage threshold {signal} must be >= 0%: {value}")]
    NegativePercentage { signal: Signal, value: String },
    #[error("eviction percentage threshold {signal} must be <= 100%: {value}")]
    PercentageAbove100 { signal: Signal, value: String },
    #[error("eviction threshold {signal}: {source}")]
    Quantity {
        signal: Signal,
        source: crate::pods::quantity::QuantityError,
    },
    #[error("eviction threshold {signal} must be positive: {value}")]
    NotPositive { signal: Signal, value: String },
}

/// An eviction signal kubelet accepts in `evictionHard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    MemoryAvailable,
    AllocatableMemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    ContainerFsAvailable,
    ContainerFsInodesFree,
    PidAvailable,
}

impl Signal {
    /// Every signal, in kubelet's declaration order.
    pub const ALL: [Signal; 9] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::ContainerFsAvailable,
        Signal::ContainerFsInodesFree,
        Signal::PidAvailable,
    ];

    /// The name used in the configuration (`memory.available`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::ContainerFsAvailable => "containerfs.available",
            Signal::ContainerFsInodesFree => "containerfs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    /// The signal of a configuration name, `None` for names kubelet does not know.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A threshold's value: an absolute quantity or a fraction of capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ThresholdValue {
    Quantity(Quantity),
    /// A fraction in (0, 1), held as `float32` like kubelet so percentages of large capacities
    /// round exactly as kubelet's do (5% of 10Gi is 536870920, not 536870912).
    Percentage(f32),
}

impl ThresholdValue {
    /// The threshold in units (bytes, pids) on a resource of `capacity` units
    /// (`evictionapi.GetThresholdQuantity`: a percentage is truncated toward zero).
    #[must_use]
    pub fn units_of(&self, capacity: i64) -> i64 {
        match self {
            ThresholdValue::Quantity(q) => q.value(),
            // Float-to-int `as` truncates toward zero and saturates, like Go's int64(float64).
            ThresholdValue::Percentage(p) => (capacity as f64 * f64::from(*p)) as i64,
        }
    }
}

/// One hard eviction threshold (`signal < value`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: ThresholdValue,
}

/// Parses one `signal: value` statement like kubelet's `parseThresholdStatement`: `Ok(None)` for
/// `0%` and `100%`, which kubelet ignores (that is how a default is switched off).
pub fn parse_threshold(signal: &str, value: &str) -> Result<Option<Threshold>, ThresholdError> {
    let signal = Signal::from_name(signal)
        .ok_or_else(|| ThresholdError::UnsupportedSignal(signal.to_owned()))?;
    if value.ends_with('%') {
        if value == "0%" || value == "100%" {
            return Ok(None);
        }
        // Go: strconv.ParseFloat(strings.TrimRight(value, "%"), 32), then float32(v) / 100.
        let number: f32 = value
            .trim_end_matches('%')
            .parse()
            .ok()
            .filter(|n: &f32| !n.is_nan())
            .ok_or_else(|| ThresholdError::MalformedPercentage {
                signal,
                value: value.to_owned(),
            })?;
        let fraction = number / 100.0;
        if fraction < 0.0 {
            return Err(ThresholdError::NegativePercentage {
                signal,
                value: value.to_owned(),
            });
        }
        if fraction > 1.0 {
            return Err(ThresholdError::PercentageAbove100 {
                signal,
                value: value.to_owned(),
            });
        }
        return Ok(Some(Threshold {
            signal,
            value: ThresholdValue::Percentage(fraction),
        }));
    }
    let quantity =
        Quantity::parse(value).map_err(|source| ThresholdError::Quantity { signal, source })?;
    if quantity.is_negative() || quantity.is_zero() {
        return Err(ThresholdError::NotPositive {
            signal,
            value: value.to_owned(),
        });
    }
    Ok(Some(Threshold {
        signal,
        value: ThresholdValue::Quantity(quantity),
    }))
}

/// Parses a whole `evictionHard` map; the error names the signal whose value is wrong.
pub fn parse_thresholds(
    statements: &BTreeMap<String, String>,
) -> Result<Vec<Threshold>, ThresholdError> {
    let mut thresholds = Vec::new();
    for (signal, value) in statements {
        if let Some(threshold) = parse_threshold(signal, value)? {
            thresholds.push(threshold);
        }
    }
    Ok(thresholds)
}

/// The threshold of `signal` in a list, if any.
#[must_use]
pub fn threshold_for(thresholds: &[Threshold], signal: Signal) -> Option<&Threshold> {
    thresholds.iter().find(|t| t.signal == signal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statements(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Rows mirror kubelet's eviction `helpers_test.go` `TestParseThresholdConfig` (hard
    /// thresholds only: qosd reads neither evictionSoft nor evictionMinimumReclaim).
    #[test]
    fn parses_like_parse_threshold_config() {
        type Want = Result<Vec<(Signal, ThresholdValue)>, &'static str>;
        type Case = (&'static str, Vec<(&'static str, &'static str)>, Want);
        let mib = |n: i64| ThresholdValue::Quantity(Quantity::from_units(n << 20));
        let gib = |n: i64| ThresholdValue::Quantity(Quantity::from_units(n << 30));
        let cases: Vec<Case> = vec![
            ("no values", vec![], Ok(vec![])),
            (
                "all memory eviction values",
                vec![("memory.available", "150Mi")],
                Ok(vec![(Signal::MemoryAvailable, mib(150))]),
            ),
            (
                "all memory eviction values in percentages",
                vec![("memory.available", "10%")],
                Ok(vec![(
                    Signal::MemoryAvailable,
                    ThresholdValue::Percentage(0.1),
                )]),
            ),
            (
                "disk eviction values",
                vec![
                    ("imagefs.available", "150Mi"),
                    ("nodefs.available", "100Mi"),
                ],
                Ok(vec![
                    (Signal::ImageFsAvailable, mib(150)),
                    (Signal::NodeFsAvailable, mib(100)),
                ]),
            ),
            (
                "disk eviction values in percentages",
                vec![("imagefs.available", "15%"), ("nodefs.available", "10.5%")],
                Ok(vec![
                    (Signal::ImageFsAvailable, ThresholdValue::Percentage(0.15)),
                    (Signal::NodeFsAvailable, ThresholdValue::Percentage(0.105)),
                ]),
            ),
            (
                "inode eviction values",
                vec![
                    ("imagefs.inodesFree", "150Mi"),
                    ("nodefs.inodesFree", "100Mi"),
                ],
                Ok(vec![
                    (Signal::ImageFsInodesFree, mib(150)),
                    (Signal::NodeFsInodesFree, mib(100)),
                ]),
            ),
            (
                "disable via 0%",
                vec![("memory.available", "0%")],
                Ok(vec![]),
            ),
            (
                "disable via 100%",
                vec![("memory.available", "100%")],
                Ok(vec![]),
            ),
            (
                "invalid-signal",
                vec![("mem.available", "150Mi")],
                Err("unsupported eviction signal mem.available"),
            ),
            (
                "hard-signal-negative",
                vec![("memory.available", "-150Mi")],
                Err("eviction threshold memory.available must be positive: -150Mi"),
            ),
            (
                "hard-signal-negative-percentage",
                vec![("memory.available", "-15%")],
                Err("eviction percentage threshold memory.available must be >= 0%: -15%"),
            ),
            (
                "hard-signal-above-100-percentage",
                vec![("memory.available", "150%")],
                Err("eviction percentage threshold memory.available must be <= 100%: 150%"),
            ),
            (
                "pid eviction",
                vec![("pid.available", "1000")],
                Ok(vec![(
                    Signal::PidAvailable,
                    ThresholdValue::Quantity(Quantity::from_units(1000)),
                )]),
            ),
            (
                "zero quantity",
                vec![("memory.available", "0")],
                Err("eviction threshold memory.available must be positive: 0"),
            ),
            (
                "gibibytes",
                vec![("memory.available", "1Gi")],
                Ok(vec![(Signal::MemoryAvailable, gib(1))]),
            ),
        ];
        for (name, input, want) in cases {
            let got = parse_thresholds(&statements(&input));
            match (got, want) {
                (Ok(got), Ok(want)) => {
                    let mut got: Vec<_> = got.into_iter().map(|t| (t.signal, t.value)).collect();
                    let mut want = want;
                    got.sort_by_key(|(s, _)| *s);
                    want.sort_by_key(|(s, _)| *s);
                    assert_eq!(got, want, "{name}");
                }
                (Err(err), Err(want)) => assert_eq!(err.to_string(), want, "{name}"),
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// `GetThresholdQuantity` through a float32 percentage, as in kubelet's
    /// `TestNodeAllocatableReservationForScheduling` (5% of 10Gi = 536870920).
    #[test]
    fn percentage_of_capacity_rounds_like_kubelet() {
        let five = parse_threshold("memory.available", "5%").unwrap().unwrap();
        assert_eq!(five.value.units_of(10 << 30), 536_870_920);
        let ten = parse_threshold("pid.available", "10%").unwrap().unwrap();
        assert_eq!(ten.value.units_of(4_194_304), 419_430);
        let abs = parse_threshold("memory.available", "100Mi")
            .unwrap()
            .unwrap();
        assert_eq!(abs.value.units_of(10 << 30), 100 << 20);
    }

    #[test]
    fn every_signal_round_trips_by_name() {
        for signal in Signal::ALL {
            assert_eq!(Signal::from_name(signal.as_str()), Some(signal));
        }
        for (signal, value) in DEFAULT_EVICTION_HARD {
            assert!(
                parse_threshold(signal, value).unwrap().is_some(),
                "{signal}"
            );
        }
    }

    #[test]
    fn malformed_percentage_is_an_error() {
        for bad in ["abc%", "%", "NaN%"] {
            let err = parse_threshold("memory.available", bad).expect_err(bad);
            assert!(
                matches!(err, ThresholdError::MalformedPercentage { .. }),
                "{bad}: {err}"
            );
        }
        let err = parse_threshold("memory.available", "5x").expect_err("5x");
        assert!(err.to_string().contains("5x"), "{err}");
    }
}
