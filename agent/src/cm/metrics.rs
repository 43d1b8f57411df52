//! The container manager's metrics: `qosd_pods{qos_class}`, `qosd_node_allocatable{resource}`,
//! `qosd_cgroup_write_errors_total{file}`, `qosd_manifest_errors_total`,
//! `qosd_pod_admission_rejections_total{reason}` and `qosd_cgroup_drift_corrections_total`.
use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};

/// Handles to the container manager's series.
#[derive(Clone)]
pub struct CmMetrics {
    pub pods: IntGaugeVec,
    pub node_allocatable: IntGaugeVec,
    pub cgroup_write_errors: IntCounterVec,
    pub manifest_errors: IntCounter,
    pub admission_rejections: IntCounterVec,
    pub drift_corrections: IntCounter,
}

impl CmMetrics {
    /// Creates the series and registers them.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let metrics = Self {
            pods: IntGaugeVec::new(
                Opts::new("qosd_pods", "Pods admitted and running, by QoS class"),
                &["qos_class"],
            )?,
            node_allocatable: IntGaugeVec::new(
                Opts::new(
                    "qosd_node_allocatable",
                    "Node allocatable: capacity minus reservations and hard eviction thresholds (cpu in cores, memory in bytes, pids)",
                ),
                &["resource"],
            )?,
            cgroup_write_errors: IntCounterVec::new(
                Opts::new(
                    "qosd_cgroup_write_errors_total",
                    "Failed cgroup file writes, by file name",
                ),
                &["file"],
            )?,
            manifest_errors: IntCounter::new(
                "qosd_manifest_errors_total",
                "Malformed or invalid pod manifests seen (each distinct error counted once)",
            )?,
            admission_rejections: IntCounterVec::new(
                Opts::new(
                    "qosd_pod_admission_rejections_total",
                    "Pods rejected at admission, by kubelet's reason",
                ),
                &["reason"],
            )?,
            drift_corrections: IntCounter::new(
                "qosd_cgroup_drift_corrections_total",
                "cgroup files found different from the desired state and rewritten by reconcile",
            )?,
        };
        registry.register(Box::new(metrics.pods.clone()))?;
        registry.register(Box::new(metrics.node_allocatable.clone()))?;
        registry.register(Box::new(metrics.cgroup_write_errors.clone()))?;
        registry.register(Box::new(metrics.manifest_errors.clone()))?;
        registry.register(Box::new(metrics.admission_rejections.clone()))?;
        registry.register(Box::new(metrics.drift_corrections.clone()))?;
        for qos in ["guaranteed", "burstable", "besteffort"] {
            metrics.pods.with_label_values(&[qos]).set(0);
        }
        metrics.manifest_errors.reset();
        Ok(metrics)
    }
}
