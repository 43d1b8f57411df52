//! The container manager: admits pods, gives each a pod cgroup under its QoS tier and a cgroup
//! per container, runs the containers through the standalone runtime, keeps the tiers' values
//! in line with the admitted pods, and reconciles cgroupfs with the desired state on every
//! change and every period. One pod's error never stops the others. On shutdown it stops every
//! container and removes every cgroup it created.
//!
//! It is the only writer of cgroup files (see docs/architecture.md). It is synchronous and
//! driven by its owner: [`ContainerManager::handle`] for pod events, [`ContainerManager::tick`]
//! often (container exits, terminations), [`ContainerManager::reconcile`] every period.
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::cgroup::files::Controller;
use crate::cgroup::manager::{CgroupError, CgroupManager};
use crate::cgroup::name::{CgroupName, NameError};
use crate::cgroup::resources::ResourceConfig;
use crate::pods::manifest::{PodEvent, SourcedPod};
use crate::pods::model::{Container, Pod, RestartPolicy as PodRestartPolicy};
use crate::pods::qos::{QosClass, pod_qos};
use crate::runtime::backoff::Backoff;
use crate::runtime::process::Launch;
use crate::runtime::supervisor::{
    ContainerKey, ContainerSpec, ContainerState, Event, RestartPolicy, Supervisor,
};

use super::admission::{AdmissionRejection, PodRequests as AdmissionRequests, fits};
use super::allocatable::NodeAllocatable;
use super::index::{Workload, WorkloadIndex};
use super::metrics::CmMetrics;
use super::pod_resources::{PodCgroupPolicy, container_config, pod_config};
use super::qos_tiers::{QosTiers, tier_settings};

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
    pub backoff: Backoff,
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

struct ManagedPod {
    pod: Pod,
    file: PathBuf,
    qos: QosClass,
    cgroup: CgroupName,
    phase: Phase,
}

/// The container manager.
pub struct ContainerManager {
    cgroups: Box<dyn CgroupManager>,
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
}

impl ContainerManager {
    /// Creates the root (when missing), kubepods and the QoS tiers.
    pub fn start(
        cgroups: Box<dyn CgroupManager>,
        options: ManagerOptions,
        index: WorkloadIndex,
        metrics: CmMetrics,
    ) -> Result<Self, ManagerError> {
        let tiers = QosTiers::new(&options.root)?;
        let created_root = !cgroups.exists(&options.root)?;
        if created_root {
            cgroups.create(&options.root, &ResourceConfig::default())?;
        }
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
        };
        manager.ensure_tiers(Cause::Change)?;
        tracing::info!(root = %manager.options.root, created_root, "container manager started");
        Ok(manager)
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
        for event in self.supervisor.tick() {
            log_event(&event);
        }
        let uids: Vec<String> = self.pods.keys().cloned().collect();
        for uid in uids {
            self.advance(&uid);
        }
    }

    /// Compares cgroupfs with the desired state and corrects every difference.
    pub fn reconcile(&mut self) {
        if let Err(e) = self.ensure_tiers(Cause::Reconcile) {
            tracing::warn!(error = %e, "reconciling the QoS tiers");
        }
        let uids: Vec<String> = self.pods.keys().cloned().collect();
        for uid in uids {
            if let Err(e) = self.reconcile_pod(&uid, Cause::Reconcile) {
                tracing::warn!(pod_uid = %uid, error = %e, "reconciling pod cgroups");
                self.count_error(&e);
            }
        }
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
            for event in self.supervisor.tick() {
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
        if self.created_root
            && let Err(e) = self.cgroups.destroy(&self.options.root)
        {
            tracing::warn!(cgroup = %self.options.root, error = %e, "removing the cgroup root");
        }
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
        let admitted: Vec<AdmissionRequests> = self
            .pods
            .values()
            .filter(|p| p.phase != Phase::Terminating)
            .map(|p| to_admission(&p.pod))
            .collect();
        if let Err(rejection) = fits(&to_admission(&pod), &admitted, &self.options.allocatable) {
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
        let phase = if pod.spec.init_containers.is_empty() {
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
        if let Err(e) = self.reconcile_pod(&uid, Cause::Change) {
            tracing::warn!(pod = %name, error = %e, "creating pod cgroups");
            self.count_error(&e);
        }
        self.advance(&uid);
        self.refresh_tiers();
        self.publish_pod_counts();
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
            qos_class: managed.qos.as_str().to_owned(),
        };
        let mut indexed = vec![(pod_cgroup.clone(), workload(None))];
        self.apply(&pod_cgroup, &desired, cause)?;
        for container in &containers {
            let name = pod_cgroup
                .child(&container.name)
                .map_err(CgroupError::from)?;
            self.apply(
                &name,
                &container_config(container, self.options.policy),
                cause,
            )?;
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
        let cgroup_procs: Vec<PathBuf> = match self.cgroups.paths(&cgroup) {
            Ok(paths) => {
                let mut dirs: Vec<PathBuf> = paths.into_values().collect();
                dirs.sort();
                dirs.dedup();
                dirs.into_iter().map(|d| d.join("cgroup.procs")).collect()
            }
            Err(e) => {
                tracing::warn!(pod = %managed.pod.full_name(), container = %container.name, error = %e, "container cgroup paths");
                return;
            }
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
                cgroup_procs,
                log_file,
            },
            restart_policy,
            grace: Duration::from_secs(
                u64::try_from(managed.pod.spec.termination_grace_period_seconds).unwrap_or(0),
            ),
        };
        let key = self.key(uid, &container.name);
        if let Some(event) = self.supervisor.ensure(&key, &spec) {
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
        tracing::info!(pod = %managed.pod.full_name(), "pod stopped and its cgroups removed");
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
        self.apply(&self.tiers.besteffort.clone(), &settings.besteffort, cause)?;
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

    /// The kernel id of a cgroup: the inode of its directory in the cpu hierarchy.
    fn cgroup_id(&self, name: &CgroupName) -> Option<u64> {
        let paths = self.cgroups.paths(name).ok()?;
        let dir = paths
            .get(&Controller::Cpu)
            .or_else(|| paths.values().next())?;
        std::fs::metadata(dir).ok().map(|m| m.ino())
    }

    // Accessors for the tree renderer.
    pub(super) fn tiers(&self) -> &QosTiers {
        &self.tiers
    }
    pub(super) fn cgroup_driver(&self) -> &dyn CgroupManager {
        self.cgroups.as_ref()
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
    use std::collections::BTreeMap;

    use super::*;
    use crate::cgroup::manager::NameStyle;
    use crate::cgroup::{CgroupfsManager, Hierarchies};
    use crate::pods::manifest::{ManifestFormat, parse_manifest};

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

    /// A v2-shaped fixture tree (plain directories; the manager creates the files it writes).
    fn manager(dir: &std::path::Path) -> (ContainerManager, CmMetrics, WorkloadIndex) {
        let root = CgroupName::new(["qosd"]).expect("name");
        let cgroups = CgroupfsManager::new(
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
                milli_cpu: 2000,
                memory_bytes: 4 << 30,
                hugepages: BTreeMap::new(),
                pids: None,
                pods: 110,
            },
            log_dir: None,
            backoff: Backoff {
                initial: Duration::from_millis(20),
                max: Duration::from_millis(100),
                reset_after: Duration::from_secs(600),
            },
        };
        let manager =
            ContainerManager::start(Box::new(cgroups), options, index.clone(), metrics.clone())
                .expect("start");
        (manager, metrics, index)
    }

    fn read(dir: &std::path::Path, relative: &str) -> String {
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
}
