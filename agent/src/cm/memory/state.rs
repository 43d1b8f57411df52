//! The memory manager's state (per-NUMA-node accounting and per-container memory blocks) and
//! its checkpoint file, `memory_manager_state`, in kubelet's format.
//!
//! qosd writes kubelet's v1 layout, the one kubelet 1.21-1.35 writes and 1.36 still reads:
//! `{"policyName":"Static","machineState":{"0":{"numberOfAssignments":1,"memoryMap":{"memory":
//! {"total":..,"systemReserved":..,"allocatable":..,"reserved":..,"free":..}},"cells":[0]}},
//! "entries":{"<pod uid>":{"<container>":[{"numaAffinity":[0],"type":"memory","size":N}]}},
//! "checksum":N}` with `N` kubelet's checksum of `state.MemoryManagerCheckpoint`.
//!
//! It reads that layout, v2 (an empty `podEntries`), and kubelet 1.36's v3 (`data` with
//! `dataChecksum`). The checksum of a file read is computed from the JSON as Go decodes it
//! (`null` and absent members become nil maps and slices, which spew prints differently from
//! empty ones), so files kubelet wrote verify exactly.
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::cm::checkpoint::{
    GoValue, RecoveryReason, Restored, ShapeError, json_field, json_string, json_u64,
    kubelet_checksum, kubelet_string_checksum,
};

/// The checkpoint's file name in the kubelet root directory.
pub const MEMORY_MANAGER_STATE_FILE: &str = "memory_manager_state";

/// Memory accounting of one resource (`memory`, `hugepages-2Mi`, ...) on one NUMA node
/// (kubelet's `MemoryTable`), in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MemoryTable {
    #[serde(rename = "total")]
    pub total: u64,
    #[serde(rename = "systemReserved")]
    pub system_reserved: u64,
    pub allocatable: u64,
    pub reserved: u64,
    pub free: u64,
}

/// One NUMA node (kubelet's `NUMANodeState`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NumaNodeState {
    /// Memory blocks placed on this node (one per resource per container).
    #[serde(rename = "numberOfAssignments")]
    pub number_of_assignments: i64,
    #[serde(rename = "memoryMap")]
    pub memory_map: BTreeMap<String, MemoryTable>,
    /// The group of nodes this node's allocations span (itself when single-node).
    pub cells: Vec<u32>,
}

/// NUMA node id -> state.
pub type NumaNodeMap = BTreeMap<u32, NumaNodeState>;

/// Memory of one resource given to a container on a set of NUMA nodes (kubelet's `Block`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Block {
    #[serde(rename = "numaAffinity")]
    pub numa_affinity: Vec<u32>,
    #[serde(rename = "type")]
    pub resource: String,
    pub size: u64,
}

/// Blocks by pod uid, then container name.
pub type MemoryAssignments = BTreeMap<String, BTreeMap<String, Vec<Block>>>;

/// The memory manager's state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryState {
    pub machine: NumaNodeMap,
    pub assignments: MemoryAssignments,
}

impl MemoryState {
    /// The container's blocks.
    #[must_use]
    pub fn blocks(&self, pod_uid: &str, container: &str) -> Option<&Vec<Block>> {
        self.assignments.get(pod_uid)?.get(container)
    }

    /// Records the container's blocks.
    pub fn set_blocks(&mut self, pod_uid: &str, container: &str, blocks: Vec<Block>) {
        self.assignments
            .entry(pod_uid.to_owned())
            .or_default()
            .insert(container.to_owned(), blocks);
    }

    /// Forgets the container's blocks.
    pub fn delete(&mut self, pod_uid: &str, container: &str) {
        if let Some(pod) = self.assignments.get_mut(pod_uid) {
            pod.remove(container);
            if pod.is_empty() {
                self.assignments.remove(pod_uid);
            }
        }
    }
}

#[derive(Serialize)]
struct FileV1<'a> {
    #[serde(rename = "policyName")]
    policy_name: &'a str,
    #[serde(rename = "machineState")]
    machine_state: &'a NumaNodeMap,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    entries: &'a MemoryAssignments,
    checksum: u64,
}

fn ints(values: &[u32]) -> Vec<GoValue> {
    values.iter().map(|&v| GoValue::int(i64::from(v))).collect()
}

fn table_value(t: &MemoryTable) -> GoValue {
    GoValue::structure(
        "state.MemoryTable",
        vec![
            ("TotalMemSize", GoValue::uint64(t.total)),
            ("SystemReserved", GoValue::uint64(t.system_reserved)),
            ("Allocatable", GoValue::uint64(t.allocatable)),
            ("Reserved", GoValue::uint64(t.reserved)),
            ("Free", GoValue::uint64(t.free)),
        ],
    )
}

fn node_value(n: &NumaNodeState) -> GoValue {
    GoValue::structure(
        "state.NUMANodeState",
        vec![
            ("NumberOfAssignments", GoValue::int(n.number_of_assignments)),
            (
                "MemoryMap",
                GoValue::map(
                    "map[v1.ResourceName]*state.MemoryTable",
                    Some(
                        n.memory_map
                            .iter()
                            .map(|(r, t)| {
                                (
                                    GoValue::named_string("v1.ResourceName", r),
                                    GoValue::ptr("state.MemoryTable", Some(table_value(t))),
                                )
                            })
                            .collect(),
                    ),
                ),
            ),
            ("Cells", GoValue::slice("[]int", Some(ints(&n.cells)))),
        ],
    )
}

fn block_value(b: &Block) -> GoValue {
    GoValue::structure(
        "state.Block",
        vec![
            (
                "NUMAAffinity",
                GoValue::slice("[]int", Some(ints(&b.numa_affinity))),
            ),
            (
                "Type",
                GoValue::named_string("v1.ResourceName", &b.resource),
            ),
            ("Size", GoValue::uint64(b.size)),
        ],
    )
}

fn checkpoint_value(
    type_name: &str,
    policy: &str,
    machine: GoValue,
    entries: GoValue,
    pod_entries: Option<GoValue>,
) -> GoValue {
    let mut fields = vec![
        ("PolicyName", GoValue::string(policy)),
        ("MachineState", machine),
        ("Entries", entries),
    ];
    if let Some(p) = pod_entries {
        fields.push(("PodEntries", p));
    }
    fields.push((
        "Checksum",
        GoValue::Uint {
            ty: "checksum.Checksum".to_owned(),
            value: 0,
        },
    ));
    GoValue::ptr(type_name, Some(GoValue::structure(type_name, fields)))
}

fn machine_value(machine: &NumaNodeMap) -> GoValue {
    GoValue::map(
        "state.NUMANodeMap",
        Some(
            machine
                .iter()
                .map(|(id, n)| {
                    (
                        GoValue::int(i64::from(*id)),
                        GoValue::ptr("state.NUMANodeState", Some(node_value(n))),
                    )
                })
                .collect(),
        ),
    )
}

fn entries_value(entries: &MemoryAssignments) -> GoValue {
    GoValue::map(
        "state.ContainerMemoryAssignments",
        Some(
            entries
                .iter()
                .map(|(pod, containers)| {
                    (
                        GoValue::string(pod),
                        GoValue::map(
                            "map[string][]state.Block",
                            Some(
                                containers
                                    .iter()
                                    .map(|(c, blocks)| {
                                        (
                                            GoValue::string(c),
                                            GoValue::slice(
                                                "[]state.Block",
                                                Some(blocks.iter().map(block_value).collect()),
                                            ),
                                        )
                                    })
                                    .collect(),
                            ),
                        ),
                    )
                })
                .collect(),
        ),
    )
}

/// kubelet's checksum of a v1 checkpoint holding `state` under `policy`.
#[must_use]
pub fn checksum_v1(policy: &str, state: &MemoryState) -> u64 {
    kubelet_checksum(&checkpoint_value(
        "state.MemoryManagerCheckpoint",
        policy,
        machine_value(&state.machine),
        entries_value(&state.assignments),
        None,
    ))
}

/// The checkpoint bytes for `state` under `policy` (kubelet's v1 layout and checksum).
pub fn encode(policy: &str, state: &MemoryState) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(&FileV1 {
        policy_name: policy,
        machine_state: &state.machine,
        entries: &state.assignments,
        checksum: checksum_v1(policy, state),
    })
}

/// A Go-side decoding error: the file does not have the shape kubelet's types need.
type Shape<T> = Result<T, ShapeError>;

fn as_object<'a>(v: &'a Value, what: &str) -> Shape<&'a Map<String, Value>> {
    v.as_object()
        .ok_or_else(|| ShapeError::wrong(what, v, "an object"))
}

fn int_list(v: Option<&Value>, what: &str) -> Shape<Option<Vec<u32>>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| ShapeError::wrong(what, i, "a NUMA node id"))
            })
            .collect::<Shape<Vec<u32>>>()
            .map(Some),
        Some(other) => Err(ShapeError::wrong(what, other, "an array")),
    }
}

fn u64_field(o: &Map<String, Value>, name: &str) -> Shape<u64> {
    json_u64(o, name)
}

fn int_field(o: &Map<String, Value>, name: &str) -> Shape<i64> {
    match json_field(o, name) {
        None | Some(Value::Null) => Ok(0),
        Some(v) => v
            .as_i64()
            .ok_or_else(|| ShapeError::wrong(format!("field {name:?}"), v, "an integer")),
    }
}

/// The machine state as Go decodes it: its checksum value and the typed state.
fn decode_machine(v: Option<&Value>) -> Shape<(GoValue, NumaNodeMap)> {
    let mut typed = NumaNodeMap::new();
    let entries = match v {
        None => Some(Vec::new()),
        Some(Value::Null) => None,
        Some(v) => {
            let mut entries = Vec::new();
            for (key, node) in as_object(v, "machineState")? {
                let id: u32 = key.parse().map_err(|_| ShapeError::WrongType {
                    what: "machineState: NUMA node key".to_owned(),
                    found: format!("{key:?}"),
                    expected: "a number",
                })?;
                let node_go = match node {
                    Value::Null => GoValue::ptr("state.NUMANodeState", None),
                    other => {
                        let o = as_object(other, "machineState node")?;
                        let (map_go, map) = match json_field(o, "memoryMap") {
                            None | Some(Value::Null) => (None, BTreeMap::new()),
                            Some(m) => {
                                let mut go = Vec::new();
                                let mut map = BTreeMap::new();
                                for (resource, table) in as_object(m, "memoryMap")? {
                                    let table_go = match table {
                                        Value::Null => GoValue::ptr("state.MemoryTable", None),
                                        t => {
                                            let t = as_object(t, "memory table")?;
                                            let table = MemoryTable {
                                                total: u64_field(t, "total")?,
                                                system_reserved: u64_field(t, "systemReserved")?,
                                                allocatable: u64_field(t, "allocatable")?,
                                                reserved: u64_field(t, "reserved")?,
                                                free: u64_field(t, "free")?,
                                            };
                                            map.insert(resource.clone(), table);
                                            GoValue::ptr(
                                                "state.MemoryTable",
                                                Some(table_value(&table)),
                                            )
                                        }
                                    };
                                    go.push((
                                        GoValue::named_string("v1.ResourceName", resource),
                                        table_go,
                                    ));
                                }
                                (Some(go), map)
                            }
                        };
                        let cells = int_list(json_field(o, "cells"), "cells")?;
                        let state = NumaNodeState {
                            number_of_assignments: int_field(o, "numberOfAssignments")?,
                            memory_map: map,
                            cells: cells.clone().unwrap_or_default(),
                        };
                        let go = GoValue::structure(
                            "state.NUMANodeState",
                            vec![
                                (
                                    "NumberOfAssignments",
                                    GoValue::int(state.number_of_assignments),
                                ),
                                (
                                    "MemoryMap",
                                    GoValue::map("map[v1.ResourceName]*state.MemoryTable", map_go),
                                ),
                                ("Cells", GoValue::slice("[]int", cells.as_deref().map(ints))),
                            ],
                        );
                        typed.insert(id, state);
                        GoValue::ptr("state.NUMANodeState", Some(go))
                    }
                };
                entries.push((GoValue::int(i64::from(id)), node_go));
            }
            Some(entries)
        }
    };
    Ok((GoValue::map("state.NUMANodeMap", entries), typed))
}

/// The entries as Go decodes them: checksum value and typed assignments.
fn decode_entries(v: Option<&Value>) -> Shape<(GoValue, MemoryAssignments)> {
    let mut typed = MemoryAssignments::new();
    let pods = match v {
        None => Some(Vec::new()),
        Some(Value::Null) => None,
        Some(v) => {
            let mut pods = Vec::new();
            for (pod, containers) in as_object(v, "entries")? {
                let containers_go = match containers {
                    Value::Null => None,
                    c => {
                        let mut list = Vec::new();
                        for (name, blocks) in as_object(c, "entries pod")? {
                            let blocks_go = match blocks {
                                Value::Null => None,
                                Value::Array(items) => {
                                    let mut go = Vec::new();
                                    let mut typed_blocks = Vec::new();
                                    for item in items {
                                        let o = as_object(item, "memory block")?;
                                        let affinity = int_list(
                                            json_field(o, "numaAffinity"),
                                            "numaAffinity",
                                        )?;
                                        let block = Block {
                                            numa_affinity: affinity.clone().unwrap_or_default(),
                                            resource: json_string(o, "type")?,
                                            size: u64_field(o, "size")?,
                                        };
                                        go.push(GoValue::structure(
                                            "state.Block",
                                            vec![
                                                (
                                                    "NUMAAffinity",
                                                    GoValue::slice(
                                                        "[]int",
                                                        affinity.as_deref().map(ints),
                                                    ),
                                                ),
                                                (
                                                    "Type",
                                                    GoValue::named_string(
                                                        "v1.ResourceName",
                                                        &block.resource,
                                                    ),
                                                ),
                                                ("Size", GoValue::uint64(block.size)),
                                            ],
                                        ));
                                        typed_blocks.push(block);
                                    }
                                    typed
                                        .entry(pod.clone())
                                        .or_default()
                                        .insert(name.clone(), typed_blocks);
                                    Some(go)
                                }
                                other => {
                                    return Err(ShapeError::wrong("blocks", other, "an array"));
                                }
                            };
                            list.push((
                                GoValue::string(name),
                                GoValue::slice("[]state.Block", blocks_go),
                            ));
                        }
                        Some(list)
                    }
                };
                pods.push((
                    GoValue::string(pod),
                    GoValue::map("map[string][]state.Block", containers_go),
                ));
            }
            Some(pods)
        }
    };
    Ok((
        GoValue::map("state.ContainerMemoryAssignments", pods),
        typed,
    ))
}

fn rebuild<T>(
    reason: RecoveryReason,
    detail: impl Into<String>,
) -> Result<T, Restored<MemoryState>> {
    Err(Restored::Rebuild {
        reason,
        detail: detail.into(),
    })
}

fn pod_entries_present(o: &Map<String, Value>) -> bool {
    json_field(o, "podEntries").is_some_and(|v| v.as_object().is_some_and(|m| !m.is_empty()))
}

const POD_LEVEL: &str = "the checkpoint holds pod-level memory assignments (podEntries, kubelet's \
                         PodLevelResourceManagers), which qosd does not implement";

/// Decodes and verifies a checkpoint written by kubelet or qosd for the configured `policy`
/// (`None` or `Static`).
#[must_use]
pub fn decode(bytes: &[u8], policy: &str) -> Restored<MemoryState> {
    match decode_inner(bytes, policy) {
        Ok(s) => Restored::State(s),
        Err(r) => r,
    }
}

fn decode_inner(bytes: &[u8], policy: &str) -> Result<MemoryState, Restored<MemoryState>> {
    // Shape errors and the JSON parser's alike become the recovery's detail.
    #[expect(
        clippy::needless_pass_by_value,
        reason = "passed as `map_err(corrupt)` over errors of several types"
    )]
    fn corrupt(e: impl ToString) -> Restored<MemoryState> {
        Restored::Rebuild {
            reason: RecoveryReason::Corrupt,
            detail: e.to_string(),
        }
    }
    let value: Value = serde_json::from_slice(bytes).map_err(corrupt)?;
    let outer = as_object(&value, "checkpoint").map_err(corrupt)?;
    let (name, state) = if json_field(outer, "dataChecksum").is_some() {
        let data = json_string(outer, "data").map_err(corrupt)?;
        let expected = json_u64(outer, "dataChecksum").map_err(corrupt)?;
        let inner: Value = serde_json::from_str(&data).map_err(|e| {
            corrupt(format!(
                "could not load v3 checkpoint: failed to deserialize memory manager checkpoint data: {e}"
            ))
        })?;
        if kubelet_string_checksum(&data) != expected {
            return rebuild(
                RecoveryReason::Checksum,
                format!(
                    "checkpoint is corrupted: stored checksum {expected} does not match the content"
                ),
            );
        }
        let inner = as_object(&inner, "data").map_err(corrupt)?;
        if pod_entries_present(inner) {
            return rebuild(RecoveryReason::Invalid, POD_LEVEL);
        }
        let (_, machine) = decode_machine(json_field(inner, "machineState")).map_err(corrupt)?;
        let (_, assignments) = decode_entries(json_field(inner, "entries")).map_err(corrupt)?;
        (
            json_string(inner, "policyName").map_err(corrupt)?,
            MemoryState {
                machine,
                assignments,
            },
        )
    } else {
        if pod_entries_present(outer) {
            return rebuild(RecoveryReason::Invalid, POD_LEVEL);
        }
        let name = json_string(outer, "policyName").map_err(corrupt)?;
        let checksum = json_u64(outer, "checksum").map_err(corrupt)?;
        let (machine_go, machine) =
            decode_machine(json_field(outer, "machineState")).map_err(corrupt)?;
        let (entries_go, assignments) =
            decode_entries(json_field(outer, "entries")).map_err(corrupt)?;
        let empty_pods = GoValue::map("state.PodMemoryAssignments", Some(Vec::new()));
        let v1 = checkpoint_value(
            "state.MemoryManagerCheckpoint",
            &name,
            machine_go.clone(),
            entries_go.clone(),
            None,
        );
        let v2 = checkpoint_value(
            "state.MemoryManagerCheckpoint",
            &name,
            machine_go,
            entries_go,
            Some(empty_pods),
        );
        let verified =
            checksum == 0 || kubelet_checksum(&v1) == checksum || kubelet_checksum(&v2) == checksum;
        if !verified {
            return rebuild(
                RecoveryReason::Checksum,
                format!(
                    "checkpoint is corrupted: stored checksum {checksum} does not match the content"
                ),
            );
        }
        (
            name,
            MemoryState {
                machine,
                assignments,
            },
        )
    };
    if name != policy {
        return rebuild(
            RecoveryReason::PolicyChanged,
            format!(
                "[memorymanager] configured policy {policy:?} differs from state checkpoint policy {name:?}"
            ),
        );
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn restored(bytes: &str, policy: &str) -> Result<MemoryState, (RecoveryReason, String)> {
        match decode(bytes.as_bytes(), policy) {
            Restored::State(s) => Ok(s),
            Restored::Rebuild { reason, detail } => Err((reason, detail)),
        }
    }

    fn kubelet_vector_state() -> MemoryState {
        let mut s = MemoryState::default();
        s.machine.insert(
            0,
            NumaNodeState {
                number_of_assignments: 0,
                memory_map: BTreeMap::from([(
                    "memory".to_owned(),
                    MemoryTable {
                        total: 2048,
                        system_reserved: 512,
                        allocatable: 1536,
                        reserved: 512,
                        free: 1024,
                    },
                )]),
                cells: vec![],
            },
        );
        s.set_blocks(
            "pod",
            "container1",
            vec![Block {
                numa_affinity: vec![0],
                resource: "memory".to_owned(),
                size: 512,
            }],
        );
        s
    }

    /// kubelet's memorymanager/state/state_checkpoint_test.go `TestCheckpointStateRestore`,
    /// "Restore valid checkpoint" (checksum 4215593881).
    const KUBELET_V1: &str = r#"{
        "policyName":"static",
        "machineState":{"0":{"numberOfAssignments":0,"memoryMap":{"memory":{"total":2048,"systemReserved":512,"allocatable":1536,"reserved":512,"free":1024}},"cells":[]}},
        "entries":{"pod":{"container1":[{"numaAffinity":[0],"type":"memory","size":512}]}},
        "checksum": 4215593881
    }"#;

    #[test]
    fn restores_kubelets_released_vector() {
        assert_eq!(restored(KUBELET_V1, "static"), Ok(kubelet_vector_state()));
        // And produces the same checksum when writing that state.
        assert_eq!(
            checksum_v1("static", &kubelet_vector_state()),
            4_215_593_881
        );
    }

    #[test]
    fn rejects_with_kubelets_reasons() {
        // "Restore checkpoint with invalid checksum".
        let bad = KUBELET_V1.replace("4215593881", "101010");
        assert_eq!(
            restored(&bad, "static").unwrap_err().0,
            RecoveryReason::Checksum
        );
        // "Restore checkpoint with invalid JSON".
        assert_eq!(
            restored("{", "static").unwrap_err().0,
            RecoveryReason::Corrupt
        );
        let (reason, detail) = restored(KUBELET_V1, "None").unwrap_err();
        assert_eq!(reason, RecoveryReason::PolicyChanged);
        assert_eq!(
            detail,
            r#"[memorymanager] configured policy "None" differs from state checkpoint policy "static""#
        );
        // A changed size is caught by the checksum.
        let tampered = KUBELET_V1.replace("\"size\":512", "\"size\":513");
        assert_eq!(
            restored(&tampered, "static").unwrap_err().0,
            RecoveryReason::Checksum
        );
    }

    #[test]
    fn nil_and_empty_collections_hash_as_go_decodes_them() {
        // Cells absent is a nil slice in Go: a different checksum from `[]`. Recompute what
        // kubelet would have written for an absent `cells` and check it verifies.
        let no_cells = KUBELET_V1.replace(",\"cells\":[]", "");
        let value: Value = serde_json::from_str(&no_cells).unwrap();
        let o = value.as_object().unwrap();
        let (m, _) = decode_machine(json_field(o, "machineState")).unwrap();
        let (e, _) = decode_entries(json_field(o, "entries")).unwrap();
        let sum = kubelet_checksum(&checkpoint_value(
            "state.MemoryManagerCheckpoint",
            "static",
            m,
            e,
            None,
        ));
        assert_ne!(sum, 4_215_593_881);
        let file = no_cells.replace("4215593881", &sum.to_string());
        assert!(restored(&file, "static").is_ok());
        // Claiming the `[]` checksum for the nil slice fails.
        assert_eq!(
            restored(&no_cells, "static").unwrap_err().0,
            RecoveryReason::Checksum
        );
    }

    #[test]
    fn reads_kubelet_1_36_data_section_and_rejects_pod_entries() {
        let data = r#"{"policyName":"static","machineState":{"0":{"numberOfAssignments":0,"memoryMap":{"memory":{"total":2048,"systemReserved":512,"allocatable":1536,"reserved":512,"free":1024}},"cells":[]}},"entries":{"pod":{"container1":[{"numaAffinity":[0],"type":"memory","size":512}]}}}"#;
        let file = serde_json::json!({
            "policyName": "other", "checksum": 1234,
            "data": data, "dataChecksum": kubelet_string_checksum(data),
        })
        .to_string();
        assert_eq!(restored(&file, "static"), Ok(kubelet_vector_state()));
        let wrong = serde_json::json!({"data": data, "dataChecksum": 1}).to_string();
        assert_eq!(
            restored(&wrong, "static").unwrap_err().0,
            RecoveryReason::Checksum
        );
        let pods = r#"{"policyName":"static","podEntries":{"p":[]}}"#;
        let file = serde_json::json!({"data": pods, "dataChecksum": kubelet_string_checksum(pods)})
            .to_string();
        assert_eq!(
            restored(&file, "static").unwrap_err().0,
            RecoveryReason::Invalid
        );
    }

    fn arb_state() -> impl Strategy<Value = MemoryState> {
        let table = (
            0u64..1 << 40,
            0u64..1 << 30,
            0u64..1 << 40,
            0u64..1 << 40,
            0u64..1 << 40,
        )
            .prop_map(|(total, system_reserved, allocatable, reserved, free)| {
                MemoryTable {
                    total,
                    system_reserved,
                    allocatable,
                    reserved,
                    free,
                }
            });
        let node = (
            0i64..5,
            proptest::collection::btree_map("(memory|hugepages-2Mi|hugepages-1Gi)", table, 1..3),
            proptest::collection::vec(0u32..4, 1..3),
        )
            .prop_map(|(number_of_assignments, memory_map, cells)| NumaNodeState {
                number_of_assignments,
                memory_map,
                cells,
            });
        let block = (
            proptest::collection::vec(0u32..4, 1..3),
            "(memory|hugepages-2Mi)",
            0u64..1 << 40,
        )
            .prop_map(|(numa_affinity, resource, size)| Block {
                numa_affinity,
                resource,
                size,
            });
        let containers = proptest::collection::btree_map(
            "[a-z]{1,6}",
            proptest::collection::vec(block, 1..3),
            1..3,
        );
        (
            proptest::collection::btree_map(0u32..12, node, 0..4),
            proptest::collection::btree_map("[0-9a-f]{6}", containers, 0..4),
        )
            .prop_map(|(machine, assignments)| MemoryState {
                machine,
                assignments,
            })
    }

    proptest! {
        #[test]
        fn checkpoint_round_trips(s in arb_state()) {
            let bytes = encode("Static", &s).unwrap();
            prop_assert_eq!(decode(&bytes, "Static"), Restored::State(s));
        }
    }
}
