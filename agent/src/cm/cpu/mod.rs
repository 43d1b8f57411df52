//! The CPU manager (kubelet's `pkg/kubelet/cm/cpumanager`): policies `none` and `static`, the
//! exclusive CPU assignments and shared pool they keep, their checkpoint, and the topology hints
//! they give the topology manager.
//!
//! This module owns [`CpuManager`] (configuration, restore and rebuild, allocate and release,
//! the CPU set each container should run on, metrics values) and its submodules:
//! [`cpuset`] (the [`Cpus`] bitset), [`topology`] (the machine's CPU layout, [`CpuTopology`]),
//! [`take`] (topology-aware selection), [`options`] (policy options), [`policy_static`] (the
//! static policy) and [`state`] (state and the `cpu_manager_state` checkpoint).
//!
//! The caller (the container manager) drives it: [`CpuManager::new`] at start, then
//! [`CpuManager::rebuild`] if it reported a [`Recovery`]; per admission the
//! [`HintProvider`] calls; [`CpuManager::remove_container`] when a container is gone; and,
//! after each change, `cpuset.cpus` for every container from [`CpuManager::cpuset`] (the shared
//! pool changes whenever an exclusive assignment does).
pub mod cpu_topology;
pub mod cpuset;
pub mod options;
pub mod policy_static;
pub mod state;
pub mod take;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use cpu_topology::{CpuInfo, CpuTopology};
pub use cpuset::Cpus;
pub use options::{OptionGates, OptionsError, StaticPolicyOptions};
pub use policy_static::{AllocateError, Allocation, StaticPolicy};
pub use state::{CPU_MANAGER_STATE_FILE, CpuState};

use crate::cm::checkpoint::{
    self, CheckpointError, CheckpointFile, Recovery, RecoveryReason, Restored,
};
use crate::cm::topology_manager::hint::{
    AllocationError, HintProvider, ProviderHints, TopologyHint,
};
use crate::config::kubelet::KubeletConfiguration;
use crate::pods::model::{Container, Pod};

/// The resource name of the CPU hints.
pub const RESOURCE_CPU: &str = "cpu";

/// Errors configuring or starting the CPU manager (admission errors are [`AllocateError`]).
#[derive(Debug, thiserror::Error)]
pub enum CpuManagerError {
    #[error("unknown policy: \"{0}\"")]
    UnknownPolicy(String),
    #[error(
        "[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero"
    )]
    ZeroReservation,
    #[error(transparent)]
    Options(#[from] OptionsError),
    #[error(transparent)]
    Policy(#[from] policy_static::PolicyError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

/// `cpuManagerPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuPolicyName {
    None,
    Static,
}

impl CpuPolicyName {
    /// Parses kubelet's policy names (`none`, `static`).
    pub fn parse(name: &str) -> Result<Self, CpuManagerError> {
        match name {
            "none" => Ok(Self::None),
            "static" => Ok(Self::Static),
            other => Err(CpuManagerError::UnknownPolicy(other.to_owned())),
        }
    }

    /// The name written to the checkpoint.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Static => "static",
        }
    }
}

/// What the CPU manager needs from the kubelet configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuManagerConfig {
    pub policy: CpuPolicyName,
    /// `cpuManagerPolicyOptions`.
    pub policy_options: BTreeMap<String, String>,
    pub option_gates: OptionGates,
    /// `reservedSystemCPUs` (empty: take the reservation topologically).
    pub reserved_system_cpus: Cpus,
    /// kubeReserved.cpu + systemReserved.cpu in millicores (with `reservedSystemCPUs`, their
    /// count times 1000, as kubelet overrides systemReserved.cpu with it).
    pub reserved_millicores: i64,
    /// `topologyManagerPolicy`, for the `align-by-socket` compatibility check.
    pub topology_manager_policy: String,
    /// The directory of `cpu_manager_state` (kubelet's root directory); `None`: no checkpoint.
    pub state_dir: Option<PathBuf>,
}

impl CpuManagerConfig {
    /// The configuration from a KubeletConfiguration (`cpuManagerPolicy`,
    /// `cpuManagerPolicyOptions`, `reservedSystemCPUs`, the reservations, the feature gates).
    pub fn from_kubelet(
        config: &KubeletConfiguration,
        state_dir: Option<PathBuf>,
    ) -> Result<Self, CpuManagerError> {
        let reserved_system_cpus = Cpus::from(&config.reserved_system_cpus);
        let reserved_millicores = if reserved_system_cpus.is_empty() {
            config
                .kube_reserved
                .milli_cpu()
                .saturating_add(config.system_reserved.milli_cpu())
        } else {
            i64::try_from(reserved_system_cpus.len())
                .unwrap_or(i64::MAX)
                .saturating_mul(1000)
        };
        Ok(Self {
            policy: CpuPolicyName::parse(&config.cpu_manager_policy)?,
            policy_options: config.cpu_manager_policy_options.clone(),
            option_gates: OptionGates::from_feature_gates(&config.feature_gates),
            reserved_system_cpus,
            reserved_millicores,
            topology_manager_policy: config.topology_manager_policy.clone(),
            state_dir,
        })
    }
}

#[derive(Debug, Clone)]
enum Policy {
    None,
    Static(Box<StaticPolicy>),
}

/// Counters with kubelet's meaning (`cpu_manager_pinning_requests_total`,
/// `cpu_manager_pinning_errors_total`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PinningCounters {
    /// Allocations of containers that need exclusive CPUs.
    pub requests: u64,
    /// Those that failed.
    pub errors: u64,
}

/// What [`CpuManager::rebuild`] did with each observed container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RebuildReport {
    /// Exclusive assignments taken over: (pod uid, container, CPUs).
    pub adopted: Vec<(String, String, Cpus)>,
    /// Observed CPU sets not taken over, and why; those containers get CPUs again at their
    /// next admission (their current `cpuset.cpus` is rewritten to the shared pool).
    pub rejected: Vec<(String, String, Cpus, String)>,
}

/// The CPU manager.
#[derive(Debug, Clone)]
pub struct CpuManager {
    policy: Policy,
    name: CpuPolicyName,
    topology: CpuTopology,
    state: CpuState,
    checkpoint: CheckpointFile,
    counters: PinningCounters,
}

impl CpuManager {
    /// Creates the manager and restores its state from `cpu_manager_state`.
    ///
    /// Configuration errors are errors. A checkpoint that cannot be used is not: the manager
    /// starts from a fresh state and returns the [`Recovery`]; the caller then calls
    /// [`CpuManager::rebuild`] with what cgroupfs shows.
    pub fn new(
        config: &CpuManagerConfig,
        topology: CpuTopology,
    ) -> Result<(Self, Option<Recovery>), CpuManagerError> {
        let policy = match config.policy {
            CpuPolicyName::None => Policy::None,
            CpuPolicyName::Static => {
                let options =
                    StaticPolicyOptions::parse(&config.policy_options, config.option_gates)?;
                options.validate(&topology, &config.topology_manager_policy)?;
                if config.reserved_millicores <= 0 {
                    return Err(CpuManagerError::ZeroReservation);
                }
                // ceil of the reservation: fractional CPUs cannot be exclusive.
                let num_reserved = usize::try_from((config.reserved_millicores + 999) / 1000)
                    .unwrap_or(usize::MAX);
                Policy::Static(Box::new(StaticPolicy::new(
                    topology.clone(),
                    num_reserved,
                    &config.reserved_system_cpus,
                    options,
                )?))
            }
        };
        let mut manager = Self {
            policy,
            name: config.policy,
            topology,
            state: CpuState::default(),
            checkpoint: CheckpointFile::new(config.state_dir.as_deref(), CPU_MANAGER_STATE_FILE),
            counters: PinningCounters::default(),
        };
        let recovery = manager.restore()?;
        if recovery.is_none() {
            manager.persist_or_mark();
        }
        Ok((manager, recovery))
    }

    fn restore(&mut self) -> Result<Option<Recovery>, CpuManagerError> {
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
            Restored::State(mut state) => match &self.policy {
                Policy::None => Ok(state),
                Policy::Static(p) => p
                    .validate_state(&mut state)
                    .map(|()| state)
                    .map_err(|e| (RecoveryReason::Invalid, e.to_string())),
            },
            Restored::Rebuild { reason, detail } => Err((reason, detail)),
        };
        match outcome {
            Ok(state) => {
                self.state = state;
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

    fn fresh_state(&self) -> CpuState {
        let mut state = CpuState::default();
        if let Policy::Static(p) = &self.policy {
            state.default_cpus = p.initial_default();
        }
        state
    }

    /// Rebuilds the state from the CPU sets the containers have in cgroupfs (after a
    /// [`Recovery`]): starting from a fresh state, a container's set is taken over as its
    /// exclusive assignment when the static policy would give it exclusive CPUs (Guaranteed pod,
    /// integer request), the set has exactly that many CPUs, none reserved, and no CPU already
    /// taken over for another pod. Other containers are left on the shared pool. The result is
    /// checkpointed.
    pub fn rebuild<'a>(
        &mut self,
        observed: impl IntoIterator<Item = (&'a Pod, &'a str, Cpus)>,
    ) -> RebuildReport {
        self.state = self.fresh_state();
        let mut report = RebuildReport::default();
        if let Policy::Static(policy) = &mut self.policy {
            policy.clear_reuse();
            let allocatable = policy.allocatable();
            let mut owner: BTreeMap<u32, String> = BTreeMap::new();
            for (pod, name, cpus) in observed {
                let uid = pod.uid();
                let Some(container) = pod.spec.all_containers().find(|c| c.name == name) else {
                    continue;
                };
                let wanted = policy_static::guaranteed_cpus(pod, container);
                if wanted == 0 {
                    continue;
                }
                let reject = if cpus.len() != wanted {
                    Some(format!("holds {} CPUs, requests {wanted}", cpus.len()))
                } else if !cpus.is_subset(&allocatable) {
                    Some(format!(
                        "includes reserved or unknown CPUs ({})",
                        cpus.difference(&allocatable)
                    ))
                } else {
                    cpus.iter()
                        .find(|c| owner.get(c).is_some_and(|o| *o != uid))
                        .map(|cpu| format!("CPU {cpu} is already assigned to another pod"))
                };
                match reject {
                    Some(why) => report.rejected.push((uid, name.to_owned(), cpus, why)),
                    None => {
                        for cpu in cpus.iter() {
                            owner.insert(cpu, uid.clone());
                        }
                        self.state.default_cpus.subtract(&cpus);
                        self.state.set(&uid, name, cpus.clone());
                        report.adopted.push((uid, name.to_owned(), cpus));
                    }
                }
            }
        }
        self.persist_or_mark();
        report
    }

    /// The configured policy.
    #[must_use]
    pub fn policy_name(&self) -> CpuPolicyName {
        self.name
    }

    /// The machine's CPU topology.
    #[must_use]
    pub fn topology(&self) -> &CpuTopology {
        &self.topology
    }

    /// The state (shared pool and exclusive assignments).
    #[must_use]
    pub fn state(&self) -> &CpuState {
        &self.state
    }

    /// The reserved CPUs (empty with policy `none`).
    #[must_use]
    pub fn reserved_cpus(&self) -> Cpus {
        match &self.policy {
            Policy::None => Cpus::new(),
            Policy::Static(p) => p.reserved().clone(),
        }
    }

    /// The shared pool: what containers without exclusive CPUs run on.
    #[must_use]
    pub fn shared_pool(&self) -> &Cpus {
        &self.state.default_cpus
    }

    /// The CPUs free for exclusive allocation (shared pool minus reserved).
    #[must_use]
    pub fn available_cpus(&self) -> Cpus {
        match &self.policy {
            Policy::None => Cpus::new(),
            Policy::Static(p) => p.available(&self.state),
        }
    }

    /// The container's exclusive CPUs, if it has any.
    #[must_use]
    pub fn exclusive_cpus(&self, pod_uid: &str, container: &str) -> Option<&Cpus> {
        self.state.get(pod_uid, container)
    }

    /// What to write to the container's `cpuset.cpus`: its exclusive CPUs, else the shared
    /// pool. `None` with policy `none` (leave the cgroup alone), or if the set would be empty
    /// (kubelet skips those too).
    #[must_use]
    pub fn cpuset(&self, pod_uid: &str, container: &str) -> Option<Cpus> {
        if matches!(self.policy, Policy::None) {
            return None;
        }
        let cpus = self.state.get_or_default(pod_uid, container);
        (!cpus.is_empty()).then(|| cpus.clone())
    }

    /// Allocates (or confirms) the container's CPUs within the topology manager's `affinity`;
    /// idempotent for a container that already has CPUs. The state is checkpointed.
    pub fn allocate(
        &mut self,
        pod: &Pod,
        container: &Container,
        affinity: &TopologyHint,
    ) -> Result<Allocation, AllocateError> {
        let Policy::Static(policy) = &mut self.policy else {
            return Ok(Allocation::Shared);
        };
        if policy_static::guaranteed_cpus(pod, container) > 0 {
            self.counters.requests += 1;
        }
        let result = policy.allocate(&mut self.state, pod, container, affinity.affinity);
        match &result {
            Err(e) => {
                self.counters.errors += 1;
                tracing::warn!(pod = %pod.full_name(), container = %container.name, error = %e, "CPU allocation failed");
            }
            Ok(Allocation::Exclusive(cpus)) => {
                tracing::info!(pod = %pod.full_name(), container = %container.name, cpus = %cpus, "exclusive CPUs allocated");
                self.persist_or_mark();
            }
            Ok(_) => {}
        }
        result
    }

    /// Releases the container's exclusive CPUs to the shared pool (those no sibling container
    /// of the pod still holds); returns them. Idempotent.
    pub fn remove_container(&mut self, pod_uid: &str, container: &str) -> Option<Cpus> {
        let Policy::Static(policy) = &mut self.policy else {
            return None;
        };
        let released = policy.remove_container(&mut self.state, pod_uid, container)?;
        self.persist_or_mark();
        Some(released)
    }

    /// Releases every container of the pod.
    pub fn remove_pod(&mut self, pod_uid: &str) -> Cpus {
        let names: Vec<String> = self
            .state
            .assignments
            .get(pod_uid)
            .map(|c| c.keys().cloned().collect())
            .unwrap_or_default();
        let mut released = Cpus::new();
        for name in names {
            if let Some(cpus) = self.remove_container(pod_uid, &name) {
                released.union_with(&cpus);
            }
        }
        released
    }

    /// Releases the assignments of containers `is_active` rejects (kubelet's
    /// `removeStaleState`); returns what was removed.
    pub fn remove_stale(
        &mut self,
        is_active: impl Fn(&str, &str) -> bool,
    ) -> Vec<(String, String)> {
        let stale: Vec<(String, String)> = self
            .state
            .assignments
            .iter()
            .flat_map(|(pod, c)| c.keys().map(move |name| (pod.clone(), name.clone())))
            .filter(|(pod, name)| !is_active(pod, name))
            .collect();
        for (pod, name) in &stale {
            self.remove_container(pod, name);
        }
        stale
    }

    /// `cpu_manager_shared_pool_size_millicores`: the CPUs free for exclusive allocation, in
    /// millicores.
    #[must_use]
    pub fn shared_pool_size_millicores(&self) -> u64 {
        (self.available_cpus().len() as u64).saturating_mul(1000)
    }

    /// `cpu_manager_exclusive_cpu_allocation_count`.
    #[must_use]
    pub fn exclusive_cpu_allocation_count(&self) -> usize {
        self.state.exclusive_count()
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
            .write_or_mark("CPU manager", || state::encode(name.as_str(), state));
    }
}

impl HintProvider for CpuManager {
    fn name(&self) -> &str {
        RESOURCE_CPU
    }

    fn hints(&self, pod: &Pod, container: &Container) -> ProviderHints {
        let mut out = ProviderHints::new();
        if let Policy::Static(p) = &self.policy
            && let Some(hints) = p.hints(&self.state, pod, container)
        {
            out.insert(RESOURCE_CPU.to_owned(), Some(hints));
        }
        out
    }

    fn pod_hints(&self, pod: &Pod) -> ProviderHints {
        let mut out = ProviderHints::new();
        if let Policy::Static(p) = &self.policy
            && let Some(hints) = p.pod_hints(&self.state, pod)
        {
            out.insert(RESOURCE_CPU.to_owned(), Some(hints));
        }
        out
    }

    fn allocate(
        &mut self,
        pod: &Pod,
        container: &Container,
        affinity: &TopologyHint,
    ) -> Result<(), AllocationError> {
        CpuManager::allocate(self, pod, container, affinity)
            .map(|_| ())
            .map_err(|e| match e {
                AllocateError::SmtAlignment { .. } => {
                    AllocationError::new(e.reason(), e.to_string())
                }
                AllocateError::Take(_) => AllocationError::unexpected(e),
            })
    }
}

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
