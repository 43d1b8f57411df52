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
use std::time::{Duration, Instant};

use crate::cgroup::backend::{CgroupError, CgroupReader, CgroupWriter};
use crate::cgroup::cpuset::CpuSet;
use crate::cgroup::files::{Controller, Setting};
use crate::cgroup::name::{CgroupName, NameError};
use crate::cgroup::resources::{Limit, QUOTA_PERIOD, ResourceConfig};
use crate::feedback::{
    CfsLimit, ContainerRef, DecisionLog, Feedback, FeedbackConfig, FeedbackMetrics,
    PreemptionSource,
};
use crate::numa::NodeLayout;
use crate::pods::manifest::{PodEvent, SourcedPod};
use crate::pods::model::{Container, Pod, RestartPolicy as PodRestartPolicy};
use crate::pods::qos::{QosClass, pod_qos};
use crate::runtime::backoff::Backoff;
use crate::runtime::process::{self, Launch};
use crate::runtime::supervisor::{
    ContainerKey, ContainerSpec, ContainerState, Event, RestartPolicy, Supervisor,
};

use super::admission::{AdmissionRejection, PodRequests as AdmissionRequests, fits};
use super::allocatable::NodeAllocatable;
use super::checkpoint;
use super::feedback::{self, FeedbackLoop, Watched};
use super::index::{Workload, WorkloadIndex};
use super::metrics::CmMetrics;
use super::pod_resources::{PodCgroupPolicy, container_config, pod_config};
use super::qos_tiers::{QosTiers, tier_settings};
use super::resource_managers::{ObservedContainer, PlacementRejection, ResourceManagers};
use crate::cm::cpu::Cpus;

/// In the state directory: the cgroup root qosd created and has not removed yet.
const ROOT_OWNER_FILE: &str = "cgroup_root_created";

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
    file: PathBuf,
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
    /// Containers whose cgroup survived a restart with its process: adopted, not started.
    adoptable: BTreeSet<ContainerKey>,
    /// The feedback policies and the values they lay over kubelet's, when enabled.
    feedback: Option<FeedbackLoop>,
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
            feedback: None,
        };
        manager.ensure_tiers(Cause::Change)?;
        manager.enforce_reserved(Cause::Change);
        tracing::info!(root = %manager.options.root, created_root, "container manager started");
        Ok(manager)
    }

    /// Takes the pod source's first complete list after start: rebuilds unusable checkpoints
    /// from the cgroups of these pods that survived (a restart of qosd), releases checkpointed
    /// assignments of pods that are gone, admits the pods (surviving ones keep their CPUs and
    /// memory nodes, and their running processes are adopted), and removes pod cgroups under
    /// the QoS tiers that no pod claims.
    pub fn resume(&mut self, events: Vec<PodEvent>) {
        let pods: Vec<&Pod> = events
            .iter()
            .filter_map(|e| match e {
                PodEvent::Added(s) | PodEvent::Updated(s) => Some(&s.pod),
                PodEvent::Removed { .. } => None,
            })
            .collect();
        let mut observed = Vec::new();
        let mut surviving = 0usize;
        for pod in &pods {
            let uid = pod.uid();
            let Ok(cgroup) = self.tiers.pod_cgroup(pod_qos(&pod.spec), &uid) else {
                continue;
            };
            if !self.cgroups.exists(&cgroup).unwrap_or(false) {
                continue;
            }
            surviving += 1;
            for container in pod.spec.all_containers() {
                let Ok(name) = cgroup.child(&container.name) else {
                    continue;
                };
                let Some((cpus, mems)) = self.read_cpusets(&name) else {
                    continue;
                };
                observed.push(ObservedContainer {
                    pod,
                    container: &container.name,
                    cpus,
                    mems,
                });
                if self
                    .cgroups
                    .pids(&name)
                    .is_ok_and(|p| process::group_leader(&p).is_some())
                {
                    self.adoptable.insert(self.key(&uid, &container.name));
                }
            }
        }
        if self.resources.needs_recovery() {
            self.resources.recover(&observed);
        }
        let active: BTreeMap<String, BTreeSet<String>> = pods
            .iter()
            .map(|p| {
                (
                    p.uid(),
                    p.spec.all_containers().map(|c| c.name.clone()).collect(),
                )
            })
            .collect();
        self.resources
            .remove_stale(|uid, c| active.get(uid).is_some_and(|names| names.contains(c)));
        tracing::info!(
            pods = pods.len(),
            surviving,
            adoptable = self.adoptable.len(),
            "resuming"
        );
        for event in events {
            self.handle(event);
        }
        self.remove_orphans();
        // Anything not adopted by now is started afresh from here on.
        self.adoptable.clear();
    }

    /// Kills the processes of pod cgroups under the tiers that belong to no admitted pod (left
    /// by an earlier run whose pods are gone or were not admitted again) and removes the
    /// cgroups.
    fn remove_orphans(&mut self) {
        let claimed: BTreeSet<CgroupName> = self.pods.values().map(|p| p.cgroup.clone()).collect();
        for tier in [
            self.tiers.kubepods.clone(),
            self.tiers.burstable.clone(),
            self.tiers.besteffort.clone(),
        ] {
            let children = match self.cgroups.children(&tier) {
                Ok(children) => children,
                Err(e) => {
                    tracing::warn!(cgroup = %tier, error = %e, "listing pod cgroups");
                    continue;
                }
            };
            for child in children {
                let is_pod = child
                    .components()
                    .last()
                    .is_some_and(|c| c.starts_with("pod"));
                if !is_pod || claimed.contains(&child) {
                    continue;
                }
                match self.cgroups.kill(&child) {
                    Ok(killed) => {
                        tracing::warn!(cgroup = %child, processes = killed, "removing a pod cgroup no pod claims (left by an earlier run)");
                    }
                    Err(e) => {
                        tracing::warn!(cgroup = %child, error = %e, "killing the processes of an orphaned pod cgroup");
                    }
                }
                if let Err(e) = self.cgroups.destroy(&child) {
                    tracing::warn!(cgroup = %child, error = %e, "removing an orphaned pod cgroup");
                    self.count_error(&e);
                }
            }
        }
    }

    /// A container cgroup's `cpuset.cpus` and `cpuset.mems` (`None` each when unset or
    /// unreadable); `None` when the cgroup has no cpuset directory.
    fn read_cpusets(&self, name: &CgroupName) -> Option<(Option<CpuSet>, Option<CpuSet>)> {
        if !self
            .cgroups
            .paths(name)
            .ok()?
            .contains_key(&Controller::Cpuset)
        {
            return None;
        }
        let read = |setting: Setting| {
            self.cgroups
                .setting(name, setting)
                .ok()
                .flatten()
                .and_then(|(_, text)| CpuSet::parse(&text).ok())
                .filter(|set| !set.is_empty())
        };
        Some((read(Setting::CpusetCpus), read(Setting::CpusetMems)))
    }

    /// Applies a pod event from the pod source.
    pub fn handle(&mut self, event: PodEvent) {
        match event {
            PodEvent::Added(sourced) => self.admit(sourced),
            PodEvent::Updated(sourced) => {
                let uid = sourced.pod.uid();
                tracing::info!(pod = %sourced.pod.full_name(), "pod changed; restarting it with the new spec");
                self.begin_termination(&uid);
                self.pending.insert(uid, sourced);
            }
            PodEvent::Removed {
                uid,
                namespace,
                name,
            } => {
                tracing::info!(pod = %format!("{namespace}/{name}"), "pod removed");
                self.pending.remove(&uid);
                self.begin_termination(&uid);
            }
        }
    }

    /// Reaps containers, advances init containers, finishes terminations.
    pub fn tick(&mut self) {
        for event in self.supervisor.tick(&*self.cgroups) {
            log_event(&event);
        }
        let uids: Vec<String> = self.pods.keys().cloned().collect();
        for uid in uids {
            self.advance(&uid);
        }
    }

    /// Compares cgroupfs with the desired state and corrects every difference.
    pub fn reconcile(&mut self) {
        self.resources.flush();
        if let Err(e) = self.ensure_tiers(Cause::Reconcile) {
            tracing::warn!(error = %e, "reconciling the QoS tiers");
        }
        self.enforce_reserved(Cause::Reconcile);
        let uids: Vec<String> = self.pods.keys().cloned().collect();
        for uid in uids {
            if let Err(e) = self.reconcile_pod(&uid, Cause::Reconcile) {
                tracing::warn!(pod_uid = %uid, error = %e, "reconciling pod cgroups");
                self.count_error(&e);
            }
        }
    }

    /// Turns the feedback on: what the kernel allows is read from the kubepods cgroup's files;
    /// NUMA realignment needs the machine's `layout`; BestEffort suppression needs the run-queue
    /// probe's `preemptions`.
    pub fn enable_feedback(
        &mut self,
        config: FeedbackConfig,
        layout: Option<NodeLayout>,
        preemptions: Option<Box<dyn PreemptionSource>>,
        metrics: Option<FeedbackMetrics>,
    ) {
        let caps = feedback::capabilities(self.reader(), &self.tiers.kubepods);
        tracing::info!(
            mode = ?config.mode,
            period = ?config.period,
            cpu_burst = caps.cpu_burst,
            cpu_idle = caps.cpu_idle,
            numa_layout = layout.is_some(),
            preemptions = preemptions.is_some(),
            "feedback enabled"
        );
        let policies = Feedback::new(config, caps, layout, metrics);
        self.feedback = Some(FeedbackLoop::new(policies, preemptions, self.index.clone()));
    }

    /// Runs the feedback when a snapshot is due; changed overrides are written at once.
    pub fn feedback_tick(&mut self) {
        let now = Instant::now();
        if !self.feedback.as_ref().is_some_and(|f| f.due(now)) {
            return;
        }
        let watched = self.watched();
        let changes = match self.feedback.as_mut() {
            Some(f) => f.run(&*self.cgroups, &watched, now),
            None => return,
        };
        if !changes.overrides {
            return;
        }
        self.refresh_tiers();
        let uids: Vec<String> = self.pods.keys().cloned().collect();
        for uid in uids {
            if let Err(e) = self.reconcile_pod(&uid, Cause::Change) {
                tracing::warn!(pod_uid = %uid, error = %e, "applying feedback overrides");
                self.count_error(&e);
            }
        }
        for (target, mems) in changes.memory_moved {
            if let Some(w) = watched.iter().find(|w| w.target == target) {
                self.move_memory(&w.cgroup, &mems);
            }
        }
    }

    /// Moves the pages of every process in `cgroup` onto `mems` (a single node), for kernels
    /// whose cgroup v2 does not migrate them on a `cpuset.mems` change. The kernel copies the
    /// pages synchronously (seconds for gigabytes), so it happens on a thread of its own and
    /// the manager runs on.
    fn move_memory(&self, cgroup: &CgroupName, mems: &CpuSet) {
        let Some(to) = mems.iter().next().filter(|_| mems.len() == 1) else {
            return;
        };
        let pids = match self.cgroups.pids(cgroup) {
            Ok(pids) => pids,
            Err(e) => {
                tracing::warn!(cgroup = %cgroup, error = %e, "listing processes to move their memory");
                return;
            }
        };
        let nodes = NodeLayout::read_system()
            .map(|l| l.nodes())
            .unwrap_or_default();
        let cgroup_name = cgroup.to_string();
        let moved = std::thread::Builder::new()
            .name("numa-migrate".into())
            .spawn(move || {
                for pid in pids {
                    match crate::numa::migrate::move_pages_to(pid, to, &nodes) {
                        Ok(left) => {
                            tracing::info!(cgroup = %cgroup_name, pid, node = to, pages_left = left, "memory moved");
                        }
                        Err(e) => tracing::warn!(cgroup = %cgroup_name, pid, error = %e, "moving memory"),
                    }
                }
            });
        if let Err(e) = moved {
            tracing::warn!(cgroup = %cgroup, error = %e, "starting the memory mover");
        }
    }

    /// The running containers the feedback watches.
    fn watched(&self) -> Vec<Watched> {
        let mut out = Vec::new();
        for (uid, managed) in &self.pods {
            if managed.phase == Phase::Terminating {
                continue;
            }
            for container in &managed.pod.spec.containers {
                let Ok(cgroup) = managed.cgroup.child(&container.name) else {
                    continue;
                };
                let config = container_config(container, self.options.policy);
                let limit = match config.cpu_quota {
                    Some(Limit::Value(quota_us)) => Some(CfsLimit {
                        quota_us,
                        period_us: config.cpu_period.unwrap_or(QUOTA_PERIOD),
                    }),
                    _ => None,
                };
                out.push(Watched {
                    target: container_ref(uid, &managed.pod, &container.name),
                    qos: managed.qos,
                    cgroup,
                    limit,
                    mems_pinned: self.resources.cpusets(uid, &container.name).mems.is_some(),
                });
            }
        }
        out
    }

    /// Stops every container (SIGTERM, SIGKILL after each grace period, at most `within`) and
    /// removes every cgroup this manager created.
    pub fn shutdown(mut self, within: Duration) {
        let uids: Vec<String> = self.pods.keys().cloned().collect();
        for uid in &uids {
            self.begin_termination(uid);
        }
        let deadline = Instant::now() + within;
        while !self.supervisor.is_empty() && Instant::now() < deadline {
            for event in self.supervisor.tick(&*self.cgroups) {
                log_event(&event);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for uid in uids {
            self.finish_termination(&uid);
        }
        for tier in [
            self.tiers.burstable.clone(),
            self.tiers.besteffort.clone(),
            self.tiers.kubepods.clone(),
        ] {
            if let Err(e) = self.cgroups.destroy(&tier) {
                tracing::warn!(cgroup = %tier, error = %e, "removing a QoS tier");
            }
        }
        if self.created_root {
            match self.cgroups.destroy(&self.options.root) {
                Ok(_) => {
                    if let Some(dir) = &self.options.state_dir {
                        let _ = std::fs::remove_file(dir.join(ROOT_OWNER_FILE));
                    }
                }
                Err(e) => {
                    tracing::warn!(cgroup = %self.options.root, error = %e, "removing the cgroup root");
                }
            }
        }
        self.resources.flush();
        tracing::info!("container manager stopped; its cgroups are removed");
    }

    /// The tree for `qosd inspect`.
    #[must_use]
    pub fn render_tree(&self) -> String {
        super::tree::render(self)
    }

    fn admit(&mut self, sourced: SourcedPod) {
        let SourcedPod { pod, file, .. } = sourced;
        let uid = pod.uid();
        let name = pod.full_name();
        if self.pods.contains_key(&uid) {
            // The old version is still terminating: wait for it.
            self.pending.insert(
                uid,
                SourcedPod {
                    pod,
                    file,
                    document: 0,
                },
            );
            return;
        }
        let requests = pod.effective_requests();
        // kubelet's order: the resource managers' admit handler, then the fit predicate.
        if let Err(rejection) = self.resources.admit(&pod) {
            self.reject_placement(&name, &rejection);
            return;
        }
        let admitted: Vec<AdmissionRequests> = self
            .pods
            .values()
            .filter(|p| p.phase != Phase::Terminating)
            .map(|p| to_admission(&p.pod))
            .collect();
        if let Err(rejection) = fits(&to_admission(&pod), &admitted, &self.options.allocatable) {
            self.resources.release(&uid);
            self.reject(&name, &rejection);
            return;
        }
        let qos = pod_qos(&pod.spec);
        let cgroup = match self.tiers.pod_cgroup(qos, &uid) {
            Ok(cgroup) => cgroup,
            Err(e) => {
                tracing::warn!(pod = %name, error = %e, "pod uid cannot name a cgroup; not admitted");
                return;
            }
        };
        tracing::info!(pod = %name, qos = %qos, cpu_millis = requests.cpu_millis, memory_bytes = requests.memory_bytes, file = %file.display(), "pod admitted");
        // A pod that was running before a restart does not run its init containers again.
        let resumed = pod
            .spec
            .containers
            .iter()
            .any(|c| self.adoptable.contains(&self.key(&uid, &c.name)));
        let phase = if pod.spec.init_containers.is_empty() || resumed {
            Phase::Running
        } else {
            Phase::Initializing(0)
        };
        self.pods.insert(
            uid.clone(),
            ManagedPod {
                pod,
                file,
                qos,
                cgroup,
                phase,
            },
        );
        // Shared containers leave CPUs this pod now holds exclusively before it starts.
        self.refresh_shared_pool();
        if let Err(e) = self.reconcile_pod(&uid, Cause::Change) {
            tracing::warn!(pod = %name, error = %e, "creating pod cgroups");
            self.count_error(&e);
        }
        self.advance(&uid);
        self.refresh_tiers();
        self.publish_pod_counts();
    }

    fn reject_placement(&self, pod: &str, rejection: &PlacementRejection) {
        tracing::warn!(pod, reason = %rejection.reason, message = %rejection.message, "pod rejected at admission: its resources cannot be placed");
        self.metrics
            .admission_rejections
            .with_label_values(&[&rejection.reason])
            .inc();
    }

    /// Rewrites every container's cgroup when the shared CPU pool changed (an exclusive
    /// assignment came or went), so shared containers follow the pool.
    fn refresh_shared_pool(&mut self) {
        if self.resources.shared_pool() == &self.written_pool {
            return;
        }
        tracing::info!(from = %self.written_pool, to = %self.resources.shared_pool(), "shared CPU pool changed; updating every container's cpuset");
        self.written_pool = self.resources.shared_pool().clone();
        let uids: Vec<String> = self.pods.keys().cloned().collect();
        for uid in uids {
            if let Err(e) = self.reconcile_pod(&uid, Cause::Change) {
                tracing::warn!(pod_uid = %uid, error = %e, "updating container cpusets");
                self.count_error(&e);
            }
        }
    }

    fn reject(&self, pod: &str, rejection: &AdmissionRejection) {
        let reason = rejection.reason();
        tracing::warn!(pod, reason = %reason, message = %rejection, "pod rejected at admission");
        self.metrics
            .admission_rejections
            .with_label_values(&[&reason])
            .inc();
    }

    /// Creates or corrects the pod cgroup and its container cgroups, and (re)indexes them.
    fn reconcile_pod(&mut self, uid: &str, cause: Cause) -> Result<(), CgroupError> {
        let Some(managed) = self.pods.get(uid) else {
            return Ok(());
        };
        if managed.phase == Phase::Terminating {
            return Ok(());
        }
        let pod_cgroup = managed.cgroup.clone();
        let desired = pod_config(&managed.pod.spec, self.options.policy);
        let containers: Vec<Container> = managed.pod.spec.all_containers().cloned().collect();
        let workload = |container: Option<&str>| Workload {
            namespace: managed.pod.metadata.namespace.clone(),
            pod: managed.pod.metadata.name.clone(),
            container: container.map(str::to_owned),
            qos_class: managed.qos,
        };
        let mut indexed = vec![(pod_cgroup.clone(), workload(None))];
        self.apply(&pod_cgroup, &desired, cause)?;
        for container in &containers {
            let name = pod_cgroup
                .child(&container.name)
                .map_err(CgroupError::from)?;
            let cpusets = self.resources.cpusets(uid, &container.name);
            let config = ResourceConfig {
                cpuset_cpus: cpusets.cpus,
                cpuset_mems: cpusets.mems,
                ..container_config(container, self.options.policy)
            };
            let config = match &self.feedback {
                Some(f) => {
                    f.container_config(&container_ref(uid, &managed.pod, &container.name), config)
                }
                None => config,
            };
            self.apply(&name, &config, cause)?;
            indexed.push((name, workload(Some(&container.name))));
        }
        for (name, workload) in indexed {
            if let Some(id) = self.cgroup_id(&name) {
                self.index.insert(id, workload);
            }
        }
        Ok(())
    }

    /// Creates `name` with `config`, or rewrites what differs; counts drift and errors.
    fn apply(
        &self,
        name: &CgroupName,
        config: &ResourceConfig,
        cause: Cause,
    ) -> Result<(), CgroupError> {
        if self.cgroups.exists(name)? {
            let report = self.cgroups.update(name, config)?;
            for w in &report.written {
                if cause == Cause::Reconcile {
                    tracing::info!(file = %w.path.display(), value = %w.value, "corrected drift");
                    self.metrics.drift_corrections.inc();
                } else {
                    tracing::debug!(file = %w.path.display(), value = %w.value, "updated");
                }
            }
        } else {
            if cause == Cause::Reconcile {
                tracing::info!(cgroup = %name, "recreating a cgroup that disappeared");
                self.metrics.drift_corrections.inc();
            }
            let report = self.cgroups.create(name, config)?;
            tracing::debug!(cgroup = %name, written = report.written.len(), "cgroup created");
        }
        Ok(())
    }

    /// Starts or restarts what the pod's phase calls for.
    fn advance(&mut self, uid: &str) {
        let Some(managed) = self.pods.get(uid) else {
            return;
        };
        match managed.phase {
            Phase::Initializing(i) => {
                let Some(init) = managed.pod.spec.init_containers.get(i).cloned() else {
                    self.set_phase(uid, Phase::Running);
                    self.advance(uid);
                    return;
                };
                let key = self.key(uid, &init.name);
                match self.supervisor.state(&key) {
                    None => self.launch(uid, &init, true),
                    Some(ContainerState::Terminated { exit_code: 0 }) => {
                        self.set_phase(uid, Phase::Initializing(i + 1));
                    }
                    Some(_) => {}
                }
            }
            Phase::Running => {
                let containers = managed.pod.spec.containers.clone();
                for container in &containers {
                    if self
                        .supervisor
                        .state(&self.key(uid, &container.name))
                        .is_none()
                    {
                        self.launch(uid, container, false);
                    }
                }
            }
            Phase::Terminating => {
                let names = container_names(&managed.pod);
                if names
                    .iter()
                    .all(|n| self.supervisor.state(&self.key(uid, n)).is_none())
                {
                    self.finish_termination(uid);
                    if let Some(next) = self.pending.remove(uid) {
                        self.admit(next);
                    }
                }
            }
        }
    }

    fn set_phase(&mut self, uid: &str, phase: Phase) {
        if let Some(managed) = self.pods.get_mut(uid) {
            managed.phase = phase;
        }
    }

    fn key(&self, uid: &str, container: &str) -> ContainerKey {
        ContainerKey {
            pod_uid: uid.to_owned(),
            container: container.to_owned(),
        }
    }

    fn launch(&mut self, uid: &str, container: &Container, init: bool) {
        let Some(managed) = self.pods.get(uid) else {
            return;
        };
        let Ok(cgroup) = managed.cgroup.child(&container.name) else {
            return;
        };
        let restart_policy = match (init, managed.pod.spec.restart_policy) {
            (_, PodRestartPolicy::Never) => RestartPolicy::Never,
            (true, _) | (false, PodRestartPolicy::OnFailure) => RestartPolicy::OnFailure,
            (false, PodRestartPolicy::Always) => RestartPolicy::Always,
        };
        let log_file = self.options.log_dir.as_ref().map(|dir| {
            dir.join(format!(
                "{}_{}_{uid}",
                managed.pod.metadata.namespace, managed.pod.metadata.name
            ))
            .join(format!("{}.log", container.name))
        });
        let spec = ContainerSpec {
            launch: Launch {
                argv: container
                    .command
                    .iter()
                    .chain(container.args.iter())
                    .cloned()
                    .collect(),
                env: container
                    .env
                    .iter()
                    .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
                    .collect(),
                log_file,
            },
            cgroup: cgroup.clone(),
            restart_policy,
            grace: Duration::from_secs(
                u64::try_from(managed.pod.spec.termination_grace_period_seconds).unwrap_or(0),
            ),
        };
        let key = self.key(uid, &container.name);
        if self.adoptable.remove(&key)
            && let Some(pid) = self
                .cgroups
                .pids(&cgroup)
                .ok()
                .and_then(|pids| process::group_leader(&pids))
        {
            match self.supervisor.adopt(&key, &spec, pid) {
                Some(Ok(event)) => {
                    log_event(&event);
                    return;
                }
                Some(Err(e)) => {
                    tracing::warn!(pod_uid = %uid, container = %container.name, error = %e, "cannot adopt the running process; starting the container again");
                }
                None => return,
            }
        }
        if let Some(event) = self.supervisor.ensure(&key, &spec, &*self.cgroups) {
            log_event(&event);
        }
    }

    fn begin_termination(&mut self, uid: &str) {
        let Some(managed) = self.pods.get_mut(uid) else {
            return;
        };
        managed.phase = Phase::Terminating;
        let names = container_names(&managed.pod);
        for name in names {
            let key = self.key(uid, &name);
            self.supervisor.stop(&key);
        }
        self.refresh_tiers();
        self.publish_pod_counts();
    }

    /// Removes the pod's cgroups (containers are stopped by now) and forgets it.
    fn finish_termination(&mut self, uid: &str) {
        let Some(managed) = self.pods.remove(uid) else {
            return;
        };
        if let Err(e) = self.cgroups.destroy(&managed.cgroup) {
            tracing::warn!(pod = %managed.pod.full_name(), error = %e, "removing pod cgroups");
            self.count_error(&e);
        }
        self.index
            .remove_pod(&managed.pod.metadata.namespace, &managed.pod.metadata.name);
        self.resources.release(uid);
        tracing::info!(pod = %managed.pod.full_name(), "pod stopped and its cgroups removed");
        self.refresh_shared_pool();
        self.refresh_tiers();
        self.publish_pod_counts();
    }

    fn ensure_tiers(&mut self, cause: Cause) -> Result<(), CgroupError> {
        let kubepods = self.options.kubepods.clone();
        self.apply(&self.tiers.kubepods.clone(), &kubepods, cause)?;
        self.refresh_tiers_checked(cause)
    }

    fn refresh_tiers(&mut self) {
        if let Err(e) = self.refresh_tiers_checked(Cause::Change) {
            tracing::warn!(error = %e, "updating the QoS tiers");
            self.count_error(&e);
        }
    }

    fn refresh_tiers_checked(&mut self, cause: Cause) -> Result<(), CgroupError> {
        let settings = tier_settings(
            self.pods
                .values()
                .filter(|p| p.phase != Phase::Terminating)
                .map(|p| (p.qos, &p.pod.spec)),
            self.options.policy.memory_qos,
        );
        self.apply(&self.tiers.burstable.clone(), &settings.burstable, cause)?;
        let besteffort = match &self.feedback {
            Some(f) => f.tier_config(settings.besteffort),
            None => settings.besteffort,
        };
        self.apply(&self.tiers.besteffort.clone(), &besteffort, cause)?;
        if let Some(min) = settings.kubepods_memory_min {
            let config = ResourceConfig {
                memory_min: Some(min),
                ..ResourceConfig::default()
            };
            self.apply(&self.tiers.kubepods.clone(), &config, cause)?;
        }
        Ok(())
    }

    fn publish_pod_counts(&self) {
        for qos in QosClass::ALL {
            let n = self
                .pods
                .values()
                .filter(|p| p.qos == qos && p.phase != Phase::Terminating)
                .count();
            self.metrics
                .pods
                .with_label_values(&[qos.as_str()])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    fn count_error(&self, error: &CgroupError) {
        let file = match error {
            CgroupError::Write { path, .. } | CgroupError::Read { path, .. } => path
                .file_name()
                .map_or_else(String::new, |f| f.to_string_lossy().into_owned()),
            CgroupError::Mkdir { .. } => "mkdir".to_owned(),
            CgroupError::Remove { .. } => "rmdir".to_owned(),
            _ => "other".to_owned(),
        };
        self.metrics
            .cgroup_write_errors
            .with_label_values(&[&file])
            .inc();
    }

    /// The kernel id of a cgroup (what the probes record).
    fn cgroup_id(&self, name: &CgroupName) -> Option<u64> {
        self.cgroups.id(name).ok().flatten()
    }

    /// Writes the reservations onto their existing cgroups (kubelet's
    /// `enforceNodeAllocatableCgroups`); a cgroup that is missing or refuses a write is logged
    /// and counted, and the manager runs on.
    fn enforce_reserved(&self, cause: Cause) {
        for (name, config) in &self.options.reserved {
            let result = match self.cgroups.exists(name) {
                Ok(true) => self.apply(name, config, cause),
                Ok(false) => Err(CgroupError::Missing {
                    name: name.to_string(),
                    path: self
                        .cgroups
                        .paths(name)
                        .ok()
                        .and_then(|p| p.into_values().next())
                        .unwrap_or_else(|| PathBuf::from(name.to_cgroupfs())),
                }),
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                tracing::error!(cgroup = %name, error = %e, "cannot enforce the reservation on this cgroup");
                self.metrics
                    .cgroup_write_errors
                    .with_label_values(&["reserved-cgroup"])
                    .inc();
            }
        }
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
            file: &p.file,
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
    pub file: &'a std::path::Path,
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

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use std::path::Path;

    use super::*;
    use crate::cgroup::{CgroupfsBackend, Hierarchies, NameStyle};
    use crate::cm::allocatable::Reservation;
    use crate::cm::metrics::ResourceMetrics;
    use crate::cm::resource_managers::ResourceManagersConfig;
    use crate::config::kubelet::KubeletConfiguration;
    use crate::pods::manifest::{ManifestFormat, parse_manifest};
    use crate::pods::quantity::Quantity;

    const GUARANTEED: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: g, uid: aaaa}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    command: [/bin/sh, -c, 'sleep 30']\n    resources: {limits: {cpu: '1', memory: 128Mi}}\n";
    const BURSTABLE: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: b, uid: bbbb}\nspec:\n  initContainers:\n  - name: init\n    command: [/bin/true]\n  containers:\n  - name: c\n    command: [/bin/sh, -c, 'sleep 30']\n    resources: {requests: {cpu: 500m}}\n";
    const TOO_BIG: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: big, uid: cccc}\nspec:\n  containers:\n  - name: c\n    command: [/bin/true]\n    resources: {requests: {cpu: '8'}}\n";

    fn sourced(yaml: &str) -> SourcedPod {
        let mut parsed = parse_manifest(yaml, ManifestFormat::Yaml);
        let pod = parsed.remove(0).expect("valid manifest").pod;
        SourcedPod {
            pod,
            file: PathBuf::from("fixture.yaml"),
            document: 1,
        }
    }

    /// Resource managers with kubelet's default policies (none, None, none).
    fn default_resources() -> ResourceManagers {
        resources(&KubeletConfiguration::default(), None)
    }

    /// Resource managers for `config` on the test guests' shape (two NUMA nodes of two CPUs).
    fn resources(config: &KubeletConfiguration, state_dir: Option<&Path>) -> ResourceManagers {
        let reservation = Reservation {
            milli_cpu: config.system_reserved.milli_cpu() + config.kube_reserved.milli_cpu(),
            memory_bytes: config.system_reserved.memory_bytes(),
            pids: 0,
        };
        let machine = crate::topology::synthetic::vm_two_numa_four_cpus().expect("topology");
        let metrics = ResourceMetrics::register(&prometheus::Registry::new()).expect("metrics");
        ResourceManagers::new(
            &ResourceManagersConfig::from_kubelet(
                config,
                &reservation,
                state_dir.map(Path::to_path_buf),
            )
            .expect("config"),
            &machine,
            metrics,
        )
        .expect("resource managers")
    }

    /// A v2-shaped fixture tree (plain directories; the manager creates the files it writes).
    fn manager(dir: &Path) -> (ContainerManager, CmMetrics, WorkloadIndex) {
        manager_with(dir, default_resources())
    }

    fn manager_with(
        dir: &Path,
        resources: ResourceManagers,
    ) -> (ContainerManager, CmMetrics, WorkloadIndex) {
        let root = CgroupName::new(["qosd"]).expect("name");
        let cgroups = CgroupfsBackend::new(
            Hierarchies::V2(dir.to_owned()),
            root.clone(),
            NameStyle::Cgroupfs,
        );
        let metrics = CmMetrics::register(&prometheus::Registry::new()).expect("metrics");
        let index = WorkloadIndex::new();
        let options = ManagerOptions {
            root,
            policy: PodCgroupPolicy::default(),
            kubepods: ResourceConfig::default(),
            allocatable: NodeAllocatable {
                milli_cpu: 4000,
                memory_bytes: 4 << 30,
                hugepages: BTreeMap::new(),
                pids: None,
                pods: 110,
            },
            log_dir: None,
            state_dir: Some(dir.join("state")),
            backoff: Backoff {
                initial: Duration::from_millis(20),
                max: Duration::from_millis(100),
                reset_after: Duration::from_secs(600),
            },
            reserved: Vec::new(),
        };
        let manager = ContainerManager::start(
            Box::new(cgroups),
            options,
            resources,
            index.clone(),
            metrics.clone(),
        )
        .expect("start");
        (manager, metrics, index)
    }

    fn read(dir: &Path, relative: &str) -> String {
        std::fs::read_to_string(dir.join(relative))
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|e| format!("<{relative}: {e}>"))
    }

    fn tick_until(
        m: &mut ContainerManager,
        what: &str,
        mut done: impl FnMut(&ContainerManager) -> bool,
    ) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done(m) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            m.tick();
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn pods_get_kubelet_cgroups_tiers_follow_and_everything_is_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut m, metrics, index) = manager(dir.path());
        m.handle(PodEvent::Added(sourced(GUARANTEED)));
        m.handle(PodEvent::Added(sourced(BURSTABLE)));
        let d = dir.path();
        assert_eq!(
            read(d, "qosd/kubepods/podaaaa/cpu.weight"),
            "39",
            "1 CPU = 1024 shares = weight 39"
        );
        assert_eq!(read(d, "qosd/kubepods/podaaaa/cpu.max"), "100000 100000");
        assert_eq!(read(d, "qosd/kubepods/podaaaa/memory.max"), "134217728");
        assert_eq!(read(d, "qosd/kubepods/podaaaa/c/memory.max"), "134217728");
        assert_eq!(
            read(d, "qosd/kubepods/burstable/cpu.weight"),
            "20",
            "burstable tier: 500m = 512 shares"
        );
        assert_eq!(read(d, "qosd/kubepods/besteffort/cpu.weight"), "1");
        assert_eq!(metrics.pods.with_label_values(&["guaranteed"]).get(), 1);
        assert!(index.len() >= 4, "pod and container cgroups are indexed");

        // The burstable pod's init container runs to completion before its app container.
        tick_until(&mut m, "burstable app container", |m| {
            matches!(
                m.container_state("bbbb", "c"),
                Some((ContainerState::Running { .. }, _))
            )
        });
        assert!(matches!(
            m.container_state("bbbb", "init"),
            Some((ContainerState::Terminated { exit_code: 0 }, _))
        ));

        // Does not fit: rejected with kubelet's reason, nothing created.
        m.handle(PodEvent::Added(sourced(TOO_BIG)));
        assert_eq!(
            metrics
                .admission_rejections
                .with_label_values(&["OutOfcpu"])
                .get(),
            1
        );
        assert!(!d.join("qosd/kubepods/burstable/podcccc").exists());

        // Drift: a hand edit is put back by reconcile, and counted.
        std::fs::write(d.join("qosd/kubepods/podaaaa/cpu.max"), "5000 100000").expect("edit");
        m.reconcile();
        assert_eq!(read(d, "qosd/kubepods/podaaaa/cpu.max"), "100000 100000");
        assert!(metrics.drift_corrections.get() >= 1);

        // Removal stops the containers, then removes the pod cgroup; the tier shrinks back.
        m.handle(PodEvent::Removed {
            uid: "bbbb".into(),
            namespace: "default".into(),
            name: "b".into(),
        });
        tick_until(&mut m, "burstable pod removed", |_| {
            !d.join("qosd/kubepods/burstable/podbbbb").exists()
        });
        assert_eq!(read(d, "qosd/kubepods/burstable/cpu.weight"), "1");
        assert!(
            m.render_tree()
                .contains("pod default/g [guaranteed] Running"),
            "{}",
            m.render_tree()
        );

        // An updated manifest restarts the pod with its new values (same uid, same cgroup).
        let first_pid = match m.container_state("aaaa", "c") {
            Some((ContainerState::Running { pid }, _)) => *pid,
            other => panic!("guaranteed container not running: {other:?}"),
        };
        m.handle(PodEvent::Updated(sourced(
            &GUARANTEED.replace("cpu: '1'", "cpu: '2'"),
        )));
        tick_until(
            &mut m,
            "updated pod running again",
            |m| matches!(m.container_state("aaaa", "c"), Some((ContainerState::Running { pid }, _)) if *pid != first_pid),
        );
        assert_eq!(read(d, "qosd/kubepods/podaaaa/cpu.max"), "200000 100000");

        m.shutdown(Duration::from_secs(5));
        assert!(
            !d.join("qosd").exists(),
            "the root the manager created is gone"
        );
    }

    /// The static CPU policy with CPU 0 reserved, the Static memory policy with 128 MiB
    /// reserved on node 0, `single-numa-node`.
    fn pinning_config() -> KubeletConfiguration {
        let mut config = KubeletConfiguration {
            cpu_manager_policy: "static".to_owned(),
            memory_manager_policy: "Static".to_owned(),
            topology_manager_policy: "single-numa-node".to_owned(),
            ..KubeletConfiguration::default()
        };
        config.system_reserved.cpu = Some(Quantity::parse("1").expect("quantity"));
        config.system_reserved.memory = Some(Quantity::parse("128Mi").expect("quantity"));
        config.reserved_memory = vec![crate::config::kubelet::MemoryReservation {
            numa_node: 0,
            limits: BTreeMap::from([(
                "memory".to_owned(),
                Quantity::parse("128Mi").expect("quantity"),
            )]),
        }];
        config
    }

    const PINNED: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: pinned, uid: pppp}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    command: [/bin/sh, -c, 'sleep 30']\n    resources: {limits: {cpu: '2', memory: 256Mi}}\n";
    const SHARED: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: shared, uid: ssss}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    command: [/bin/sh, -c, 'sleep 30']\n    resources: {requests: {cpu: 100m}}\n";
    const SECOND: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: second, uid: tttt}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    command: [/bin/sh, -c, 'sleep 30']\n    resources: {limits: {cpu: '2', memory: 64Mi}}\n";

    #[test]
    fn exclusive_cpus_and_memory_nodes_are_written_and_the_shared_pool_follows() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = tempfile::tempdir().expect("state dir");
        let (mut m, metrics, _) =
            manager_with(dir.path(), resources(&pinning_config(), Some(state.path())));
        m.resume(vec![PodEvent::Added(sourced(SHARED))]);
        let d = dir.path();
        assert_eq!(
            read(d, "qosd/kubepods/burstable/podssss/c/cpuset.cpus"),
            "0-3"
        );

        m.handle(PodEvent::Added(sourced(PINNED)));
        assert_eq!(read(d, "qosd/kubepods/podpppp/c/cpuset.cpus"), "2-3");
        assert_eq!(read(d, "qosd/kubepods/podpppp/c/cpuset.mems"), "1");
        assert_eq!(
            read(d, "qosd/kubepods/burstable/podssss/c/cpuset.cpus"),
            "0-1",
            "the shared container left the exclusive CPUs"
        );
        let checkpoint = std::fs::read_to_string(state.path().join("cpu_manager_state"))
            .expect("checkpoint written");
        assert!(
            checkpoint.contains("\"pppp\":{\"c\":\"2-3\"}"),
            "{checkpoint}"
        );

        // No node has two free CPUs left: kubelet's reason, nothing created, nothing moved.
        m.handle(PodEvent::Added(sourced(SECOND)));
        assert_eq!(
            metrics
                .admission_rejections
                .with_label_values(&["TopologyAffinityError"])
                .get(),
            1
        );
        assert!(!d.join("qosd/kubepods/podtttt").exists());
        assert_eq!(read(d, "qosd/kubepods/podpppp/c/cpuset.cpus"), "2-3");

        // Deletion releases: the shared container gets every CPU back.
        m.handle(PodEvent::Removed {
            uid: "pppp".into(),
            namespace: "default".into(),
            name: "pinned".into(),
        });
        tick_until(&mut m, "pinned pod removed", |_| {
            !d.join("qosd/kubepods/podpppp").exists()
        });
        assert_eq!(
            read(d, "qosd/kubepods/burstable/podssss/c/cpuset.cpus"),
            "0-3"
        );
        m.shutdown(Duration::from_secs(5));
    }

    #[test]
    fn a_restart_with_a_corrupt_checkpoint_keeps_placement_and_adopts_the_process() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = tempfile::tempdir().expect("state dir");
        let d = dir.path();
        let (mut first, _, _) = manager_with(d, resources(&pinning_config(), Some(state.path())));
        first.resume(vec![PodEvent::Added(sourced(PINNED))]);
        let pid = match first.container_state("pppp", "c") {
            Some((ContainerState::Running { pid }, _)) => *pid,
            other => panic!("not running: {other:?}"),
        };
        assert_eq!(read(d, "qosd/kubepods/podpppp/c/cpuset.cpus"), "2-3");
        // qosd dies without cleaning up (the container keeps running); in this fixture tree
        // the kernel's cgroup.procs is played by hand. A stray pod cgroup is left too.
        std::mem::forget(first);
        std::fs::write(
            d.join("qosd/kubepods/podpppp/c/cgroup.procs"),
            format!("{pid}\n"),
        )
        .expect("procs");
        std::fs::create_dir_all(d.join("qosd/kubepods/besteffort/podgone/c")).expect("mkdir");
        std::fs::write(state.path().join("cpu_manager_state"), "{garbage").expect("corrupt");

        let (mut second, _, _) = manager_with(d, resources(&pinning_config(), Some(state.path())));
        second.resume(vec![PodEvent::Added(sourced(PINNED))]);
        assert_eq!(
            second.container_state("pppp", "c").map(|(s, _)| s.clone()),
            Some(ContainerState::Running { pid }),
            "the running process was adopted, not started again"
        );
        assert_eq!(read(d, "qosd/kubepods/podpppp/c/cpuset.cpus"), "2-3");
        assert_eq!(read(d, "qosd/kubepods/podpppp/c/cpuset.mems"), "1");
        assert!(
            !d.join("qosd/kubepods/besteffort/podgone").exists(),
            "the orphaned pod cgroup is removed"
        );
        let checkpoint = std::fs::read_to_string(state.path().join("cpu_manager_state"))
            .expect("checkpoint rewritten");
        assert!(
            checkpoint.contains("\"pppp\":{\"c\":\"2-3\"}"),
            "{checkpoint}"
        );
        second.shutdown(Duration::from_secs(5));
        assert!(
            !d.join("qosd").exists(),
            "the root the first run created is removed by the second"
        );
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists() || {
                // Our own child (spawned by `first`) lingers as a zombie until reaped.
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z "))
            }
        );
    }

    /// Cumulative preemptions the test sets, by (victim, preemptor) cgroup id.
    #[derive(Clone, Default)]
    struct FakePreemptions(
        std::sync::Arc<std::sync::Mutex<HashMap<(u64, u64), crate::feedback::Preemptions>>>,
    );

    impl PreemptionSource for FakePreemptions {
        fn preemptions(
            &mut self,
        ) -> Result<HashMap<(u64, u64), crate::feedback::Preemptions>, crate::metrics::SampleError>
        {
            Ok(self.0.lock().expect("lock").clone())
        }
    }

    const LIMITED: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: web, uid: wwww}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    command: [/bin/sh, -c, 'sleep 30']\n    resources: {requests: {cpu: 100m}, limits: {cpu: 200m}}\n";
    const NOISY: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: noisy, uid: nnnn}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    command: [/bin/sh, -c, 'sleep 30']\n";

    /// The manager writes what the feedback decides, over kubelet's values: a throttled
    /// Burstable container (its cpu.stat as the kernel would report it) gets a CFS burst of
    /// its quota, the BestEffort tier becomes idle once its tasks preempt the Burstable ones,
    /// reconcile keeps both, and `inspect` lists the decisions.
    #[test]
    fn feedback_decisions_are_written_over_kubelets_values_and_kept_by_reconcile() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let (mut m, _, _) = manager(d);
        m.handle(PodEvent::Added(sourced(LIMITED)));
        m.handle(PodEvent::Added(sourced(NOISY)));
        let web = "qosd/kubepods/burstable/podwwww/c";
        let noisy = "qosd/kubepods/besteffort/podnnnn/c";
        assert_eq!(read(d, &format!("{web}/cpu.max")), "20000 100000");
        // A kernel with CFS burst and cpu.idle: the files exist in kubepods.
        for file in ["cpu.max.burst", "cpu.idle"] {
            std::fs::write(d.join("qosd/kubepods").join(file), "0").expect("write");
        }
        let preemptions = FakePreemptions::default();
        let mut config = FeedbackConfig::with_defaults(
            crate::feedback::Mode::On,
            Duration::from_millis(1),
            Duration::from_secs(600),
        );
        config.besteffort.enter_wait = 0.001;
        m.enable_feedback(config, None, Some(Box::new(preemptions.clone())), None);

        let id = |relative: &str| std::fs::metadata(d.join(relative)).expect("cgroup").ino();
        let pair = (id(web), id(noisy));
        let mut last = Instant::now();
        for window in 0..4u64 {
            // 50 periods per window, 20 of them throttled; the besteffort container's tasks
            // preempt the burstable one's, which then wait 20 ms per window.
            std::fs::write(
                d.join(web).join("cpu.stat"),
                format!(
                    "usage_usec 0\nnr_periods {}\nnr_throttled {}\nthrottled_usec 0\nnr_bursts 0\nburst_usec 0\n",
                    50 * window,
                    20 * window
                ),
            )
            .expect("cpu.stat");
            preemptions.0.lock().expect("lock").insert(
                pair,
                crate::feedback::Preemptions {
                    count: 10 * window,
                    wait_ns: 20_000_000 * window,
                },
            );
            while last.elapsed() < Duration::from_millis(2) {
                std::thread::sleep(Duration::from_millis(1));
            }
            last = Instant::now();
            m.feedback_tick();
        }
        assert_eq!(read(d, &format!("{web}/cpu.max.burst")), "20000");
        assert_eq!(read(d, "qosd/kubepods/besteffort/cpu.idle"), "1");
        // Reconcile corrects a hand edit back to the feedback's value, not kubelet's.
        std::fs::write(d.join(web).join("cpu.max.burst"), "0").expect("write");
        m.reconcile();
        assert_eq!(read(d, &format!("{web}/cpu.max.burst")), "20000");
        let tree = m.render_tree();
        assert!(tree.contains("feedback decisions (2):"), "{tree}");
        assert!(tree.contains("cpu_burst apply default/web/c"), "{tree}");
        assert!(
            tree.contains("besteffort_cpu apply besteffort tier: cpu.idle 1"),
            "{tree}"
        );
        m.shutdown(Duration::from_secs(5));
    }
}
