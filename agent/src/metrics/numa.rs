//! Cross-NUMA memory series, per cgroup with the usual labels (`cgroup`, and `namespace`,
//! `pod`, `container`, `qos_class` for managed cgroups), each source its own metric:
//!
//! - `qosd_numa_memory_bytes{node,locality}` (gauge): resident memory per node from
//!   `memory.numa_stat`, read from cgroupfs at scrape time ([`NumaMemoryCollector`]). Where the
//!   cgroup's cpuset pins it to some nodes, a node's memory is local when the node is one of
//!   its CPUs'. Elsewhere (the cgroup may run anywhere, as unpinned pods do) each node's bytes
//!   are split by where its tasks ran ([`crate::numa::placement`]): the share of the cgroup's
//!   CPU time on that node over the last window is local, the rest remote; a cgroup that never
//!   ran falls back to the cpuset rule;
//! - `qosd_numa_hint_faults_total{locality}`: NUMA hinting faults, local when the memory is on
//!   the faulting CPU's node;
//! - `qosd_numa_page_allocations_total{locality}`: pages allocated, local when on the
//!   allocating CPU's node;
//! - `qosd_numa_task_migrations_total{cross_node}`: task migrations between CPUs of one node
//!   (`false`) or of two nodes (`true`);
//!
//! the last three from the kernel maps at scrape time ([`NumaCollector`]), with the probes'
//! health series. A probe that is not attached exports nothing (its mode says why).
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{MetricFamily, MetricType};

use super::SampleError;
use super::families::{ProbeHealth, as_f64, cgroup_labels, family, sample_and_paths};
use crate::cgroup::CgroupPaths;
use crate::cgroup::trees::CgroupTrees;
use crate::cm::index::WorkloadIndex;
use crate::numa::placement::{CpuPlacement, Placement};
use crate::numa::{CgroupNumaMemory, Locality, NumaMemoryReader};
use crate::probes::ProbeMode;
use crate::probes::numa::{
    HINT_FAULT_PROBE, MIGRATION_PROBE, NumaProbe, NumaSample, PAGE_ALLOC_PROBE,
};
use qosd_common::{LocalityCounts, MAX_CGROUPS, names};

const MEMORY: &str = "qosd_numa_memory_bytes";
const MEMORY_HELP: &str = "Resident memory of each cgroup per NUMA node (memory.numa_stat). A cgroup whose cpuset pins it to some nodes: local when the node holds one of its CPUs. Any other cgroup: each node's bytes are local in the share of the cgroup's CPU time spent on that node's CPUs over the last window (at least 10 s), remote for the rest";
const HINT_FAULTS: &str = "qosd_numa_hint_faults_total";
const HINT_FAULTS_HELP: &str = "NUMA hinting faults of each cgroup's tasks, local when the memory is on the faulting CPU's node (needs kernel.numa_balancing)";
const PAGE_ALLOCS: &str = "qosd_numa_page_allocations_total";
const PAGE_ALLOCS_HELP: &str =
    "Pages allocated by each cgroup's tasks, local when on the allocating CPU's node";
const MIGRATIONS: &str = "qosd_numa_task_migrations_total";
const MIGRATIONS_HELP: &str = "Migrations of each cgroup's tasks between CPUs, cross_node when the CPUs are on different nodes";

/// Which NUMA probes are attached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NumaLive {
    pub hint_faults: bool,
    pub page_allocs: bool,
    pub migrations: bool,
}

/// Where the counters come from: the kernel probe, or a fake in tests.
pub trait NumaSource: Send {
    /// Reads every counter.
    fn sample(&mut self) -> Result<NumaSample, SampleError>;
    /// Drops the counters of cgroups that no longer exist.
    fn forget(&mut self, cgroup_ids: &[u64]);
    /// Which probes are attached.
    fn live(&self) -> NumaLive;
}

impl NumaSource for NumaProbe {
    fn sample(&mut self) -> Result<NumaSample, SampleError> {
        Ok(NumaProbe::sample(self)?)
    }

    fn forget(&mut self, cgroup_ids: &[u64]) {
        if let Err(e) = NumaProbe::forget(self, cgroup_ids) {
            tracing::warn!(error = %e, "removing NUMA counters of deleted cgroups");
        }
    }

    fn live(&self) -> NumaLive {
        let up = |mode: &ProbeMode| !matches!(mode, ProbeMode::Unavailable(_));
        NumaLive {
            hint_faults: up(self.hint_fault_mode()),
            page_allocs: up(self.page_alloc_mode()),
            migrations: up(self.migration_mode()),
        }
    }
}

fn descs(items: &[(&str, &str)]) -> Result<Vec<Desc>, prometheus::Error> {
    items
        .iter()
        .map(|(name, help)| {
            Desc::new(
                (*name).into(),
                (*help).into(),
                vec!["cgroup".into()],
                HashMap::new(),
            )
        })
        .collect()
}

struct State {
    source: Box<dyn NumaSource>,
    workloads: WorkloadIndex,
    hierarchy_root: PathBuf,
    trees: Arc<CgroupTrees>,
}

/// Collects the hinting-fault, page-allocation and migration series at scrape time.
pub struct NumaCollector {
    state: Mutex<State>,
    descs: Vec<Desc>,
}

impl NumaCollector {
    /// A collector reading `source`, resolving ids in the hierarchy mounted at `root`.
    pub fn new(
        source: Box<dyn NumaSource>,
        hierarchy_root: PathBuf,
        trees: Arc<CgroupTrees>,
        workloads: WorkloadIndex,
    ) -> Result<Self, prometheus::Error> {
        Ok(Self {
            state: Mutex::new(State {
                source,
                workloads,
                hierarchy_root,
                trees,
            }),
            descs: descs(&[
                (HINT_FAULTS, HINT_FAULTS_HELP),
                (PAGE_ALLOCS, PAGE_ALLOCS_HELP),
                (MIGRATIONS, MIGRATIONS_HELP),
            ])?,
        })
    }
}

impl Collector for NumaCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Ok(mut state) = self.state.lock() else {
            tracing::error!("NUMA collector state poisoned by an earlier panic");
            return Vec::new();
        };
        let state = &mut *state;
        let Some((sample, paths)) = sample_and_paths(
            "numa",
            || state.source.sample(),
            |s: &NumaSample| {
                s.hint_faults
                    .keys()
                    .chain(s.page_allocs.keys())
                    .chain(s.migrations.keys())
                    .copied()
                    .collect()
            },
            &state.trees,
            &state.hierarchy_root,
        ) else {
            return Vec::new();
        };
        let live = state.source.live();
        let mut gone = Vec::new();
        let mut families = Vec::new();
        let mut health = ProbeHealth::default();
        let s = &sample.stats;
        for (up, name, help, label, values, map, probe, events, dropped) in [
            (
                live.hint_faults,
                HINT_FAULTS,
                HINT_FAULTS_HELP,
                ("locality", ["local", "remote"]),
                &sample.hint_faults,
                names::NUMA_HINT_FAULTS_MAP,
                HINT_FAULT_PROBE,
                s.hint_faults,
                s.hint_dropped,
            ),
            (
                live.page_allocs,
                PAGE_ALLOCS,
                PAGE_ALLOCS_HELP,
                ("locality", ["local", "remote"]),
                &sample.page_allocs,
                names::NUMA_PAGE_ALLOCS_MAP,
                PAGE_ALLOC_PROBE,
                s.page_allocs,
                s.alloc_dropped,
            ),
            (
                live.migrations,
                MIGRATIONS,
                MIGRATIONS_HELP,
                ("cross_node", ["false", "true"]),
                &sample.migrations,
                names::NUMA_MIGRATIONS_MAP,
                MIGRATION_PROBE,
                s.migrations,
                s.migration_dropped,
            ),
        ] {
            if !up {
                continue;
            }
            let series = locality_series(values, label, &paths, &state.workloads, &mut gone);
            families.push(family(name, help, MetricType::COUNTER, series));
            health.events.push((probe, events));
            health.dropped.push((probe, dropped));
            health.maps.push((map, values.len(), MAX_CGROUPS));
        }
        if !gone.is_empty() {
            gone.sort_unstable();
            gone.dedup();
            state.source.forget(&gone);
        }
        families.extend(health.families());
        families
    }
}

/// Two series per cgroup (`label` = first value for `local`, second for `remote`), sorted;
/// ids without a cgroup go to `gone`.
fn locality_series(
    values: &HashMap<u64, LocalityCounts>,
    (label, [local, remote]): (&'static str, [&'static str; 2]),
    paths: &CgroupPaths,
    workloads: &WorkloadIndex,
    gone: &mut Vec<u64>,
) -> Vec<(Vec<(&'static str, String)>, f64)> {
    let mut out = Vec::new();
    for (&id, counts) in values {
        let Some(path) = paths.path(id) else {
            gone.push(id);
            continue;
        };
        let labels = cgroup_labels(workloads, id, path);
        for (value, count) in [(local, counts.local), (remote, counts.remote)] {
            let mut l = labels.clone();
            l.push((label, value.to_owned()));
            out.push((l, as_f64(count)));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// How far back the CPU time that weighs an unpinned cgroup's memory goes (at least; the
/// window ends at the newest reading and starts at the newest one this much older).
pub const PLACEMENT_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// Collects `qosd_numa_memory_bytes` from cgroupfs at scrape time.
pub struct NumaMemoryCollector {
    reader: NumaMemoryReader,
    trees: Arc<CgroupTrees>,
    workloads: WorkloadIndex,
    placement: Option<CpuPlacement>,
    descs: Vec<Desc>,
}

impl NumaMemoryCollector {
    /// A collector over `reader` and the hierarchies' trees, labelling managed cgroups through
    /// `workloads`; unpinned cgroups' memory is weighed by `placement` (none: by cpuset only).
    pub fn new(
        reader: NumaMemoryReader,
        trees: Arc<CgroupTrees>,
        workloads: WorkloadIndex,
        placement: Option<CpuPlacement>,
    ) -> Result<Self, prometheus::Error> {
        Ok(Self {
            reader,
            trees,
            workloads,
            placement,
            descs: descs(&[(MEMORY, MEMORY_HELP)])?,
        })
    }
}

/// What a cgroup's memory locality was judged by.
#[derive(Clone, Debug, PartialEq)]
pub enum LocalityBasis {
    /// The nodes of the cgroup's cpuset (it is pinned, or never ran).
    Cpuset,
    /// Where its tasks ran over the window.
    CpuTime(Placement),
}

/// One cgroup's memory as judged: its position in the cgroups read, (node, bytes, locality),
/// and what judged it.
#[derive(Clone, Debug, PartialEq)]
pub struct Judged {
    pub index: usize,
    pub nodes: Vec<(u32, u64, Locality)>,
    pub basis: LocalityBasis,
}

/// Every cgroup's resident memory per node with its locality: by cpuset where the cpuset pins
/// the cgroup to some nodes, else weighed by where its tasks ran over the last
/// [`PLACEMENT_WINDOW`] ([`weigh`]).
#[must_use]
pub fn memory_locality(
    cgroups: &[CgroupNumaMemory],
    reader: &NumaMemoryReader,
    placement: Option<&CpuPlacement>,
) -> Vec<Judged> {
    let all_nodes = reader.layout.nodes();
    let ran = placement.map(|p| {
        let paths: HashMap<u64, String> = cgroups
            .iter()
            .filter(|c| c.cgroup_id != 0)
            .map(|c| (c.cgroup_id, c.path.clone()))
            .collect();
        CpuPlacement::subtree(&p.window(PLACEMENT_WINDOW), |id| paths.get(&id).cloned())
    });
    cgroups
        .iter()
        .enumerate()
        .map(|(i, cgroup)| {
            let pinned = reader.layout.nodes_of(&cgroup.cpus).len() < all_nodes.len();
            let placed = ran
                .as_ref()
                .and_then(|r| r.get(&cgroup.path))
                .filter(|p| p.total() > 0);
            match placed {
                Some(placed) if !pinned => Judged {
                    index: i,
                    nodes: weigh(&cgroup.nodes, placed),
                    basis: LocalityBasis::CpuTime(placed.clone()),
                },
                _ => Judged {
                    index: i,
                    nodes: cgroup.nodes.clone(),
                    basis: LocalityBasis::Cpuset,
                },
            }
        })
        .collect()
}

/// Splits each node's bytes by `placed`: the share of the CPU time on that node local, the rest
/// remote (either may be 0).
#[must_use]
pub fn weigh(nodes: &[(u32, u64, Locality)], placed: &Placement) -> Vec<(u32, u64, Locality)> {
    let mut out = Vec::with_capacity(nodes.len() * 2);
    for &(node, bytes, _) in nodes {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "a share in [0, 1] of a byte count, rounded"
        )]
        let local = ((bytes as f64) * placed.share(node)).round() as u64;
        let local = local.min(bytes);
        out.push((node, local, Locality::Local));
        out.push((node, bytes - local, Locality::Remote));
    }
    out
}

impl Collector for NumaMemoryCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let cgroups = match self.reader.read_all(&self.trees) {
            Ok(cgroups) => cgroups,
            Err(e) => {
                tracing::warn!(error = %e, "reading memory.numa_stat");
                return Vec::new();
            }
        };
        let mut series = Vec::new();
        for Judged { index, nodes, .. } in
            memory_locality(&cgroups, &self.reader, self.placement.as_ref())
        {
            let cgroup = &cgroups[index];
            let labels = cgroup_labels(&self.workloads, cgroup.cgroup_id, &cgroup.path);
            for (node, bytes, locality) in &nodes {
                let mut l = labels.clone();
                l.push(("node", node.to_string()));
                l.push(("locality", locality.label().to_owned()));
                series.push((l, as_f64(*bytes)));
            }
        }
        vec![family(MEMORY, MEMORY_HELP, MetricType::GAUGE, series)]
    }
}

/// `qosd inspect`'s view of where each pod container runs and where its memory is.
pub struct PlacementView {
    pub reader: NumaMemoryReader,
    pub trees: Arc<CgroupTrees>,
    pub workloads: WorkloadIndex,
    pub placement: Option<CpuPlacement>,
}

impl PlacementView {
    /// The NUMA PLACEMENT table, one row per container: CPU time per node over the window,
    /// resident memory per node, the share counted remote and the rule that judged it; and the
    /// same as JSON.
    #[must_use]
    pub fn section(&self) -> (crate::report::Section, serde_json::Value) {
        let mut section = crate::report::Section::new(
            "NUMA PLACEMENT",
            &[
                "NAMESPACE",
                "POD",
                "CONTAINER",
                "RUNS ON",
                "MEMORY ON",
                "REMOTE",
                "JUDGED BY",
            ],
        );
        let cgroups = match self.reader.read_all(&self.trees) {
            Ok(c) => c,
            Err(e) => {
                section.empty = format!("memory.numa_stat unreadable: {e}");
                return (section, serde_json::Value::Null);
            }
        };
        let mut rows = Vec::new();
        for Judged {
            index,
            nodes,
            basis,
        } in memory_locality(&cgroups, &self.reader, self.placement.as_ref())
        {
            let cgroup = &cgroups[index];
            let Some(workload) = self.workloads.get(cgroup.cgroup_id) else {
                continue;
            };
            let Some(container) = workload.container.clone() else {
                continue;
            };
            let mut memory: BTreeMap<u32, u64> = BTreeMap::new();
            let (mut remote, mut total) = (0u64, 0u64);
            for (node, bytes, locality) in &nodes {
                *memory.entry(*node).or_default() += bytes;
                total += bytes;
                if *locality == Locality::Remote {
                    remote += bytes;
                }
            }
            let (runs_on, judged, cpu) = match &basis {
                LocalityBasis::CpuTime(placed) => (
                    placed
                        .by_node
                        .keys()
                        .map(|n| format!("{n} {:.0}%", placed.share(*n) * 100.0))
                        .collect::<Vec<_>>()
                        .join(", "),
                    format!("cpu time, {:.0} s", placed.window.as_secs_f64()),
                    serde_json::json!(
                        placed
                            .by_node
                            .iter()
                            .map(|(n, ns)| (n.to_string(), *ns))
                            .collect::<BTreeMap<_, _>>()
                    ),
                ),
                LocalityBasis::Cpuset => (
                    format!("cpuset {}", cgroup.cpus),
                    "cpuset".to_owned(),
                    serde_json::Value::Null,
                ),
            };
            #[expect(clippy::cast_precision_loss, reason = "a share of byte counts")]
            let share = if total == 0 {
                0.0
            } else {
                remote as f64 / total as f64
            };
            section.row([
                workload.namespace.clone(),
                workload.pod.clone(),
                container.clone(),
                runs_on,
                memory
                    .iter()
                    .map(|(n, b)| format!("{n} {:.1} MiB", as_f64(*b) / 1_048_576.0))
                    .collect::<Vec<_>>()
                    .join(", "),
                format!("{:.0}%", share * 100.0),
                judged.clone(),
            ]);
            rows.push(serde_json::json!({
                "namespace": workload.namespace,
                "pod": workload.pod,
                "container": container,
                "cgroup": cgroup.path,
                "cpu_ns_by_node": cpu,
                "memory_bytes_by_node": memory.iter().map(|(n, b)| (n.to_string(), *b)).collect::<BTreeMap<_, _>>(),
                "remote_share": share,
                "judged_by": judged,
            }));
        }
        section.empty = "no pod container with memory".to_owned();
        (section, serde_json::Value::Array(rows))
    }
}

#[cfg(test)]
mod tests {
    use crate::pods::qos::QosClass;
    use std::collections::BTreeMap;
    use std::os::unix::fs::MetadataExt as _;
    use std::sync::{Arc, Mutex as StdMutex};

    use super::*;
    use crate::cm::index::Workload;
    use crate::metrics::Metrics;
    use crate::numa::NodeLayout;
    use qosd_common::{NumaStats, PfnRange};

    struct Fake {
        sample: NumaSample,
        live: NumaLive,
        forgotten: Arc<StdMutex<Vec<u64>>>,
    }

    impl NumaSource for Fake {
        fn sample(&mut self) -> Result<NumaSample, SampleError> {
            Ok(self.sample.clone())
        }
        fn forget(&mut self, ids: &[u64]) {
            self.forgotten.lock().expect("lock").extend_from_slice(ids);
        }
        fn live(&self) -> NumaLive {
            self.live
        }
    }

    fn pod() -> Workload {
        Workload {
            namespace: "ns".into(),
            pod: "p".into(),
            container: Some("c".into()),
            qos_class: QosClass::Guaranteed,
        }
    }

    #[test]
    fn probe_counters_are_labelled_pruned_and_only_for_live_probes() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("a")).expect("mkdir");
        let a = std::fs::metadata(root.path().join("a"))
            .expect("stat")
            .ino();
        let deleted = u64::MAX - 3;
        let counts = |local, remote| LocalityCounts { local, remote };
        let sample = NumaSample {
            hint_faults: HashMap::from([(a, counts(1, 2))]),
            page_allocs: HashMap::from([(a, counts(3, 4)), (deleted, counts(1, 1))]),
            migrations: HashMap::from([(a, counts(5, 6))]),
            stats: NumaStats {
                page_allocs: 9,
                alloc_dropped: 2,
                migrations: 11,
                ..NumaStats::default()
            },
            map_entries: Vec::new(),
        };
        let forgotten = Arc::new(StdMutex::new(Vec::new()));
        let workloads = WorkloadIndex::new();
        workloads.insert(a, pod());
        let fake = Fake {
            sample,
            live: NumaLive {
                hint_faults: false,
                page_allocs: true,
                migrations: true,
            },
            forgotten: forgotten.clone(),
        };
        let metrics = Metrics::new().expect("registry");
        let collector = NumaCollector::new(
            Box::new(fake),
            root.path().to_owned(),
            Arc::default(),
            workloads,
        )
        .expect("collector");
        metrics.register("numa", Ok(collector)).expect("register");
        let text = metrics.render();
        // Label names are sorted in the exposition.
        let a_labels = |extra: &str| {
            let mut l = [
                "cgroup=\"/a\"",
                "container=\"c\"",
                extra,
                "namespace=\"ns\"",
                "pod=\"p\"",
                "qos_class=\"guaranteed\"",
            ];
            l.sort_unstable();
            l.join(",")
        };
        for want in [
            format!(
                "qosd_numa_page_allocations_total{{{}}} 3",
                a_labels("locality=\"local\"")
            ),
            format!(
                "qosd_numa_page_allocations_total{{{}}} 4",
                a_labels("locality=\"remote\"")
            ),
            format!(
                "qosd_numa_task_migrations_total{{{}}} 5",
                a_labels("cross_node=\"false\"")
            ),
            format!(
                "qosd_numa_task_migrations_total{{{}}} 6",
                a_labels("cross_node=\"true\"")
            ),
            "qosd_probe_dropped_events_total{probe=\"numa_page_alloc\"} 2".to_owned(),
            "qosd_probe_events_total{probe=\"numa_migration\"} 11".to_owned(),
            "qosd_bpf_map_capacity{map=\"NUMA_PAGE_ALLOCS\"} 16384".to_owned(),
        ] {
            assert!(text.contains(&want), "missing {want}:\n{text}");
        }
        assert!(
            !text.contains("qosd_numa_hint_faults_total")
                && !text.contains("probe=\"numa_hint_fault\""),
            "an unavailable probe exports nothing:\n{text}"
        );
        assert_eq!(forgotten.lock().expect("lock").as_slice(), &[deleted]);
    }

    /// A v2 reader of the fixture at `r` on two nodes: CPUs 0-1 on node 0, 2-3 on node 1.
    fn two_node_reader(r: &std::path::Path) -> NumaMemoryReader {
        let layout = NodeLayout::from_parts(
            BTreeMap::from([(0, 0), (1, 0), (2, 1), (3, 1)]),
            vec![PfnRange {
                start: 0,
                end: 1,
                node: 0,
                pad: 0,
            }],
        )
        .expect("layout");
        NumaMemoryReader {
            memory_root: r.to_owned(),
            cpuset_root: Some(r.to_owned()),
            id_root: r.to_owned(),
            v1: false,
            layout,
            page_size: 4096,
        }
    }

    #[test]
    fn memory_bytes_per_node_with_locality() {
        let root = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        std::fs::create_dir_all(r.join("job")).expect("mkdir");
        std::fs::write(r.join("job/cpuset.cpus.effective"), "0-1\n").expect("write");
        std::fs::write(
            r.join("job/memory.numa_stat"),
            "anon N0=4096 N1=8192\nfile N0=0 N1=4096\n",
        )
        .expect("write");
        let reader = two_node_reader(r);
        let workloads = WorkloadIndex::new();
        workloads.insert(std::fs::metadata(r.join("job")).expect("stat").ino(), pod());
        let metrics = Metrics::new().expect("registry");
        metrics
            .register(
                "numa_memory",
                NumaMemoryCollector::new(reader, Arc::default(), workloads, None),
            )
            .expect("register");
        let text = metrics.render();
        let common = "container=\"c\",locality=\"{}\",namespace=\"ns\",node=\"{}\",pod=\"p\",qos_class=\"guaranteed\"";
        let job = |locality: &str, node: &str| {
            format!(
                "cgroup=\"/job\",{}",
                common.replacen("{}", locality, 1).replacen("{}", node, 1)
            )
        };
        for want in [
            format!("qosd_numa_memory_bytes{{{}}} 4096", job("local", "0")),
            format!("qosd_numa_memory_bytes{{{}}} 12288", job("remote", "1")),
        ] {
            assert!(text.contains(&want), "missing {want}:\n{text}");
        }
    }

    /// A cgroup that may run on every node (an unpinned pod) has each node's memory split by
    /// where its tasks ran: 90% of its CPU time on node 0 makes node 0's memory 90% local and
    /// node 1's 90% remote. A pinned one keeps the cpuset rule.
    #[test]
    fn unpinned_memory_is_weighed_by_where_the_tasks_ran() {
        let root = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        for (dir, cpus) in [("free", "0-3"), ("free/task", "0-3"), ("pinned", "2-3")] {
            std::fs::create_dir_all(r.join(dir)).expect("mkdir");
            std::fs::write(r.join(dir).join("cpuset.cpus.effective"), cpus).expect("write");
            std::fs::write(
                r.join(dir).join("memory.numa_stat"),
                "anon N0=40960 N1=40960\nfile N0=0 N1=0\n",
            )
            .expect("write");
        }
        let reader = two_node_reader(r);
        let ino = |p: &str| std::fs::metadata(r.join(p)).expect("stat").ino();
        let placement = CpuPlacement::new(vec![0, 1]);
        let t0 = std::time::Instant::now();
        placement.record(t0, HashMap::from([(ino("free/task"), vec![0, 0])]));
        placement.record(
            t0 + std::time::Duration::from_secs(10),
            HashMap::from([
                (ino("free/task"), vec![900, 100]),
                (ino("pinned"), vec![0, 500]),
            ]),
        );
        let metrics = Metrics::new().expect("registry");
        metrics
            .register(
                "numa_memory",
                NumaMemoryCollector::new(
                    reader,
                    Arc::default(),
                    WorkloadIndex::new(),
                    Some(placement),
                ),
            )
            .expect("register");
        let text = metrics.render();
        for (cgroup, node, locality, bytes) in [
            // The parent's memory is weighed by its task's CPU time.
            ("/free", "0", "local", 36864),
            ("/free", "0", "remote", 4096),
            ("/free", "1", "local", 4096),
            ("/free", "1", "remote", 36864),
            ("/free/task", "1", "remote", 36864),
            ("/pinned", "0", "remote", 40960),
            ("/pinned", "1", "local", 40960),
        ] {
            let want = format!(
                "qosd_numa_memory_bytes{{cgroup=\"{cgroup}\",locality=\"{locality}\",node=\"{node}\"}} {bytes}"
            );
            assert!(text.contains(&want), "missing {want}:\n{text}");
        }
    }
}
