//! Realigning a container's memory with its CPUs' NUMA node.
//!
//! A container whose CPUs (`cpuset.cpus.effective`) all lie on one NUMA node, but whose
//! resident memory (`memory.numa_stat`) is at least [`NumaAlignConfig::enter_remote`] on
//! other nodes for [`NumaAlignConfig::windows`] windows in a row, has its `cpuset.mems` set to
//! its CPUs' node. The kernel then migrates its pages there (v2 always does on a `cpuset.mems`
//! change; on v1 `cpuset.memory_migrate` is turned on first) and allocates there from then on.
//! Typical causes: memory allocated before the CPU manager pinned the container, or a process
//! that bound its memory elsewhere and let go of the binding.
//!
//! Containers whose memory the memory manager placed (`Static` policy) are left to it. The
//! realignment is a placement correction: it stays for the container's life.
//!
//! A container whose CPUs span nodes (unpinned: Burstable, BestEffort, or Guaranteed without the
//! static CPU manager) is only reported (`action="report"`), never moved: when it has run at
//! least [`NumaAlignConfig::unpinned_share`] of its CPU time on one node for
//! [`NumaAlignConfig::unpinned_windows`] windows in a row while at least `enter_remote` of its
//! memory is on other nodes. Moving its pages would chase the scheduler, which places an
//! unpinned task where CPU is free and moves it again when load changes; binding its
//! `cpuset.mems` would make every access remote the next time it moves. What fixes it lasts:
//! pinning it (static CPU manager, memory manager), after which this policy realigns it, or
//! the kernel's NUMA balancing, which moves pages after the task as it runs.
use std::collections::{BTreeMap, BTreeSet};

use super::Overrides;
use super::decision::{Action, Decision};
use super::hysteresis::Streak;
use super::snapshot::{ContainerRef, Window};
use crate::cgroup::CpuSet;
use crate::numa::NodeLayout;

/// The policy's name in decisions and metrics.
pub const POLICY: &str = "numa_align";

/// Thresholds of the NUMA realignment policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NumaAlignConfig {
    /// Share of resident memory on other nodes than the CPUs' that counts as misplaced.
    pub enter_remote: f64,
    /// Windows in a row misplaced.
    pub windows: u32,
    /// Containers with less resident memory are left alone.
    pub min_bytes: u64,
    /// Share of an unpinned container's CPU time on one node that makes that node its own.
    pub unpinned_share: f64,
    /// Windows in a row an unpinned container must run there with its memory elsewhere before
    /// it is reported (the CPU time is also taken over that many windows).
    pub unpinned_windows: u32,
}

#[derive(Debug, Default)]
struct TargetState {
    misplaced: Streak,
    /// The node its memory was realigned to.
    aligned: Option<u32>,
    /// Unpinned: windows in a row on one node with its memory elsewhere.
    away: Streak,
    /// Unpinned: reported for the current episode.
    reported: bool,
}

/// The realignment policy: the machine's CPU-to-node map and per-container state.
#[derive(Debug)]
pub struct NumaAlignPolicy {
    config: NumaAlignConfig,
    layout: NodeLayout,
    targets: BTreeMap<ContainerRef, TargetState>,
}

impl NumaAlignPolicy {
    #[must_use]
    pub fn new(config: NumaAlignConfig, layout: NodeLayout) -> Self {
        Self {
            config,
            layout,
            targets: BTreeMap::new(),
        }
    }

    /// Decisions for one window (only the current snapshot matters: memory is a level, not a
    /// counter).
    pub fn evaluate(&mut self, window: &Window<'_>) -> Vec<Decision> {
        let mut decisions = Vec::new();
        let present: Vec<&ContainerRef> = window.containers().map(|c| &c.target).collect();
        self.targets.retain(|t, _| present.contains(&t));
        for container in window.containers() {
            if container.mems_pinned {
                continue;
            }
            let Some(cpus) = &container.cpus else {
                continue;
            };
            let nodes = self.layout.nodes_of(cpus);
            let Some(&node) = nodes.first().filter(|_| nodes.len() == 1) else {
                if nodes.len() > 1
                    && let Some(decision) = self.unpinned(container)
                {
                    decisions.push(decision);
                }
                continue;
            };
            let state = self.targets.entry(container.target.clone()).or_default();
            if state.aligned == Some(node) {
                continue;
            }
            let total: u64 = container.memory_by_node.values().sum();
            let local = container.memory_by_node.get(&node).copied().unwrap_or(0);
            let remote = total.saturating_sub(local);
            #[expect(
                clippy::cast_precision_loss,
                reason = "a ratio of byte counts; the precision lost is far below a percent"
            )]
            let share = if total == 0 {
                0.0
            } else {
                remote as f64 / total as f64
            };
            let misplaced = total >= self.config.min_bytes && share >= self.config.enter_remote;
            let streak = state.misplaced.observe(misplaced);
            if streak < self.config.windows {
                continue;
            }
            state.aligned = Some(node);
            let elsewhere = elsewhere(&container.memory_by_node, node);
            decisions.push(Decision {
                policy: POLICY,
                action: Action::Apply,
                target: container.target.to_string(),
                change: format!("cpuset.mems {node} (pages migrate to node {node})"),
                reason: format!(
                    "{:.1} of {:.1} MiB resident ({:.0}%) on node(s) {} while its CPUs {cpus} are on node {node}, {streak} windows in a row",
                    mib(remote),
                    mib(total),
                    share * 100.0,
                    join(&elsewhere)
                ),
            });
        }
        decisions
    }

    /// An unpinned container's report, once per episode of running on one node with most of its
    /// memory on others.
    fn unpinned(&mut self, container: &super::snapshot::ContainerSnapshot) -> Option<Decision> {
        let state = self.targets.entry(container.target.clone()).or_default();
        let main = container.ran_on.as_ref().and_then(|r| r.main_node());
        let total: u64 = container.memory_by_node.values().sum();
        let (away, node, cpu_share, share) = match main {
            Some((node, cpu_share)) if cpu_share >= self.config.unpinned_share => {
                let here = container.memory_by_node.get(&node).copied().unwrap_or(0);
                #[expect(clippy::cast_precision_loss, reason = "a ratio of byte counts")]
                let share = if total == 0 {
                    0.0
                } else {
                    total.saturating_sub(here) as f64 / total as f64
                };
                (
                    total >= self.config.min_bytes && share >= self.config.enter_remote,
                    node,
                    cpu_share,
                    share,
                )
            }
            _ => (false, 0, 0.0, 0.0),
        };
        let streak = state.away.observe(away);
        if !away {
            state.reported = false;
            return None;
        }
        if streak < self.config.unpinned_windows || state.reported {
            return None;
        }
        state.reported = true;
        let elsewhere = elsewhere(&container.memory_by_node, node);
        Some(Decision {
            policy: POLICY,
            action: Action::Report,
            target: container.target.to_string(),
            change: format!(
                "none: runs on node {node}, {:.0}% of its memory on node(s) {}",
                share * 100.0,
                join(&elsewhere)
            ),
            reason: format!(
                "{:.0}% of its CPU time on node {node} and {:.1} of {:.1} MiB resident elsewhere, {streak} windows in a row; it is not pinned (CPUs {}), so the scheduler may move it and its pages are not moved after it: pin it (static CPU manager) to have them realigned, or turn on kernel.numa_balancing",
                cpu_share * 100.0,
                mib(total.saturating_sub(container.memory_by_node.get(&node).copied().unwrap_or(0))),
                mib(total),
                container
                    .cpus
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default()
            ),
        })
    }

    /// Adds the realigned containers' `cpuset.mems` (with v1's migration switch) to `out`.
    pub fn overrides(&self, out: &mut Overrides) {
        for (target, state) in &self.targets {
            if let Some(node) = state.aligned {
                let config = out.containers.entry(target.clone()).or_default();
                config.cpuset_mems = Some(CpuSet::from_iter([node]));
                config.cpuset_memory_migrate = Some(true);
            }
        }
    }

    /// Containers realigned.
    #[must_use]
    pub fn active(&self) -> usize {
        self.targets
            .values()
            .filter(|s| s.aligned.is_some())
            .count()
    }
}

#[expect(
    clippy::cast_precision_loss,
    reason = "MiB for the log, two decimals suffice"
)]
fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

/// The nodes other than `node` that hold some of the memory.
fn elsewhere(memory_by_node: &BTreeMap<u32, u64>, node: u32) -> BTreeSet<u32> {
    memory_by_node
        .iter()
        .filter(|&(&n, &bytes)| n != node && bytes > 0)
        .map(|(&n, _)| n)
        .collect()
}

fn join(nodes: &BTreeSet<u32>) -> String {
    nodes
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::snapshot::fixtures::{container, each_window, snapshot, target};
    use super::super::snapshot::{ContainerSnapshot, Snapshot};
    use super::*;
    use crate::pods::qos::QosClass;

    const MIB: u64 = 1 << 20;

    /// Two nodes: CPUs 0-1 on node 0, 2-3 on node 1.
    fn layout() -> NodeLayout {
        NodeLayout::from_parts(BTreeMap::from([(0, 0), (1, 0), (2, 1), (3, 1)]), vec![]).unwrap()
    }

    fn config() -> NumaAlignConfig {
        NumaAlignConfig {
            unpinned_share: 0.9,
            unpinned_windows: 3,
            enter_remote: 0.5,
            windows: 2,
            min_bytes: 16 * MIB,
        }
    }

    fn db(cpus: &str, memory: &[(u32, u64)], pinned: bool) -> ContainerSnapshot {
        let mut c = container("db", QosClass::Guaranteed);
        c.cpus = Some(CpuSet::parse(cpus).unwrap());
        c.memory_by_node = memory.iter().copied().collect();
        c.mems_pinned = pinned;
        c
    }

    fn run(policy: &mut NumaAlignPolicy, containers: &[ContainerSnapshot]) -> Vec<Vec<Decision>> {
        let t0 = Instant::now();
        let snaps: Vec<Snapshot> = containers
            .iter()
            .zip(0u64..)
            .map(|(c, i)| snapshot(t0 + Duration::from_secs(5 * i), vec![c.clone()], &[]))
            .collect();
        each_window(&snaps, |window, _| policy.evaluate(window))
    }

    #[test]
    fn memory_on_the_far_node_follows_cpus_on_one_node_once() {
        let mut policy = NumaAlignPolicy::new(config(), layout());
        let far = db("2-3", &[(0, 60 * MIB), (1, 4 * MIB)], false);
        let decisions = run(&mut policy, &[far.clone(), far.clone(), far.clone(), far]);
        assert!(decisions[0].is_empty());
        assert_eq!(decisions[1].len(), 1);
        let d = &decisions[1][0];
        assert_eq!(d.action, Action::Apply);
        assert_eq!(d.change, "cpuset.mems 1 (pages migrate to node 1)");
        assert_eq!(
            d.reason,
            "60.0 of 64.0 MiB resident (94%) on node(s) 0 while its CPUs 2-3 are on node 1, 2 windows in a row"
        );
        assert!(decisions[2].is_empty(), "decided once");
        let mut out = Overrides::default();
        policy.overrides(&mut out);
        let config = &out.containers[&target("db")];
        assert_eq!(config.cpuset_mems, Some(CpuSet::from_iter([1])));
        assert_eq!(config.cpuset_memory_migrate, Some(true));
        assert_eq!(policy.active(), 1);
    }

    #[test]
    fn local_small_spanning_or_pinned_containers_are_left_alone() {
        let cases = [
            ("local", db("2-3", &[(0, 4 * MIB), (1, 60 * MIB)], false)),
            ("small", db("2-3", &[(0, 8 * MIB)], false)),
            ("spans nodes", db("1-2", &[(0, 60 * MIB)], false)),
            ("memory manager's", db("2-3", &[(0, 60 * MIB)], true)),
        ];
        for (what, c) in cases {
            let mut policy = NumaAlignPolicy::new(config(), layout());
            let all = run(&mut policy, &[c.clone(), c.clone(), c.clone()]).concat();
            assert!(all.is_empty(), "{what}: {all:?}");
        }
    }

    /// An unpinned container running 95% on node 0 with its memory on node 1 is reported once
    /// after the windows, never given a `cpuset.mems`; one spread over both nodes, or with its
    /// memory where it runs, is not reported.
    #[test]
    fn an_unpinned_container_away_from_its_memory_is_reported_not_moved() {
        use crate::numa::placement::{NodeNanos, Placement};
        let ran = |n0: u64, n1: u64| {
            Some(Placement {
                by_node: NodeNanos::from([(0, n0), (1, n1)]),
                window: Duration::from_secs(10),
            })
        };
        let mut far = db("0-3", &[(0, 4 * MIB), (1, 60 * MIB)], false);
        far.ran_on = ran(95, 5);
        let mut spread = db("0-3", &[(0, 4 * MIB), (1, 60 * MIB)], false);
        spread.target = target("spread");
        spread.ran_on = ran(60, 40);
        let mut near = db("0-3", &[(0, 60 * MIB), (1, 4 * MIB)], false);
        near.target = target("near");
        near.ran_on = ran(95, 5);
        let mut policy = NumaAlignPolicy::new(config(), layout());
        let t0 = Instant::now();
        let snaps: Vec<Snapshot> = (0..5u64)
            .map(|i| {
                snapshot(
                    t0 + Duration::from_secs(5 * i),
                    vec![far.clone(), spread.clone(), near.clone()],
                    &[],
                )
            })
            .collect();
        let decisions = each_window(&snaps, |window, _| policy.evaluate(window));
        let all: Vec<&Decision> = decisions.iter().flatten().collect();
        assert_eq!(all.len(), 1, "{all:?}");
        assert_eq!(all[0].action, Action::Report);
        assert!(
            all[0].change.contains("runs on node 0"),
            "{}",
            all[0].change
        );
        assert!(all[0].reason.contains("not pinned"), "{}", all[0].reason);
        assert_eq!(
            decisions.iter().position(|d| !d.is_empty()),
            Some(2),
            "after 3 windows"
        );
        let mut out = Overrides::default();
        policy.overrides(&mut out);
        assert!(out.containers.is_empty(), "nothing written: {out:?}");
    }
}
