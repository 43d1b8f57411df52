//! Pod events from the pod source: admission (resource managers, then the node allocatable fit),
//! rejections with kubelet's reasons, and the shared CPU pool that follows exclusive assignments.
use crate::cm::admission::{AdmissionRejection, PodRequests as AdmissionRequests, fits};
use crate::cm::resource_managers::PlacementRejection;
use crate::pods::qos::{QosClass, pod_qos};
use crate::pods::source::{PodEvent, SourcedPod};

use super::ContainerManager;
use super::{Cause, ManagedPod, Phase, to_admission};

impl ContainerManager {
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

    pub(super) fn admit(&mut self, sourced: SourcedPod) {
        let SourcedPod { pod, origin } = sourced;
        let uid = pod.uid();
        let name = pod.full_name();
        if self.pods.contains_key(&uid) {
            // The old version is still terminating: wait for it.
            self.pending.insert(uid, SourcedPod { pod, origin });
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
        tracing::info!(pod = %name, qos = %qos, cpu_millis = requests.cpu_millis, memory_bytes = requests.memory_bytes, from = %origin, "pod admitted");
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
                origin,
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

    pub(super) fn reject_placement(&self, pod: &str, rejection: &PlacementRejection) {
        tracing::warn!(pod, reason = %rejection.reason, message = %rejection.message, "pod rejected at admission: its resources cannot be placed");
        self.metrics
            .admission_rejections
            .with_label_values(&[&rejection.reason])
            .inc();
    }

    /// Rewrites every container's cgroup when the shared CPU pool changed (an exclusive
    /// assignment came or went), so shared containers follow the pool.
    pub(super) fn refresh_shared_pool(&mut self) {
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

    pub(super) fn reject(&self, pod: &str, rejection: &AdmissionRejection) {
        let reason = rejection.reason();
        tracing::warn!(pod, reason = %reason, message = %rejection, "pod rejected at admission");
        self.metrics
            .admission_rejections
            .with_label_values(&[&reason])
            .inc();
    }

    pub(super) fn publish_pod_counts(&self) {
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
}
