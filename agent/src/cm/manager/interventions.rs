//! The feedback's side of the manager: turning the loop on, running it when due, applying the
//! overrides it returns to the cgroups, and moving memory to the node a container was realigned to.
use std::time::Instant;

use crate::cgroup::cpuset::CpuSet;
use crate::cgroup::name::CgroupName;
use crate::cm::feedback_loop::{self, FeedbackLoop, Watched};
use crate::cm::pod_resources::container_config;
use crate::feedback::{Feedback, FeedbackConfig, FeedbackMetrics, PreemptionSource};
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
        let caps = feedback_loop::capabilities(self.reader(), &self.tiers.kubepods);
        tracing::info!(
            mode = ?config.mode,
            period = ?config.period,
            cpu_burst = caps.cpu_burst,
            cpu_idle = caps.cpu_idle,
            numa_layout = layout.is_some(),
            preemptions = preemptions.is_some(),
            "feedback enabled"
        );
        self.numa_nodes = layout.as_ref().map(NodeLayout::nodes).unwrap_or_default();
        let policies = Feedback::new(config, caps, layout, metrics);
        self.feedback = Some(FeedbackLoop::new(
            policies,
            preemptions,
            self.index.clone(),
            self.numa_nodes.len(),
        ));
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

    /// Moves the pages of every process in `cgroup` onto `mems` (a single node), for kernels
    /// whose cgroup v2 does not migrate them on a `cpuset.mems` change. The kernel copies the
    /// pages synchronously (seconds for gigabytes), so it happens on a thread of its own and
    /// the manager runs on.
    pub(super) fn move_memory(&self, cgroup: &CgroupName, mems: &CpuSet) {
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
        let nodes = self.numa_nodes.clone();
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
                let Ok(cgroup) = managed.cgroup.child(&container.name) else {
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
