//! Kernel surprises on demand, for the system tests: `QOSD_TEST_FAULTS` makes the real kernel
//! refuse or fill what it otherwise accepts, so the tests can show that qosd degrades the one
//! part that failed and keeps the rest. Never set it on a production node: `qosd run` and
//! `qosd check` warn when it is set.
//!
//! The value is a comma-separated list of `key=value` items:
//!
//! - `map-entries=MAP:N`: the kernel creates map `MAP` (a name from `qosd_common::names`, for
//!   example `CGROUP_CPU_NS`) with room for `N` entries instead of its capacity, so it fills
//!   after `N` cgroups; the programs then count dropped events and log that the map is full.
//! - `tp-btf-target=TRACEPOINT`: the BTF-typed flavour of the sched_switch handler is loaded
//!   against `TRACEPOINT` instead of `sched_switch`. Against a tracepoint with fewer arguments
//!   (`sched_wakeup` has one) the verifier refuses the program, and qosd falls back to the raw
//!   tracepoint flavour.
use std::sync::OnceLock;

/// The environment variable that holds the faults.
pub const FAULTS_VAR: &str = "QOSD_TEST_FAULTS";

/// A malformed `QOSD_TEST_FAULTS`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FaultError {
    #[error("{FAULTS_VAR}: item {item:?} is not key=value")]
    NotKeyValue { item: String },
    #[error("{FAULTS_VAR}: unknown key {key:?} (map-entries, tp-btf-target)")]
    UnknownKey { key: String },
    #[error("{FAULTS_VAR}: map-entries={value:?}: want MAP:N with N a positive number")]
    MapEntries { value: String },
    #[error(
        "{FAULTS_VAR}: map-entries names {map:?}, which is none of the programs' maps ({known})"
    )]
    UnknownMap { map: String, known: String },
    #[error("{FAULTS_VAR}: tp-btf-target is empty")]
    EmptyTarget,
}

/// The faults asked for; empty when the variable is unset.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProbeFaults {
    /// Maps created smaller than their capacity: (map name, entries).
    pub map_entries: Vec<(String, u32)>,
    /// The tracepoint the BTF-typed sched_switch program is loaded against.
    pub tp_btf_target: Option<String>,
}

impl ProbeFaults {
    /// Parses the variable's value.
    pub fn parse(value: &str) -> Result<Self, FaultError> {
        let mut faults = Self::default();
        for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| FaultError::NotKeyValue {
                    item: item.to_owned(),
                })?;
            match key.trim() {
                "map-entries" => {
                    let bad = || FaultError::MapEntries {
                        value: value.to_owned(),
                    };
                    let (map, entries) = value.split_once(':').ok_or_else(bad)?;
                    let entries: u32 = entries.trim().parse().map_err(|_| bad())?;
                    let map = map.trim();
                    if map.is_empty() || entries == 0 {
                        return Err(bad());
                    }
                    if !super::MAP_USERS.iter().any(|(name, _)| *name == map) {
                        let known: Vec<&str> =
                            super::MAP_USERS.iter().map(|(name, _)| *name).collect();
                        return Err(FaultError::UnknownMap {
                            map: map.to_owned(),
                            known: known.join(", "),
                        });
                    }
                    faults.map_entries.push((map.to_owned(), entries));
                }
                "tp-btf-target" => {
                    let target = value.trim();
                    if target.is_empty() {
                        return Err(FaultError::EmptyTarget);
                    }
                    faults.tp_btf_target = Some(target.to_owned());
                }
                other => {
                    return Err(FaultError::UnknownKey {
                        key: other.to_owned(),
                    });
                }
            }
        }
        Ok(faults)
    }

    /// Whether any fault is asked for.
    #[must_use]
    pub fn any(&self) -> bool {
        !self.map_entries.is_empty() || self.tp_btf_target.is_some()
    }
}

/// The faults of this process's environment, parsed once.
pub fn active() -> Result<&'static ProbeFaults, FaultError> {
    static FAULTS: OnceLock<Result<ProbeFaults, FaultError>> = OnceLock::new();
    FAULTS
        .get_or_init(|| match std::env::var(FAULTS_VAR) {
            Ok(value) => ProbeFaults::parse(&value),
            Err(_) => Ok(ProbeFaults::default()),
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Says once, loudly, that faults are injected (or that the variable is malformed).
pub fn warn_if_active() -> Result<(), FaultError> {
    let faults = active()?;
    if faults.any() {
        tracing::warn!(
            variable = FAULTS_VAR,
            ?faults,
            "fault injection for tests is active: the kernel is made to refuse or fill what it would accept"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_key() {
        let faults =
            ProbeFaults::parse("map-entries=CGROUP_CPU_NS:1, tp-btf-target=sched_wakeup").unwrap();
        assert_eq!(faults.map_entries, vec![("CGROUP_CPU_NS".to_owned(), 1)]);
        assert_eq!(faults.tp_btf_target.as_deref(), Some("sched_wakeup"));
        assert!(faults.any());
        assert!(!ProbeFaults::parse("").unwrap().any());
    }

    #[test]
    fn malformed_items_are_named() {
        assert_eq!(
            ProbeFaults::parse("map-entries=CGROUP_CPU_NS"),
            Err(FaultError::MapEntries {
                value: "CGROUP_CPU_NS".into()
            })
        );
        assert_eq!(
            ProbeFaults::parse("map-entries=X:0"),
            Err(FaultError::MapEntries {
                value: "X:0".into()
            })
        );
        let unknown = ProbeFaults::parse("map-entries=CGROUP_CPU:1").unwrap_err();
        assert!(
            matches!(&unknown, FaultError::UnknownMap { map, known } if map == "CGROUP_CPU" && known.contains("CGROUP_CPU_NS")),
            "{unknown}"
        );
        assert_eq!(
            ProbeFaults::parse("verifier"),
            Err(FaultError::NotKeyValue {
                item: "verifier".into()
            })
        );
        assert_eq!(
            ProbeFaults::parse("full=1"),
            Err(FaultError::UnknownKey { key: "full".into() })
        );
        assert_eq!(
            ProbeFaults::parse("tp-btf-target= "),
            Err(FaultError::EmptyTarget)
        );
    }
}
