//! What the feedback policies see: a [`Snapshot`] of the node the container manager takes each
//! feedback period (cumulative kernel counters per container, resident memory per node,
//! preemptions between QoS classes), and the [`Window`] between two snapshots, which turns
//! the counters into what happened in the window.
use std::collections::BTreeMap;
use std::time::Instant;

use crate::cgroup::CpuSet;
use crate::cgroup::stats::CpuStats;
use crate::pods::qos::QosClass;

/// A container the feedback can act on.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContainerRef {
    pub pod_uid: String,
    /// `namespace/name`, for the decision log.
    pub pod: String,
    pub container: String,
}

impl std::fmt::Display for ContainerRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.pod, self.container)
    }
}

/// One container as the manager last read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerSnapshot {
    pub target: ContainerRef,
    pub qos: QosClass,
    /// The CFS quota and period written for it, when it has a CPU limit.
    pub limit: Option<CfsLimit>,
    /// `cpu.stat` of its cgroup (cumulative).
    pub cpu: Option<CpuStats>,
    /// The CPUs it may run on (`cpuset.cpus.effective`), when readable.
    pub cpus: Option<CpuSet>,
    /// Resident bytes per NUMA node (`memory.numa_stat`).
    pub memory_by_node: BTreeMap<u32, u64>,
    /// The memory manager placed its memory (`cpuset.mems` is its decision).
    pub mems_pinned: bool,
    /// Where its tasks ran (CPU time per node) over the NUMA policy's span, when known.
    pub ran_on: Option<crate::numa::placement::Placement>,
}

/// A CFS bandwidth limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CfsLimit {
    pub quota_us: u64,
    pub period_us: u64,
}

impl CfsLimit {
    /// The limit in CPUs.
    #[must_use]
    pub fn cpus(&self) -> f64 {
        #[expect(
            clippy::cast_precision_loss,
            reason = "CFS quotas and periods in µs, far below 2^53"
        )]
        let cpus = self.quota_us as f64 / self.period_us.max(1) as f64;
        cpus
    }
}

/// Preemptions and the run-queue waits they caused (cumulative or over a window).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Preemptions {
    pub count: u64,
    pub wait_ns: u64,
}

/// The node at one instant.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub taken: Instant,
    pub containers: Vec<ContainerSnapshot>,
    /// Cumulative preemptions by (victim class, preemptor class) of the managed cgroups;
    /// `None` when the run-queue probe is not running.
    pub preemptions: Option<BTreeMap<(QosClass, QosClass), Preemptions>>,
    /// The BestEffort tier cgroup's own CPU counters (every BestEffort pod in one file), when
    /// read; the containers' are then not.
    pub besteffort_tier: Option<CpuStats>,
}

/// CFS bandwidth counters over a window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CfsDelta {
    pub periods: u64,
    pub throttled_periods: u64,
    /// Periods in which the cgroup used burst (`nr_bursts`); `None` where the kernel does not
    /// report it.
    pub bursts: Option<u64>,
}

impl CfsDelta {
    /// Throttled periods per elapsed period, 0 without periods.
    #[must_use]
    pub fn throttled_ratio(&self) -> f64 {
        if self.periods == 0 {
            return 0.0;
        }
        #[expect(
            clippy::cast_precision_loss,
            reason = "a ratio of period counts; far below 2^53 over a window"
        )]
        let ratio = self.throttled_periods as f64 / self.periods as f64;
        ratio
    }
}

/// What happened between two snapshots.
#[derive(Clone, Copy, Debug)]
pub struct Window<'a> {
    pub previous: &'a Snapshot,
    pub current: &'a Snapshot,
}

impl<'a> Window<'a> {
    /// Seconds between the snapshots.
    #[must_use]
    pub fn seconds(&self) -> f64 {
        self.current
            .taken
            .saturating_duration_since(self.previous.taken)
            .as_secs_f64()
    }

    /// The containers of the current snapshot.
    pub fn containers(&self) -> impl Iterator<Item = &'a ContainerSnapshot> {
        self.current.containers.iter()
    }

    /// The CFS counters of `target` over the window; `None` when it was not in both
    /// snapshots, has no `cpu.stat` bandwidth counters, or a counter went backwards (its
    /// cgroup was made anew).
    #[must_use]
    pub fn cfs(&self, target: &ContainerRef) -> Option<CfsDelta> {
        let before = find(self.previous, target)?.cpu.as_ref()?;
        let now = find(self.current, target)?.cpu.as_ref()?;
        let delta = |a: Option<u64>, b: Option<u64>| b?.checked_sub(a?);
        Some(CfsDelta {
            periods: delta(before.nr_periods, now.nr_periods)?,
            throttled_periods: delta(before.nr_throttled, now.nr_throttled)?,
            bursts: delta(before.nr_bursts, now.nr_bursts),
        })
    }

    /// CPUs used by the containers of class `qos` over the window (their `cpu.stat` usage,
    /// cpuacct on v1), counting containers present in both snapshots.
    #[must_use]
    pub fn cpu_used(&self, qos: QosClass) -> f64 {
        self.current
            .containers
            .iter()
            .filter(|c| c.qos == qos)
            .filter_map(|c| self.cpu_used_by(&c.target))
            .sum()
    }

    /// CPUs the BestEffort tier used over the window, from the tier cgroup's own usage when
    /// both snapshots have it, else summed over its containers ([`Self::cpu_used`]).
    #[must_use]
    pub fn besteffort_cpu_used(&self) -> f64 {
        let tier = |s: &Snapshot| s.besteffort_tier.as_ref()?.usage_ns;
        let seconds = self.seconds();
        match (tier(self.previous), tier(self.current)) {
            (Some(before), Some(now)) if seconds > 0.0 && now >= before => {
                #[expect(
                    clippy::cast_precision_loss,
                    reason = "nanoseconds of one window, far below 2^53"
                )]
                let used = (now - before) as f64 / 1e9 / seconds;
                used
            }
            _ => self.cpu_used(QosClass::BestEffort),
        }
    }

    /// CPUs `target` used over the window; `None` when it was not in both snapshots, its
    /// usage is unreadable, or the counter went backwards.
    #[must_use]
    pub fn cpu_used_by(&self, target: &ContainerRef) -> Option<f64> {
        let seconds = self.seconds();
        let before = find(self.previous, target)?.cpu.as_ref()?.usage_ns?;
        let nanos = find(self.current, target)?
            .cpu
            .as_ref()?
            .usage_ns?
            .checked_sub(before)?;
        #[expect(
            clippy::cast_precision_loss,
            reason = "nanoseconds of one window, far below 2^53"
        )]
        let used = nanos as f64 / 1e9 / seconds;
        (seconds > 0.0).then_some(used)
    }

    /// Preemptions of `victim`-class tasks by `preemptor`-class tasks over the window; `None`
    /// without the run-queue probe.
    #[must_use]
    pub fn preemptions(&self, victim: QosClass, preemptor: QosClass) -> Option<Preemptions> {
        let pair = (victim, preemptor);
        let before = self.previous.preemptions.as_ref()?;
        let now = self.current.preemptions.as_ref()?;
        let a = before.get(&pair).copied().unwrap_or_default();
        let b = now.get(&pair).copied().unwrap_or_default();
        // Counters of removed cgroups leave the sum: never report a negative window.
        Some(Preemptions {
            count: b.count.saturating_sub(a.count),
            wait_ns: b.wait_ns.saturating_sub(a.wait_ns),
        })
    }
}

fn find<'s>(snapshot: &'s Snapshot, target: &ContainerRef) -> Option<&'s ContainerSnapshot> {
    snapshot.containers.iter().find(|c| &c.target == target)
}

#[cfg(test)]
pub(super) mod fixtures {
    //! Snapshots for the policies' tests.
    use super::*;

    pub(crate) fn target(name: &str) -> ContainerRef {
        ContainerRef {
            pod_uid: format!("uid-{name}"),
            pod: format!("default/{name}"),
            container: name.to_owned(),
        }
    }

    pub(crate) fn container(name: &str, qos: QosClass) -> ContainerSnapshot {
        ContainerSnapshot {
            target: target(name),
            qos,
            limit: None,
            cpu: None,
            cpus: None,
            memory_by_node: BTreeMap::new(),
            mems_pinned: false,
            ran_on: None,
        }
    }

    /// `cpu.stat` with these cumulative counters (and no CPU used).
    pub(crate) fn cpu(periods: u64, throttled: u64, bursts: u64) -> CpuStats {
        CpuStats {
            usage_ns: Some(0),
            nr_periods: Some(periods),
            nr_throttled: Some(throttled),
            nr_bursts: Some(bursts),
            ..CpuStats::default()
        }
    }

    /// `decide` applied to each window between consecutive `snapshots`, with the window's end.
    pub(crate) fn each_window<T>(
        snapshots: &[Snapshot],
        mut decide: impl FnMut(&Window<'_>, Instant) -> T,
    ) -> Vec<T> {
        snapshots
            .windows(2)
            .map(|pair| {
                let window = Window {
                    previous: &pair[0],
                    current: &pair[1],
                };
                decide(&window, pair[1].taken)
            })
            .collect()
    }

    pub(crate) fn snapshot(
        taken: Instant,
        containers: Vec<ContainerSnapshot>,
        preemptions: &[((QosClass, QosClass), u64, u64)],
    ) -> Snapshot {
        Snapshot {
            taken,
            containers,
            preemptions: Some(
                preemptions
                    .iter()
                    .map(|&(pair, count, wait_ns)| (pair, Preemptions { count, wait_ns }))
                    .collect(),
            ),
            besteffort_tier: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::fixtures::*;
    use super::*;

    #[test]
    fn cfs_counters_over_a_window() {
        let t0 = Instant::now();
        let mut a = container("web", QosClass::Burstable);
        a.cpu = Some(cpu(100, 10, 0));
        let mut b = a.clone();
        b.cpu = Some(cpu(150, 30, 4));
        let before = snapshot(t0, vec![a], &[]);
        let after = snapshot(t0 + Duration::from_secs(5), vec![b], &[]);
        let window = Window {
            previous: &before,
            current: &after,
        };
        let delta = window.cfs(&target("web")).unwrap();
        assert_eq!(
            delta,
            CfsDelta {
                periods: 50,
                throttled_periods: 20,
                bursts: Some(4)
            }
        );
        assert!((delta.throttled_ratio() - 0.4).abs() < 1e-9);
        assert!((window.seconds() - 5.0).abs() < 1e-9);
    }

    #[test]
    fn a_cgroup_made_anew_has_no_window() {
        let t0 = Instant::now();
        let mut a = container("web", QosClass::Burstable);
        a.cpu = Some(cpu(100, 10, 0));
        let mut b = a.clone();
        b.cpu = Some(cpu(3, 0, 0));
        let before = snapshot(t0, vec![a], &[]);
        let after = snapshot(t0, vec![b], &[]);
        let window = Window {
            previous: &before,
            current: &after,
        };
        assert_eq!(window.cfs(&target("web")), None);
        assert_eq!(window.cfs(&target("absent")), None);
    }

    #[test]
    fn cpus_used_by_a_class_over_a_window() {
        let t0 = Instant::now();
        let used = |name: &str, qos, ns| {
            let mut c = container(name, qos);
            c.cpu = Some(CpuStats {
                usage_ns: Some(ns),
                ..CpuStats::default()
            });
            c
        };
        let before = snapshot(
            t0,
            vec![
                used("a", QosClass::BestEffort, 1_000_000_000),
                used("b", QosClass::BestEffort, 0),
                used("c", QosClass::Burstable, 0),
            ],
            &[],
        );
        let after = snapshot(
            t0 + Duration::from_secs(2),
            vec![
                used("a", QosClass::BestEffort, 2_000_000_000),
                used("b", QosClass::BestEffort, 500_000_000),
                used("c", QosClass::Burstable, 2_000_000_000),
                used("new", QosClass::BestEffort, 9_000_000_000),
            ],
            &[],
        );
        let window = Window {
            previous: &before,
            current: &after,
        };
        assert!((window.cpu_used(QosClass::BestEffort) - 0.75).abs() < 1e-9);
        assert!((window.cpu_used(QosClass::Burstable) - 1.0).abs() < 1e-9);
        // Without the tier's own counters, the tier's use is its containers'.
        assert!((window.besteffort_cpu_used() - 0.75).abs() < 1e-9);

        // With them, the tier cgroup's usage is the tier's use (every BestEffort pod,
        // including ones that came or went during the window).
        let tier = |ns| {
            Some(CpuStats {
                usage_ns: Some(ns),
                ..CpuStats::default()
            })
        };
        let (mut before, mut after) = (before, after);
        before.besteffort_tier = tier(4_000_000_000);
        after.besteffort_tier = tier(7_000_000_000);
        let window = Window {
            previous: &before,
            current: &after,
        };
        assert!((window.besteffort_cpu_used() - 1.5).abs() < 1e-9);
        // A counter that went backwards (the tier made anew) falls back to the containers.
        after.besteffort_tier = tier(1);
        let window = Window {
            previous: &before,
            current: &after,
        };
        assert!((window.besteffort_cpu_used() - 0.75).abs() < 1e-9);
    }

    #[test]
    fn preemptions_between_classes_over_a_window() {
        use QosClass::{BestEffort, Burstable};
        let t0 = Instant::now();
        let before = snapshot(t0, vec![], &[((Burstable, BestEffort), 10, 1_000)]);
        let after = snapshot(
            t0,
            vec![],
            &[
                ((Burstable, BestEffort), 25, 4_000),
                ((BestEffort, Burstable), 7, 9),
            ],
        );
        let window = Window {
            previous: &before,
            current: &after,
        };
        assert_eq!(
            window.preemptions(Burstable, BestEffort),
            Some(Preemptions {
                count: 15,
                wait_ns: 3_000
            })
        );
        assert_eq!(
            window.preemptions(BestEffort, Burstable),
            Some(Preemptions {
                count: 7,
                wait_ns: 9
            })
        );
        let without_probe = Snapshot {
            taken: t0,
            containers: vec![],
            preemptions: None,
            besteffort_tier: None,
        };
        let window = Window {
            previous: &before,
            current: &without_probe,
        };
        assert_eq!(window.preemptions(Burstable, BestEffort), None);
    }
}
