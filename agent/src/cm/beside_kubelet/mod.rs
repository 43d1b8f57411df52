//! qosd beside kubelet: on a Kubernetes node kubelet owns the pod cgroups (creates, writes,
//! removes them) and the container runtime owns the containers. This manager never creates or
//! removes a cgroup there; it
//!
//! - finds kubelet's cgroups for the node's pods ([`discovery`]: pod and container cgroups by
//!   the driver's naming and the runtime ids of the pods' status, on a tree of the hierarchy
//!   kept live from inotify, so discovery runs only when cgroups come or go) and indexes them,
//!   so every metric carries `namespace`, `pod`, `container` and `qos_class` for kubelet's pods
//!   as for qosd's own; cgroups under kubepods that belong to no pod are reported;
//! - checks kubelet ([`expected`], [`drift`]): the values kubelet should have written, from
//!   the pod specs, the KubeletConfiguration and kubelet's own CPU and memory manager
//!   checkpoints, compared with cgroupfs every period; differences are reported, never
//!   corrected;
//! - runs the feedback on kubelet's pods ([`interventions`]): the same policies as standalone,
//!   writing only the files they own through a writer that refuses anything else, with
//!   kubelet's values restored when an intervention is lifted, a pod is being deleted, or qosd
//!   stops; an intervention kubelet writes back is written again and counted.
//!
//! It is synchronous and driven by its owner ([`crate::kubernetes`]): [`BesideKubelet::handle`]
//! for pod events, [`BesideKubelet::tick`] often, [`BesideKubelet::reconcile`] every period,
//! [`BesideKubelet::shutdown`] at the end.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::cgroup::backend::{CgroupReader, CgroupWriter};
use crate::cgroup::name::CgroupName;
use crate::cgroup::trees::CgroupTrees;
use crate::cgroup::walk::Walk;
use crate::cm::feedback_loop::{self, FeedbackLoop, Watched};
use crate::cm::index::{Workload, WorkloadIndex};
use crate::cm::pod_resources::container_config;
use crate::cm::qos_tiers::QosTiers;
use crate::feedback::{ContainerRef, FeedbackConfig, FeedbackMetrics, PreemptionSource};
use crate::numa::NodeLayout;
use crate::pods::model::Pod;
use crate::pods::qos::{QosClass, pod_qos};
use crate::pods::source::{Origin, PodEvent};
use crate::pods::validate::validate_pod;

pub mod discovery;
pub mod drift;
pub mod expected;
pub mod interventions;
pub mod metrics;
mod report;
#[cfg(test)]
mod tests;

use discovery::{Discovery, SANDBOX_CONTAINER};
use drift::{DriftItem, DriftTracker};
use expected::{CheckedPod, KubeletView, Placements};
use interventions::{InForce, Interventions, Target};
use metrics::BesideKubeletMetrics;

/// A pod of the node as the source reports it.
#[derive(Clone, Debug)]
struct TrackedPod {
    pod: Pod,
    origin: Origin,
    /// kubelet's class (`status.qosClass`), else qosd's.
    qos: QosClass,
    /// qosd's class (kubelet's `GetPodQOS`).
    computed: QosClass,
    /// Why qosd cannot model the pod's cgroup values (it then only labels its cgroups).
    unmodelled: Option<String>,
}

impl TrackedPod {
    fn new(pod: Pod, origin: Origin) -> Self {
        let computed = pod_qos(&pod.spec);
        let qos = match pod.status.qos_class.as_str() {
            "Guaranteed" => QosClass::Guaranteed,
            "Burstable" => QosClass::Burstable,
            "BestEffort" => QosClass::BestEffort,
            _ => computed,
        };
        let unmodelled = validate_pod(&pod).err().map(|e| e.to_string());
        Self {
            pod,
            origin,
            qos,
            computed,
            unmodelled,
        }
    }

    /// Running or about to: not finished, not being deleted.
    fn active(&self) -> bool {
        !self.pod.status.is_terminal() && self.pod.metadata.deletion_timestamp.is_none()
    }
}

/// What the manager needs besides its writer.
#[derive(Clone, Debug)]
pub struct BesideKubeletOptions {
    pub view: KubeletView,
    /// kubelet's cgroups: `<cgroupRoot>/kubepods` and its tiers.
    pub tiers: QosTiers,
    /// Where the hierarchy whose directory inodes are the cgroup ids is mounted (the cpu
    /// hierarchy on v1, the unified one on v2): discovery reads its tree.
    pub id_root: PathBuf,
    /// Where kubelet's values under the feedback's interventions are recorded, so that a qosd
    /// killed before it could restore them has the next one do it; `None`: not recorded.
    pub state_dir: Option<PathBuf>,
}

/// The manager beside kubelet.
pub struct BesideKubelet {
    cgroups: Box<dyn CgroupWriter>,
    options: BesideKubeletOptions,
    trees: Arc<CgroupTrees>,
    index: WorkloadIndex,
    metrics: BesideKubeletMetrics,
    pods: BTreeMap<String, TrackedPod>,
    found: Discovery,
    /// The tree the last discovery ran on, and whether pods changed since.
    discovered_on: Option<Arc<Walk>>,
    pods_changed: bool,
    drift: DriftTracker,
    drifts: Vec<DriftItem>,
    placements: Placements,
    placement_problems: Vec<String>,
    feedback: Option<FeedbackLoop>,
    interventions: Interventions,
    numa_nodes: BTreeSet<u32>,
    /// Source health, for `inspect`.
    source: (String, Option<bool>, bool),
}

impl BesideKubelet {
    /// A manager writing through `cgroups` (a [`crate::cgroup::settings_writer::SettingsOnlyWriter`]),
    /// discovering on `trees`, indexing into `index`.
    #[must_use]
    pub fn new(
        cgroups: Box<dyn CgroupWriter>,
        options: BesideKubeletOptions,
        trees: Arc<CgroupTrees>,
        index: WorkloadIndex,
        metrics: BesideKubeletMetrics,
    ) -> Self {
        let mut interventions = match &options.state_dir {
            Some(dir) => Interventions::recorded_in(dir),
            None => Interventions::default(),
        };
        match interventions.recover(&*cgroups) {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                settings = n,
                "kubelet's values put back under interventions an earlier qosd left"
            ),
            Err(e) => {
                tracing::error!(error = %e, "cannot put back what an earlier qosd's interventions changed");
            }
        }
        Self {
            cgroups,
            options,
            trees,
            index,
            metrics,
            pods: BTreeMap::new(),
            found: Discovery::default(),
            discovered_on: None,
            pods_changed: true,
            drift: DriftTracker::default(),
            drifts: Vec::new(),
            placements: Placements::default(),
            placement_problems: Vec::new(),
            feedback: None,
            interventions,
            numa_nodes: BTreeSet::new(),
            source: (String::new(), None, false),
        }
    }

    /// Turns the feedback on (see [`crate::cm::manager::ContainerManager::enable_feedback`]).
    pub fn enable_feedback(
        &mut self,
        config: FeedbackConfig,
        layout: Option<NodeLayout>,
        preemptions: Option<Box<dyn PreemptionSource>>,
        metrics: Option<FeedbackMetrics>,
    ) {
        let (feedback, nodes) = FeedbackLoop::enable(
            &*self.cgroups,
            &self.options.tiers.kubepods,
            config,
            layout,
            preemptions,
            metrics,
            self.index.clone(),
        );
        self.numa_nodes = nodes;
        self.feedback = Some(feedback);
    }

    /// Has the feedback judge unpinned containers by where they ran (see
    /// [`FeedbackLoop::set_placement`]).
    pub fn set_cpu_placement(&mut self, placement: crate::numa::placement::CpuPlacement) {
        if let Some(feedback) = &mut self.feedback {
            feedback.set_placement(placement);
        }
    }

    /// Records how the pod source is doing, for `qosd inspect`.
    pub fn set_source(&mut self, describe: String, reachable: Option<bool>, synced: bool) {
        self.source = (describe, reachable, synced);
    }

    /// A pod event from the source.
    pub fn handle(&mut self, event: PodEvent) {
        self.pods_changed = true;
        match event {
            PodEvent::Added(sourced) | PodEvent::Updated(sourced) => {
                let uid = sourced.pod.metadata.uid.clone();
                let tracked = TrackedPod::new(sourced.pod, sourced.origin);
                if let Some(why) = &tracked.unmodelled {
                    tracing::info!(pod = %tracked.pod.full_name(), reason = %why, "pod's cgroup values not modelled: labelled, not checked");
                }
                self.pods.insert(uid, tracked);
            }
            PodEvent::Removed { uid, .. } => {
                self.pods.remove(&uid);
            }
        }
    }

    /// Discovery when cgroups or pods changed, then the feedback when it is due.
    pub fn tick(&mut self) {
        self.discover();
        self.feedback_tick();
    }

    fn discover(&mut self) {
        let tree = match self.trees.current(&self.options.id_root) {
            Ok(tree) => tree,
            Err(e) => {
                tracing::warn!(root = %self.options.id_root.display(), error = %e, "reading the cgroup tree");
                return;
            }
        };
        let same_tree = self
            .discovered_on
            .as_ref()
            .is_some_and(|t| Arc::ptr_eq(t, &tree));
        if same_tree && !self.pods_changed {
            return;
        }
        let found = discovery::discover(
            &tree,
            &*self.cgroups,
            &self.options.tiers,
            self.pods
                .iter()
                .map(|(uid, p)| (uid.as_str(), &p.pod, p.qos)),
        );
        let mut entries = HashMap::new();
        for (uid, cgroups) in &found.pods {
            let Some(tracked) = self.pods.get(uid) else {
                continue;
            };
            let workload = |container: Option<&str>| Workload {
                namespace: tracked.pod.metadata.namespace.clone(),
                pod: tracked.pod.metadata.name.clone(),
                container: container.map(str::to_owned),
                qos_class: tracked.qos,
            };
            if let Some((pod_cgroup, _)) = &cgroups.pod {
                entries.insert(pod_cgroup.id, workload(None));
            }
            for (name, cgroup) in &cgroups.containers {
                entries.insert(cgroup.id, workload(Some(name)));
            }
            for other in &cgroups.others {
                entries.insert(other.id, workload(Some(SANDBOX_CONTAINER)));
            }
        }
        self.index.replace_all(entries);
        for reason in [
            discovery::Unattributed::UnknownPod,
            discovery::Unattributed::NotAPod,
        ] {
            let n = found
                .unattributed
                .iter()
                .filter(|(_, r)| *r == reason)
                .count();
            self.metrics
                .unattributed
                .with_label_values(&[reason.label()])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        if found.unattributed != self.found.unattributed && !found.unattributed.is_empty() {
            tracing::info!(cgroups = ?found.unattributed, "cgroups under kubepods that belong to no pod of this node");
        }
        self.found = found;
        self.discovered_on = Some(tree);
        self.pods_changed = false;
        for qos in QosClass::ALL {
            let n = self
                .pods
                .values()
                .filter(|p| p.active() && p.qos == qos)
                .count();
            self.metrics
                .pods
                .with_label_values(&[qos.as_str()])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// The pods whose values can be checked: active, modelled, their pod cgroup found; and
    /// whether that is every active pod (the tiers' values sum them all).
    fn checked_pods(&self) -> (Vec<CheckedPod<'_>>, bool) {
        let mut out = Vec::new();
        let mut complete = true;
        for (uid, tracked) in &self.pods {
            if !tracked.active() {
                continue;
            }
            let found = self.found.pods.get(uid);
            let pod_cgroup = found.and_then(|f| f.pod.as_ref());
            let (Some((pod_cgroup, _)), None) = (pod_cgroup, &tracked.unmodelled) else {
                complete = false;
                continue;
            };
            let containers = found
                .map(|f| {
                    f.containers
                        .iter()
                        .map(|(name, c)| (name.as_str(), c.name.clone()))
                        .collect()
                })
                .unwrap_or_default();
            out.push(CheckedPod {
                uid,
                pod: &tracked.pod,
                qos: tracked.qos,
                cgroup: pod_cgroup.name.clone(),
                containers,
            });
        }
        (out, complete)
    }

    /// Compares kubelet's values with cgroupfs (drift), and finds interventions written back.
    pub fn reconcile(&mut self) {
        self.discover();
        self.placements = Placements::read(&self.options.view);
        if self.placements.problems != self.placement_problems {
            for problem in &self.placements.problems {
                tracing::warn!(problem = %problem, "kubelet's checkpoint not usable; its placements are not checked");
            }
            self.placement_problems = self.placements.problems.clone();
        }
        let found = self.drift_items();
        self.drifts = self.drift.check(found, Some(&self.metrics.drift));
        let (reverted, errors) = self.interventions.check(&*self.cgroups);
        for (target, setting, found) in reverted.rewritten {
            let policy = interventions::policy_of(setting);
            tracing::warn!(target = %target, %setting, found = %found, policy, "a feedback intervention was written back (by kubelet?); written again");
            self.metrics.reverted.with_label_values(&[policy]).inc();
        }
        for (target, e) in errors {
            tracing::warn!(target = %target, error = %e, "checking a feedback intervention");
            self.count_intervention_error(&e);
        }
    }

    fn drift_items(&self) -> Vec<DriftItem> {
        let (checked, complete) = self.checked_pods();
        let expectations = expected::expectations(
            &self.options.view,
            &self.options.tiers,
            &checked,
            complete,
            &self.placements,
        );
        let mut items = Vec::new();
        for expectation in expectations {
            let differences = match self
                .cgroups
                .compare(&expectation.cgroup, &expectation.config)
            {
                Ok(d) => d,
                Err(e) => {
                    tracing::debug!(cgroup = %expectation.cgroup, error = %e, "comparing with kubelet's values");
                    continue;
                }
            };
            let (namespace, pod, container, qos_class) = match &expectation.owner {
                Some((uid, container)) => match self.pods.get(uid) {
                    Some(t) => (
                        t.pod.metadata.namespace.clone(),
                        t.pod.metadata.name.clone(),
                        container.clone().unwrap_or_default(),
                        t.qos.as_str().to_owned(),
                    ),
                    None => continue,
                },
                None => Default::default(),
            };
            let path = self
                .cgroups
                .name(&expectation.cgroup)
                .unwrap_or_else(|_| expectation.cgroup.to_cgroupfs());
            // What an intervention holds is the feedback's, not kubelet's drift.
            let held: Vec<_> = self
                .interventions
                .in_force()
                .values()
                .filter(|i| i.cgroup == expectation.cgroup)
                .flat_map(|i| interventions::held(&i.config))
                .collect();
            let not_drift = |d: &crate::cgroup::backend::Difference| {
                held.contains(&d.setting)
                    || (self.options.view.systemd_driver && systemd_rounded(&expectation.config, d))
            };
            for d in differences.into_iter().filter(|d| !not_drift(d)) {
                items.push(DriftItem {
                    level: expectation.level,
                    cgroup: path.clone(),
                    file: d
                        .path
                        .file_name()
                        .map(|f| f.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    expected: d.expected,
                    actual: d.actual,
                    namespace: namespace.clone(),
                    pod: pod.clone(),
                    container: container.clone(),
                    qos_class: qos_class.clone(),
                });
            }
        }
        // kubelet's QoS class itself, against GetPodQOS.
        for checked in &checked {
            if let Some(tracked) = self.pods.get(checked.uid)
                && !tracked.pod.status.qos_class.is_empty()
                && tracked.qos != tracked.computed
            {
                items.push(DriftItem {
                    level: expected::Level::Pod,
                    cgroup: self
                        .cgroups
                        .name(&checked.cgroup)
                        .unwrap_or_else(|_| checked.cgroup.to_cgroupfs()),
                    file: "status.qosClass".into(),
                    expected: tracked.computed.kubelet_name().into(),
                    actual: Some(tracked.pod.status.qos_class.clone()),
                    namespace: tracked.pod.metadata.namespace.clone(),
                    pod: tracked.pod.metadata.name.clone(),
                    container: String::new(),
                    qos_class: tracked.qos.as_str().into(),
                });
            }
        }
        items
    }

    /// The containers the feedback watches: running containers of active pods whose cgroups
    /// were found and that a policy would read something of.
    fn watched(&self) -> Vec<Watched> {
        let Some(feedback) = &self.feedback else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (uid, tracked) in &self.pods {
            if !tracked.active() {
                continue;
            }
            let Some(found) = self.found.pods.get(uid) else {
                continue;
            };
            for container in &tracked.pod.spec.containers {
                let Some(cgroup) = found.containers.get(&container.name) else {
                    continue;
                };
                let limit = if tracked.unmodelled.is_none() {
                    feedback_loop::cfs_limit(&container_config(container, self.options.view.policy))
                } else {
                    None
                };
                // Memory the memory manager placed, or CPUs of its own: kubelet's placement,
                // not to be fought.
                let pinned = self.placements.mems(uid, &container.name).is_some()
                    || self.placements.exclusive(uid, &container.name);
                if !feedback.interested(tracked.qos, limit.is_some(), pinned) {
                    continue;
                }
                out.push(Watched {
                    target: ContainerRef {
                        pod_uid: uid.clone(),
                        pod: tracked.pod.full_name(),
                        container: container.name.clone(),
                    },
                    qos: tracked.qos,
                    cgroup: cgroup.name.clone(),
                    limit,
                    mems_pinned: pinned,
                });
            }
        }
        out
    }

    fn feedback_tick(&mut self) {
        let now = Instant::now();
        if !self.feedback.as_ref().is_some_and(|f| f.due(now)) {
            return;
        }
        let watched = self.watched();
        let besteffort = self.options.tiers.besteffort.clone();
        let changes = match self.feedback.as_mut() {
            Some(f) => f.run(&*self.cgroups, &watched, &besteffort, now),
            None => return,
        };
        if !changes.overrides {
            return;
        }
        self.apply_interventions(&watched);
        for (target, mems) in changes.memory_moved {
            if let Some(w) = watched.iter().find(|w| w.target == target) {
                feedback_loop::move_memory(&*self.cgroups, &w.cgroup, &mems, &self.numa_nodes);
            }
        }
    }

    /// Writes the feedback's overrides (and lifts those gone).
    fn apply_interventions(&mut self, watched: &[Watched]) {
        let Some(feedback) = &self.feedback else {
            return;
        };
        let overrides = feedback.overrides();
        let mut wanted = BTreeMap::new();
        if !overrides.besteffort_tier.is_empty() {
            wanted.insert(
                Target::BestEffortTier,
                InForce {
                    cgroup: self.options.tiers.besteffort.clone(),
                    config: overrides.besteffort_tier.clone(),
                },
            );
        }
        for (target, config) in &overrides.containers {
            let Some(w) = watched.iter().find(|w| &w.target == target) else {
                continue;
            };
            if !config.is_empty() {
                wanted.insert(
                    Target::Container(target.clone()),
                    InForce {
                        cgroup: w.cgroup.clone(),
                        config: config.clone(),
                    },
                );
            }
        }
        for (target, e) in self.interventions.apply(&*self.cgroups, &wanted) {
            tracing::warn!(target = %target, error = %e, "writing a feedback intervention");
            self.count_intervention_error(&e);
        }
    }

    fn count_intervention_error(&self, error: &interventions::InterventionError) {
        match error {
            interventions::InterventionError::Cgroup(e) => self.count_error(e),
            _ => self
                .metrics
                .write_errors
                .with_label_values(&[interventions::RECORD_FILE])
                .inc(),
        }
    }

    fn count_error(&self, error: &crate::cgroup::backend::CgroupError) {
        let file = match error {
            crate::cgroup::backend::CgroupError::Write { path, .. }
            | crate::cgroup::backend::CgroupError::Read { path, .. } => path
                .file_name()
                .map_or_else(String::new, |f| f.to_string_lossy().into_owned()),
            _ => "other".to_owned(),
        };
        self.metrics.write_errors.with_label_values(&[&file]).inc();
    }

    /// Puts kubelet's values back under every intervention; the index is emptied.
    pub fn shutdown(&mut self) {
        let lifted = self.interventions.in_force().len();
        for (target, e) in self.interventions.restore_all(&*self.cgroups) {
            tracing::error!(target = %target, error = %e, "could not put kubelet's value back");
            self.count_intervention_error(&e);
        }
        tracing::info!(
            interventions = lifted,
            "kubelet's values restored under every intervention"
        );
        self.index.replace_all(HashMap::new());
    }

    /// The cgroups found so far (tests and `inspect`).
    #[must_use]
    pub fn discovery(&self) -> &Discovery {
        &self.found
    }

    /// The drifts of the last check.
    #[must_use]
    pub fn drifts(&self) -> &[DriftItem] {
        &self.drifts
    }

    /// The cgroup backend's read side.
    fn reader(&self) -> &dyn CgroupReader {
        &*self.cgroups
    }

    /// The feedback's decisions.
    fn decisions(&self) -> Option<&crate::feedback::DecisionLog> {
        self.feedback.as_ref().map(FeedbackLoop::log)
    }
}

/// True for a quota difference whose value is kubelet's quota as systemd keeps it (rounded up
/// to a whole percent of a CPU, [`crate::cgroup::systemd::properties::quota_per_sec`]): what
/// kubelet's pods hold on the systemd driver after a `daemon-reload`.
fn systemd_rounded(
    expected: &crate::cgroup::resources::ResourceConfig,
    difference: &crate::cgroup::backend::Difference,
) -> bool {
    use crate::cgroup::resources::{Limit, QUOTA_PERIOD};
    use crate::cgroup::systemd::properties::{kernel_quota, quota_per_sec};
    let (crate::cgroup::files::Setting::CpuQuota, Some(quota), Some(actual)) = (
        difference.setting,
        expected.cpu_quota,
        difference.actual.as_deref(),
    ) else {
        return false;
    };
    let period = expected.cpu_period.unwrap_or(QUOTA_PERIOD);
    let rounded = kernel_quota(quota_per_sec(quota, period), period);
    actual
        .split_whitespace()
        .next()
        .and_then(|q| q.parse::<u64>().ok())
        .is_some_and(|q| Limit::Value(q) == rounded)
}

/// What qosd may write beside kubelet: the feedback's settings, each on the cgroup its policy
/// acts on (the BestEffort tier's CFS quota and `cpu.idle`; a container's CFS burst and
/// `cpuset.mems`, with v1's `memory_migrate`). A container cgroup is one whose parent is a pod
/// cgroup (`pod<uid>`). The tier's weight is written only back to kubelet's recorded value when
/// `cpu.idle` is lifted (the kernel resets an idle group's weight when it stops being idle;
/// see [`interventions::held`]). Everything else, kubelet's values included, is refused.
#[must_use]
pub fn write_rule(tiers: &QosTiers) -> crate::cgroup::settings_writer::Rule {
    use crate::cgroup::files::Setting;
    let besteffort = tiers.besteffort.clone();
    let kubepods = tiers.kubepods.clone();
    Box::new(move |name: &CgroupName, setting: Setting| {
        if *name == besteffort {
            return matches!(
                setting,
                Setting::CpuQuota | Setting::CpuIdle | Setting::CpuShares
            );
        }
        let in_a_pod = name.starts_with(&kubepods)
            && name
                .parent()
                .and_then(|p| p.components().last().cloned())
                .is_some_and(|parent| parent.starts_with("pod"));
        in_a_pod
            && matches!(
                setting,
                Setting::CpuBurst | Setting::CpusetMems | Setting::CpusetMemoryMigrate
            )
    })
}

/// The CgroupName of a container found (used by tests).
#[must_use]
pub fn container_cgroup(found: &Discovery, uid: &str, container: &str) -> Option<CgroupName> {
    found
        .pods
        .get(uid)?
        .containers
        .get(container)
        .map(|c| c.name.clone())
}
