//! `qosd_cgroup_cpu_seconds_total{cgroup}`, `qosd_cgroup_node_cpu_seconds_total{numa_node}` (pod
//! and container cgroups only, on machines with two NUMA nodes or more),
//! `qosd_cpu_unchained_switches_total` and the cpu-time probe's health series.
//!
//! Each reading's CPU time per node is also recorded in the [`CpuPlacement`] history, where the
//! NUMA memory collector and the feedback find where each cgroup ran.
//!
//! At every scrape the collector reads the kernel counters, resolves cgroup ids to paths
//! through the cpu hierarchy's tree ([`crate::cgroup::trees`]), drops (and removes from the kernel map) the cgroups that are
//! gone, and never lets a series go backwards.
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{MetricFamily, MetricType};

use super::SampleError;
use super::families::{
    DROPPED, DROPPED_HELP, EVENTS, EVENTS_HELP, MAP_CAPACITY, MAP_CAPACITY_HELP, MAP_ENTRIES,
    MAP_ENTRIES_HELP, ProbeHealth, as_f64, cgroup_labels, family, sample_and_paths,
};
use crate::cgroup::trees::CgroupTrees;
use crate::cm::index::WorkloadIndex;
use crate::numa::placement::CpuPlacement;
use crate::probes::cpu_time::{CpuTimeSample, PROBE_NAME};
use crate::probes::sched_switch::SharedSwitchProbe;
use qosd_common::{MAX_CGROUPS, MAX_SLOTS, names};

/// Where the per-cgroup counters come from: the kernel probe, or a fake in tests.
pub trait CpuTimeSource: Send {
    /// Reads every counter.
    fn sample(&mut self) -> Result<CpuTimeSample, SampleError>;
    /// Drops the counters of cgroups that no longer exist.
    fn forget(&mut self, cgroup_ids: &[u64]);
}

impl CpuTimeSource for SharedSwitchProbe {
    fn sample(&mut self) -> Result<CpuTimeSample, SampleError> {
        Ok(self.lock().sample_cpu_time()?)
    }

    fn forget(&mut self, cgroup_ids: &[u64]) {
        if let Err(e) = self.lock().forget(cgroup_ids) {
            tracing::warn!(error = %e, "removing counters of deleted cgroups");
        }
    }
}

struct State {
    source: Box<dyn CpuTimeSource>,
    workloads: WorkloadIndex,
    hierarchy_root: PathBuf,
    trees: Arc<CgroupTrees>,
    /// Last exported nanoseconds per cgroup id, so a series never decreases.
    last: HashMap<u64, u64>,
    /// The same per node position, for the per-node family.
    last_by_node: HashMap<u64, Vec<u64>>,
    /// Where the per-node readings go; `None` on one node.
    placement: Option<CpuPlacement>,
}

/// Collects the cpu-time series at scrape time.
pub struct CgroupCpuCollector {
    state: Mutex<State>,
    descs: Vec<Desc>,
}

const CPU_SECONDS: &str = "qosd_cgroup_cpu_seconds_total";
const CPU_SECONDS_HELP: &str =
    "CPU time consumed by the tasks of each cgroup, counted on sched_switch by qosd's eBPF probe";
const NODE_CPU_SECONDS: &str = "qosd_cgroup_node_cpu_seconds_total";
const NODE_CPU_SECONDS_HELP: &str = "CPU time consumed by the tasks of each pod and container cgroup on the CPUs of each NUMA node (the cpu-time probe's per-CPU counters summed per node): where the workload runs";
const UNCHAINED: &str = "qosd_cpu_unchained_switches_total";
const UNCHAINED_HELP: &str = "Switches out of a task whose switch in the probe did not see (one per CPU at attach, and switches the kernel did not deliver to BPF); their slices are charged from the scheduler's start-of-run mark";

impl CgroupCpuCollector {
    /// A collector reading `source`, resolving ids in the hierarchy mounted at `root`, and
    /// labelling managed cgroups with their namespace, pod, container and QoS class; each
    /// reading's per-node CPU time goes to `placement` (machines with two NUMA nodes or more).
    pub fn new(
        source: Box<dyn CpuTimeSource>,
        hierarchy_root: PathBuf,
        trees: Arc<CgroupTrees>,
        workloads: WorkloadIndex,
        placement: Option<CpuPlacement>,
    ) -> Result<Self, prometheus::Error> {
        let descs = vec![
            Desc::new(
                CPU_SECONDS.into(),
                CPU_SECONDS_HELP.into(),
                vec!["cgroup".into()],
                HashMap::new(),
            )?,
            Desc::new(
                NODE_CPU_SECONDS.into(),
                NODE_CPU_SECONDS_HELP.into(),
                vec!["cgroup".into(), "numa_node".into()],
                HashMap::new(),
            )?,
            Desc::new(
                UNCHAINED.into(),
                UNCHAINED_HELP.into(),
                Vec::new(),
                HashMap::new(),
            )?,
            Desc::new(
                EVENTS.into(),
                EVENTS_HELP.into(),
                vec!["probe".into()],
                HashMap::new(),
            )?,
            Desc::new(
                DROPPED.into(),
                DROPPED_HELP.into(),
                vec!["probe".into()],
                HashMap::new(),
            )?,
            Desc::new(
                MAP_ENTRIES.into(),
                MAP_ENTRIES_HELP.into(),
                vec!["map".into()],
                HashMap::new(),
            )?,
            Desc::new(
                MAP_CAPACITY.into(),
                MAP_CAPACITY_HELP.into(),
                vec!["map".into()],
                HashMap::new(),
            )?,
        ];
        Ok(Self {
            state: Mutex::new(State {
                source,
                workloads,
                hierarchy_root,
                trees,
                last: HashMap::new(),
                last_by_node: HashMap::new(),
                placement,
            }),
            descs,
        })
    }
}

impl Collector for CgroupCpuCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Ok(mut state) = self.state.lock() else {
            tracing::error!("cpu-time collector state poisoned by an earlier panic");
            return Vec::new();
        };
        let state = &mut *state;
        let Some((sample, paths)) = sample_and_paths(
            PROBE_NAME,
            || state.source.sample(),
            |s: &CpuTimeSample| s.nanos_by_cgroup.keys().copied().collect(),
            &state.trees,
            &state.hierarchy_root,
        ) else {
            return Vec::new();
        };
        let node_series = node_series(state, &sample, &paths);
        let mut series = Vec::new();
        let mut gone = Vec::new();
        for (&id, &nanos) in &sample.nanos_by_cgroup {
            let Some(path) = paths.path(id) else {
                gone.push(id);
                continue;
            };
            let last = state.last.entry(id).or_default();
            *last = (*last).max(nanos);
            #[expect(
                clippy::cast_precision_loss,
                reason = "f64 holds 2^53 ns = 104 days exactly; beyond that sub-microsecond precision is irrelevant"
            )]
            let seconds = *last as f64 / 1e9;
            series.push((cgroup_labels(&state.workloads, id, path), seconds));
        }
        if !gone.is_empty() {
            tracing::debug!(count = gone.len(), "forgetting counters of removed cgroups");
            for id in &gone {
                state.last.remove(id);
                state.last_by_node.remove(id);
            }
            state.source.forget(&gone);
        }
        series.sort_by(|a, b| a.0.cmp(&b.0));

        let health = ProbeHealth {
            events: vec![(PROBE_NAME, sample.stats.events)],
            dropped: vec![(
                PROBE_NAME,
                sample
                    .stats
                    .dropped
                    .saturating_add(sample.stats.read_errors),
            )],
            maps: vec![
                (names::CPU_TIME_MAP, sample.map_entries, MAX_CGROUPS),
                (names::CPU_TIME_SLOTS_MAP, sample.slots_used, MAX_SLOTS),
            ],
        };
        let mut families = vec![
            family(CPU_SECONDS, CPU_SECONDS_HELP, MetricType::COUNTER, series),
            family(
                NODE_CPU_SECONDS,
                NODE_CPU_SECONDS_HELP,
                MetricType::COUNTER,
                node_series,
            ),
            family(
                UNCHAINED,
                UNCHAINED_HELP,
                MetricType::COUNTER,
                [(Vec::new(), as_f64(sample.stats.unchained))],
            ),
        ];
        families.extend(health.families());
        families
    }
}

/// Records the reading's per-node CPU time in the placement history, and returns the per-node
/// series of pod and container cgroups (never decreasing).
fn node_series(
    state: &mut State,
    sample: &CpuTimeSample,
    paths: &crate::cgroup::CgroupPaths,
) -> Vec<(Vec<(&'static str, String)>, f64)> {
    let Some(placement) = &state.placement else {
        return Vec::new();
    };
    if sample.nanos_by_cgroup_node.is_empty() {
        return Vec::new();
    }
    placement.record(
        std::time::Instant::now(),
        sample.nanos_by_cgroup_node.clone(),
    );
    let nodes = placement.nodes();
    let mut series = Vec::new();
    for (&id, per_node) in &sample.nanos_by_cgroup_node {
        let (Some(path), true) = (paths.path(id), state.workloads.get(id).is_some()) else {
            continue;
        };
        let last = state
            .last_by_node
            .entry(id)
            .or_insert_with(|| vec![0; per_node.len()]);
        let labels = cgroup_labels(&state.workloads, id, path);
        for ((node, now), last) in nodes.iter().zip(per_node).zip(last.iter_mut()) {
            *last = (*last).max(*now);
            let mut l = labels.clone();
            l.push(("numa_node", node.to_string()));
            #[expect(
                clippy::cast_precision_loss,
                reason = "f64 holds 2^53 ns = 104 days exactly"
            )]
            series.push((l, *last as f64 / 1e9));
        }
    }
    series.sort_by(|a, b| a.0.cmp(&b.0));
    series
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;
    use std::sync::{Arc, Mutex as StdMutex};

    use super::*;
    use crate::metrics::Metrics;
    use crate::pods::qos::QosClass;

    /// Returns scripted samples and records what it was told to forget.
    struct FakeSource {
        samples: Vec<HashMap<u64, u64>>,
        by_node: HashMap<u64, Vec<u64>>,
        forgotten: Arc<StdMutex<Vec<u64>>>,
    }

    impl CpuTimeSource for FakeSource {
        fn sample(&mut self) -> Result<CpuTimeSample, SampleError> {
            let nanos_by_cgroup = if self.samples.len() > 1 {
                self.samples.remove(0)
            } else {
                self.samples[0].clone()
            };
            let nanos_by_cgroup_node = self.by_node.clone();
            Ok(CpuTimeSample {
                map_entries: nanos_by_cgroup.len(),
                slots_used: 0,
                nanos_by_cgroup,
                nanos_by_cgroup_node,
                stats: qosd_common::ProbeStats {
                    events: 7,
                    read_errors: 1,
                    dropped: 2,
                    unchained: 4,
                },
            })
        }
        fn forget(&mut self, ids: &[u64]) {
            self.forgotten.lock().expect("lock").extend_from_slice(ids);
        }
    }

    /// The container `prod/web/app`, Burstable.
    fn web_app() -> crate::cm::index::Workload {
        crate::cm::index::Workload {
            namespace: "prod".into(),
            pod: "web".into(),
            container: Some("app".into()),
            qos_class: QosClass::Burstable,
        }
    }

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    #[test]
    fn series_are_labelled_by_path_monotonic_and_pruned() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("pod/ctr")).expect("mkdir");
        let ino = |p: &str| std::fs::metadata(root.path().join(p)).expect("stat").ino();
        let (pod, ctr) = (ino("pod"), ino("pod/ctr"));
        let deleted = u64::MAX - 1;
        let forgotten = Arc::new(StdMutex::new(Vec::new()));
        let source = FakeSource {
            samples: vec![
                HashMap::from([(pod, 1_500_000_000), (ctr, 250_000_000), (deleted, 9)]),
                // The running-slice estimate can trail a completed charge by a little.
                HashMap::from([(pod, 1_400_000_000), (ctr, 500_000_000)]),
            ],
            by_node: HashMap::new(),
            forgotten: forgotten.clone(),
        };
        let metrics = Metrics::new().expect("registry");
        let workloads = WorkloadIndex::new();
        workloads.insert(ctr, web_app());
        let collector = CgroupCpuCollector::new(
            Box::new(source),
            root.path().to_owned(),
            Arc::default(),
            workloads,
            None,
        )
        .expect("collector");
        metrics
            .register("cgroup_cpu", Ok(collector))
            .expect("register");

        let first = metrics.render();
        assert_eq!(
            line(&first, "qosd_cgroup_cpu_seconds_total{cgroup=\"/pod\"}"),
            Some("qosd_cgroup_cpu_seconds_total{cgroup=\"/pod\"} 1.5"),
            "{first}"
        );
        assert_eq!(
            line(
                &first,
                "qosd_cgroup_cpu_seconds_total{cgroup=\"/pod/ctr\",container=\"app\",namespace=\"prod\",pod=\"web\",qos_class=\"burstable\"}"
            ),
            Some(
                "qosd_cgroup_cpu_seconds_total{cgroup=\"/pod/ctr\",container=\"app\",namespace=\"prod\",pod=\"web\",qos_class=\"burstable\"} 0.25"
            )
        );
        assert_eq!(
            forgotten.lock().expect("lock").as_slice(),
            &[deleted],
            "ids without a cgroup are removed from the kernel map"
        );
        assert!(first.contains("# TYPE qosd_cgroup_cpu_seconds_total counter"));
        assert!(
            first.contains("qosd_probe_dropped_events_total{probe=\"cpu_time\"} 3"),
            "{first}"
        );
        assert!(
            first.contains("\nqosd_cpu_unchained_switches_total 4\n"),
            "{first}"
        );
        assert!(
            first.contains("qosd_bpf_map_capacity{map=\"CGROUP_CPU_NS\"} 16384"),
            "{first}"
        );

        let second = metrics.render();
        assert_eq!(
            line(&second, "qosd_cgroup_cpu_seconds_total{cgroup=\"/pod\"}"),
            Some("qosd_cgroup_cpu_seconds_total{cgroup=\"/pod\"} 1.5"),
            "never decreases: {second}"
        );
        assert_eq!(
            line(
                &second,
                "qosd_cgroup_cpu_seconds_total{cgroup=\"/pod/ctr\",container=\"app\",namespace=\"prod\",pod=\"web\",qos_class=\"burstable\"}"
            ),
            Some(
                "qosd_cgroup_cpu_seconds_total{cgroup=\"/pod/ctr\",container=\"app\",namespace=\"prod\",pod=\"web\",qos_class=\"burstable\"} 0.5"
            )
        );
    }

    #[test]
    fn a_cgroup_created_after_the_scrapes_tree_is_resolved_not_forgotten() {
        for trees in [
            CgroupTrees::new(),
            CgroupTrees::walked_only("the walked mode"),
        ] {
            let trees = Arc::new(trees);
            let root = tempfile::tempdir().expect("tempdir");
            // Another collector of this scrape took the tree before the cgroup existed.
            let scope = trees.scope();
            let before = trees.current(root.path()).expect("walk");
            std::fs::create_dir(root.path().join("new")).expect("mkdir");
            let new = std::fs::metadata(root.path().join("new"))
                .expect("stat")
                .ino();
            assert!(before.dirs.iter().all(|d| d.ino != new));
            let forgotten = Arc::new(StdMutex::new(Vec::new()));
            let source = FakeSource {
                samples: vec![HashMap::from([(new, 2_000_000_000)])],
                by_node: HashMap::new(),
                forgotten: forgotten.clone(),
            };
            let collector = CgroupCpuCollector::new(
                Box::new(source),
                root.path().to_owned(),
                Arc::clone(&trees),
                WorkloadIndex::new(),
                None,
            )
            .expect("collector");
            let families = collector.collect();
            drop(scope);
            let cpu = families
                .iter()
                .find(|f| f.name() == CPU_SECONDS)
                .expect("cpu family");
            assert_eq!(cpu.get_metric().len(), 1, "{:?}: {cpu:?}", trees.modes());
            assert_eq!(cpu.get_metric()[0].get_label()[0].value(), "/new");
            assert!(forgotten.lock().expect("lock").is_empty());
        }
    }

    #[test]
    fn cpu_per_node_of_pods_is_exported_and_recorded() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("pod/ctr")).expect("mkdir");
        let ino = |p: &str| std::fs::metadata(root.path().join(p)).expect("stat").ino();
        let (pod, ctr) = (ino("pod"), ino("pod/ctr"));
        let source = FakeSource {
            samples: vec![HashMap::from([(pod, 10), (ctr, 3_000_000_000)])],
            by_node: HashMap::from([
                (pod, vec![10, 0]),
                (ctr, vec![2_000_000_000, 1_000_000_000]),
            ]),
            forgotten: Arc::default(),
        };
        let workloads = WorkloadIndex::new();
        workloads.insert(ctr, web_app());
        let placement = CpuPlacement::new(vec![0, 1]);
        let collector = CgroupCpuCollector::new(
            Box::new(source),
            root.path().to_owned(),
            Arc::default(),
            workloads,
            Some(placement.clone()),
        )
        .expect("collector");
        let metrics = Metrics::new().expect("registry");
        metrics
            .register("cgroup_cpu", Ok(collector))
            .expect("register");
        let text = metrics.render();
        for (node, seconds) in [("0", "2"), ("1", "1")] {
            let want = format!(
                "qosd_cgroup_node_cpu_seconds_total{{cgroup=\"/pod/ctr\",container=\"app\",namespace=\"prod\",numa_node=\"{node}\",pod=\"web\",qos_class=\"burstable\"}} {seconds}"
            );
            assert!(text.contains(&want), "missing {want}:\n{text}");
        }
        assert!(
            !text.contains("qosd_cgroup_node_cpu_seconds_total{cgroup=\"/pod\","),
            "a cgroup of no pod has no per-node series:\n{text}"
        );
        let recorded = placement.window(std::time::Duration::from_secs(1));
        assert_eq!(recorded[&ctr].share(0), 2.0 / 3.0);
    }
}
