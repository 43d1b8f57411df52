//! The metrics of qosd beside kubelet: `qosd_pods{qos_class}` (the node's running pods, as in
//! standalone mode), `qosd_pod_source_up{source}`, `qosd_pod_source_errors_total{source}`,
//! `qosd_unattributed_cgroups{reason}`, `qosd_kubelet_drift{level,file,namespace,pod,container,qos_class}`,
//! `qosd_feedback_reverted_total{policy}` and `qosd_cgroup_write_errors_total{file}`.
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

/// Handles to the series.
#[derive(Clone)]
pub struct BesideKubeletMetrics {
    pub pods: IntGaugeVec,
    pub source_up: IntGaugeVec,
    pub source_errors: IntCounterVec,
    pub unattributed: IntGaugeVec,
    pub drift: IntGaugeVec,
    pub reverted: IntCounterVec,
    pub write_errors: IntCounterVec,
}

/// The labels of `qosd_kubelet_drift`, in order.
pub const DRIFT_LABELS: [&str; 6] = [
    "level",
    "file",
    "namespace",
    "pod",
    "container",
    "qos_class",
];

impl BesideKubeletMetrics {
    /// Creates the series and registers them.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let metrics = Self {
            pods: IntGaugeVec::new(
                Opts::new(
                    "qosd_pods",
                    "Pods running on the node (from the pod source), by QoS class",
                ),
                &["qos_class"],
            )?,
            source_up: IntGaugeVec::new(
                Opts::new(
                    "qosd_pod_source_up",
                    "1 when the pod source (API server watch or kubelet /pods) answered its last request, 0 when it did not; the pods known stay until it answers again",
                ),
                &["source"],
            )?,
            source_errors: IntCounterVec::new(
                Opts::new(
                    "qosd_pod_source_errors_total",
                    "Problems of the pod source: unreachable or refusing, and pod objects that could not be read (each named in the log)",
                ),
                &["source"],
            )?,
            unattributed: IntGaugeVec::new(
                Opts::new(
                    "qosd_unattributed_cgroups",
                    "Pod-level cgroups under kubepods that belong to no pod of this node: unknown_pod (named like a pod cgroup) or not_a_pod",
                ),
                &["reason"],
            )?,
            drift: IntGaugeVec::new(
                Opts::new(
                    "qosd_kubelet_drift",
                    "1 for each cgroup file whose value differs from what kubelet should have written (from the pod specs, the KubeletConfiguration and kubelet's CPU and memory manager checkpoints) for three checks in a row; qosd never corrects it",
                ),
                &DRIFT_LABELS,
            )?,
            reverted: IntCounterVec::new(
                Opts::new(
                    "qosd_feedback_reverted_total",
                    "Feedback interventions found undone (a file written back, by kubelet or anyone) and written again, by policy",
                ),
                &["policy"],
            )?,
            write_errors: IntCounterVec::new(
                Opts::new(
                    "qosd_cgroup_write_errors_total",
                    "Failed cgroup file writes, by file name",
                ),
                &["file"],
            )?,
        };
        registry.register(Box::new(metrics.pods.clone()))?;
        registry.register(Box::new(metrics.source_up.clone()))?;
        registry.register(Box::new(metrics.source_errors.clone()))?;
        registry.register(Box::new(metrics.unattributed.clone()))?;
        registry.register(Box::new(metrics.drift.clone()))?;
        registry.register(Box::new(metrics.reverted.clone()))?;
        registry.register(Box::new(metrics.write_errors.clone()))?;
        Ok(metrics)
    }
}
