//! Desired state to cgroupfs: pod and container cgroups, the QoS tiers, the reserved cgroups; every
//! write idempotent, every write made by the periodic reconcile counted as corrected drift.
use std::path::PathBuf;

use crate::cgroup::backend::CgroupError;
use crate::cgroup::name::CgroupName;
use crate::cgroup::resources::{Limit, ResourceConfig};
use crate::cm::feedback_loop;
use crate::cm::index::Workload;
use crate::cm::pod_resources::{container_config, pod_config};
use crate::cm::qos_tiers::tier_settings;
use crate::pods::model::Container;

use super::ContainerManager;
use super::{Cause, Phase, container_ref};

impl ContainerManager {
    /// Compares cgroupfs with the desired state and corrects every difference.
    pub fn reconcile(&mut self) {
        self.resources.flush();
        if let Err(e) = self.ensure_tiers(Cause::Reconcile) {
            tracing::warn!(error = %e, "reconciling the QoS tiers");
        }
        self.enforce_reserved(Cause::Reconcile);
        let uids: Vec<String> = self.pods.keys().cloned().collect();
        // The next tick advances every pod, whatever events it had: a sweep that would start
        // anything an event failed to.
        self.to_advance.extend(uids.iter().cloned());
        for uid in uids {
            if let Err(e) = self.reconcile_pod(&uid, Cause::Reconcile) {
                tracing::warn!(pod_uid = %uid, error = %e, "reconciling pod cgroups");
                self.count_error(&e);
            }
        }
    }

    /// Creates or corrects the pod cgroup and its container cgroups, and (re)indexes them.
    pub(super) fn reconcile_pod(&mut self, uid: &str, cause: Cause) -> Result<(), CgroupError> {
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
        let mut indexed = vec![(
            pod_cgroup.clone(),
            workload(None),
            self.apply(&pod_cgroup, &desired, cause)?,
        )];
        for container in &containers {
            let name = self.cgroups.container(&pod_cgroup, &container.name)?;
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
                None => {
                    let quota = matches!(config.cpu_quota, Some(Limit::Value(_)));
                    config.overlaid(&self.knobs.container_baseline(quota))
                }
            };
            let created = self.apply(&name, &config, cause)?;
            indexed.push((name, workload(Some(&container.name)), created));
        }
        for (name, workload, created) in indexed {
            // A cgroup keeps its id while it exists: asked again only when it was (re)created.
            let known = self.ids.get(&name).copied().filter(|_| !created);
            if let Some(id) = known.or_else(|| self.cgroup_id(&name)) {
                self.ids.insert(name, id);
                self.index.insert(id, workload);
            }
        }
        Ok(())
    }

    /// Rewrites what differs from `config` in `name`, or creates it; counts drift and errors.
    /// The update comes first: a cgroup that exists (the usual case) costs no existence check,
    /// and only a failed update asks whether the cgroup is gone (then it is created). True when
    /// it was created.
    pub(super) fn apply(
        &self,
        name: &CgroupName,
        config: &ResourceConfig,
        cause: Cause,
    ) -> Result<bool, CgroupError> {
        let updated = match self.cgroups.update(name, config) {
            Ok(report) => Some(report),
            Err(e) if self.cgroups.exists(name)? => return Err(e),
            Err(_) => None,
        };
        if let Some(report) = updated {
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
            return Ok(true);
        }
        Ok(false)
    }

    /// Makes kubepods and the tiers with their settings. A setting the kernel refuses does not
    /// stop the others (the tiers below kubepods are still made): once everything else is
    /// done, one error is returned ([`Self::one_error`]) and the others are logged and counted.
    pub(super) fn ensure_tiers(&mut self, cause: Cause) -> Result<(), CgroupError> {
        let kubepods = self.options.kubepods.clone();
        let refused = self
            .apply(&self.tiers.kubepods.clone(), &kubepods, cause)
            .err();
        if let Some(error) = refused.as_ref()
            && !self.cgroups.exists(&self.tiers.kubepods)?
        {
            // Not even made: nothing can be made below it.
            return Err(CgroupError::NoHierarchy {
                what: format!("{} could not be made: {error}", self.tiers.kubepods),
            });
        }
        self.knobs = feedback_loop::capabilities(self.reader(), &self.tiers.kubepods);
        let tiers = self.refresh_tiers_checked(cause).err();
        self.one_error(refused.into_iter().chain(tiers).collect())
    }

    /// Of several errors of one pass, the one to return: the first that is not a refused write
    /// (a directory not made, a file not read: the caller may not go on), else the first.
    /// Every other one is logged and counted here, so none is lost.
    fn one_error(&self, mut errors: Vec<CgroupError>) -> Result<(), CgroupError> {
        if errors.is_empty() {
            return Ok(());
        }
        let chosen = errors
            .iter()
            .position(|e| !matches!(e, CgroupError::Write { .. }))
            .unwrap_or(0);
        let returned = errors.remove(chosen);
        for other in &errors {
            tracing::warn!(error = %other, "a QoS tier setting was not applied; reconcile tries again");
            self.count_error(other);
        }
        Err(returned)
    }

    pub(super) fn refresh_tiers(&mut self) {
        if let Err(e) = self.refresh_tiers_checked(Cause::Change) {
            tracing::warn!(error = %e, "updating the QoS tiers");
            self.count_error(&e);
        }
    }

    pub(super) fn refresh_tiers_checked(&mut self, cause: Cause) -> Result<(), CgroupError> {
        let settings = tier_settings(
            self.pods
                .values()
                .filter(|p| p.phase != Phase::Terminating)
                .map(|p| (p.qos, &p.pod.spec)),
            self.options.policy.memory_qos,
        );
        let burstable = self
            .apply(&self.tiers.burstable.clone(), &settings.burstable, cause)
            .err();
        let besteffort = match &self.feedback {
            Some(f) => f.tier_config(settings.besteffort),
            None => settings
                .besteffort
                .overlaid(&self.knobs.besteffort_baseline()),
        };
        let besteffort = self
            .apply(&self.tiers.besteffort.clone(), &besteffort, cause)
            .err();
        let kubepods = settings.kubepods_memory_min.and_then(|min| {
            let config = ResourceConfig {
                memory_min: Some(min),
                ..ResourceConfig::default()
            };
            self.apply(&self.tiers.kubepods.clone(), &config, cause)
                .err()
        });
        self.one_error(
            burstable
                .into_iter()
                .chain(besteffort)
                .chain(kubepods)
                .collect(),
        )
    }

    pub(super) fn count_error(&self, error: &CgroupError) {
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
    /// Indexes a container's cgroup again after its process started: the cgroup may be new
    /// (a systemd scope exists only while its processes do), and with it its kernel id.
    pub(super) fn index_started(&mut self, uid: &str, container: &str) {
        let Some(managed) = self.pods.get(uid) else {
            return;
        };
        let Ok(name) = self.cgroups.container(&managed.cgroup, container) else {
            return;
        };
        let workload = Workload {
            namespace: managed.pod.metadata.namespace.clone(),
            pod: managed.pod.metadata.name.clone(),
            container: Some(container.to_owned()),
            qos_class: managed.qos,
        };
        if let Some(id) = self.cgroup_id(&name)
            && self.ids.get(&name) != Some(&id)
        {
            self.ids.insert(name, id);
            self.index.insert(id, workload);
        }
    }

    pub(super) fn cgroup_id(&self, name: &CgroupName) -> Option<u64> {
        self.cgroups.id(name).ok().flatten()
    }

    /// Writes the reservations onto their existing cgroups (kubelet's
    /// `enforceNodeAllocatableCgroups`); a cgroup that is missing or refuses a write is logged
    /// and counted, and the manager runs on.
    pub(super) fn enforce_reserved(&self, cause: Cause) {
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
                // Said loudly once at start; each reconcile counts it again.
                if cause == Cause::Change {
                    tracing::error!(cgroup = %name, error = %e, "cannot enforce the reservation on this cgroup");
                } else {
                    tracing::debug!(cgroup = %name, error = %e, "reservation still not enforced");
                }
                self.metrics
                    .cgroup_write_errors
                    .with_label_values(&["reserved-cgroup"])
                    .inc();
            }
        }
    }
}
