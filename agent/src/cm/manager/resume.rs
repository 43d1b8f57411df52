//! After a restart: the pod source's first complete list rebuilds unusable checkpoints from the
//! surviving cgroups, adopts running containers, and removes pod cgroups no pod claims.
use std::collections::{BTreeMap, BTreeSet};

use crate::cgroup::cpuset::CpuSet;
use crate::cgroup::files::{Controller, Setting};
use crate::cgroup::name::CgroupName;
use crate::cm::resource_managers::ObservedContainer;
use crate::pods::model::Pod;
use crate::pods::qos::pod_qos;
use crate::pods::source::{PodEvent, SourcedPod};
use crate::runtime::process;

use super::{ContainerManager, POD_FINGERPRINT_ENV};

impl ContainerManager {
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
        // Pods whose running containers were started for another version of the pod (the
        // manifest changed while qosd was down, or before it could restart them).
        let mut earlier_version = BTreeSet::new();
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
                let Ok(name) = self.cgroups.container(&cgroup, &container.name) else {
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
                let leader = self
                    .cgroups
                    .pids(&name)
                    .ok()
                    .and_then(|p| process::group_leader(&p));
                if let Some(pid) = leader {
                    self.adoptable.insert(self.key(&uid, &container.name));
                    // No fingerprint: started by a qosd from before fingerprints; adopted as
                    // it is. Unreadable: adopted as it is too, and said.
                    match process::environ_var(pid, POD_FINGERPRINT_ENV) {
                        Ok(Some(started_for)) if started_for != pod.fingerprint() => {
                            earlier_version.insert(uid.clone());
                        }
                        Ok(_) => {}
                        Err(e) => tracing::warn!(
                            pod = %pod.full_name(),
                            container = %container.name,
                            pid,
                            error = %e,
                            "the running container's pod version cannot be read; it is adopted as it is"
                        ),
                    }
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
            earlier_versions = earlier_version.len(),
            "resuming"
        );
        let changed: Vec<SourcedPod> = events
            .iter()
            .filter_map(|e| match e {
                PodEvent::Added(s) | PodEvent::Updated(s)
                    if earlier_version.contains(&s.pod.uid()) =>
                {
                    Some(s.clone())
                }
                _ => None,
            })
            .collect();
        for event in events {
            self.handle(event);
        }
        // Adopted as they run, then replaced the way a change seen while running is: stopped
        // with their grace period, and started again with the new spec.
        for sourced in changed {
            if self.pods.contains_key(&sourced.pod.uid()) {
                tracing::info!(pod = %sourced.pod.full_name(), "running containers are of an earlier version of the pod");
                self.handle(PodEvent::Updated(sourced));
            }
        }
        self.remove_orphans();
        // Anything not adopted by now is started afresh from here on.
        self.adoptable.clear();
    }

    /// Kills the processes of pod cgroups under the tiers that belong to no admitted pod (left
    /// by an earlier run whose pods are gone or were not admitted again) and removes the
    /// cgroups.
    pub(super) fn remove_orphans(&mut self) {
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
    pub(super) fn read_cpusets(
        &self,
        name: &CgroupName,
    ) -> Option<(Option<CpuSet>, Option<CpuSet>)> {
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
}
