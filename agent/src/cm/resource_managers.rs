//! The resource managers behind admission: the topology manager, with the CPU and memory
//! managers as its hint providers (kubelet's `GetAllocateResourcesPodAdmitHandler`).
//!
//! This module owns their construction from the KubeletConfiguration and the machine,
//! the admission of a pod through them (all or nothing: a rejected pod keeps no CPUs or
//! memory), releasing a pod, the CPU and memory-node sets each container must run on, the
//! recovery of unusable checkpoints from what cgroupfs shows, and their metrics (kubelet's,
//! under `qosd_`). The container manager calls it; it writes no cgroup file itself.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use crate::cgroup::cpuset::CpuSet;
use crate::config::kubelet::KubeletConfiguration;
use crate::machine::MachineTopology;
use crate::pods::model::Pod;

use super::allocatable::Reservation;
use super::checkpoint::{Recovery, RecoveryReason};
use super::cpu::{self, CpuManager, CpuManagerConfig, CpuManagerError, Cpus};
use super::memory::{self, MemoryManager, MemoryManagerConfig, MemoryManagerError};
use super::metrics::ResourceMetrics;
use super::topology_manager::hint::{HintProvider, NumaMask};
use super::topology_manager::scope::PodAdmitResult;
use super::topology_manager::{TopologyManager, TopologyManagerError};

/// Errors that keep the resource managers from starting (kubelet's start-up errors).
#[derive(Debug, thiserror::Error)]
pub enum ResourceManagersError {
    #[error("CPU manager: {0}")]
    Cpu(#[from] CpuManagerError),
    #[error("CPU manager: machine topology: {0}")]
    CpuTopology(#[from] cpu::cpu_topology::TopologyError),
    #[error("memory manager: {0}")]
    Memory(#[from] MemoryManagerError),
    #[error("topology manager: {0}")]
    Topology(#[from] TopologyManagerError),
}

/// What the three managers are configured with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceManagersConfig {
    pub cpu: CpuManagerConfig,
    pub memory: MemoryManagerConfig,
    /// `topologyManagerPolicy`, `topologyManagerScope`, `topologyManagerPolicyOptions`.
    pub topology_policy: String,
    pub topology_scope: String,
    pub topology_options: BTreeMap<String, String>,
}

impl ResourceManagersConfig {
    /// From the KubeletConfiguration, the node allocatable reservation (which `reservedMemory`
    /// must add up to) and the directory of the checkpoints (`None`: no checkpoints).
    pub fn from_kubelet(
        config: &KubeletConfiguration,
        reservation: &Reservation,
        state_dir: Option<PathBuf>,
    ) -> Result<Self, ResourceManagersError> {
        Ok(Self {
            cpu: CpuManagerConfig::from_kubelet(config, state_dir.clone())?,
            memory: MemoryManagerConfig::from_kubelet(config, reservation, state_dir)?,
            topology_policy: config.topology_manager_policy.clone(),
            topology_scope: config.topology_manager_scope.clone(),
            topology_options: config.topology_manager_policy_options.clone(),
        })
    }
}

/// A pod the resource managers cannot place: kubelet's pod status reason and message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct PlacementRejection {
    /// `TopologyAffinityError`, `SMTAlignmentError`, `UnexpectedAdmissionError`, ...
    pub reason: String,
    pub message: String,
}

/// The CPU and memory-node sets a container's cgroup must have; `None` leaves the file as it
/// is (inherited), as kubelet does for a manager with policy `none`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerCpusets {
    pub cpus: Option<CpuSet>,
    pub mems: Option<CpuSet>,
}

/// A container as found in cgroupfs when a checkpoint has to be rebuilt.
#[derive(Debug, Clone)]
pub struct ObservedContainer<'a> {
    pub pod: &'a Pod,
    pub container: &'a str,
    /// Its `cpuset.cpus`, if set.
    pub cpus: Option<CpuSet>,
    /// Its `cpuset.mems`, if set.
    pub mems: Option<CpuSet>,
}

/// The topology, CPU and memory managers.
pub struct ResourceManagers {
    topology: TopologyManager,
    cpu: CpuManager,
    memory: MemoryManager,
    /// Checkpoints that could not be restored, until [`ResourceManagers::recover`] runs.
    pending: Vec<Recovery>,
    metrics: ResourceMetrics,
    /// Counter values already added to the metrics (the managers count from start).
    published: Published,
}

#[derive(Default)]
struct Published {
    cpu_requests: u64,
    cpu_errors: u64,
    memory_requests: u64,
    memory_errors: u64,
    admissions: u64,
    admission_errors: u64,
}

impl ResourceManagers {
    /// Builds the managers (kubelet's start-up checks) and restores their checkpoints. An
    /// unusable checkpoint is not an error: it waits for [`ResourceManagers::recover`].
    pub fn new(
        config: &ResourceManagersConfig,
        machine: &MachineTopology,
        metrics: ResourceMetrics,
    ) -> Result<Self, ResourceManagersError> {
        let topology = TopologyManager::new(
            machine,
            &config.topology_policy,
            &config.topology_scope,
            &config.topology_options,
        )?;
        let (cpu, cpu_recovery) =
            CpuManager::new(&config.cpu, cpu::CpuTopology::from_machine(machine)?)?;
        let (memory, memory_recovery) =
            MemoryManager::new(&config.memory, memory::numa_memory(machine))?;
        tracing::info!(
            cpu_policy = cpu.policy_name().as_str(),
            memory_policy = memory.policy_name().as_str(),
            topology_policy = %config.topology_policy,
            topology_scope = %config.topology_scope,
            reserved_cpus = %cpu.reserved_cpus(),
            shared_pool = %cpu.shared_pool(),
            "resource managers started"
        );
        let mut managers = Self {
            topology,
            cpu,
            memory,
            pending: cpu_recovery.into_iter().chain(memory_recovery).collect(),
            metrics,
            published: Published::default(),
        };
        managers.publish();
        Ok(managers)
    }

    /// True while a checkpoint waits to be rebuilt from cgroupfs.
    #[must_use]
    pub fn needs_recovery(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Rebuilds the state of every manager whose checkpoint could not be restored from the
    /// cpusets the containers have in cgroupfs, so running pods keep their CPUs and memory
    /// nodes; logs and counts what was done (`qosd_checkpoint_recoveries_total{checkpoint,
    /// reason}`). A missing checkpoint with nothing running is a first start: not counted.
    pub fn recover(&mut self, observed: &[ObservedContainer<'_>]) {
        for recovery in std::mem::take(&mut self.pending) {
            let file = recovery
                .path
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            if recovery.reason == RecoveryReason::Missing && observed.is_empty() {
                tracing::info!(checkpoint = %recovery.path.display(), "no checkpoint; starting with an empty state");
            } else {
                tracing::warn!(checkpoint = %recovery.path.display(), reason = %recovery.reason, detail = %recovery.detail, containers = observed.len(), "checkpoint not restored; rebuilding the state from cgroupfs");
                self.metrics
                    .checkpoint_recoveries
                    .with_label_values(&[&file, recovery.reason.as_str()])
                    .inc();
            }
            if file == cpu::CPU_MANAGER_STATE_FILE {
                let report =
                    self.cpu.rebuild(observed.iter().filter_map(|o| {
                        o.cpus.as_ref().map(|c| (o.pod, o.container, Cpus::from(c)))
                    }));
                for (pod, container, cpus) in &report.adopted {
                    tracing::info!(pod_uid = %pod, container = %container, cpus = %cpus, "exclusive CPUs taken over from cgroupfs");
                }
                for (pod, container, cpus, why) in &report.rejected {
                    tracing::warn!(pod_uid = %pod, container = %container, cpus = %cpus, why = %why, "CPU set in cgroupfs not taken over; the container moves to the shared pool");
                }
            } else {
                let report = self.memory.rebuild(observed.iter().filter_map(|o| {
                    o.mems
                        .as_ref()
                        .and_then(mask_of)
                        .map(|m| (o.pod, o.container, m))
                }));
                for (pod, container, nodes) in &report.adopted {
                    tracing::info!(pod_uid = %pod, container = %container, numa_nodes = ?nodes.to_vec(), "memory pinning taken over from cgroupfs");
                }
                for (pod, container, nodes, why) in &report.rejected {
                    tracing::warn!(pod_uid = %pod, container = %container, numa_nodes = ?nodes.to_vec(), why = %why, "memory nodes in cgroupfs not taken over");
                }
            }
        }
        self.publish();
    }

    /// Admits the pod through the topology manager, which has the CPU and memory managers
    /// allocate every container. On rejection nothing stays allocated for the pod.
    pub fn admit(&mut self, pod: &Pod) -> Result<(), PlacementRejection> {
        let started = Instant::now();
        let result: PodAdmitResult = {
            let mut providers: [&mut dyn HintProvider; 2] = [&mut self.cpu, &mut self.memory];
            self.topology.admit(pod, &mut providers)
        };
        self.metrics
            .admission_duration
            .observe(started.elapsed().as_secs_f64());
        let outcome = if result.admit {
            Ok(())
        } else {
            // Providers may have allocated earlier containers before a later one failed.
            self.release(&pod.uid());
            Err(PlacementRejection {
                reason: result.reason,
                message: result.message,
            })
        };
        self.publish();
        outcome
    }

    /// Releases every CPU and memory assignment of the pod. Idempotent.
    pub fn release(&mut self, pod_uid: &str) {
        self.cpu.remove_pod(pod_uid);
        self.memory.remove_pod(pod_uid);
        self.topology.remove_pod(pod_uid);
        self.publish();
    }

    /// Releases the assignments of containers `is_active` rejects (kubelet's
    /// `removeStaleState`): pods that are in a checkpoint but no longer in the pod source.
    pub fn remove_stale(&mut self, is_active: impl Fn(&str, &str) -> bool) {
        for (pod, container) in self.cpu.remove_stale(&is_active) {
            tracing::info!(pod_uid = %pod, container = %container, "released the CPUs of a container that is gone");
        }
        for (pod, container) in self.memory.remove_stale(&is_active) {
            tracing::info!(pod_uid = %pod, container = %container, "released the memory of a container that is gone");
        }
        self.publish();
    }

    /// The sets the container's cgroup must have.
    #[must_use]
    pub fn cpusets(&self, pod_uid: &str, container: &str) -> ContainerCpusets {
        ContainerCpusets {
            cpus: self.cpu.cpuset(pod_uid, container).map(|c| c.to_cpuset()),
            mems: self
                .memory
                .numa_nodes(pod_uid, container)
                .map(|mask| mask.nodes().filter_map(|n| u32::try_from(n).ok()).collect()),
        }
    }

    /// The CPU manager's shared pool (changes whenever an exclusive assignment does).
    #[must_use]
    pub fn shared_pool(&self) -> &Cpus {
        self.cpu.shared_pool()
    }

    /// Retries checkpoint writes that failed earlier.
    pub fn flush(&mut self) {
        if self.cpu.checkpoint_dirty()
            && let Err(e) = self.cpu.persist()
        {
            tracing::warn!(manager = "cpu", error = %e, "checkpoint still not written");
        }
        if self.memory.checkpoint_dirty()
            && let Err(e) = self.memory.persist()
        {
            tracing::warn!(manager = "memory", error = %e, "checkpoint still not written");
        }
    }

    /// Brings the metrics up to date with the managers' counters and state.
    fn publish(&mut self) {
        let m = &self.metrics;
        let p = &mut self.published;
        let cpu = self.cpu.pinning_counters();
        let memory = self.memory.pinning_counters();
        let admission = self.topology.counters();
        for (counter, now, before) in [
            (&m.cpu_pinning_requests, cpu.requests, &mut p.cpu_requests),
            (&m.cpu_pinning_errors, cpu.errors, &mut p.cpu_errors),
            (
                &m.memory_pinning_requests,
                memory.requests,
                &mut p.memory_requests,
            ),
            (
                &m.memory_pinning_errors,
                memory.errors,
                &mut p.memory_errors,
            ),
            (
                &m.topology_admission_requests,
                admission.requests_total,
                &mut p.admissions,
            ),
            (
                &m.topology_admission_errors,
                admission.errors_total,
                &mut p.admission_errors,
            ),
        ] {
            counter.inc_by(now.saturating_sub(*before));
            *before = now;
        }
        m.cpu_shared_pool_millicores
            .set(i64::try_from(self.cpu.shared_pool_size_millicores()).unwrap_or(i64::MAX));
        m.cpu_exclusive_allocation_count
            .set(i64::try_from(self.cpu.exclusive_cpu_allocation_count()).unwrap_or(i64::MAX));
    }
}

/// A node set as a NUMA mask; `None` for an empty set or ids a mask cannot hold.
fn mask_of(nodes: &CpuSet) -> Option<NumaMask> {
    let ids: Vec<usize> = nodes
        .iter()
        .filter_map(|n| usize::try_from(n).ok())
        .collect();
    if ids.is_empty() {
        return None;
    }
    NumaMask::new(&ids).ok()
}

#[cfg(test)]
mod tests;
