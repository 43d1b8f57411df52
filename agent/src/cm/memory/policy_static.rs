//! The `Static` memory manager policy (kubelet's `memorymanager/policy_static.go`): Guaranteed
//! pods get their memory and huge pages accounted on the NUMA nodes the topology manager chose,
//! and their containers are confined there (`cpuset.mems`).
//!
//! Per NUMA node and resource the policy keeps total, system reserved (`reservedMemory`),
//! allocatable, reserved (given to containers) and free bytes. A node used by a single-node
//! allocation cannot join a multi-node group and vice versa; nodes of a multi-node group are only
//! used together (`cells`). Memory of finished init containers is reused by later containers of
//! the pod, as kubelet does.
use std::collections::BTreeMap;

use super::NumaMemory;
use super::state::{Block, MemoryState, MemoryTable, NumaNodeMap, NumaNodeState};
use crate::cm::cpu::policy_static::for_each_numa_subset;
use crate::cm::topology_manager::hint::{NumaMask, ProviderHints, TopologyHint};
use crate::pods::model::{Container, MEMORY, Pod};
use crate::pods::qos::{QosClass, pod_qos};

/// The prefix of huge page resource names (`hugepages-2Mi`).
pub const HUGEPAGES_PREFIX: &str = "hugepages-";

/// Errors allocating memory, worded as kubelet's.
/// Why a restored memory manager state does not fit this machine (kubelet's `validateState`
/// messages, word for word).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("[memorymanager] machine state can not be empty when it has memory assignments")]
    EmptyMachine,
    #[error(
        "[memorymanager] (pod: {pod}, container: {container}) the memory assignment uses the NUMA that does not exist"
    )]
    NoSuchNode { pod: String, container: String },
    #[error(
        "[memorymanager] (pod: {pod}, container: {container}) the memory assignment uses memory resource that does not exist"
    )]
    NoSuchResource { pod: String, container: String },
    #[error("[memorymanager] the expected machine state is different from the real one")]
    Mismatch,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryAllocateError {
    #[error("[memorymanager] failed to represent quantity as int64")]
    Quantity,
    #[error(
        "[memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough memory is available"
    )]
    NoDefaultAffinity,
    #[error("[memorymanager] failed to find the default preferred hint")]
    NoDefaultPreferredHint,
    #[error("[memorymanager] failed to find NUMA nodes to extend the current topology hint")]
    CannotExtend,
    #[error("[memorymanager] failed to find the extended preferred hint")]
    NoExtendedPreferredHint,
    #[error("[memorymanager] preferred hint violates NUMA node allocation")]
    ViolatesNumaAllocation,
}

/// kubelet's `HugePageResourceName` for a page size: `hugepages-` and the size in Kubernetes'
/// binary notation (`2Mi`, `1Gi`, `64Ki`).
#[must_use]
pub fn hugepage_resource_name(page_size_bytes: u64) -> String {
    const SUFFIXES: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    for (suffix, shift) in SUFFIXES {
        let unit = 1u64 << shift;
        if page_size_bytes >= unit && page_size_bytes.is_multiple_of(unit) {
            return format!("{HUGEPAGES_PREFIX}{}{suffix}", page_size_bytes / unit);
        }
    }
    format!("{HUGEPAGES_PREFIX}{page_size_bytes}")
}

fn is_memory_resource(name: &str) -> bool {
    name == MEMORY || name.starts_with(HUGEPAGES_PREFIX)
}

/// kubelet's `getRequestedResources`: the container's memory and huge page requests in bytes.
pub fn requested_resources(
    container: &Container,
) -> Result<BTreeMap<String, u64>, MemoryAllocateError> {
    let names: std::collections::BTreeSet<&String> = container
        .resources
        .requests
        .keys()
        .chain(container.resources.limits.keys())
        .filter(|n| is_memory_resource(n))
        .collect();
    let mut out = BTreeMap::new();
    for name in names {
        let Some(q) = container.request(name) else {
            continue;
        };
        if q.is_negative() || q.value().saturating_mul(1000) != q.milli_value() {
            return Err(MemoryAllocateError::Quantity);
        }
        out.insert(name.clone(), u64::try_from(q.value()).unwrap_or(0));
    }
    Ok(out)
}

/// kubelet's `getPodRequestedResources`: the larger of the long-running containers' sum (app
/// containers and sidecars) and the init phase's peak, per resource.
pub fn pod_requested_resources(pod: &Pod) -> Result<BTreeMap<String, u64>, MemoryAllocateError> {
    let mut init_peak: BTreeMap<String, u64> = BTreeMap::new();
    let mut sidecars: BTreeMap<String, u64> = BTreeMap::new();
    for c in &pod.spec.init_containers {
        for (name, qty) in requested_resources(c)? {
            let peak = init_peak.entry(name.clone()).or_insert(0);
            let side = sidecars.entry(name).or_insert(0);
            if c.is_sidecar() {
                *side += qty;
            } else if *side + qty > *peak {
                *peak = *side + qty;
            }
        }
    }
    let mut apps: BTreeMap<String, u64> = BTreeMap::new();
    for c in &pod.spec.containers {
        for (name, qty) in requested_resources(c)? {
            *apps.entry(name).or_insert(0) += qty;
        }
    }
    Ok(apps
        .into_iter()
        .map(|(name, qty)| {
            let long_running = qty + sidecars.get(&name).copied().unwrap_or(0);
            let peak = init_peak.get(&name).copied().unwrap_or(0);
            (name, long_running.max(peak))
        })
        .collect())
}

fn mask_of(nodes: &[u32]) -> NumaMask {
    let ids: Vec<usize> = nodes
        .iter()
        .filter_map(|&n| usize::try_from(n).ok())
        .collect();
    NumaMask::new(&ids).unwrap_or(NumaMask::EMPTY)
}

fn nodes_of(mask: NumaMask) -> Vec<u32> {
    mask.nodes().filter_map(|n| u32::try_from(n).ok()).collect()
}

fn same_group(a: &[u32], b: &[u32]) -> bool {
    let mut a = a.to_vec();
    let mut b = b.to_vec();
    a.sort_unstable();
    b.sort_unstable();
    a == b
}

/// Reusable memory of a pod's init containers: NUMA mask -> resource -> bytes.
type PodReusable = BTreeMap<NumaMask, BTreeMap<String, u64>>;

/// The static policy.
#[derive(Debug, Clone)]
pub struct StaticPolicy {
    nodes: Vec<NumaMemory>,
    system_reserved: BTreeMap<u32, BTreeMap<String, u64>>,
    /// kubelet's `initContainersReusableMemory`, for the pod being admitted.
    reusable: BTreeMap<String, PodReusable>,
}

impl StaticPolicy {
    /// kubelet's `NewPolicyStatic`; `None` when no memory is reserved for the system (kubelet:
    /// "you should specify the system reserved memory").
    #[must_use]
    pub fn new(
        nodes: Vec<NumaMemory>,
        system_reserved: BTreeMap<u32, BTreeMap<String, u64>>,
    ) -> Option<Self> {
        let total: u64 = system_reserved.values().filter_map(|r| r.get(MEMORY)).sum();
        (total > 0).then_some(Self {
            nodes,
            system_reserved,
            reusable: BTreeMap::new(),
        })
    }

    fn reserved_of(&self, node: u32, resource: &str) -> u64 {
        self.system_reserved
            .get(&node)
            .and_then(|r| r.get(resource))
            .copied()
            .unwrap_or(0)
    }

    /// kubelet's `getDefaultMachineState`.
    #[must_use]
    pub fn default_machine_state(&self) -> NumaNodeMap {
        let mut machine = NumaNodeMap::new();
        for node in &self.nodes {
            let mut state = NumaNodeState {
                number_of_assignments: 0,
                memory_map: BTreeMap::new(),
                cells: vec![node.node],
            };
            let mut hugepages_total = 0u64;
            for hp in &node.hugepages {
                let name = hugepage_resource_name(hp.page_size_bytes);
                let reserved = self.reserved_of(node.node, &name);
                let total = hp.count.saturating_mul(hp.page_size_bytes);
                let allocatable = total.saturating_sub(reserved);
                state.memory_map.insert(
                    name,
                    MemoryTable {
                        total,
                        system_reserved: reserved,
                        allocatable,
                        reserved: 0,
                        free: allocatable,
                    },
                );
                hugepages_total = hugepages_total.saturating_add(total);
            }
            let reserved = self.reserved_of(node.node, MEMORY);
            let allocatable = node
                .memory_bytes
                .saturating_sub(reserved)
                .saturating_sub(hugepages_total);
            state.memory_map.insert(
                MEMORY.to_owned(),
                MemoryTable {
                    total: node.memory_bytes,
                    system_reserved: reserved,
                    allocatable,
                    reserved: 0,
                    free: allocatable,
                },
            );
            machine.insert(node.node, state);
        }
        machine
    }

    /// kubelet's `validateState`: initialises an empty state; checks a restored one by replaying
    /// its assignments on the default machine state. The error is kubelet's message.
    pub fn validate_state(&self, state: &mut MemoryState) -> Result<(), StateError> {
        if state.machine.is_empty() {
            if !state.assignments.is_empty() {
                return Err(StateError::EmptyMachine);
            }
            state.machine = self.default_machine_state();
            return Ok(());
        }
        let mut expected = self.default_machine_state();
        for (pod, containers) in &state.assignments {
            for (container, blocks) in containers {
                for b in blocks {
                    let mut size = b.size;
                    for node in &b.numa_affinity {
                        let Some(n) = expected.get_mut(node) else {
                            return Err(StateError::NoSuchNode {
                                pod: pod.clone(),
                                container: container.clone(),
                            });
                        };
                        n.number_of_assignments += 1;
                        n.cells.clone_from(&b.numa_affinity);
                        let Some(t) = n.memory_map.get_mut(&b.resource) else {
                            return Err(StateError::NoSuchResource {
                                pod: pod.clone(),
                                container: container.clone(),
                            });
                        };
                        size = reserve(t, size);
                    }
                }
            }
        }
        if !machine_states_equal(&state.machine, &expected) {
            return Err(StateError::Mismatch);
        }
        Ok(())
    }

    fn pod_reusable(&self, pod_uid: &str, mask: NumaMask, resource: &str) -> u64 {
        self.reusable
            .get(pod_uid)
            .and_then(|p| p.get(&mask))
            .and_then(|r| r.get(resource))
            .copied()
            .unwrap_or(0)
    }

    /// kubelet's `calculateHints`.
    fn calculate_hints(
        &self,
        machine: &NumaNodeMap,
        pod_uid: &str,
        requested: &BTreeMap<String, u64>,
    ) -> BTreeMap<String, Vec<TopologyHint>> {
        let nodes: Vec<usize> = machine
            .keys()
            .filter_map(|&n| usize::try_from(n).ok())
            .filter(|&n| n < NumaMask::MAX_NODES)
            .collect();
        let mut min_affinity = nodes.len();
        let mut found: Vec<NumaMask> = Vec::new();
        let table = |node: u32, resource: &str| -> MemoryTable {
            machine
                .get(&node)
                .and_then(|n| n.memory_map.get(resource))
                .copied()
                .unwrap_or_default()
        };
        for_each_numa_subset(&nodes, &mut |mask: NumaMask| {
            let bits = nodes_of(mask);
            let single = bits.len() == 1;
            for (resource, &size) in requested {
                let allocatable: u64 = bits.iter().map(|&n| table(n, resource).allocatable).sum();
                if allocatable < size {
                    return;
                }
            }
            min_affinity = min_affinity.min(mask.count());
            if single && machine.get(&bits[0]).is_some_and(|n| n.cells.len() > 1) {
                return;
            }
            for n in &bits {
                let Some(state) = machine.get(n) else {
                    continue;
                };
                if !single
                    && state.number_of_assignments > 0
                    && (state.cells.len() == 1 || !same_group(&state.cells, &bits))
                {
                    return;
                }
            }
            for (resource, &size) in requested {
                let free: u64 = bits.iter().map(|&n| table(n, resource).free).sum();
                if free + self.pod_reusable(pod_uid, mask, resource) < size {
                    return;
                }
            }
            found.push(mask);
        });
        let mut hints = BTreeMap::new();
        if found.is_empty() {
            return hints;
        }
        for resource in requested.keys() {
            hints.insert(
                resource.clone(),
                found
                    .iter()
                    .map(|&m| TopologyHint::new(m, m.count() == min_affinity))
                    .collect(),
            );
        }
        hints
    }

    /// kubelet's `GetTopologyHints`: `None` for no preference.
    #[must_use]
    pub fn hints(&self, state: &MemoryState, pod: &Pod, container: &Container) -> ProviderHints {
        if pod_qos(&pod.spec) != QosClass::Guaranteed {
            return ProviderHints::new();
        }
        let Ok(requested) = requested_resources(container) else {
            return ProviderHints::new();
        };
        let uid = pod.uid();
        if let Some(blocks) = state.blocks(&uid, &container.name) {
            return regenerate_hints(blocks, &requested);
        }
        to_provider_hints(self.calculate_hints(&state.machine, &uid, &requested))
    }

    /// kubelet's `GetPodTopologyHints`.
    #[must_use]
    pub fn pod_hints(&self, state: &MemoryState, pod: &Pod) -> ProviderHints {
        if pod_qos(&pod.spec) != QosClass::Guaranteed {
            return ProviderHints::new();
        }
        let Ok(requested) = pod_requested_resources(pod) else {
            return ProviderHints::new();
        };
        let uid = pod.uid();
        for c in pod.spec.init_containers.iter().chain(&pod.spec.containers) {
            if let Some(blocks) = state.blocks(&uid, &c.name) {
                return regenerate_hints(blocks, &requested);
            }
        }
        to_provider_hints(self.calculate_hints(&state.machine, &uid, &requested))
    }

    /// kubelet's `Allocate`: the container's blocks on the topology manager's `affinity`
    /// (extended or defaulted as kubelet does); `Ok(None)` for containers of pods that are not
    /// Guaranteed, `Ok(Some(blocks))` otherwise (existing blocks when already allocated).
    pub fn allocate(
        &mut self,
        state: &mut MemoryState,
        pod: &Pod,
        container: &Container,
        affinity: &TopologyHint,
    ) -> Result<Option<Vec<Block>>, MemoryAllocateError> {
        if pod_qos(&pod.spec) != QosClass::Guaranteed {
            return Ok(None);
        }
        let uid = pod.uid();
        if let Some(blocks) = state.blocks(&uid, &container.name).cloned() {
            self.update_reusable(pod, container, &blocks);
            return Ok(Some(blocks));
        }
        let requested = requested_resources(container)?;
        let mut machine = state.machine.clone();
        let mut best = *affinity;
        if best.affinity.is_none() {
            let hints = self.calculate_hints(&machine, &uid, &requested);
            if hints.is_empty() {
                return Err(MemoryAllocateError::NoDefaultAffinity);
            }
            let default = find_best_hint(hints.get(MEMORY).map_or(&[][..], Vec::as_slice));
            if !default.preferred && best.preferred {
                return Err(MemoryAllocateError::NoDefaultPreferredHint);
            }
            best = default;
        }
        let mask = best.affinity.unwrap_or(NumaMask::EMPTY);
        if !satisfies(&machine, mask, &requested) {
            let hints = self.calculate_hints(&machine, &uid, &requested);
            let filtered: Vec<TopologyHint> = hints
                .get(MEMORY)
                .map(|h| {
                    h.iter()
                        .filter(|h| h.affinity.is_some_and(|a| mask.is_subset_of(a)))
                        .copied()
                        .collect()
                })
                .unwrap_or_default();
            if filtered.is_empty() {
                return Err(MemoryAllocateError::CannotExtend);
            }
            let extended = find_best_hint(&filtered);
            if !extended.preferred && best.preferred {
                return Err(MemoryAllocateError::NoExtendedPreferredHint);
            }
            best = extended;
        }
        let mask = best.affinity.unwrap_or(NumaMask::EMPTY);
        if violates_numa_allocation(&machine, mask) {
            return Err(MemoryAllocateError::ViolatesNumaAllocation);
        }
        let bits = nodes_of(mask);
        let mut blocks = Vec::new();
        for (resource, &size) in &requested {
            blocks.push(Block {
                numa_affinity: bits.clone(),
                resource: resource.clone(),
                size,
            });
            let reusable = self.pod_reusable(&uid, mask, resource);
            let remaining = size.saturating_sub(reusable);
            update_machine_state(&mut machine, &bits, resource, remaining);
        }
        self.update_reusable(pod, container, &blocks);
        state.machine = machine;
        state.set_blocks(&uid, &container.name, blocks.clone());
        update_init_container_blocks(state, pod, container, &blocks);
        Ok(Some(blocks))
    }

    /// kubelet's `RemoveContainer`: frees the container's blocks; returns whether it had any.
    pub fn remove_container(
        &self,
        state: &mut MemoryState,
        pod_uid: &str,
        container: &str,
    ) -> bool {
        let Some(blocks) = state.blocks(pod_uid, container).cloned() else {
            return false;
        };
        state.delete(pod_uid, container);
        for b in &blocks {
            let mut released = b.size;
            for node in &b.numa_affinity {
                let Some(n) = state.machine.get_mut(node) else {
                    continue;
                };
                n.number_of_assignments -= 1;
                if n.number_of_assignments == 0 {
                    n.cells = vec![*node];
                }
                if released == 0 {
                    continue;
                }
                let Some(t) = n.memory_map.get_mut(&b.resource) else {
                    continue;
                };
                if t.reserved == 0 {
                    continue;
                }
                if t.reserved < released {
                    released -= t.reserved;
                    t.free += t.reserved;
                    t.reserved = 0;
                    continue;
                }
                t.free += released;
                t.reserved -= released;
                released = 0;
            }
        }
        true
    }

    /// kubelet's `updatePodReusableMemory`.
    fn update_reusable(&mut self, pod: &Pod, container: &Container, blocks: &[Block]) {
        let uid = pod.uid();
        self.reusable.retain(|k, _| *k == uid);
        let regular_init = pod
            .spec
            .init_containers
            .iter()
            .any(|c| c.name == container.name && !c.is_sidecar());
        if regular_init {
            let pod_reusable = self.reusable.entry(uid).or_default();
            for b in blocks {
                let entry = pod_reusable
                    .entry(mask_of(&b.numa_affinity))
                    .or_default()
                    .entry(b.resource.clone())
                    .or_insert(0);
                if b.size > *entry {
                    *entry = b.size;
                }
            }
            return;
        }
        for b in blocks {
            let mask = mask_of(&b.numa_affinity);
            let reusable = self.pod_reusable(&uid, mask, &b.resource);
            if reusable == 0 {
                continue;
            }
            if let Some(entry) = self
                .reusable
                .get_mut(&uid)
                .and_then(|p| p.get_mut(&mask))
                .and_then(|r| r.get_mut(&b.resource))
            {
                *entry = reusable.saturating_sub(b.size);
            }
        }
    }

    /// Forgets reusable memory (after a rebuild).
    pub fn clear_reuse(&mut self) {
        self.reusable.clear();
    }

    /// Records the container's requested memory on `mask` without checks other than the
    /// single/cross NUMA rule (used when rebuilding from cgroupfs).
    pub fn adopt(
        &mut self,
        state: &mut MemoryState,
        pod: &Pod,
        container: &Container,
        mask: NumaMask,
    ) -> Result<Vec<Block>, String> {
        let requested = requested_resources(container).map_err(|e| e.to_string())?;
        if mask.is_empty() {
            return Err("no NUMA nodes".to_owned());
        }
        let bits = nodes_of(mask);
        if let Some(n) = bits.iter().find(|n| !state.machine.contains_key(n)) {
            return Err(format!("NUMA node {n} does not exist"));
        }
        if violates_numa_allocation(&state.machine, mask) {
            return Err("the nodes are already used by a different NUMA group".to_owned());
        }
        if !satisfies(&state.machine, mask, &requested) {
            return Err("not enough free memory on those nodes".to_owned());
        }
        let mut blocks = Vec::new();
        for (resource, &size) in &requested {
            blocks.push(Block {
                numa_affinity: bits.clone(),
                resource: resource.clone(),
                size,
            });
            update_machine_state(&mut state.machine, &bits, resource, size);
        }
        state.set_blocks(&pod.uid(), &container.name, blocks.clone());
        Ok(blocks)
    }
}

fn to_provider_hints(hints: BTreeMap<String, Vec<TopologyHint>>) -> ProviderHints {
    hints.into_iter().map(|(k, v)| (k, Some(v))).collect()
}

/// kubelet's `regenerateHints`.
fn regenerate_hints(blocks: &[Block], requested: &BTreeMap<String, u64>) -> ProviderHints {
    if blocks.len() != requested.len() {
        return ProviderHints::new();
    }
    let mut hints: BTreeMap<String, Vec<TopologyHint>> =
        requested.keys().map(|k| (k.clone(), Vec::new())).collect();
    for b in blocks {
        if requested.get(&b.resource) != Some(&b.size) {
            return ProviderHints::new();
        }
        if let Some(list) = hints.get_mut(&b.resource) {
            list.push(TopologyHint::new(mask_of(&b.numa_affinity), true));
        }
    }
    to_provider_hints(hints)
}

/// kubelet's `findBestHint`: preferred first, then narrowest.
fn find_best_hint(hints: &[TopologyHint]) -> TopologyHint {
    let mut best: Option<TopologyHint> = None;
    for &hint in hints {
        best = match best {
            None => Some(hint),
            Some(b) if hint.preferred && !b.preferred => Some(hint),
            Some(b)
                if hint.preferred == b.preferred
                    && hint
                        .affinity
                        .unwrap_or(NumaMask::EMPTY)
                        .is_narrower_than(b.affinity.unwrap_or(NumaMask::EMPTY)) =>
            {
                Some(hint)
            }
            keep => keep,
        };
    }
    best.unwrap_or_default()
}

/// kubelet's `isAffinitySatisfyRequest`.
fn satisfies(machine: &NumaNodeMap, mask: NumaMask, requested: &BTreeMap<String, u64>) -> bool {
    requested.iter().all(|(resource, &size)| {
        let free: u64 = mask
            .nodes()
            .filter_map(|n| u32::try_from(n).ok())
            .filter_map(|n| machine.get(&n)?.memory_map.get(resource))
            .map(|t| t.free)
            .sum();
        free >= size
    })
}

/// kubelet's `isAffinityViolatingNUMAAllocations`.
fn violates_numa_allocation(machine: &NumaNodeMap, mask: NumaMask) -> bool {
    let bits = nodes_of(mask);
    if bits.len() == 1 {
        return false;
    }
    bits.iter().any(|n| {
        machine.get(n).is_some_and(|s| {
            s.number_of_assignments > 0 && (s.cells.len() == 1 || !same_group(&s.cells, &bits))
        })
    })
}

/// Takes up to `size` from the table's free bytes; returns what is left to place.
fn reserve(t: &mut MemoryTable, size: u64) -> u64 {
    if size == 0 || t.free == 0 {
        return size;
    }
    if t.free >= size {
        t.reserved += size;
        t.free -= size;
        return 0;
    }
    let rest = size - t.free;
    t.reserved += t.free;
    t.free = 0;
    rest
}

/// kubelet's `updateMachineState`.
fn update_machine_state(machine: &mut NumaNodeMap, nodes: &[u32], resource: &str, size: u64) {
    let mut size = size;
    for node in nodes {
        let Some(n) = machine.get_mut(node) else {
            continue;
        };
        n.number_of_assignments += 1;
        n.cells = nodes.to_vec();
        if let Some(t) = n.memory_map.get_mut(resource) {
            size = reserve(t, size);
        }
    }
}

/// kubelet's `updateInitContainersMemoryBlocks`: shrink the blocks of earlier init containers by
/// what this container reused, so the blocks of the pod add up to what it holds.
fn update_init_container_blocks(
    state: &mut MemoryState,
    pod: &Pod,
    container: &Container,
    blocks: &[Block],
) {
    let uid = pod.uid();
    for block in blocks {
        let mut size = block.size;
        for init in &pod.spec.init_containers {
            if init.name == container.name || size == 0 {
                break;
            }
            if init.is_sidecar() {
                continue;
            }
            let Some(mut init_blocks) = state.blocks(&uid, &init.name).cloned() else {
                continue;
            };
            for ib in &mut init_blocks {
                if ib.size == 0
                    || ib.resource != block.resource
                    || mask_of(&ib.numa_affinity) != mask_of(&block.numa_affinity)
                {
                    continue;
                }
                if ib.size > size {
                    ib.size -= size;
                    size = 0;
                } else {
                    size -= ib.size;
                    ib.size = 0;
                }
            }
            state.set_blocks(&uid, &init.name, init_blocks);
        }
    }
}

/// kubelet's `areMachineStatesEqual` (totals, reservations, allocatable per node; free and
/// reserved per NUMA group).
fn machine_states_equal(a: &NumaNodeMap, b: &NumaNodeMap) -> bool {
    if a.len() != b.len() {
        return false;
    }
    for (id, na) in a {
        let Some(nb) = b.get(id) else { return false };
        if na.number_of_assignments != nb.number_of_assignments
            || !same_group(&na.cells, &nb.cells)
            || na.memory_map.len() != nb.memory_map.len()
        {
            return false;
        }
        for (resource, ta) in &na.memory_map {
            let Some(tb) = nb.memory_map.get(resource) else {
                return false;
            };
            if ta.total != tb.total
                || ta.system_reserved != tb.system_reserved
                || ta.allocatable != tb.allocatable
            {
                return false;
            }
            let group_sum = |m: &NumaNodeMap| {
                na.cells.iter().fold((0u64, 0u64), |(f, r), n| {
                    let t = m
                        .get(n)
                        .and_then(|s| s.memory_map.get(resource))
                        .copied()
                        .unwrap_or_default();
                    (f + t.free, r + t.reserved)
                })
            };
            if group_sum(a) != group_sum(b) {
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests;
