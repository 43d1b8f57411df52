//! The `static` CPU manager policy (kubelet's `policy_static.go`): exclusive whole CPUs for the
//! containers of Guaranteed pods that request an integer number of CPUs; everyone else shares
//! the pool of the remaining CPUs.
//!
//! The policy keeps, in [`CpuState`]:
//! - SHARED (the default set): every CPU not exclusively assigned. With
//!   `strict-cpu-reservation` the reserved CPUs are not in it either;
//! - RESERVED: `reservedSystemCPUs`, or else `ceil(kube + system reserved CPU)` CPUs taken with
//!   the topology-aware take (lowest cores first). Never handed out exclusively;
//! - ASSIGNABLE = SHARED - RESERVED, from which exclusive CPUs are taken;
//! - exclusive assignments per pod and container.
//!
//! CPUs of a finished init container are reused by the containers after it (sidecars excepted),
//! as kubelet does (`cpusToReuse`). Topology hints list every NUMA-node combination that can
//! hold the request; the narrowest ones (or, with `align-by-socket`, the socket-aligned ones)
//! are preferred.
use std::collections::BTreeMap;

use super::cpu_topology::CpuTopology;
use super::cpuset::Cpus;
use super::options::StaticPolicyOptions;
use super::state::CpuState;
use super::take::{SortingStrategy, TakeError, take_distributed, take_packed};
use crate::cm::topology_manager::hint::{NumaMask, TopologyHint};
use crate::pods::model::{CPU, Container, Pod};
use crate::pods::qos::{QosClass, pod_qos};

/// kubelet's `ErrorSMTAlignment`, the pod status reason of [`AllocateError::SmtAlignment`].
pub const REASON_SMT_ALIGNMENT: &str = "SMTAlignmentError";

/// NUMA nodes up to which hints enumerate every combination, as kubelet does. Above this the
/// combinations are enumerated by increasing size up to [`HINT_ENUMERATION_LIMIT`] (kubelet
/// would enumerate 2^n masks; its `max-allowable-numa-nodes` defaults to 8).
pub const EXACT_HINT_NUMA_NODES: usize = 16;
/// The number of masks enumerated above [`EXACT_HINT_NUMA_NODES`] nodes.
pub const HINT_ENUMERATION_LIMIT: usize = 1 << 16;

/// Errors creating the policy.
/// Why a restored CPU manager state does not fit this machine and configuration (kubelet's
/// `validateState` messages, word for word).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("default cpuset cannot be empty")]
    EmptyDefault,
    #[error(
        "some of strictly reserved cpus: \"{leaked}\" are present in defaultCpuSet: \"{default}\""
    )]
    StrictlyReservedInDefault { leaked: Cpus, default: Cpus },
    #[error("not all reserved cpus: \"{reserved}\" are present in defaultCpuSet: \"{default}\"")]
    ReservedNotInDefault { reserved: Cpus, default: Cpus },
    #[error(
        "pod: {pod}, container: {container} cpuset: \"{cpus}\" overlaps with default cpuset \"{default}\""
    )]
    Overlap {
        pod: String,
        container: String,
        cpus: Cpus,
        default: Cpus,
    },
    #[error("current set of available CPUs \"{all}\" doesn't match with CPUs in state \"{total}\"")]
    Mismatch { all: Cpus, total: Cpus },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error(
        "[cpumanager] unable to reserve the required amount of CPUs (size of {reserved} did not equal {wanted})"
    )]
    ReservationMismatch { reserved: String, wanted: usize },
    #[error(
        "[cpumanager] unable to build the reserved physical CPUs from the reserved set: unknown CPU ID: {0}"
    )]
    UnknownReservedCpu(u32),
}

/// Errors allocating CPUs to a container.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    /// `full-pcpus-only` and the request cannot be met with whole cores.
    #[error("{}", smt_message(*requested, *cpus_per_core, *available_physical))]
    SmtAlignment {
        requested: usize,
        cpus_per_core: usize,
        /// `Some` when the cause is too few free whole cores.
        available_physical: Option<usize>,
    },
    /// Not enough CPUs, or the topology-aware take failed.
    #[error(transparent)]
    Take(#[from] TakeError),
}

fn smt_message(requested: usize, cpus_per_core: usize, available: Option<usize>) -> String {
    match available {
        Some(available) => format!(
            "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = {available}, requested CPUs = {requested}, CPUs per core = {cpus_per_core}"
        ),
        None => format!(
            "SMT Alignment Error: requested {requested} cpus not multiple cpus per core = {cpus_per_core}"
        ),
    }
}

impl AllocateError {
    /// The pod status reason kubelet reports (`SMTAlignmentError`, else
    /// `UnexpectedAdmissionError`).
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::SmtAlignment { .. } => REASON_SMT_ALIGNMENT,
            Self::Take(_) => crate::cm::topology_manager::hint::REASON_UNEXPECTED,
        }
    }
}

/// What [`StaticPolicy::allocate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allocation {
    /// Not Guaranteed with an integer CPU request: the container runs on the shared pool.
    Shared,
    /// The container already had exclusive CPUs (after a restart, for example).
    AlreadyAssigned(Cpus),
    /// Newly assigned exclusive CPUs.
    Exclusive(Cpus),
}

/// The static policy.
#[derive(Debug, Clone)]
pub struct StaticPolicy {
    topology: CpuTopology,
    reserved: Cpus,
    /// The reserved CPUs with their core siblings.
    reserved_physical: Cpus,
    options: StaticPolicyOptions,
    cpu_group_size: usize,
    /// CPUs of the pod's init containers that later containers may reuse, for the pod being
    /// admitted (kubelet keeps one pod at a time).
    cpus_to_reuse: BTreeMap<String, Cpus>,
}

/// kubelet's `guaranteedCPUs`: the container's CPU request when the pod is Guaranteed and the
/// request is a whole number, else 0.
#[must_use]
pub fn guaranteed_cpus(pod: &Pod, container: &Container) -> usize {
    if pod_qos(&pod.spec) != QosClass::Guaranteed {
        return 0;
    }
    let Some(q) = container.request(CPU) else {
        return 0;
    };
    if q.value().saturating_mul(1000) != q.milli_value() {
        return 0;
    }
    usize::try_from(q.value()).unwrap_or(0)
}

/// kubelet's `podGuaranteedCPUs`: the larger of the long-running containers' sum (app
/// containers and sidecars) and the peak of the init phase.
#[must_use]
pub fn pod_guaranteed_cpus(pod: &Pod) -> usize {
    let mut init_peak = 0;
    let mut sidecars = 0;
    for c in &pod.spec.init_containers {
        if c.request(CPU).is_none() {
            continue;
        }
        let n = guaranteed_cpus(pod, c);
        if c.is_sidecar() {
            sidecars += n;
        } else if sidecars + n > init_peak {
            init_peak = sidecars + n;
        }
    }
    let apps: usize = pod
        .spec
        .containers
        .iter()
        .filter(|c| c.request(CPU).is_some())
        .map(|c| guaranteed_cpus(pod, c))
        .sum();
    init_peak.max(apps + sidecars)
}

impl StaticPolicy {
    /// kubelet's `NewStaticPolicy`: `reserved_cpus` when given (it must hold
    /// `num_reserved` CPUs), else `num_reserved` CPUs taken topologically.
    pub fn new(
        topology: CpuTopology,
        num_reserved: usize,
        reserved_cpus: &Cpus,
        options: StaticPolicyOptions,
    ) -> Result<Self, PolicyError> {
        let mut policy = Self {
            cpu_group_size: topology.cpus_per_core().max(1),
            topology,
            reserved: Cpus::new(),
            reserved_physical: Cpus::new(),
            options,
            cpus_to_reuse: BTreeMap::new(),
        };
        let reserved = if reserved_cpus.is_empty() {
            policy
                .take_by_topology(policy.topology.all_cpus(), num_reserved)
                .unwrap_or_default()
        } else {
            reserved_cpus.clone()
        };
        if reserved.len() != num_reserved {
            return Err(PolicyError::ReservationMismatch {
                reserved: reserved.to_string(),
                wanted: num_reserved,
            });
        }
        if let Some(unknown) = reserved.iter().find(|&c| policy.topology.cpu(c).is_none()) {
            return Err(PolicyError::UnknownReservedCpu(unknown));
        }
        policy.reserved_physical = policy.topology.cores_of(&reserved);
        policy.reserved = reserved;
        Ok(policy)
    }

    /// The machine's CPU topology.
    #[must_use]
    pub fn topology(&self) -> &CpuTopology {
        &self.topology
    }

    /// The parsed options.
    #[must_use]
    pub fn options(&self) -> StaticPolicyOptions {
        self.options
    }

    /// The reserved CPUs.
    #[must_use]
    pub fn reserved(&self) -> &Cpus {
        &self.reserved
    }

    /// The shared pool of a fresh state: every CPU, minus the reserved ones with
    /// `strict-cpu-reservation`.
    #[must_use]
    pub fn initial_default(&self) -> Cpus {
        if self.options.strict_cpu_reservation {
            self.topology.all_cpus().difference(&self.reserved)
        } else {
            self.topology.all_cpus().clone()
        }
    }

    /// kubelet's `validateState`: initialises an empty state, and checks a restored one
    /// against this machine and configuration. The error is kubelet's message.
    pub fn validate_state(&self, state: &mut CpuState) -> Result<(), StateError> {
        let all = self.initial_default();
        if state.default_cpus.is_empty() {
            if !state.assignments.is_empty() {
                return Err(StateError::EmptyDefault);
            }
            state.default_cpus = all;
            return Ok(());
        }
        let default = &state.default_cpus;
        if self.options.strict_cpu_reservation {
            let leaked = self.reserved.intersection(default);
            if !leaked.is_empty() {
                return Err(StateError::StrictlyReservedInDefault {
                    leaked,
                    default: default.clone(),
                });
            }
        } else if !self.reserved.is_subset(default) {
            return Err(StateError::ReservedNotInDefault {
                reserved: self.reserved.clone(),
                default: default.clone(),
            });
        }
        let mut total = default.clone();
        for (pod, containers) in &state.assignments {
            for (container, cpus) in containers {
                if default.intersects(cpus) {
                    return Err(StateError::Overlap {
                        pod: pod.clone(),
                        container: container.clone(),
                        cpus: cpus.clone(),
                        default: default.clone(),
                    });
                }
                total.union_with(cpus);
            }
        }
        if total != all {
            return Err(StateError::Mismatch { all, total });
        }
        Ok(())
    }

    /// Every CPU that can be exclusively allocated (`GetAllocatableCPUs`).
    #[must_use]
    pub fn allocatable(&self) -> Cpus {
        self.topology.all_cpus().difference(&self.reserved)
    }

    /// The CPUs free for exclusive allocation now (`GetAvailableCPUs`).
    #[must_use]
    pub fn available(&self, state: &CpuState) -> Cpus {
        state.default_cpus.difference(&self.reserved)
    }

    fn available_physical(&self, state: &CpuState) -> Cpus {
        state.default_cpus.difference(&self.reserved_physical)
    }

    /// kubelet's `takeByTopology` with this policy's options.
    fn take_by_topology(&self, available: &Cpus, num: usize) -> Result<Cpus, TakeError> {
        let strategy = if self.options.distribute_cpus_across_cores {
            SortingStrategy::Spread
        } else {
            SortingStrategy::Packed
        };
        if self.options.distribute_cpus_across_numa {
            let group = if self.options.full_physical_cpus_only {
                self.cpu_group_size
            } else {
                1
            };
            return take_distributed(&self.topology, available, num, group, strategy);
        }
        take_packed(
            &self.topology,
            available,
            num,
            strategy,
            self.options.prefer_align_by_uncore_cache,
        )
    }

    /// kubelet's `updateCPUsToReuse`.
    fn update_cpus_to_reuse(&mut self, pod: &Pod, container: &Container, cpus: &Cpus) {
        let uid = pod.uid();
        self.cpus_to_reuse.retain(|k, _| *k == uid);
        let reuse = self.cpus_to_reuse.entry(uid).or_default();
        let init = pod
            .spec
            .init_containers
            .iter()
            .find(|c| c.name == container.name);
        match init {
            Some(init) if !init.is_sidecar() => reuse.union_with(cpus),
            _ => reuse.subtract(cpus),
        }
    }

    /// Forgets reusable CPUs (after a rebuild).
    pub fn clear_reuse(&mut self) {
        self.cpus_to_reuse.clear();
    }

    /// kubelet's `Allocate`: exclusive CPUs for the container within `affinity` if it can,
    /// topping up outside it otherwise.
    pub fn allocate(
        &mut self,
        state: &mut CpuState,
        pod: &Pod,
        container: &Container,
        affinity: Option<NumaMask>,
    ) -> Result<Allocation, AllocateError> {
        let num = guaranteed_cpus(pod, container);
        if num == 0 {
            return Ok(Allocation::Shared);
        }
        let uid = pod.uid();
        if let Some(cpus) = state.get(&uid, &container.name).cloned() {
            self.update_cpus_to_reuse(pod, container, &cpus);
            return Ok(Allocation::AlreadyAssigned(cpus));
        }
        if self.options.full_physical_cpus_only {
            if !num.is_multiple_of(self.cpu_group_size) {
                return Err(AllocateError::SmtAlignment {
                    requested: num,
                    cpus_per_core: self.cpu_group_size,
                    available_physical: None,
                });
            }
            let available = self.available_physical(state).len();
            if num > available {
                return Err(AllocateError::SmtAlignment {
                    requested: num,
                    cpus_per_core: self.cpu_group_size,
                    available_physical: Some(available),
                });
            }
        }
        let reusable = self.cpus_to_reuse.get(&uid).cloned().unwrap_or_default();
        let cpus = self.allocate_cpus(state, num, affinity, &reusable)?;
        state.set(&uid, &container.name, cpus.clone());
        self.update_cpus_to_reuse(pod, container, &cpus);
        Ok(Allocation::Exclusive(cpus))
    }

    /// kubelet's `allocateCPUs`.
    fn allocate_cpus(
        &self,
        state: &mut CpuState,
        num: usize,
        affinity: Option<NumaMask>,
        reusable: &Cpus,
    ) -> Result<Cpus, TakeError> {
        let allocatable = self.available(state).union(reusable);
        let mut result = Cpus::new();
        if let Some(mask) = affinity {
            let aligned = self.aligned_cpus(mask, &allocatable);
            let n = num.min(aligned.len());
            result = self.take_by_topology(&aligned, n)?;
        }
        let rest = self.take_by_topology(
            &allocatable.difference(&result),
            num.saturating_sub(result.len()),
        )?;
        result.union_with(&rest);
        state.default_cpus.subtract(&result);
        Ok(result)
    }

    /// kubelet's `getAlignedCPUs`: the allocatable CPUs of the hint's NUMA nodes, or of their
    /// sockets with `align-by-socket`.
    fn aligned_cpus(&self, mask: NumaMask, allocatable: &Cpus) -> Cpus {
        let numa_cpus = self
            .topology
            .cpus_in_numa_nodes(mask.nodes().filter_map(|n| u32::try_from(n).ok()));
        if self.options.align_by_socket {
            let mut out = Cpus::new();
            for socket in self.topology.sockets_of(&numa_cpus) {
                out.union_with(&allocatable.intersection(self.topology.socket_cpus(socket)));
            }
            return out;
        }
        allocatable.intersection(&numa_cpus)
    }

    /// kubelet's `RemoveContainer`: returns the CPUs given back to the shared pool (those
    /// no sibling container still holds).
    pub fn remove_container(
        &mut self,
        state: &mut CpuState,
        pod_uid: &str,
        container: &str,
    ) -> Option<Cpus> {
        let mut in_use = Cpus::new();
        if let Some(pod) = state.assignments.get(pod_uid) {
            for (name, cpus) in pod {
                if name != container {
                    in_use.union_with(cpus);
                }
            }
        }
        let released = state.get(pod_uid, container)?.difference(&in_use);
        state.delete(pod_uid, container);
        state.default_cpus.union_with(&released);
        Some(released)
    }

    /// kubelet's `GetTopologyHints`: `None` for no preference (not an exclusive container),
    /// `Some(vec![])` when the container already holds a different number of CPUs.
    #[must_use]
    pub fn hints(
        &self,
        state: &CpuState,
        pod: &Pod,
        container: &Container,
    ) -> Option<Vec<TopologyHint>> {
        let requested = guaranteed_cpus(pod, container);
        if requested == 0 {
            return None;
        }
        let uid = pod.uid();
        if let Some(allocated) = state.get(&uid, &container.name) {
            if allocated.len() != requested {
                return Some(Vec::new());
            }
            return Some(self.generate_hints(allocated, &Cpus::new(), requested));
        }
        let reusable = self.cpus_to_reuse.get(&uid).cloned().unwrap_or_default();
        Some(self.generate_hints(&self.available(state), &reusable, requested))
    }

    /// kubelet's `GetPodTopologyHints`.
    #[must_use]
    pub fn pod_hints(&self, state: &CpuState, pod: &Pod) -> Option<Vec<TopologyHint>> {
        let requested = pod_guaranteed_cpus(pod);
        if requested == 0 {
            return None;
        }
        let uid = pod.uid();
        let mut assigned = Cpus::new();
        for container in pod.spec.init_containers.iter().chain(&pod.spec.containers) {
            if let Some(allocated) = state.get(&uid, &container.name) {
                if allocated.len() != guaranteed_cpus(pod, container) {
                    return Some(Vec::new());
                }
                assigned.union_with(allocated);
            }
        }
        if assigned.len() == requested {
            return Some(self.generate_hints(&assigned, &Cpus::new(), requested));
        }
        let mut reusable = self.cpus_to_reuse.get(&uid).cloned().unwrap_or_default();
        reusable.union_with(&assigned);
        Some(self.generate_hints(&self.available(state), &reusable, requested))
    }

    /// kubelet's `generateCPUTopologyHints`: every NUMA-node combination with enough CPUs
    /// (counting `reusable` ones, which must all lie inside it), the narrowest preferred.
    #[must_use]
    pub fn generate_hints(
        &self,
        available: &Cpus,
        reusable: &Cpus,
        request: usize,
    ) -> Vec<TopologyHint> {
        let nodes: Vec<usize> = self
            .topology
            .numa_ids()
            .filter_map(|n| usize::try_from(n).ok())
            .filter(|&n| n < NumaMask::MAX_NODES)
            .collect();
        let mut total_cpus = [0usize; NumaMask::MAX_NODES];
        let mut free_cpus = [0usize; NumaMask::MAX_NODES];
        for &n in &nodes {
            let cpus = self.topology.numa_cpus(n as u32);
            total_cpus[n] = cpus.len();
            free_cpus[n] = available.intersection_len(cpus);
        }
        let mut reusable_mask = NumaMask::EMPTY;
        for cpu in reusable.iter() {
            if let Some(info) = self.topology.cpu(cpu) {
                // A NUMA id beyond the mask range can never be covered.
                let ok = usize::try_from(info.numa)
                    .ok()
                    .and_then(|n| NumaMask::single(n).ok());
                match ok {
                    Some(m) => reusable_mask = reusable_mask.or(m),
                    None => return Vec::new(),
                }
            }
        }
        // The narrowest mask size whose NUMA nodes hold `request` CPUs in total.
        let mut sizes: Vec<usize> = nodes.iter().map(|&n| total_cpus[n]).collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let mut min_affinity = nodes.len();
        let mut sum = 0;
        for (i, s) in sizes.iter().enumerate() {
            sum += s;
            if sum >= request {
                min_affinity = min_affinity.min(i + 1);
                break;
            }
        }
        let mut hints = Vec::new();
        let mut consider = |mask: NumaMask| {
            if !reusable_mask.is_subset_of(mask) {
                return;
            }
            let matching: usize =
                reusable.len() + mask.nodes().map(|n| free_cpus[n]).sum::<usize>();
            if matching >= request {
                hints.push(TopologyHint::new(mask, false));
            }
        };
        for_each_numa_subset(&nodes, &mut consider);
        if hints.is_empty() && nodes.len() > EXACT_HINT_NUMA_NODES {
            let all = NumaMask::new(&nodes).unwrap_or(NumaMask::EMPTY);
            let matching: usize =
                reusable.len() + nodes.iter().map(|&n| free_cpus[n]).sum::<usize>();
            if matching >= request {
                hints.push(TopologyHint::new(all, false));
            }
        }
        for hint in &mut hints {
            let Some(mask) = hint.affinity else { continue };
            hint.preferred = mask.count() == min_affinity
                || (self.options.align_by_socket && self.is_socket_aligned(mask, min_affinity));
        }
        hints
    }

    /// kubelet's `isHintSocketAligned`.
    fn is_socket_aligned(&self, mask: NumaMask, min_affinity: usize) -> bool {
        let numa_per_socket = self
            .topology
            .num_numa_nodes
            .checked_div(self.topology.num_sockets)
            .unwrap_or(0);
        if numa_per_socket == 0 {
            return false;
        }
        let min_sockets = min_affinity.div_ceil(numa_per_socket);
        let cpus = self
            .topology
            .cpus_in_numa_nodes(mask.nodes().filter_map(|n| u32::try_from(n).ok()));
        self.topology.sockets_of(&cpus).len() == min_sockets
    }
}

/// Every subset of `nodes` in kubelet's `IterateBitMasks` order when there are at most
/// [`EXACT_HINT_NUMA_NODES`] nodes; above that, subsets by increasing size, whole sizes at a
/// time, until [`HINT_ENUMERATION_LIMIT`] masks have been produced.
pub(crate) fn for_each_numa_subset(nodes: &[usize], f: &mut impl FnMut(NumaMask)) {
    if nodes.len() <= EXACT_HINT_NUMA_NODES {
        NumaMask::for_each_subset(nodes, f);
    } else {
        for_each_subset_bounded(nodes, f);
    }
}

/// `n choose k`, saturating.
fn binomial(n: usize, k: usize) -> usize {
    let k = k.min(n - k);
    let mut out: usize = 1;
    for i in 0..k {
        out = out.saturating_mul(n - i) / (i + 1);
    }
    out
}

/// Subsets of `nodes` by increasing size, whole sizes at a time, as long as the next size keeps
/// the total within [`HINT_ENUMERATION_LIMIT`] masks (the first size always runs).
fn for_each_subset_bounded(nodes: &[usize], f: &mut impl FnMut(NumaMask)) {
    let n = nodes.len();
    let mut produced = 0usize;
    for k in 1..=n {
        let level = binomial(n, k);
        if produced > 0 && produced.saturating_add(level) > HINT_ENUMERATION_LIMIT {
            return;
        }
        let mut idx: Vec<usize> = (0..k).collect();
        loop {
            let mut mask = NumaMask::EMPTY;
            for &i in &idx {
                if let Ok(m) = NumaMask::single(nodes[i]) {
                    mask = mask.or(m);
                }
            }
            f(mask);
            produced += 1;
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

#[cfg(test)]
mod tests;
