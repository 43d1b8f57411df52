//! Run-queue latency, preemption and throttle-episode series, read from the kernel maps at
//! scrape time:
//!
//! - `qosd_runqueue_latency_seconds{cgroup[,namespace,pod,container,qos_class]}`: histogram of
//!   the waits for a CPU of each cgroup's tasks (sum by `qos_class` or by `pod`);
//! - `qosd_preemptions_total{victim_qos_class,preemptor_qos_class}` and
//!   `qosd_preemption_wait_seconds_total{...}`: preemptions between QoS classes (`none` for
//!   cgroups no pod owns) and the waits they caused;
//! - `qosd_cgroup_preemptions_total{victim_cgroup,preemptor_cgroup}`: the same per cgroup pair;
//! - `qosd_cpu_throttle_episode_seconds{cgroup,...}`: histogram of CFS throttle episodes, where
//!   the fentry programs are attached;
//! - the probes' health: `qosd_probe_events_total`, `qosd_probe_dropped_events_total`,
//!   `qosd_bpf_map_entries`, `qosd_bpf_map_capacity` (merged with the cpu-time probe's).
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, MetricFamily, MetricType};

use super::SampleError;
use super::families::{ProbeHealth, as_f64, cgroup_labels, family, label_pairs, sample_and_paths};
use crate::cgroup::CgroupPaths;
use crate::cgroup::trees::CgroupTrees;
use crate::cm::index::WorkloadIndex;
use crate::probes::runqlat::{self, Log2Histogram, RunqSample};
use crate::probes::sched_switch::SharedSwitchProbe;
use crate::probes::throttle;
use qosd_common::{MAX_HIST_ENTRIES, MAX_PREEMPT_PAIRS, MAX_SLOTS, MAX_THROTTLED_CFS_RQS, names};

/// Where the counters come from: the kernel probe, or a fake in tests.
pub trait RunqSource: Send {
    /// Reads every counter.
    fn sample(&mut self) -> Result<RunqSample, SampleError>;
    /// Drops the counters of cgroups that no longer exist.
    fn forget(&mut self, cgroup_ids: &[u64]);
    /// Whether throttle episodes are recorded.
    fn episodes_live(&self) -> bool;
}

impl RunqSource for SharedSwitchProbe {
    fn sample(&mut self) -> Result<RunqSample, SampleError> {
        Ok(self.lock().sample_runq()?)
    }

    fn forget(&mut self, cgroup_ids: &[u64]) {
        if let Err(e) = self.lock().forget(cgroup_ids) {
            tracing::warn!(error = %e, "removing run-queue counters of deleted cgroups");
        }
    }

    fn episodes_live(&self) -> bool {
        *self.lock().throttle_mode() == crate::probes::ProbeMode::Fentry
    }
}

const RUNQ_LATENCY: &str = "qosd_runqueue_latency_seconds";
const RUNQ_LATENCY_HELP: &str =
    "Time tasks of each cgroup waited for a CPU after a wakeup or a preemption";
const PREEMPTIONS: &str = "qosd_preemptions_total";
const PREEMPTIONS_HELP: &str = "Tasks switched out while runnable, by the QoS class of the task preempted and of the task that took the CPU (none: no pod)";
const PREEMPT_WAIT: &str = "qosd_preemption_wait_seconds_total";
const PREEMPT_WAIT_HELP: &str = "Time preempted tasks then waited for a CPU, by QoS class pair";
const CGROUP_PREEMPTIONS: &str = "qosd_cgroup_preemptions_total";
const CGROUP_PREEMPTIONS_HELP: &str = "Preemptions per (victim cgroup, preemptor cgroup) pair";
const CGROUP_PREEMPT_WAIT: &str = "qosd_cgroup_preemption_wait_seconds_total";
const CGROUP_PREEMPT_WAIT_HELP: &str =
    "Time preempted tasks then waited for a CPU, per (victim cgroup, preemptor cgroup) pair";
const UNMEASURED_WAITS: &str = "qosd_runqueue_unmeasured_waits_total";
const UNMEASURED_WAITS_HELP: &str = "Waits not measured because the task's previous departure was not seen (one per task already running when the probe attached) or a task with colliding pid bits took its entry";
const EPISODES: &str = "qosd_cpu_throttle_episode_seconds";
const EPISODES_HELP: &str = "Duration of each CFS throttle episode of a cgroup on one CPU (throttle_cfs_rq to unthrottle_cfs_rq)";

/// Lowest and highest exported log2 bucket (upper bounds 2^10 ns ~ 1 us to 2^34 ns ~ 17 s).
const FIRST_BUCKET: usize = 10;
const LAST_BUCKET: usize = 34;

struct State {
    source: Box<dyn RunqSource>,
    workloads: WorkloadIndex,
    hierarchy_root: PathBuf,
    trees: Arc<CgroupTrees>,
}

/// Collects the run-queue and throttle-episode series at scrape time.
pub struct RunqCollector {
    state: Mutex<State>,
    descs: Vec<Desc>,
}

impl RunqCollector {
    /// A collector reading `source`, resolving ids in the hierarchy mounted at `root`.
    pub fn new(
        source: Box<dyn RunqSource>,
        hierarchy_root: PathBuf,
        trees: Arc<CgroupTrees>,
        workloads: WorkloadIndex,
    ) -> Result<Self, prometheus::Error> {
        let desc = |name: &str, help: &str, labels: &[&str]| {
            Desc::new(
                name.into(),
                help.into(),
                labels.iter().map(|l| (*l).to_owned()).collect(),
                HashMap::new(),
            )
        };
        let descs = vec![
            desc(RUNQ_LATENCY, RUNQ_LATENCY_HELP, &["cgroup"])?,
            desc(
                PREEMPTIONS,
                PREEMPTIONS_HELP,
                &["victim_qos_class", "preemptor_qos_class"],
            )?,
            desc(
                PREEMPT_WAIT,
                PREEMPT_WAIT_HELP,
                &["victim_qos_class", "preemptor_qos_class"],
            )?,
            desc(
                CGROUP_PREEMPTIONS,
                CGROUP_PREEMPTIONS_HELP,
                &["victim_cgroup", "preemptor_cgroup"],
            )?,
            desc(
                CGROUP_PREEMPT_WAIT,
                CGROUP_PREEMPT_WAIT_HELP,
                &["victim_cgroup", "preemptor_cgroup"],
            )?,
            desc(EPISODES, EPISODES_HELP, &["cgroup"])?,
            desc(UNMEASURED_WAITS, UNMEASURED_WAITS_HELP, &[])?,
        ];
        Ok(Self {
            state: Mutex::new(State {
                source,
                workloads,
                hierarchy_root,
                trees,
            }),
            descs,
        })
    }
}

impl Collector for RunqCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Ok(mut state) = self.state.lock() else {
            tracing::error!("run-queue collector state poisoned by an earlier panic");
            return Vec::new();
        };
        let state = &mut *state;
        let Some((sample, paths)) = sample_and_paths(
            runqlat::PROBE_NAME,
            || state.source.sample(),
            |s: &RunqSample| {
                s.waits
                    .keys()
                    .chain(s.throttle_episodes.keys())
                    .copied()
                    .chain(s.preemptions.keys().flat_map(|&(v, p)| [v, p]))
                    .collect()
            },
            &state.trees,
            &state.hierarchy_root,
        ) else {
            return Vec::new();
        };
        let mut gone = Vec::new();
        let waits = labelled(&sample.waits, &paths, &state.workloads, &mut gone);
        let episodes = labelled(
            &sample.throttle_episodes,
            &paths,
            &state.workloads,
            &mut gone,
        );

        let class = |id: u64| {
            state
                .workloads
                .get(id)
                .map_or_else(|| "none".to_owned(), |w| w.qos_class.as_str().to_owned())
        };
        let mut by_class: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
        let mut pairs = Vec::new();
        let mut pair_waits = Vec::new();
        for (&(victim, preemptor), value) in &sample.preemptions {
            let (Some(vp), Some(pp)) = (paths.path(victim), paths.path(preemptor)) else {
                gone.push(if paths.path(victim).is_none() {
                    victim
                } else {
                    preemptor
                });
                continue;
            };
            let entry = by_class
                .entry((class(victim), class(preemptor)))
                .or_default();
            entry.0 = entry.0.saturating_add(value.count);
            entry.1 = entry.1.saturating_add(value.wait_ns);
            let labels = vec![
                ("victim_cgroup", vp.to_owned()),
                ("preemptor_cgroup", pp.to_owned()),
            ];
            pair_waits.push((labels.clone(), as_f64(value.wait_ns) / 1e9));
            pairs.push((labels, as_f64(value.count)));
        }
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        pair_waits.sort_by(|a, b| a.0.cmp(&b.0));
        if !gone.is_empty() {
            gone.sort_unstable();
            gone.dedup();
            state.source.forget(&gone);
        }
        let class_series = |wait: bool| {
            by_class
                .iter()
                .map(|((v, p), (count, wait_ns))| {
                    (
                        vec![
                            ("victim_qos_class", v.clone()),
                            ("preemptor_qos_class", p.clone()),
                        ],
                        if wait {
                            as_f64(*wait_ns) / 1e9
                        } else {
                            as_f64(*count)
                        },
                    )
                })
                .collect::<Vec<_>>()
        };

        let mut families = vec![
            histogram_family(RUNQ_LATENCY, RUNQ_LATENCY_HELP, &waits),
            family(
                PREEMPTIONS,
                PREEMPTIONS_HELP,
                MetricType::COUNTER,
                class_series(false),
            ),
            family(
                PREEMPT_WAIT,
                PREEMPT_WAIT_HELP,
                MetricType::COUNTER,
                class_series(true),
            ),
            family(
                CGROUP_PREEMPTIONS,
                CGROUP_PREEMPTIONS_HELP,
                MetricType::COUNTER,
                pairs,
            ),
            family(
                CGROUP_PREEMPT_WAIT,
                CGROUP_PREEMPT_WAIT_HELP,
                MetricType::COUNTER,
                pair_waits,
            ),
            family(
                UNMEASURED_WAITS,
                UNMEASURED_WAITS_HELP,
                MetricType::COUNTER,
                [(Vec::new(), as_f64(sample.stats.unmeasured_waits))],
            ),
        ];
        if state.source.episodes_live() {
            families.push(histogram_family(EPISODES, EPISODES_HELP, &episodes));
        }

        let s = &sample.stats;
        let mut health = ProbeHealth {
            events: vec![(runqlat::PROBE_NAME, s.switches)],
            dropped: vec![(runqlat::PROBE_NAME, s.dropped.saturating_add(s.read_errors))],
            maps: Vec::new(),
        };
        if state.source.episodes_live() {
            health
                .events
                .push((throttle::PROBE_NAME, s.throttle_episodes));
            health
                .dropped
                .push((throttle::PROBE_NAME, s.throttle_dropped));
        }
        let capacity = |map: &str| match map {
            m if m == names::RUNQ_SLOTS_MAP => MAX_SLOTS,
            m if m == names::PREEMPT_MAP => MAX_PREEMPT_PAIRS,
            m if m == names::THROTTLED_MAP => MAX_THROTTLED_CFS_RQS,
            _ => MAX_HIST_ENTRIES,
        };
        health.maps = sample
            .map_entries
            .iter()
            .map(|(m, n)| (*m, *n, capacity(m)))
            .collect();
        families.extend(health.families());
        families
    }
}

/// Histograms with their cgroup labels, sorted; ids without a cgroup go to `gone`.
fn labelled<'a>(
    hists: &'a HashMap<u64, Log2Histogram>,
    paths: &CgroupPaths,
    workloads: &WorkloadIndex,
    gone: &mut Vec<u64>,
) -> Vec<(Vec<(&'static str, String)>, &'a Log2Histogram)> {
    let mut out = Vec::new();
    for (&id, hist) in hists {
        match paths.path(id) {
            Some(path) => out.push((cgroup_labels(workloads, id, path), hist)),
            None => gone.push(id),
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// A histogram family from log2 histograms, with cumulative buckets `le = 2^b ns`.
fn histogram_family(
    name: &str,
    help: &str,
    series: &[(Vec<(&'static str, String)>, &Log2Histogram)],
) -> MetricFamily {
    let mut fam = MetricFamily::default();
    fam.set_name(name.to_owned());
    fam.set_help(help.to_owned());
    fam.set_field_type(MetricType::HISTOGRAM);
    let metrics = series
        .iter()
        .map(|(labels, hist)| {
            let mut h = proto::Histogram::default();
            let mut cumulative = 0u64;
            let mut buckets = Vec::new();
            for b in 0..=LAST_BUCKET {
                cumulative =
                    cumulative.saturating_add(hist.buckets.get(b).copied().unwrap_or_default());
                if b >= FIRST_BUCKET {
                    let mut bucket = proto::Bucket::default();
                    bucket.set_cumulative_count(cumulative);
                    bucket.set_upper_bound(as_f64(1u64 << b) / 1e9);
                    buckets.push(bucket);
                }
            }
            h.set_bucket(buckets);
            h.set_sample_count(hist.count());
            h.set_sample_sum(as_f64(hist.sum_ns) / 1e9);
            let mut m = proto::Metric::default();
            m.set_label(label_pairs(labels.clone()));
            m.set_histogram(h);
            m
        })
        .collect();
    fam.set_metric(metrics);
    fam
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use super::*;
    use crate::metrics::Metrics;
    use crate::pods::qos::QosClass;
    use qosd_common::PreemptValue;

    struct Fake(RunqSample);

    impl RunqSource for Fake {
        fn sample(&mut self) -> Result<RunqSample, SampleError> {
            Ok(self.0.clone())
        }
        fn forget(&mut self, _: &[u64]) {}
        fn episodes_live(&self) -> bool {
            false
        }
    }

    #[test]
    fn histograms_and_pairs_are_labelled() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("a")).expect("mkdir");
        std::fs::create_dir_all(root.path().join("b")).expect("mkdir");
        let ino = |p: &str| std::fs::metadata(root.path().join(p)).expect("stat").ino();
        let (a, b) = (ino("a"), ino("b"));
        let mut hist = Log2Histogram {
            buckets: vec![0; 41],
            sum_ns: 3_000_000,
        };
        hist.buckets[5] = 1; // below 1 us
        hist.buckets[21] = 2; // 1-2 ms
        let sample = RunqSample {
            waits: HashMap::from([(a, hist)]),
            preemptions: HashMap::from([(
                (a, b),
                PreemptValue {
                    count: 4,
                    wait_ns: 2_000_000_000,
                },
            )]),
            stats: qosd_common::RunqStats {
                unmeasured_waits: 7,
                ..qosd_common::RunqStats::default()
            },
            ..RunqSample::default()
        };
        let metrics = Metrics::new().expect("registry");
        let workloads = WorkloadIndex::new();
        workloads.insert(
            b,
            crate::cm::index::Workload {
                namespace: "ns".into(),
                pod: "p".into(),
                container: Some("c".into()),
                qos_class: QosClass::BestEffort,
            },
        );
        let collector = RunqCollector::new(
            Box::new(Fake(sample)),
            root.path().to_owned(),
            Arc::default(),
            workloads,
        )
        .expect("collector");
        metrics.register("runq", Ok(collector)).expect("register");
        let text = metrics.render();
        for want in [
            "qosd_runqueue_latency_seconds_bucket{cgroup=\"/a\",le=\"0.000001024\"} 1",
            "qosd_runqueue_latency_seconds_bucket{cgroup=\"/a\",le=\"0.002097152\"} 3",
            "qosd_runqueue_latency_seconds_count{cgroup=\"/a\"} 3",
            "qosd_runqueue_latency_seconds_sum{cgroup=\"/a\"} 0.003",
            "qosd_preemptions_total{preemptor_qos_class=\"besteffort\",victim_qos_class=\"none\"} 4",
            "qosd_preemption_wait_seconds_total{preemptor_qos_class=\"besteffort\",victim_qos_class=\"none\"} 2",
            "qosd_cgroup_preemptions_total{preemptor_cgroup=\"/b\",victim_cgroup=\"/a\"} 4",
            "qosd_runqueue_unmeasured_waits_total 7",
        ] {
            assert!(text.contains(want), "missing {want}:\n{text}");
        }
    }
}
