//! The memory manager (kubelet's `pkg/kubelet/cm/memorymanager`): policies `None` and
//! `Static`, per-NUMA-node accounting of memory and huge pages with `reservedMemory`, topology
//! hints, and the NUMA nodes each container's memory is confined to (`cpuset.mems`).
//!
//! This module owns [`MemoryManager`] (configuration and `reservedMemory` validation, restore
//! and rebuild, allocate and release, [`MemoryManager::numa_nodes`] for `cpuset.mems`) and its
//! submodules [`policy_static`] and [`state`] (state and the `memory_manager_state`
//! checkpoint).
//!
//! The caller drives it like the CPU manager: [`MemoryManager::new`], then
//! [`MemoryManager::rebuild`] after a [`Recovery`]; the [`HintProvider`] calls at admission;
//! [`MemoryManager::remove_container`] when a container is gone; and `cpuset.mems` of each
//! container from [`MemoryManager::numa_nodes`] (`None`: leave it as inherited).
pub mod policy_static;
pub mod state;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use policy_static::{MemoryAllocateError, StaticPolicy, hugepage_resource_name};
pub use state::{Block, MEMORY_MANAGER_STATE_FILE, MemoryState, MemoryTable, NumaNodeState};

use crate::cm::allocatable::Reservation;
use crate::cm::checkpoint::{
    self, CheckpointError, CheckpointFile, Recovery, RecoveryReason, Restored,
};
use crate::cm::topology_manager::hint::{
    AllocationError, HintProvider, NumaMask, ProviderHints, TopologyHint,
};
use crate::config::kubelet::KubeletConfiguration;
use crate::machine::MachineTopology;
use crate::pods::model::{Container, MEMORY, Pod};

/// Errors configuring or starting the memory manager.
#[derive(Debug, thiserror::Error)]
pub enum MemoryManagerError {
    #[error("unknown policy: \"{0}\"")]
    UnknownPolicy(String),
    #[error(
        "the reserved memory configuration references a NUMA node {0} that does not exist on this machine"
    )]
    UnknownNumaNode(u32),
    #[error(
        "the total amount \"{reserved}\" of type \"{resource}\" is not equal to the value \"{allocatable}\" determined by Node Allocatable feature"
    )]
    ReservationMismatch {
        resource: String,
        reserved: u64,
        allocatable: u64,
    },
    #[error("[memorymanager] you should specify the system reserved memory")]
    NoSystemReserved,
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

/// `memoryManagerPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryPolicyName {
    None,
    Static,
}

impl MemoryPolicyName {
    /// Parses kubelet's policy names (`None`, `Static`).
    pub fn parse(name: &str) -> Result<Self, MemoryManagerError> {
        match name {
            "None" => Ok(Self::None),
            "Static" => Ok(Self::Static),
            other => Err(MemoryManagerError::UnknownPolicy(other.to_owned())),
        }
    }

    /// The name written to the checkpoint.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::Static => "Static",
        }
    }
}

/// One NUMA node's memory as the machine reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaMemory {
    pub node: u32,
    /// Total memory of the node, huge pages included.
    pub memory_bytes: u64,
    pub hugepages: Vec<HugePages>,
}

/// Huge pages of one size on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HugePages {
    pub page_size_bytes: u64,
    pub count: u64,
}

/// Every NUMA node's memory and huge pages from the machine topology (memory-only nodes
/// included, as kubelet's machine info has them).
#[must_use]
pub fn numa_memory(machine: &MachineTopology) -> Vec<NumaMemory> {
    machine
        .numa_nodes()
        .iter()
        .filter_map(|n| {
            Some(NumaMemory {
                node: u32::try_from(n.id).ok()?,
                memory_bytes: n.memory_bytes,
                hugepages: n
                    .hugepages
                    .iter()
                    .map(|h| HugePages {
                        page_size_bytes: h.page_size_bytes,
                        count: h.count,
                    })
                    .collect(),
            })
        })
        .collect()
}

/// One `reservedMemory` entry: what is reserved for the system on a NUMA node, by resource
/// (`memory`, `hugepages-1Gi`), in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryReservation {
    pub numa_node: u32,
    pub limits: BTreeMap<String, u64>,
}

/// What the memory manager needs from the kubelet configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryManagerConfig {
    pub policy: MemoryPolicyName,
    /// `reservedMemory`.
    pub reserved_memory: Vec<MemoryReservation>,
    /// kube + system reserved + hard eviction threshold by memory resource (kubelet's node
    /// allocatable reservation); `reservedMemory` must add up to it.
    pub node_allocatable_reservation: BTreeMap<String, u64>,
    /// The directory of `memory_manager_state`; `None`: no checkpoint.
    pub state_dir: Option<PathBuf>,
}

impl MemoryManagerConfig {
    /// From a KubeletConfiguration (`memoryManagerPolicy`, `reservedMemory`) and the node
    /// allocatable reservation.
    pub fn from_kubelet(
        config: &KubeletConfiguration,
        reservation: &Reservation,
        state_dir: Option<PathBuf>,
    ) -> Result<Self, MemoryManagerError> {
        let mut node_allocatable_reservation = BTreeMap::new();
        if reservation.memory_bytes > 0 {
            node_allocatable_reservation.insert(
                MEMORY.to_owned(),
                u64::try_from(reservation.memory_bytes).unwrap_or(0),
            );
        }
        let reserved_memory = config
            .reserved_memory
            .iter()
            .map(|r| MemoryReservation {
                numa_node: r.numa_node,
                limits: r
                    .limits
                    .iter()
                    .map(|(resource, q)| (resource.clone(), u64::try_from(q.value()).unwrap_or(0)))
                    .collect(),
            })
            .collect();
        Ok(Self {
            policy: MemoryPolicyName::parse(&config.memory_manager_policy)?,
            reserved_memory,
            node_allocatable_reservation,
            state_dir,
        })
    }
}

/// kubelet's `getSystemReservedMemory` with `validateReservedMemory`.
fn system_reserved(
    nodes: &[NumaMemory],
    config: &MemoryManagerConfig,
) -> Result<BTreeMap<u32, BTreeMap<String, u64>>, MemoryManagerError> {
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    let mut out: BTreeMap<u32, BTreeMap<String, u64>> =
        nodes.iter().map(|n| (n.node, BTreeMap::new())).collect();
    for r in &config.reserved_memory {
        let Some(node) = out.get_mut(&r.numa_node) else {
            return Err(MemoryManagerError::UnknownNumaNode(r.numa_node));
        };
        for (resource, &bytes) in &r.limits {
            *totals.entry(resource.clone()).or_insert(0) += bytes;
            node.insert(resource.clone(), bytes);
        }
    }
    let resources: std::collections::BTreeSet<&String> = totals
        .keys()
        .chain(
            config
                .node_allocatable_reservation
                .keys()
                .filter(|r| r.as_str() == MEMORY || r.starts_with(policy_static::HUGEPAGES_PREFIX)),
        )
        .collect();
    for resource in resources {
        let reserved = totals.get(resource).copied().unwrap_or(0);
        let allocatable = config
            .node_allocatable_reservation
            .get(resource)
            .copied()
            .unwrap_or(0);
        if reserved != allocatable {
            return Err(MemoryManagerError::ReservationMismatch {
                resource: resource.clone(),
                reserved,
                allocatable,
            });
        }
    }
    Ok(out)
}

/// Counters with kubelet's meaning (`memory_manager_pinning_requests_total`,
/// `memory_manager_pinning_errors_total`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PinningCounters {
    pub requests: u64,
    pub errors: u64,
}

/// What [`MemoryManager::rebuild`] did with each observed container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RebuildReport {
    /// (pod uid, container, NUMA nodes) taken over.
    pub adopted: Vec<(String, String, NumaMask)>,
    /// (pod uid, container, NUMA nodes, why not).
    pub rejected: Vec<(String, String, NumaMask, String)>,
}

/// The memory manager.
#[derive(Debug, Clone)]
pub struct MemoryManager {
    policy: Option<StaticPolicy>,
    name: MemoryPolicyName,
    state: MemoryState,
    checkpoint: CheckpointFile,
    counters: PinningCounters,
}

impl MemoryManager {
    /// Creates the manager and restores `memory_manager_state`. Configuration errors are
    /// errors; an unusable checkpoint is a returned [`Recovery`] (fresh state; the caller calls
    /// [`MemoryManager::rebuild`]).
    pub fn new(
        config: &MemoryManagerConfig,
        nodes: Vec<NumaMemory>,
    ) -> Result<(Self, Option<Recovery>), MemoryManagerError> {
        let policy = match config.policy {
            MemoryPolicyName::None => None,
            MemoryPolicyName::Static => {
                let reserved = system_reserved(&nodes, config)?;
                Some(
                    StaticPolicy::new(nodes, reserved)
                        .ok_or(MemoryManagerError::NoSystemReserved)?,
                )
            }
        };
        let mut manager = Self {
            policy,
            name: config.policy,
            state: MemoryState::default(),
            checkpoint: CheckpointFile::new(config.state_dir.as_deref(), MEMORY_MANAGER_STATE_FILE),
            counters: PinningCounters::default(),
        };
        let recovery = manager.restore()?;
        if recovery.is_none() {
            manager.persist_or_mark();
        }
        Ok((manager, recovery))
    }

    fn fresh_state(&self) -> MemoryState {
        MemoryState {
            machine: self
                .policy
                .as_ref()
                .map(StaticPolicy::default_machine_state)
                .unwrap_or_default(),
            assignments: BTreeMap::new(),
        }
    }

    fn restore(&mut self) -> Result<Option<Recovery>, MemoryManagerError> {
        let Some(path) = self.checkpoint.path().map(Path::to_owned) else {
            self.state = self.fresh_state();
            return Ok(None);
        };
        let restored = match checkpoint::read_checkpoint(&path)? {
            None => Restored::Rebuild {
                reason: RecoveryReason::Missing,
                detail: "no checkpoint file".to_owned(),
            },
            Some(bytes) => state::decode(&bytes, self.name.as_str()),
        };
        let outcome = match restored {
            Restored::State(mut s) => match &self.policy {
                None => Ok(s),
                Some(p) => p
                    .validate_state(&mut s)
                    .map(|()| s)
                    .map_err(|e| (RecoveryReason::Invalid, e.to_string())),
            },
            Restored::Rebuild { reason, detail } => Err((reason, detail)),
        };
        match outcome {
            Ok(s) => {
                self.state = s;
                Ok(None)
            }
            Err((reason, detail)) => {
                self.state = self.fresh_state();
                Ok(Some(Recovery {
                    path,
                    reason,
                    detail,
                }))
            }
        }
    }

    /// Rebuilds the state from the NUMA nodes containers are confined to in cgroupfs
    /// (`cpuset.mems`): starting fresh, each Guaranteed container's requested memory is
    /// accounted on those nodes when they exist, have the memory free and respect the
    /// single/cross NUMA rule. The result is checkpointed.
    pub fn rebuild<'a>(
        &mut self,
        observed: impl IntoIterator<Item = (&'a Pod, &'a str, NumaMask)>,
    ) -> RebuildReport {
        self.state = self.fresh_state();
        let mut report = RebuildReport::default();
        if let Some(policy) = &mut self.policy {
            policy.clear_reuse();
            for (pod, name, mask) in observed {
                let Some(container) = pod.spec.all_containers().find(|c| c.name == name) else {
                    continue;
                };
                if crate::pods::qos::pod_qos(&pod.spec) != crate::pods::qos::QosClass::Guaranteed {
                    continue;
                }
                match policy.adopt(&mut self.state, pod, container, mask) {
                    Ok(_) => report.adopted.push((pod.uid(), name.to_owned(), mask)),
                    Err(why) => report
                        .rejected
                        .push((pod.uid(), name.to_owned(), mask, why)),
                }
            }
        }
        self.persist_or_mark();
        report
    }

    /// The configured policy.
    #[must_use]
    pub fn policy_name(&self) -> MemoryPolicyName {
        self.name
    }

    /// The state.
    #[must_use]
    pub fn state(&self) -> &MemoryState {
        &self.state
    }

    /// kubelet's `GetMemoryNUMANodes`: the NUMA nodes of the container's memory blocks, for
    /// its `cpuset.mems`; `None` when it has none (not Guaranteed, or policy `None`).
    #[must_use]
    pub fn numa_nodes(&self, pod_uid: &str, container: &str) -> Option<NumaMask> {
        let blocks = self.state.blocks(pod_uid, container)?;
        let mut mask = NumaMask::EMPTY;
        for b in blocks {
            for &n in &b.numa_affinity {
                if let Some(m) = usize::try_from(n)
                    .ok()
                    .and_then(|n| NumaMask::single(n).ok())
                {
                    mask = mask.or(m);
                }
            }
        }
        (!mask.is_empty()).then_some(mask)
    }

    /// kubelet's `GetAllocatableMemory`: (node, resource, allocatable bytes) with non-zero
    /// allocatable.
    #[must_use]
    pub fn allocatable_memory(&self) -> Vec<(u32, String, u64)> {
        let mut out = Vec::new();
        for (node, s) in &self.state.machine {
            for (resource, t) in &s.memory_map {
                if t.allocatable > 0 {
                    out.push((*node, resource.clone(), t.allocatable));
                }
            }
        }
        out
    }

    /// Allocates (or confirms) the container's memory within `affinity`; checkpointed.
    pub fn allocate(
        &mut self,
        pod: &Pod,
        container: &Container,
        affinity: &TopologyHint,
    ) -> Result<Option<Vec<Block>>, MemoryAllocateError> {
        let Some(policy) = &mut self.policy else {
            return Ok(None);
        };
        let guaranteed =
            crate::pods::qos::pod_qos(&pod.spec) == crate::pods::qos::QosClass::Guaranteed;
        if guaranteed {
            self.counters.requests += 1;
        }
        let already = self.state.blocks(&pod.uid(), &container.name).is_some();
        let result = policy.allocate(&mut self.state, pod, container, affinity);
        match &result {
            Err(e) => {
                self.counters.errors += 1;
                tracing::warn!(pod = %pod.full_name(), container = %container.name, error = %e, "memory allocation failed");
            }
            Ok(Some(blocks)) if !already => {
                tracing::info!(pod = %pod.full_name(), container = %container.name, blocks = ?blocks, "memory pinned");
                self.persist_or_mark();
            }
            Ok(_) => {}
        }
        result
    }

    /// Frees the container's memory; returns whether it had any.
    pub fn remove_container(&mut self, pod_uid: &str, container: &str) -> bool {
        let Some(policy) = &self.policy else {
            return false;
        };
        let removed = policy.remove_container(&mut self.state, pod_uid, container);
        if removed {
            self.persist_or_mark();
        }
        removed
    }

    /// Frees every container of the pod.
    pub fn remove_pod(&mut self, pod_uid: &str) {
        let names: Vec<String> = self
            .state
            .assignments
            .get(pod_uid)
            .map(|c| c.keys().cloned().collect())
            .unwrap_or_default();
        for name in names {
            self.remove_container(pod_uid, &name);
        }
    }

    /// Releases the assignments of containers `is_active` rejects (`removeStaleState`).
    pub fn remove_stale(
        &mut self,
        is_active: impl Fn(&str, &str) -> bool,
    ) -> Vec<(String, String)> {
        let stale: Vec<(String, String)> = self
            .state
            .assignments
            .iter()
            .flat_map(|(pod, c)| c.keys().map(move |n| (pod.clone(), n.clone())))
            .filter(|(pod, n)| !is_active(pod, n))
            .collect();
        for (pod, n) in &stale {
            self.remove_container(pod, n);
        }
        stale
    }

    /// Pinning request and error counts since start.
    #[must_use]
    pub fn pinning_counters(&self) -> PinningCounters {
        self.counters
    }

    /// True while the state has changes the checkpoint does not have.
    #[must_use]
    pub fn checkpoint_dirty(&self) -> bool {
        self.checkpoint.is_dirty()
    }

    /// Writes the checkpoint now (no-op without a state directory).
    pub fn persist(&mut self) -> Result<(), CheckpointError> {
        let (name, state) = (self.name, &self.state);
        self.checkpoint
            .write(|| state::encode(name.as_str(), state))
    }

    fn persist_or_mark(&mut self) {
        let (name, state) = (self.name, &self.state);
        self.checkpoint
            .write_or_mark("memory manager", || state::encode(name.as_str(), state));
    }
}

impl HintProvider for MemoryManager {
    fn name(&self) -> &str {
        MEMORY
    }

    fn hints(&self, pod: &Pod, container: &Container) -> ProviderHints {
        self.policy
            .as_ref()
            .map(|p| p.hints(&self.state, pod, container))
            .unwrap_or_default()
    }

    fn pod_hints(&self, pod: &Pod) -> ProviderHints {
        self.policy
            .as_ref()
            .map(|p| p.pod_hints(&self.state, pod))
            .unwrap_or_default()
    }

    fn allocate(
        &mut self,
        pod: &Pod,
        container: &Container,
        affinity: &TopologyHint,
    ) -> Result<(), AllocationError> {
        MemoryManager::allocate(self, pod, container, affinity)
            .map(|_| ())
            .map_err(AllocationError::unexpected)
    }
}

#[cfg(test)]
mod tests;
