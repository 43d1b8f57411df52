//! The container manager: admits pods, gives each a pod cgroup under its QoS tier and a cgroup
//! per container, runs the containers through the standalone runtime, keeps the tiers' values
//! in line with the admitted pods, and reconciles cgroupfs with the desired state on every
//! change and every period. One pod's error never stops the others. On shutdown it stops every
//! container and removes every cgroup it created.
//!
//! Admission goes through the resource managers first (topology, CPU and memory managers, as
//! kubelet's admit handlers do), then the node allocatable fit. Every container cgroup gets
//! the `cpuset.cpus` / `cpuset.mems` they assign; when an exclusive assignment changes the
//! shared pool, every other container's `cpuset.cpus` is rewritten.
//!
//! After a restart ([`ContainerManager::resume`], with the pod source's first complete list)
//! pods whose cgroups survived keep their CPUs and memory nodes, even when a checkpoint was
//! lost or corrupt (the resource managers rebuild it from those cgroups), and their running
//! processes are adopted rather than started twice; pod cgroups no pod claims are removed.
//!
//! It is the only writer of cgroup files (see docs/architecture.md). It is synchronous and
//! driven by its owner: [`ContainerManager::resume`] once, then [`ContainerManager::handle`]
//! for pod events, [`ContainerManager::tick`] often (container exits, terminations),
//! [`ContainerManager::reconcile`] every period.
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crate::cgroup::backend::{CgroupError, CgroupReader, CgroupWriter};
use crate::cgroup::name::{CgroupName, NameError};
use crate::cgroup::resources::ResourceConfig;
use crate::feedback::{Capabilities, ContainerRef, DecisionLog};
use crate::pods::model::Pod;
use crate::pods::qos::QosClass;
use crate::pods::source::{Origin, SourcedPod};
use crate::runtime::backoff::Backoff;
use crate::runtime::supervisor::{ContainerKey, ContainerState, Event, Supervisor};

use super::admission::PodRequests as AdmissionRequests;
use super::allocatable::NodeAllocatable;
use super::checkpoint;
use super::feedback_loop::FeedbackLoop;
use super::index::WorkloadIndex;
use super::metrics::CmMetrics;
use super::pod_resources::PodCgroupPolicy;
use super::qos_tiers::QosTiers;
use super::resource_managers::ResourceManagers;
use crate::cm::cpu::Cpus;

mod admit;
mod interventions;
mod lifecycle;
mod reconcile;
mod resume;
#[cfg(test)]
mod tests;

/// In the state directory: the cgroup root qosd created and has not removed yet.
const ROOT_OWNER_FILE: &str = "cgroup_root_created";

/// In every container's environment: the fingerprint of the pod version it was started for
/// ([`Pod::fingerprint`](crate::pods::model::Pod::fingerprint)), read back at a restart.
pub const POD_FINGERPRINT_ENV: &str = "QOSD_POD_FINGERPRINT";

/// Errors that stop the manager from starting (per-pod errors are logged and counted).
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error("cgroup root: {0}")]
    Name(#[from] NameError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
}

/// What the manager needs besides its cgroup driver.
#[derive(Clone, Debug)]
pub struct ManagerOptions {
    /// The cgroup everything lives under (`cgroupRoot`).
    pub root: CgroupName,
    pub policy: PodCgroupPolicy,
    /// Values for the kubepods cgroup (node allocatable enforcement for `pods`).
    pub kubepods: ResourceConfig,
    /// What admission checks against.
    pub allocatable: NodeAllocatable,
    /// Where container output goes; `None` discards it.
    pub log_dir: Option<PathBuf>,
    /// Where the manager remembers that it created the cgroup root (so a restarted qosd
    /// still removes it at shutdown); `None`: only within one run.
    pub state_dir: Option<PathBuf>,
    pub backoff: Backoff,
    /// kubelet's `systemReservedCgroup` / `kubeReservedCgroup` with the reservation enforced on
    /// each (`enforceNodeAllocatable`): existing cgroups outside the root, updated and
    /// reconciled like the rest, never created or removed.
    pub reserved: Vec<(CgroupName, ResourceConfig)>,
}

/// Why cgroup files are being written: a pod change (expected writes) or the periodic
/// reconcile (any write there corrects drift).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cause {
    Change,
    Reconcile,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Init container `n` is running (or waiting to).
    Initializing(usize),
    Running,
    /// Containers are being stopped; then the cgroups go.
    Terminating,
}

/// The container manager's writer: the cgroup backend's write side. Nothing else in qosd holds
/// one; readers get the backend as a [`CgroupReader`].
pub type Writer = Box<dyn CgroupWriter>;

struct ManagedPod {
    pod: Pod,
    origin: Origin,
    qos: QosClass,
    cgroup: CgroupName,
    phase: Phase,
}

/// The container manager.
pub struct ContainerManager {
    cgroups: Writer,
    tiers: QosTiers,
    options: ManagerOptions,
    supervisor: Supervisor,
    pods: BTreeMap<String, ManagedPod>,
    /// Updated pods waiting for their old version to terminate.
    pending: BTreeMap<String, SourcedPod>,
    index: WorkloadIndex,
    metrics: CmMetrics,
    /// Whether the root cgroup was created by this manager (and so is removed at shutdown).
    created_root: bool,
    /// Topology, CPU and memory managers.
    resources: ResourceManagers,
    /// The shared CPU pool the containers' cgroups were last written with.
    written_pool: Cpus,
    /// The feedback's settings this kernel has. Without the feedback their kubelet values are
    /// written all the same (see [`Capabilities::besteffort_baseline`]): an intervention an
    /// earlier run left in force (killed before it could lift it) is lifted, and an idle
    /// BestEffort tier, whose weight the kernel refuses to set, is made not idle first.
    knobs: Capabilities,
    /// Containers whose cgroup survived a restart with its process: adopted, not started.
    adoptable: BTreeSet<ContainerKey>,
    /// Pods the next tick advances (see [`ContainerManager::tick`]).
    to_advance: BTreeSet<String>,
    /// The feedback policies and the values they lay over kubelet's, when enabled.
    feedback: Option<FeedbackLoop>,
    /// The machine's NUMA nodes (from the layout the feedback was given), for memory moves.
    numa_nodes: BTreeSet<u32>,
    /// Kernel ids of the pod and container cgroups indexed so far (asked again only when a
    /// cgroup is created anew).
    ids: BTreeMap<CgroupName, u64>,
}

impl ContainerManager {
    /// Creates the root (when missing), kubepods and the QoS tiers.
    pub fn start(
        cgroups: Writer,
        options: ManagerOptions,
        resources: ResourceManagers,
        index: WorkloadIndex,
        metrics: CmMetrics,
    ) -> Result<Self, ManagerError> {
        let tiers = QosTiers::new(&options.root)?;
        let marker = options.state_dir.as_ref().map(|d| d.join(ROOT_OWNER_FILE));
        let created_root = if cgroups.exists(&options.root)? {
            // Created by an earlier run that did not get to remove it?
            marker
                .as_ref()
                .and_then(|m| std::fs::read_to_string(m).ok())
                .is_some_and(|owner| owner.trim() == options.root.to_string())
        } else {
            cgroups.create(&options.root, &ResourceConfig::default())?;
            if let Some(marker) = &marker
                && let Err(e) =
                    checkpoint::write_atomic(marker, options.root.to_string().as_bytes())
            {
                tracing::warn!(file = %marker.display(), error = %e, "cannot record that qosd created its cgroup root; a restarted qosd will leave it in place");
            }
            true
        };
        let mut manager = Self {
            cgroups,
            tiers,
            supervisor: Supervisor::new(options.backoff),
            options,
            pods: BTreeMap::new(),
            pending: BTreeMap::new(),
            index,
            metrics,
            created_root,
            written_pool: resources.shared_pool().clone(),
            resources,
            adoptable: BTreeSet::new(),
            knobs: Capabilities::default(),
            to_advance: BTreeSet::new(),
            feedback: None,
            numa_nodes: BTreeSet::new(),
            ids: BTreeMap::new(),
        };
        // A setting the kernel refuses degrades that tier, not the node: it is logged and
        // counted, and reconcile writes it again. Failing to make kubepods stops the start.
        match manager.ensure_tiers(Cause::Change) {
            Ok(()) => {}
            Err(e @ CgroupError::Write { .. }) => {
                tracing::warn!(error = %e, "a QoS tier setting was refused; the tier runs without it until reconcile writes it");
                manager.count_error(&e);
            }
            Err(e) => return Err(e.into()),
        }
        manager.enforce_reserved(Cause::Change);
        tracing::info!(root = %manager.options.root, created_root, "container manager started");
        Ok(manager)
    }

    /// The report `qosd inspect` prints.
    #[must_use]
    pub fn render_tree(&self) -> crate::report::Report {
        super::tree::render(self)
    }

    /// The backend's read side.
    fn reader(&self) -> &dyn CgroupReader {
        &*self.cgroups
    }

    // Accessors for the tree renderer.
    pub(super) fn tiers(&self) -> &QosTiers {
        &self.tiers
    }

    pub(super) fn feedback_log(&self) -> Option<&DecisionLog> {
        self.feedback.as_ref().map(FeedbackLoop::log)
    }

    pub(super) fn cgroup_driver(&self) -> &dyn CgroupReader {
        self.reader()
    }

    pub(super) fn pod_views(&self) -> impl Iterator<Item = PodView<'_>> {
        self.pods.iter().map(|(uid, p)| PodView {
            uid,
            pod: &p.pod,
            qos: p.qos,
            cgroup: &p.cgroup,
            origin: &p.origin,
            phase: match p.phase {
                Phase::Initializing(_) => "Initializing",
                Phase::Running => "Running",
                Phase::Terminating => "Terminating",
            },
        })
    }

    pub(super) fn container_state(
        &self,
        uid: &str,
        container: &str,
    ) -> Option<(&ContainerState, u32)> {
        let key = self.key(uid, container);
        self.supervisor
            .state(&key)
            .map(|s| (s, self.supervisor.restart_count(&key)))
    }
}

/// A read-only view of one managed pod.
pub(super) struct PodView<'a> {
    pub uid: &'a str,
    pub pod: &'a Pod,
    pub qos: QosClass,
    pub cgroup: &'a CgroupName,
    pub origin: &'a Origin,
    pub phase: &'static str,
}

/// How the feedback names a container of pod `uid`.
fn container_ref(uid: &str, pod: &Pod, container: &str) -> ContainerRef {
    ContainerRef {
        pod_uid: uid.to_owned(),
        pod: pod.full_name(),
        container: container.to_owned(),
    }
}

/// Names of all of a pod's containers, init containers included.
fn container_names(pod: &Pod) -> Vec<String> {
    pod.spec.all_containers().map(|c| c.name.clone()).collect()
}

fn to_admission(pod: &Pod) -> AdmissionRequests {
    let r = pod.effective_requests();
    AdmissionRequests {
        milli_cpu: r.cpu_millis,
        memory_bytes: r.memory_bytes,
    }
}

fn log_event(event: &Event) {
    match event {
        Event::Started { key, pid } => {
            tracing::info!(pod_uid = %key.pod_uid, container = %key.container, pid, "container started");
        }
        Event::Adopted { key, pid } => {
            tracing::info!(pod_uid = %key.pod_uid, container = %key.container, pid, "running container adopted from an earlier run");
        }
        Event::Exited { key, exit_code } => {
            tracing::info!(pod_uid = %key.pod_uid, container = %key.container, exit_code, "container exited");
        }
        Event::StartFailed { key, error } => {
            tracing::warn!(pod_uid = %key.pod_uid, container = %key.container, %error, "container failed to start");
        }
        Event::Killed { key } => {
            tracing::warn!(pod_uid = %key.pod_uid, container = %key.container, "grace period over; SIGKILL");
        }
        Event::Stopped { key } => {
            tracing::info!(pod_uid = %key.pod_uid, container = %key.container, "container stopped");
        }
    }
}
