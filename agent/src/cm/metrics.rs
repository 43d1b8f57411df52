//! The container manager's metrics: `qosd_pods{qos_class}`, `qosd_node_allocatable{resource}`,
//! `qosd_cgroup_write_errors_total{file}`, `qosd_manifest_errors_total`,
//! `qosd_pod_admission_rejections_total{reason}` and `qosd_cgroup_drift_corrections_total`;
//! and the resource managers' ([`ResourceMetrics`]), with kubelet's meaning under `qosd_`.
use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use super::checkpoint::RecoveryReason;
use super::cpu::CPU_MANAGER_STATE_FILE;
use super::memory::MEMORY_MANAGER_STATE_FILE;

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

/// Handles to the CPU, memory and topology managers' series (kubelet's
/// `cpu_manager_*`, `memory_manager_*`, `topology_manager_*`) and the checkpoint recoveries.
#[derive(Clone)]
pub struct ResourceMetrics {
    pub cpu_pinning_requests: IntCounter,
    pub cpu_pinning_errors: IntCounter,
    pub cpu_shared_pool_millicores: IntGauge,
    pub cpu_exclusive_allocation_count: IntGauge,
    pub memory_pinning_requests: IntCounter,
    pub memory_pinning_errors: IntCounter,
    pub topology_admission_requests: IntCounter,
    pub topology_admission_errors: IntCounter,
    pub admission_duration: Histogram,
    pub checkpoint_recoveries: IntCounterVec,
}

impl ResourceMetrics {
    /// Creates the series and registers them.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let metrics = Self {
            cpu_pinning_requests: IntCounter::new(
                "qosd_cpu_manager_pinning_requests_total",
                "Container allocations that asked the CPU manager for exclusive CPUs",
            )?,
            cpu_pinning_errors: IntCounter::new(
                "qosd_cpu_manager_pinning_errors_total",
                "Exclusive CPU allocations that failed",
            )?,
            cpu_shared_pool_millicores: IntGauge::new(
                "qosd_cpu_manager_shared_pool_size_millicores",
                "CPUs in the shared pool that exclusive allocations can still take (reserved CPUs excluded), in millicores",
            )?,
            cpu_exclusive_allocation_count: IntGauge::new(
                "qosd_cpu_manager_exclusive_cpu_allocation_count",
                "CPUs assigned exclusively to containers",
            )?,
            memory_pinning_requests: IntCounter::new(
                "qosd_memory_manager_pinning_requests_total",
                "Container allocations handled by the memory manager's Static policy (Guaranteed pods)",
            )?,
            memory_pinning_errors: IntCounter::new(
                "qosd_memory_manager_pinning_errors_total",
                "Memory manager allocations that failed",
            )?,
            topology_admission_requests: IntCounter::new(
                "qosd_topology_manager_admission_requests_total",
                "Pods the topology manager was asked to admit",
            )?,
            topology_admission_errors: IntCounter::new(
                "qosd_topology_manager_admission_errors_total",
                "Pods the topology manager rejected (affinity or allocation errors)",
            )?,
            admission_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "qosd_topology_manager_admission_duration_seconds",
                    "Time to merge the hints and allocate the resources of one pod",
                )
                // kubelet's buckets (0.05 ms doubling 15 times), in seconds.
                .buckets(prometheus::exponential_buckets(0.000_05, 2.0, 15)?),
            )?,
            checkpoint_recoveries: IntCounterVec::new(
                Opts::new(
                    "qosd_checkpoint_recoveries_total",
                    "CPU and memory manager checkpoints that could not be restored at start, by file and reason; the state was rebuilt from cgroupfs",
                ),
                &["checkpoint", "reason"],
            )?,
        };
        registry.register(Box::new(metrics.cpu_pinning_requests.clone()))?;
        registry.register(Box::new(metrics.cpu_pinning_errors.clone()))?;
        registry.register(Box::new(metrics.cpu_shared_pool_millicores.clone()))?;
        registry.register(Box::new(metrics.cpu_exclusive_allocation_count.clone()))?;
        registry.register(Box::new(metrics.memory_pinning_requests.clone()))?;
        registry.register(Box::new(metrics.memory_pinning_errors.clone()))?;
        registry.register(Box::new(metrics.topology_admission_requests.clone()))?;
        registry.register(Box::new(metrics.topology_admission_errors.clone()))?;
        registry.register(Box::new(metrics.admission_duration.clone()))?;
        registry.register(Box::new(metrics.checkpoint_recoveries.clone()))?;
        for file in [CPU_MANAGER_STATE_FILE, MEMORY_MANAGER_STATE_FILE] {
            for reason in RecoveryReason::ALL {
                metrics
                    .checkpoint_recoveries
                    .with_label_values(&[file, reason.as_str()]);
            }
        }
        Ok(metrics)
    }
}
