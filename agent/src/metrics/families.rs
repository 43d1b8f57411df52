//! Building Prometheus metric families by hand for the scrape-time collectors: label sets of
//! cgroups (path plus the owning workload), counters and gauges, float conversion, and the
//! probes' health series that every probe's collector adds to (the registry merges families of
//! one name).
use std::path::Path;
use std::time::Instant;

use prometheus::proto::{self, LabelPair, MetricFamily, MetricType};

use crate::cgroup::trees::CgroupTrees;
use crate::cgroup::{CgroupPaths, HierarchyError};
use crate::cm::index::WorkloadIndex;

/// The common start of a probe collector's scrape: the probe's sample and the cgroup paths to
/// resolve its ids, or `None` (logged) when either cannot be had. The paths come from the
/// tree of `hierarchy_root` ([`CgroupTrees`]: live, or the scrape's shared walk); when that
/// tree lacks one of the sample's ids (`ids`) and may be older than the sample, it is asked
/// again for one holding every change before the sample, so an id the paths do not resolve is
/// always of a cgroup removed before the tree was taken (the collectors then forget its
/// counters).
pub(crate) fn sample_and_paths<S>(
    probe: &str,
    sample: impl FnOnce() -> Result<S, super::SampleError>,
    ids: impl Fn(&S) -> Vec<u64>,
    trees: &CgroupTrees,
    hierarchy_root: &Path,
) -> Option<(S, CgroupPaths)> {
    let sampled_at = Instant::now();
    let sample = match sample() {
        Ok(sample) => sample,
        Err(e) => {
            tracing::warn!(probe, error = %e, "reading the probe's maps");
            return None;
        }
    };
    let paths = |after| {
        trees
            .current_after(hierarchy_root, after)
            .map_err(|source| HierarchyError::Root {
                path: hierarchy_root.to_owned(),
                source,
            })
            .and_then(|found| {
                let paths = CgroupPaths::from_walk(hierarchy_root, &found)?;
                Ok((paths, found.started >= sampled_at))
            })
    };
    let resolved = paths(None).and_then(|(shared, after_sample)| {
        if after_sample || ids(&sample).into_iter().all(|id| shared.path(id).is_some()) {
            Ok(shared)
        } else {
            paths(Some(sampled_at)).map(|(fresh, _)| fresh)
        }
    });
    match resolved {
        Ok(paths) => Some((sample, paths)),
        Err(e) => {
            tracing::warn!(error = %e, "resolving cgroup ids");
            None
        }
    }
}

/// Labels of a cgroup: its path, and its workload when a pod owns it.
pub(crate) fn cgroup_labels(
    workloads: &WorkloadIndex,
    id: u64,
    path: &str,
) -> Vec<(&'static str, String)> {
    let mut labels = vec![("cgroup", path.to_owned())];
    if let Some(w) = workloads.get(id) {
        labels.push(("namespace", w.namespace));
        labels.push(("pod", w.pod));
        labels.push(("container", w.container.unwrap_or_default()));
        labels.push(("qos_class", w.qos_class.as_str().to_owned()));
    }
    labels
}

#[expect(
    clippy::cast_precision_loss,
    reason = "counts and nanoseconds below 2^53 are exact; beyond, precision loss is irrelevant"
)]
pub(crate) fn as_f64(v: u64) -> f64 {
    v as f64
}

pub(crate) fn label_pairs(mut labels: Vec<(&'static str, String)>) -> Vec<LabelPair> {
    labels.sort_by_key(|(k, _)| *k);
    labels
        .into_iter()
        .map(|(k, v)| {
            let mut l = LabelPair::default();
            l.set_name(k.to_owned());
            l.set_value(v);
            l
        })
        .collect()
}

/// One metric family; each series is its labels and value. A series without pod labels (an
/// unmanaged cgroup) simply has fewer labels, which the exposition format allows.
pub(crate) fn family(
    name: &str,
    help: &str,
    kind: MetricType,
    series: impl IntoIterator<Item = (Vec<(&'static str, String)>, f64)>,
) -> MetricFamily {
    let mut fam = MetricFamily::default();
    fam.set_name(name.to_owned());
    fam.set_help(help.to_owned());
    fam.set_field_type(kind);
    let metrics = series
        .into_iter()
        .map(|(labels, value)| {
            let mut m = proto::Metric::default();
            m.set_label(label_pairs(labels));
            if kind == MetricType::COUNTER {
                let mut c = proto::Counter::default();
                c.set_value(value);
                m.set_counter(c);
            } else {
                let mut g = proto::Gauge::default();
                g.set_value(value);
                m.set_gauge(g);
            }
            m
        })
        .collect();
    fam.set_metric(metrics);
    fam
}

pub(crate) const EVENTS: &str = "qosd_probe_events_total";
pub(crate) const EVENTS_HELP: &str = "Kernel events handled by each probe";
pub(crate) const DROPPED: &str = "qosd_probe_dropped_events_total";
pub(crate) const DROPPED_HELP: &str =
    "Events a probe could not record (map full or busy, or unreadable kernel memory)";
pub(crate) const MAP_ENTRIES: &str = "qosd_bpf_map_entries";
pub(crate) const MAP_ENTRIES_HELP: &str = "Entries in each bounded kernel map";
pub(crate) const MAP_CAPACITY: &str = "qosd_bpf_map_capacity";
pub(crate) const MAP_CAPACITY_HELP: &str = "Maximum entries of each bounded kernel map";

/// Health series of one collector's probes.
#[derive(Debug, Default)]
pub(crate) struct ProbeHealth {
    /// (probe, events handled).
    pub events: Vec<(&'static str, u64)>,
    /// (probe, events not recorded).
    pub dropped: Vec<(&'static str, u64)>,
    /// (map, entries, capacity).
    pub maps: Vec<(&'static str, usize, u32)>,
}

impl ProbeHealth {
    /// `qosd_probe_events_total`, `qosd_probe_dropped_events_total`, `qosd_bpf_map_entries`,
    /// `qosd_bpf_map_capacity`.
    pub(crate) fn families(&self) -> Vec<MetricFamily> {
        let per_probe = |values: &[(&'static str, u64)]| {
            values
                .iter()
                .map(|(probe, v)| (vec![("probe", (*probe).to_owned())], as_f64(*v)))
                .collect::<Vec<_>>()
        };
        let per_map = |value: &dyn Fn(usize, u32) -> u64| {
            self.maps
                .iter()
                .map(|(map, entries, capacity)| {
                    (
                        vec![("map", (*map).to_owned())],
                        as_f64(value(*entries, *capacity)),
                    )
                })
                .collect::<Vec<_>>()
        };
        vec![
            family(
                EVENTS,
                EVENTS_HELP,
                MetricType::COUNTER,
                per_probe(&self.events),
            ),
            family(
                DROPPED,
                DROPPED_HELP,
                MetricType::COUNTER,
                per_probe(&self.dropped),
            ),
            family(
                MAP_ENTRIES,
                MAP_ENTRIES_HELP,
                MetricType::GAUGE,
                per_map(&|entries, _| entries as u64),
            ),
            family(
                MAP_CAPACITY,
                MAP_CAPACITY_HELP,
                MetricType::GAUGE,
                per_map(&|_, capacity| u64::from(capacity)),
            ),
        ]
    }
}
