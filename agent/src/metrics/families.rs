//! Building Prometheus metric families by hand for the scrape-time collectors: label sets of
//! cgroups (path plus the owning workload), counters and gauges, float conversion.
use prometheus::proto::{self, LabelPair, MetricFamily, MetricType};

use crate::cm::index::WorkloadIndex;

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
        labels.push(("qos_class", w.qos_class));
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
