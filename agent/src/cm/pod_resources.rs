//! The cgroup settings kubelet derives from a pod: `ResourceConfigForPod` for the pod cgroup
//! (pkg/kubelet/cm/helpers_linux.go) and the container-level values the runtime applies
//! (kuberuntime's `calculateLinuxResources`), for the standalone runtime's container cgroups.
use crate::cgroup::resources::{
    Limit, MIN_SHARES, ResourceConfig, milli_cpu_to_quota, milli_cpu_to_shares,
};
use crate::pods::model::{Container, PodSpec};
use crate::pods::qos::{QosClass, pod_qos};

/// The knobs of the KubeletConfiguration that shape pod cgroups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodCgroupPolicy {
    /// `cpuCFSQuota`: enforce CPU limits with CFS quota.
    pub enforce_cpu_limits: bool,
    /// `cpuCFSQuotaPeriod` in microseconds.
    pub cpu_period_us: u64,
    /// `MemoryQoS` feature gate (cgroup v2 memory.min/high).
    pub memory_qos: bool,
    /// `podPidsLimit`; negative means unlimited (not written).
    pub pod_pids_limit: i64,
}

impl Default for PodCgroupPolicy {
    fn default() -> Self {
        Self {
            enforce_cpu_limits: true,
            cpu_period_us: 100_000,
            memory_qos: false,
            pod_pids_limit: -1,
        }
    }
}

impl PodCgroupPolicy {
    /// The policy of a KubeletConfiguration; MemoryQoS applies on cgroup v2 only (`v2`).
    #[must_use]
    pub fn from_kubelet(config: &crate::config::kubelet::KubeletConfiguration, v2: bool) -> Self {
        Self {
            enforce_cpu_limits: config.cpu_cfs_quota,
            cpu_period_us: u64::try_from(config.cpu_cfs_quota_period.as_micros())
                .unwrap_or(100_000),
            memory_qos: config.memory_qos() && v2,
            pod_pids_limit: config.pod_pids_limit,
        }
    }
}

const CPU: &str = "cpu";
const MEMORY: &str = "memory";

/// kubelet's `ResourceConfigForPod`.
#[must_use]
pub fn pod_config(spec: &PodSpec, policy: PodCgroupPolicy) -> ResourceConfig {
    let requests = spec.effective_requests();
    let cpu_limit = pod_limit(spec, Container::cpu_limit_millis);
    let memory_limit = pod_limit(spec, Container::memory_limit_bytes);
    let cpu_limits_declared = spec
        .all_containers()
        .all(|c| c.limit(CPU).is_some_and(|q| !q.is_zero()));
    let memory_limits_declared = spec
        .all_containers()
        .all(|c| c.limit(MEMORY).is_some_and(|q| !q.is_zero()));

    let shares = milli_cpu_to_shares(requests.cpu_millis);
    let quota = if policy.enforce_cpu_limits {
        quota_limit(milli_cpu_to_quota(cpu_limit, policy.cpu_period_us))
    } else {
        Limit::Max
    };
    let mut config = ResourceConfig::default();
    match pod_qos(spec) {
        QosClass::Guaranteed => {
            config.cpu_shares = Some(shares);
            config.cpu_quota = Some(quota);
            config.cpu_period = Some(policy.cpu_period_us);
            config.memory_limit = Some(Limit::from_signed(memory_limit));
        }
        QosClass::Burstable => {
            config.cpu_shares = Some(shares);
            if cpu_limits_declared {
                config.cpu_quota = Some(quota);
                config.cpu_period = Some(policy.cpu_period_us);
            }
            if memory_limits_declared {
                config.memory_limit = Some(Limit::from_signed(memory_limit));
            }
        }
        QosClass::BestEffort => config.cpu_shares = Some(MIN_SHARES),
    }
    if policy.memory_qos && requests.memory_bytes > 0 {
        config.memory_min = u64::try_from(requests.memory_bytes).ok();
    }
    if policy.pod_pids_limit > 0 {
        config.pids_limit = Some(Limit::from_signed(policy.pod_pids_limit));
    }
    config
}

/// The container-level cgroup values of one container (what kubelet asks the runtime for).
#[must_use]
pub fn container_config(container: &Container, policy: PodCgroupPolicy) -> ResourceConfig {
    let mut config = ResourceConfig {
        cpu_shares: Some(milli_cpu_to_shares(container.cpu_request_millis())),
        ..ResourceConfig::default()
    };
    if let Some(limit) = container
        .cpu_limit_millis()
        .filter(|_| policy.enforce_cpu_limits)
    {
        config.cpu_quota = Some(quota_limit(milli_cpu_to_quota(limit, policy.cpu_period_us)));
        config.cpu_period = Some(policy.cpu_period_us);
    }
    config.memory_limit = Some(
        container
            .memory_limit_bytes()
            .map_or(Limit::Max, Limit::from_signed),
    );
    config
}

/// The pod's limit of one resource: the sum over app containers raised to the largest init
/// container; 0 when any container has none (then it is not declared and not written).
fn pod_limit(spec: &PodSpec, limit: fn(&Container) -> Option<i64>) -> i64 {
    let sum: i64 = spec.containers.iter().map(|c| limit(c).unwrap_or(0)).sum();
    let init = spec
        .init_containers
        .iter()
        .map(|c| limit(c).unwrap_or(0))
        .max()
        .unwrap_or(0);
    sum.max(init)
}

/// kubelet writes a 0 quota as "no quota".
fn quota_limit(quota: i64) -> Limit {
    if quota <= 0 {
        Limit::Max
    } else {
        Limit::from_signed(quota)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> PodSpec {
        serde_yaml_ng::from_str(yaml).expect("pod spec")
    }

    /// Rows mirror kubelet's TestResourceConfigForPod (pkg/kubelet/cm/helpers_linux_test.go):
    /// guaranteed, burstable with and without every limit, besteffort.
    #[test]
    fn resource_config_for_pod_matches_kubelet() {
        let policy = PodCgroupPolicy::default();
        let guaranteed = pod_config(
            &spec("containers: [{name: a, resources: {limits: {cpu: '1', memory: 128Mi}}}]"),
            policy,
        );
        assert_eq!(guaranteed.cpu_shares, Some(1024));
        assert_eq!(guaranteed.cpu_quota, Some(Limit::Value(100_000)));
        assert_eq!(guaranteed.cpu_period, Some(100_000));
        assert_eq!(guaranteed.memory_limit, Some(Limit::Value(128 << 20)));

        let burstable_with_limits = pod_config(
            &spec(
                "containers: [{name: a, resources: {requests: {cpu: 250m, memory: 64Mi}, limits: {cpu: 500m, memory: 128Mi}}}]",
            ),
            policy,
        );
        assert_eq!(burstable_with_limits.cpu_shares, Some(256));
        assert_eq!(burstable_with_limits.cpu_quota, Some(Limit::Value(50_000)));
        assert_eq!(
            burstable_with_limits.memory_limit,
            Some(Limit::Value(128 << 20))
        );

        // One container without limits: no pod-level quota or memory limit.
        let burstable_partial = pod_config(
            &spec(
                "containers: [{name: a, resources: {requests: {cpu: 100m}, limits: {cpu: 200m, memory: 1Gi}}}, {name: b, resources: {requests: {cpu: 100m}}}]",
            ),
            policy,
        );
        assert_eq!(burstable_partial.cpu_shares, Some(204));
        assert_eq!(burstable_partial.cpu_quota, None);
        assert_eq!(burstable_partial.memory_limit, None);

        let best_effort = pod_config(&spec("containers: [{name: a}]"), policy);
        assert_eq!(
            best_effort,
            ResourceConfig {
                cpu_shares: Some(2),
                ..ResourceConfig::default()
            }
        );
    }

    /// kubelet's "burstable-partial-limits with cpuCFSQuota false" rows.
    #[test]
    fn cpu_limits_not_enforced_without_cfs_quota() {
        let policy = PodCgroupPolicy {
            enforce_cpu_limits: false,
            ..PodCgroupPolicy::default()
        };
        let config = pod_config(
            &spec("containers: [{name: a, resources: {limits: {cpu: '1', memory: 1Gi}}}]"),
            policy,
        );
        assert_eq!(config.cpu_quota, Some(Limit::Max));
    }

    #[test]
    fn init_containers_raise_the_pod_limit() {
        let config = pod_config(
            &spec(
                "initContainers: [{name: i, resources: {limits: {cpu: '2', memory: 1Gi}}}]\ncontainers: [{name: a, resources: {limits: {cpu: '1', memory: 128Mi}}}]",
            ),
            PodCgroupPolicy::default(),
        );
        assert_eq!(config.cpu_quota, Some(Limit::Value(200_000)));
        assert_eq!(config.memory_limit, Some(Limit::Value(1 << 30)));
    }

    #[test]
    fn memory_qos_and_pids() {
        let policy = PodCgroupPolicy {
            memory_qos: true,
            pod_pids_limit: 1024,
            ..PodCgroupPolicy::default()
        };
        let config = pod_config(
            &spec("containers: [{name: a, resources: {requests: {memory: 64Mi}}}]"),
            policy,
        );
        assert_eq!(config.memory_min, Some(64 << 20));
        assert_eq!(config.pids_limit, Some(Limit::Value(1024)));
    }

    #[test]
    fn container_values_follow_the_runtime() {
        let pod = spec(
            "containers: [{name: a, resources: {requests: {cpu: 250m}, limits: {cpu: 500m, memory: 128Mi}}}, {name: b}]",
        );
        let a = container_config(&pod.containers[0], PodCgroupPolicy::default());
        assert_eq!(a.cpu_shares, Some(256));
        assert_eq!(a.cpu_quota, Some(Limit::Value(50_000)));
        assert_eq!(a.memory_limit, Some(Limit::Value(128 << 20)));
        let b = container_config(&pod.containers[1], PodCgroupPolicy::default());
        assert_eq!(b.cpu_shares, Some(2));
        assert_eq!(b.cpu_quota, None);
        assert_eq!(b.memory_limit, Some(Limit::Max));
    }
}
