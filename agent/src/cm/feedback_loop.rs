//! The container manager's side of the feedback ([`crate::feedback`]): the kernel's
//! capabilities, the snapshot of the watched containers (their cgroups' `cpu.stat`,
//! `memory.numa_stat` and effective CPUs, and the probe's preemptions resolved to QoS classes
//! through the workload index), and the configs the manager writes: kubelet's values, those
//! of the settings the policies change, and the interventions in force over them.
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use crate::cgroup::CpuSet;
use crate::cgroup::backend::{CgroupReader, StatKinds};
use crate::cgroup::files::Setting;
use crate::cgroup::name::CgroupName;
use crate::cgroup::resources::{Limit, QUOTA_PERIOD, ResourceConfig};
use crate::feedback::{
    Capabilities, CfsLimit, ContainerRef, ContainerSnapshot, DecisionLog, Feedback, Overrides,
    PreemptionSource, Preemptions, Snapshot,
};
use crate::numa::NumaStat;
use crate::numa::node_layout::page_size;
use crate::numa::placement::{CpuPlacement, Placement};
use crate::pods::qos::QosClass;

use super::index::WorkloadIndex;

/// A container the manager hands to the feedback: who it is and what the manager knows of it.
#[derive(Clone, Debug)]
pub(super) struct Watched {
    pub target: ContainerRef,
    pub qos: QosClass,
    pub cgroup: CgroupName,
    /// The CFS quota and period the manager writes, when it has a CPU limit.
    pub limit: Option<CfsLimit>,
    /// The memory manager placed its memory.
    pub mems_pinned: bool,
}

/// Moves the pages of every process in `cgroup` onto `mems` (a single node of `nodes`), for
/// kernels whose cgroup v2 does not migrate them on a `cpuset.mems` change. The kernel copies
/// the pages synchronously (seconds for gigabytes), so it happens on a thread of its own and the
/// caller runs on.
pub(super) fn move_memory(
    reader: &dyn CgroupReader,
    cgroup: &CgroupName,
    mems: &CpuSet,
    nodes: &std::collections::BTreeSet<u32>,
) {
    let Some(to) = mems.iter().next().filter(|_| mems.len() == 1) else {
        return;
    };
    let pids = match reader.pids(cgroup) {
        Ok(pids) => pids,
        Err(e) => {
            tracing::warn!(cgroup = %cgroup, error = %e, "listing processes to move their memory");
            return;
        }
    };
    let nodes = nodes.clone();
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

/// The CFS quota and period of a container's config, when it has a CPU limit.
pub(super) fn cfs_limit(config: &ResourceConfig) -> Option<CfsLimit> {
    match config.cpu_quota {
        Some(Limit::Value(quota_us)) => Some(CfsLimit {
            quota_us,
            period_us: config.cpu_period.unwrap_or(QUOTA_PERIOD),
        }),
        _ => None,
    }
}

/// Which feedback settings the running kernel has, judged by the files in `cgroup` (the
/// kubepods cgroup: every pod cgroup below it has the same).
pub(super) fn capabilities(cgroups: &dyn CgroupReader, cgroup: &CgroupName) -> Capabilities {
    let has = |setting: Setting| cgroups.setting(cgroup, setting).is_ok_and(|s| s.is_some());
    Capabilities {
        cpu_burst: has(Setting::CpuBurst),
        cpu_idle: has(Setting::CpuIdle),
    }
}

/// What one feedback run changed.
#[derive(Debug, Default)]
pub(super) struct Changes {
    /// The overrides differ: the tiers and pods are to be written again.
    pub overrides: bool,
    /// Containers whose `cpuset.mems` the feedback changed, with the new nodes: their pages
    /// are to be moved there.
    pub memory_moved: Vec<(ContainerRef, CpuSet)>,
}

/// The feedback and what feeds it.
pub struct FeedbackLoop {
    feedback: Feedback,
    preemptions: Option<Box<dyn PreemptionSource>>,
    index: WorkloadIndex,
    overrides: Overrides,
    next: Option<Instant>,
    page_size: u64,
    /// Whether the last preemption read failed (logged once per change).
    preemptions_failing: bool,
    /// NUMA nodes of the machine (realignment is judged only with two or more).
    numa_nodes: usize,
    /// The BestEffort tier's own counters could not be read at the last run (its containers'
    /// are read instead).
    tier_unreadable: bool,
    /// Where cgroups ran, per node (machines with two nodes or more).
    placement: Option<CpuPlacement>,
}

/// How old the newest placement reading may be before the feedback takes one itself.
const PLACEMENT_REFRESH: std::time::Duration = std::time::Duration::from_secs(2);

/// No statistic at all.
const NOTHING: StatKinds = StatKinds {
    cpu: false,
    memory: false,
    numa: false,
    cpuset: false,
};

impl FeedbackLoop {
    /// The feedback fed from the manager's cgroups and, when the run-queue probe runs,
    /// `preemptions` (cgroup ids resolved through `index`), on a machine of `numa_nodes`.
    #[must_use]
    pub fn new(
        feedback: Feedback,
        preemptions: Option<Box<dyn PreemptionSource>>,
        index: WorkloadIndex,
        numa_nodes: usize,
    ) -> Self {
        Self {
            feedback,
            preemptions,
            index,
            overrides: Overrides::default(),
            next: None,
            page_size: page_size(),
            preemptions_failing: false,
            numa_nodes,
            tier_unreadable: false,
            placement: None,
        }
    }

    /// Judges unpinned containers by where they ran (`numa_align` reports those away from
    /// their memory), from `placement`, which the scrapes keep and the feedback refreshes when
    /// its newest reading is older than [`PLACEMENT_REFRESH`].
    pub fn set_placement(&mut self, placement: CpuPlacement) {
        self.placement = Some(placement);
    }

    /// CPU time per node of every cgroup over the NUMA policy's span, a fresh reading recorded
    /// first when the newest is older than [`PLACEMENT_REFRESH`] (a reading of the probe's
    /// map costs about what its part of a scrape does; the span is 10 s).
    fn ran_on(&mut self, now: Instant) -> HashMap<u64, Placement> {
        let Some(placement) = &self.placement else {
            return HashMap::new();
        };
        if self.numa_nodes < 2 {
            return HashMap::new();
        }
        let stale = placement
            .newest()
            .is_none_or(|t| now.saturating_duration_since(t) >= PLACEMENT_REFRESH);
        if stale && let Some(nanos) = self.preemptions.as_mut().and_then(|s| s.cpu_by_node()) {
            placement.record(Instant::now(), nanos);
        }
        placement.window(self.feedback.numa_span())
    }

    /// The feedback over the cgroups below `kubepods` (whose files say what the kernel allows),
    /// with NUMA realignment on the machine's `layout` and BestEffort suppression from the
    /// run-queue probe's `preemptions` when they are given; also the machine's NUMA nodes.
    pub(super) fn enable(
        cgroups: &dyn CgroupReader,
        kubepods: &CgroupName,
        config: crate::feedback::FeedbackConfig,
        layout: Option<crate::numa::NodeLayout>,
        preemptions: Option<Box<dyn PreemptionSource>>,
        metrics: Option<crate::feedback::FeedbackMetrics>,
        index: WorkloadIndex,
    ) -> (Self, std::collections::BTreeSet<u32>) {
        let caps = capabilities(cgroups, kubepods);
        tracing::info!(
            mode = ?config.mode,
            period = ?config.period,
            cpu_burst = caps.cpu_burst,
            cpu_idle = caps.cpu_idle,
            numa_layout = layout.is_some(),
            preemptions = preemptions.is_some(),
            "feedback enabled"
        );
        let nodes = layout
            .as_ref()
            .map(crate::numa::NodeLayout::nodes)
            .unwrap_or_default();
        let feedback = Feedback::new(config, caps, layout, metrics);
        (Self::new(feedback, preemptions, index, nodes.len()), nodes)
    }

    /// Whether a snapshot is due at `now`.
    pub(super) fn due(&self, now: Instant) -> bool {
        self.next.is_none_or(|next| now >= next)
    }

    /// Takes a snapshot of `watched`, lets the policies decide, and returns what changed.
    /// The BestEffort tier's CPU counters come from `besteffort_tier` itself (one file for
    /// every BestEffort pod); its containers' are read only when the tier's cannot be.
    pub(super) fn run(
        &mut self,
        cgroups: &dyn CgroupReader,
        watched: &[Watched],
        besteffort_tier: &CgroupName,
        now: Instant,
    ) -> Changes {
        self.next = Some(now + self.feedback.period());
        let cpu_only = StatKinds {
            cpu: true,
            memory: false,
            numa: false,
            cpuset: false,
        };
        let tier = match cgroups.stats_of(besteffort_tier, cpu_only) {
            Ok(stats) => stats.cpu,
            Err(e) => {
                tracing::debug!(cgroup = %besteffort_tier, error = %e, "feedback: BestEffort tier unreadable; reading its containers");
                None
            }
        };
        let tier_read = tier.as_ref().is_some_and(|t| t.usage_ns.is_some());
        self.tier_unreadable = !tier_read;
        let ran_on = self.ran_on(now);
        let containers = watched
            .iter()
            .filter(|w| self.wanted(w, tier_read) != NOTHING)
            .filter_map(|w| self.read_container(cgroups, w, tier_read, &ran_on))
            .collect();
        let preemptions = self.read_preemptions();
        self.feedback.observe(Snapshot {
            taken: now,
            containers,
            preemptions,
            besteffort_tier: tier,
        });
        let overrides = self.feedback.overrides();
        if overrides == self.overrides {
            return Changes::default();
        }
        let moved = overrides
            .containers
            .iter()
            .filter_map(|(target, config)| {
                let mems = config.cpuset_mems.as_ref()?;
                let before = self
                    .overrides
                    .containers
                    .get(target)
                    .and_then(|c| c.cpuset_mems.as_ref());
                (before != Some(mems)).then(|| (target.clone(), mems.clone()))
            })
            .collect();
        self.overrides = overrides;
        Changes {
            overrides: true,
            memory_moved: moved,
        }
    }

    fn read_container(
        &self,
        cgroups: &dyn CgroupReader,
        watched: &Watched,
        tier_read: bool,
        ran_on: &HashMap<u64, Placement>,
    ) -> Option<ContainerSnapshot> {
        let stats = match cgroups.stats_of(&watched.cgroup, self.wanted(watched, tier_read)) {
            Ok(stats) => stats,
            Err(e) => {
                tracing::debug!(cgroup = %watched.cgroup, error = %e, "feedback: cgroup unreadable");
                return None;
            }
        };
        Some(ContainerSnapshot {
            target: watched.target.clone(),
            qos: watched.qos,
            limit: watched.limit,
            cpu: stats.cpu,
            cpus: stats.cpuset.map(|c| c.cpus.into_iter().collect()),
            memory_by_node: stats
                .numa
                .map(|numa| NumaStat::from_kernel(&numa, self.page_size).bytes_by_node)
                .unwrap_or_default(),
            mems_pinned: watched.mems_pinned,
            ran_on: if ran_on.is_empty() {
                None
            } else {
                cgroups
                    .id(&watched.cgroup)
                    .ok()
                    .flatten()
                    .and_then(|id| ran_on.get(&id).cloned())
            },
        })
    }

    /// Whether a container of class `qos` (with a CPU limit or not, its memory placed by the
    /// memory manager or not) can matter to a policy at the next run: the manager hands only
    /// those over, so a window costs nothing per container that no policy judges.
    pub(super) fn interested(&self, qos: QosClass, limited: bool, mems_pinned: bool) -> bool {
        self.wanted_for(qos, limited, mems_pinned, !self.tier_unreadable) != NOTHING
    }

    /// What the policies can use of a container, so nothing else is read: CPU counters of
    /// BestEffort containers only when their tier's were not read (`besteffort_cpu` caps the
    /// tier by its use), of Burstable ones with a limit (`cpu_burst`); where its memory and
    /// CPUs are (`numa_align`) only on a machine with several NUMA nodes and for containers
    /// the memory manager did not place.
    fn wanted(&self, watched: &Watched, tier_read: bool) -> StatKinds {
        self.wanted_for(
            watched.qos,
            watched.limit.is_some(),
            watched.mems_pinned,
            tier_read,
        )
    }

    fn wanted_for(
        &self,
        qos: QosClass,
        limited: bool,
        mems_pinned: bool,
        tier_read: bool,
    ) -> StatKinds {
        let numa = self.numa_nodes > 1 && !mems_pinned;
        StatKinds {
            cpu: match qos {
                QosClass::BestEffort => !tier_read,
                QosClass::Burstable => limited,
                QosClass::Guaranteed => false,
            },
            memory: false,
            numa,
            cpuset: numa,
        }
    }

    /// The probe's preemptions between containers qosd manages, summed by QoS class pair.
    fn read_preemptions(&mut self) -> Option<BTreeMap<(QosClass, QosClass), Preemptions>> {
        let source = self.preemptions.as_mut()?;
        let pairs = match source.preemptions() {
            Ok(pairs) => {
                self.preemptions_failing = false;
                pairs
            }
            Err(e) => {
                if !self.preemptions_failing {
                    tracing::warn!(error = %e, "feedback: preemptions unreadable; deciding without them");
                }
                self.preemptions_failing = true;
                return None;
            }
        };
        let class = |id: u64| self.index.get(id).map(|w| w.qos_class);
        let mut by_class: BTreeMap<(QosClass, QosClass), Preemptions> = BTreeMap::new();
        for ((victim, preemptor), p) in pairs {
            if let (Some(victim), Some(preemptor)) = (class(victim), class(preemptor)) {
                let sum = by_class.entry((victim, preemptor)).or_default();
                sum.count = sum.count.saturating_add(p.count);
                sum.wait_ns = sum.wait_ns.saturating_add(p.wait_ns);
            }
        }
        Some(by_class)
    }

    /// The BestEffort tier's config: kubelet's `base`, kubelet's values of what the policies
    /// change, and the interventions in force.
    pub(super) fn tier_config(&self, base: ResourceConfig) -> ResourceConfig {
        base.overlaid(&self.feedback.capabilities().besteffort_baseline())
            .overlaid(&self.overrides.besteffort_tier)
    }

    /// A container's config, the same way: `base` has a CFS quota or not.
    pub(super) fn container_config(
        &self,
        target: &ContainerRef,
        base: ResourceConfig,
    ) -> ResourceConfig {
        let quota = matches!(base.cpu_quota, Some(Limit::Value(_)));
        let config = base.overlaid(&self.feedback.capabilities().container_baseline(quota));
        match self.overrides.containers.get(target) {
            Some(over) => config.overlaid(over),
            None => config,
        }
    }

    /// The interventions in force (none in dry-run mode).
    pub(super) fn overrides(&self) -> &Overrides {
        &self.overrides
    }

    /// The decisions so far, for `qosd inspect`.
    pub(super) fn log(&self) -> &DecisionLog {
        self.feedback.log()
    }
}
