//! The feedback's side of the manager: turning the loop on, running it when due, applying the
//! overrides it returns to the cgroups, and moving memory to the node a container was realigned to.
use std::time::Instant;

use crate::cgroup::cpuset::CpuSet;
use crate::cgroup::name::CgroupName;
use crate::cm::feedback_loop::{self, FeedbackLoop, Watched};
use crate::cm::pod_resources::container_config;
use crate::feedback::{FeedbackConfig, FeedbackMetrics, PreemptionSource};
use crate::numa::NodeLayout;

use super::ContainerManager;
use super::{Cause, Phase, container_ref};

impl ContainerManager {
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
        let (feedback, nodes) = FeedbackLoop::enable(
            self.reader(),
            &self.tiers.kubepods,
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

    /// Runs the feedback when a snapshot is due; changed overrides are written at once.
    pub fn feedback_tick(&mut self) {
        let now = Instant::now();
        if !self.feedback.as_ref().is_some_and(|f| f.due(now)) {
            return;
        }
        let watched = self.watched();
        let changes = match self.feedback.as_mut() {
            Some(f) => f.run(&*self.cgroups, &watched, &self.tiers.besteffort, now),
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

    /// Moves the pages of every process in `cgroup` onto `mems` (see
    /// [`feedback_loop::move_memory`]).
    pub(super) fn move_memory(&self, cgroup: &CgroupName, mems: &CpuSet) {
        feedback_loop::move_memory(self.reader(), cgroup, mems, &self.numa_nodes);
    }

    /// The running containers the feedback watches and would read something of (see
    /// [`FeedbackLoop::interested`]).
    pub(super) fn watched(&self) -> Vec<Watched> {
        let Some(feedback) = &self.feedback else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (uid, managed) in &self.pods {
            if managed.phase == Phase::Terminating {
                continue;
            }
            for container in &managed.pod.spec.containers {
                let limit =
                    feedback_loop::cfs_limit(&container_config(container, self.options.policy));
                let mems_pinned = self.resources.cpusets(uid, &container.name).mems.is_some();
                if !feedback.interested(managed.qos, limit.is_some(), mems_pinned) {
                    continue;
                }
                let Ok(cgroup) = self.cgroups.container(&managed.cgroup, &container.name) else {
                    continue;
                };
                out.push(Watched {
                    target: container_ref(uid, &managed.pod, &container.name),
                    qos: managed.qos,
                    cgroup,
                    limit,
                    mems_pinned,
                });
            }
        }
        out
    }
}
