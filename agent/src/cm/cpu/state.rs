//! The CPU manager's state (the shared pool and the exclusive assignments) and its checkpoint
//! file, `cpu_manager_state`, in kubelet's format.
//!
//! qosd writes kubelet's v2 layout, the one every kubelet from 1.18 to 1.35 writes and 1.36
//! still reads:
//! `{"policyName":"static","defaultCpuSet":"0,5-7","entries":{"<pod uid>":{"<container>":"1-4"}},"checksum":N}`
//! with `N` kubelet's checksum of the Go struct `state.CPUManagerCheckpoint`.
//!
//! It reads every layout kubelet has written: v2; v3 (`podEntries`, checksum under either of
//! the names kubelet 1.36 accepts); v4 (`data` holding the v3 payload as a JSON string, with
//! `dataChecksum`, kubelet 1.36+). A v1 file (entries keyed by container id, kubelet < 1.18)
//! is verified but reported corrupt: its container ids cannot be mapped to pods. Files whose
//! checksum is 0 are accepted unverified, as kubelet accepts them.
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value};

use super::cpuset::Cpus;
use crate::cm::checkpoint::{
    GoValue, RecoveryReason, Restored, ShapeError, json_field, json_string, json_u64,
    kubelet_checksum, kubelet_string_checksum,
};

/// The checkpoint's file name in the kubelet root directory.
pub const CPU_MANAGER_STATE_FILE: &str = "cpu_manager_state";

/// Exclusive CPUs by pod uid, then container name.
pub type Assignments = BTreeMap<String, BTreeMap<String, Cpus>>;

/// The CPU manager's state (kubelet's `stateMemory`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuState {
    /// The shared pool (kubelet's default CPU set).
    pub default_cpus: Cpus,
    /// Exclusive assignments.
    pub assignments: Assignments,
}

impl CpuState {
    /// The container's exclusive CPUs.
    #[must_use]
    pub fn get(&self, pod_uid: &str, container: &str) -> Option<&Cpus> {
        self.assignments.get(pod_uid)?.get(container)
    }

    /// The container's exclusive CPUs, else the shared pool (`GetCPUSetOrDefault`).
    #[must_use]
    pub fn get_or_default(&self, pod_uid: &str, container: &str) -> &Cpus {
        self.get(pod_uid, container).unwrap_or(&self.default_cpus)
    }

    /// Records an exclusive assignment.
    pub fn set(&mut self, pod_uid: &str, container: &str, cpus: Cpus) {
        self.assignments
            .entry(pod_uid.to_owned())
            .or_default()
            .insert(container.to_owned(), cpus);
    }

    /// Forgets an assignment (and the pod once it has none).
    pub fn delete(&mut self, pod_uid: &str, container: &str) {
        if let Some(pod) = self.assignments.get_mut(pod_uid) {
            pod.remove(container);
            if pod.is_empty() {
                self.assignments.remove(pod_uid);
            }
        }
    }

    /// Every exclusively assigned CPU.
    #[must_use]
    pub fn exclusive_cpus(&self) -> Cpus {
        let mut out = Cpus::new();
        for cpus in self.assignments.values().flat_map(BTreeMap::values) {
            out.union_with(cpus);
        }
        out
    }

    /// The number of exclusively assigned CPUs, counting each assignment
    /// (kubelet's `countExclusiveCPUs`).
    #[must_use]
    pub fn exclusive_count(&self) -> usize {
        self.assignments
            .values()
            .flat_map(BTreeMap::values)
            .map(Cpus::len)
            .sum()
    }
}

/// kubelet's v2 file layout, fields in kubelet's order.
#[derive(Serialize)]
struct FileV2<'a> {
    #[serde(rename = "policyName")]
    policy_name: &'a str,
    #[serde(rename = "defaultCpuSet")]
    default_cpu_set: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    entries: BTreeMap<&'a str, BTreeMap<&'a str, String>>,
    checksum: u64,
}

/// Entries as Go decodes them: `None` for a JSON `null` (a nil map).
type RawEntries = Option<BTreeMap<String, Option<BTreeMap<String, String>>>>;

fn entries_value(entries: &RawEntries) -> GoValue {
    GoValue::map(
        "map[string]map[string]string",
        entries.as_ref().map(|pods| {
            pods.iter()
                .map(|(pod, containers)| {
                    (
                        GoValue::string(pod),
                        GoValue::map(
                            "map[string]string",
                            containers.as_ref().map(|c| {
                                c.iter()
                                    .map(|(k, v)| (GoValue::string(k), GoValue::string(v)))
                                    .collect()
                            }),
                        ),
                    )
                })
                .collect()
        }),
    )
}

/// A `cpuset.CPUSet` as spew prints it: `{elems:(map[int]struct {})map[4:{} 5:{}]}`.
fn cpuset_value(cpus: &Cpus) -> GoValue {
    GoValue::structure(
        "cpuset.CPUSet",
        vec![(
            "elems",
            GoValue::map(
                "map[int]struct {}",
                Some(
                    cpus.iter()
                        .map(|c| {
                            (
                                GoValue::int(i64::from(c)),
                                GoValue::structure("struct {}", vec![]),
                            )
                        })
                        .collect(),
                ),
            ),
        )],
    )
}

/// The Go value kubelet hashes for a v2 checkpoint, under type name `type_name`.
fn v2_value(type_name: &str, policy: &str, default: &str, entries: &RawEntries) -> GoValue {
    GoValue::ptr(
        type_name,
        Some(GoValue::structure(
            type_name,
            vec![
                ("PolicyName", GoValue::string(policy)),
                ("DefaultCPUSet", GoValue::string(default)),
                ("Entries", entries_value(entries)),
                ("Checksum", checksum_zero()),
            ],
        )),
    )
}

/// The Go value kubelet hashes for a v3 checkpoint (`PodEntries` added).
fn v3_value(
    type_name: &str,
    policy: &str,
    default: &str,
    entries: &RawEntries,
    pod_entries: &Option<BTreeMap<String, Cpus>>,
) -> GoValue {
    let pods = GoValue::map(
        "state.PodCPUAssignments",
        pod_entries.as_ref().map(|pods| {
            pods.iter()
                .map(|(pod, cpus)| {
                    (
                        GoValue::string(pod),
                        GoValue::structure("state.PodEntry", vec![("CPUSet", cpuset_value(cpus))]),
                    )
                })
                .collect()
        }),
    );
    GoValue::ptr(
        type_name,
        Some(GoValue::structure(
            type_name,
            vec![
                ("PolicyName", GoValue::string(policy)),
                ("DefaultCPUSet", GoValue::string(default)),
                ("Entries", entries_value(entries)),
                ("PodEntries", pods),
                ("Checksum", checksum_zero()),
            ],
        )),
    )
}

fn checksum_zero() -> GoValue {
    GoValue::Uint {
        ty: "checksum.Checksum".to_owned(),
        value: 0,
    }
}

/// kubelet's checksum of a v2 checkpoint (`state.CPUManagerCheckpoint`), the one qosd writes.
#[must_use]
pub fn checksum_v2(policy: &str, default: &str, entries: &RawEntries) -> u64 {
    kubelet_checksum(&v2_value(
        "state.CPUManagerCheckpoint",
        policy,
        default,
        entries,
    ))
}

/// The checkpoint bytes for `state` under `policy` (kubelet's v2 layout and checksum).
pub fn encode(policy: &str, state: &CpuState) -> Result<Vec<u8>, serde_json::Error> {
    let default = state.default_cpus.to_string();
    let entries: BTreeMap<String, Option<BTreeMap<String, String>>> = state
        .assignments
        .iter()
        .map(|(pod, containers)| {
            (
                pod.clone(),
                Some(
                    containers
                        .iter()
                        .map(|(c, cpus)| (c.clone(), cpus.to_string()))
                        .collect(),
                ),
            )
        })
        .collect();
    let checksum = checksum_v2(policy, &default, &Some(entries));
    serde_json::to_vec(&FileV2 {
        policy_name: policy,
        default_cpu_set: default,
        entries: state
            .assignments
            .iter()
            .map(|(pod, containers)| {
                (
                    pod.as_str(),
                    containers
                        .iter()
                        .map(|(c, cpus)| (c.as_str(), cpus.to_string()))
                        .collect(),
                )
            })
            .collect(),
        checksum,
    })
}

/// Checkpoint contents before verification and parsing of the CPU lists.
struct Decoded {
    policy: String,
    default: String,
    entries: RawEntries,
    pod_entries: usize,
}

#[expect(
    clippy::needless_pass_by_value,
    reason = "passed as `or_else(corrupt)` over errors of several types"
)]
fn corrupt<T>(detail: impl ToString) -> Result<T, Restored<CpuState>> {
    Err(Restored::Rebuild {
        reason: RecoveryReason::Corrupt,
        detail: detail.to_string(),
    })
}

fn checksum_mismatch<T>(expected: u64) -> Result<T, Restored<CpuState>> {
    Err(Restored::Rebuild {
        reason: RecoveryReason::Checksum,
        detail: format!(
            "checkpoint is corrupted: stored checksum {expected} does not match the content"
        ),
    })
}

fn parse_entries(value: Option<&Value>) -> Result<RawEntries, ShapeError> {
    match value {
        None => Ok(Some(BTreeMap::new())),
        Some(Value::Null) => Ok(None),
        Some(Value::Object(pods)) => {
            let mut out = BTreeMap::new();
            for (pod, containers) in pods {
                let parsed = match containers {
                    Value::Null => None,
                    Value::Object(c) => {
                        let mut m = BTreeMap::new();
                        for (name, cpus) in c {
                            let Value::String(cpus) = cpus else {
                                return Err(ShapeError::wrong(
                                    format!("entry {pod:?}/{name:?}"),
                                    cpus,
                                    "a CPU list string",
                                ));
                            };
                            m.insert(name.clone(), cpus.clone());
                        }
                        Some(m)
                    }
                    other => {
                        return Err(ShapeError::Unmarshal {
                            found: other.to_string(),
                            field: "CPUManagerCheckpointV2.entries",
                        });
                    }
                };
                out.insert(pod.clone(), parsed);
            }
            Ok(Some(out))
        }
        Some(other) => Err(ShapeError::wrong("entries", other, "an object")),
    }
}

/// `podEntries` of v3/v4: pod uid -> `{"cpuSet": "..."}`.
fn parse_pod_entries(value: Option<&Value>) -> Result<Option<BTreeMap<String, Cpus>>, ShapeError> {
    match value {
        None => Ok(Some(BTreeMap::new())),
        Some(Value::Null) => Ok(None),
        Some(Value::Object(pods)) => {
            let mut out = BTreeMap::new();
            for (pod, entry) in pods {
                let text = match entry {
                    Value::Object(o) => json_string(o, "cpuSet")?,
                    other => {
                        return Err(ShapeError::wrong(
                            format!("podEntries {pod:?}"),
                            other,
                            "an object",
                        ));
                    }
                };
                let cpus = Cpus::parse(&text).map_err(|e| ShapeError::CpuList {
                    what: "pod cpuset",
                    text: text.clone(),
                    reason: e.to_string(),
                })?;
                out.insert(pod.clone(), cpus);
            }
            Ok(Some(out))
        }
        Some(other) => Err(ShapeError::wrong("podEntries", other, "an object")),
    }
}

/// The entries as a v1 file holds them (container id -> CPU list), if they can be read so: an
/// object of strings, possibly empty, or no entries at all.
fn v1_entries(value: Option<&Value>) -> Option<BTreeMap<String, String>> {
    match value {
        None => Some(BTreeMap::new()),
        Some(Value::Object(entries)) => entries
            .iter()
            .map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_owned())))
            .collect(),
        Some(_) => None,
    }
}

/// The Go value kubelet hashes for a v1 checkpoint (name already replaced).
fn v1_value(policy: &str, default: &str, entries: &BTreeMap<String, String>) -> GoValue {
    GoValue::ptr(
        "state.CPUManagerCheckpoint",
        Some(GoValue::structure(
            "state.CPUManagerCheckpoint",
            vec![
                ("PolicyName", GoValue::string(policy)),
                ("DefaultCPUSet", GoValue::string(default)),
                (
                    "Entries",
                    GoValue::map(
                        "map[string]string",
                        Some(
                            entries
                                .iter()
                                .map(|(k, v)| (GoValue::string(k), GoValue::string(v)))
                                .collect(),
                        ),
                    ),
                ),
                ("Checksum", checksum_zero()),
            ],
        )),
    )
}

const V1_UNSUPPORTED: &str =
    "v1 checkpoint (entries keyed by container id, kubelet before 1.18) cannot be mapped to pods";

fn decode_v4(object: &Map<String, Value>) -> Result<Decoded, Restored<CpuState>> {
    let data = json_string(object, "data").or_else(corrupt)?;
    let data_checksum = json_u64(object, "dataChecksum").or_else(corrupt)?;
    let inner: Value = serde_json::from_str(&data).or_else(|e| {
        corrupt(format!(
            "could not load v4 checkpoint: failed to deserialize cpu manager checkpoint data: {e}"
        ))
    })?;
    if kubelet_string_checksum(&data) != data_checksum {
        return checksum_mismatch(data_checksum);
    }
    let Value::Object(inner) = inner else {
        return corrupt("could not load v4 checkpoint: data is not a JSON object");
    };
    let entries = parse_entries(json_field(&inner, "entries")).or_else(corrupt)?;
    let pods = parse_pod_entries(json_field(&inner, "podEntries")).or_else(corrupt)?;
    Ok(Decoded {
        policy: json_string(&inner, "policyName").or_else(corrupt)?,
        default: json_string(&inner, "defaultCpuSet").or_else(corrupt)?,
        entries,
        pod_entries: pods.map_or(0, |p| p.len()),
    })
}

fn decode_legacy(object: &Map<String, Value>) -> Result<Decoded, Restored<CpuState>> {
    let policy = json_string(object, "policyName").or_else(corrupt)?;
    let default = json_string(object, "defaultCpuSet").or_else(corrupt)?;
    let checksum = json_u64(object, "checksum").or_else(corrupt)?;
    let v1 = v1_entries(json_field(object, "entries"));
    if let Some(v1) = v1.as_ref().filter(|e| !e.is_empty()) {
        if checksum != 0 && kubelet_checksum(&v1_value(&policy, &default, v1)) != checksum {
            return checksum_mismatch(checksum);
        }
        return corrupt(V1_UNSUPPORTED);
    }
    let entries = parse_entries(json_field(object, "entries")).or_else(corrupt)?;
    let pods = parse_pod_entries(json_field(object, "podEntries")).or_else(corrupt)?;
    if checksum != 0 {
        let candidates = [
            v2_value("state.CPUManagerCheckpoint", &policy, &default, &entries),
            v2_value("state.CPUManagerCheckpointV2", &policy, &default, &entries),
            v3_value(
                "state.CPUManagerCheckpoint",
                &policy,
                &default,
                &entries,
                &pods,
            ),
            v3_value(
                "state.CPUManagerCheckpointV3",
                &policy,
                &default,
                &entries,
                &pods,
            ),
        ];
        if !candidates.iter().any(|c| kubelet_checksum(c) == checksum) {
            if let Some(v1) = &v1
                && kubelet_checksum(&v1_value(&policy, &default, v1)) == checksum
            {
                return corrupt(V1_UNSUPPORTED);
            }
            return checksum_mismatch(checksum);
        }
    }
    Ok(Decoded {
        policy,
        default,
        entries,
        pod_entries: pods.map_or(0, |p| p.len()),
    })
}

/// Decodes and verifies a checkpoint written by kubelet or qosd for the configured `policy`.
#[must_use]
pub fn decode(bytes: &[u8], policy: &str) -> Restored<CpuState> {
    match decode_inner(bytes, policy) {
        Ok(state) => Restored::State(state),
        Err(rebuild) => rebuild,
    }
}

fn decode_inner(bytes: &[u8], policy: &str) -> Result<CpuState, Restored<CpuState>> {
    let value: Value = serde_json::from_slice(bytes).or_else(|e| corrupt(e.to_string()))?;
    let Value::Object(object) = value else {
        return corrupt("the checkpoint is not a JSON object");
    };
    let decoded = if json_field(&object, "dataChecksum").is_some() {
        decode_v4(&object)?
    } else {
        decode_legacy(&object)?
    };
    if decoded.policy != policy {
        return Err(Restored::Rebuild {
            reason: RecoveryReason::PolicyChanged,
            detail: format!(
                "configured policy {policy:?} differs from state checkpoint policy {:?}",
                decoded.policy
            ),
        });
    }
    let default_cpus = Cpus::parse(&decoded.default).or_else(|e| {
        corrupt(format!(
            "could not parse default CPU set {:?}: {e}",
            decoded.default
        ))
    })?;
    let mut state = CpuState {
        default_cpus,
        assignments: BTreeMap::new(),
    };
    for (pod, containers) in decoded.entries.unwrap_or_default() {
        for (container, text) in containers.unwrap_or_default() {
            let cpus = Cpus::parse(&text).or_else(|e| {
                corrupt(format!(
                    "could not parse cpuset {text:?} for container {container:?} in pod {pod:?}: {e}"
                ))
            })?;
            state.set(&pod, &container, cpus);
        }
    }
    if decoded.pod_entries > 0 {
        return Err(Restored::Rebuild {
            reason: RecoveryReason::Invalid,
            detail: "the checkpoint holds pod-level CPU assignments (podEntries, kubelet's \
                     PodLevelResourceManagers), which qosd does not implement"
                .to_owned(),
        });
    }
    Ok(state)
}

#[cfg(test)]
mod tests;
