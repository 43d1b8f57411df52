//! From the raw decoded file to a [`KubeletConfiguration`]: defaults applied, then kubelet's
//! checks (`pkg/kubelet/apis/config/validation/validation.go`) with the field path in every
//! error.
use super::super::eviction;
use super::super::eviction::DEFAULT_EVICTION_HARD;
use super::decode::{NonNegativeQuantity, Text};
use super::defaults::{DEFAULT_CFS_QUOTA_PERIOD, DEFAULT_MEMORY_THROTTLING_FACTOR};
use super::fields::{RawKubeletConfiguration, RawMemoryReservation};
use super::{
    CgroupDriver, EnforcementKey, FEATURE_CUSTOM_CPU_CFS_QUOTA_PERIOD, KubeletConfiguration,
    MemoryReservation,
};
use crate::cgroup::cpuset::CpuSet;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

pub(super) enum BuildFailure {
    /// A malformed value, with its field path.
    Field { field: String, reason: String },
    /// kubelet's `ValidateKubeletConfiguration` findings (all of them, as kubelet aggregates).
    Validation(Vec<String>),
}

/// Applies the v1beta1 defaults, then validates like kubelet.
pub(super) fn build(raw: RawKubeletConfiguration) -> Result<KubeletConfiguration, BuildFailure> {
    let field = |field: &str, reason: String| BuildFailure::Field {
        field: field.to_owned(),
        reason,
    };

    let cgroup_driver = match raw.cgroup_driver.as_deref().unwrap_or("") {
        "" | "cgroupfs" => CgroupDriver::Cgroupfs,
        "systemd" => CgroupDriver::Systemd,
        other => {
            return Err(field(
                "cgroupDriver",
                format!("unknown cgroup driver {other:?}, expected \"cgroupfs\" or \"systemd\""),
            ));
        }
    };

    // evictionHard: the defaults when unset; merged under the given map with
    // mergeDefaultEvictionSettings; otherwise only the signals given.
    let merge = raw.merge_default_eviction_settings.unwrap_or(false);
    let mut statements: BTreeMap<String, String> = BTreeMap::new();
    if raw.eviction_hard.is_none() || merge {
        statements.extend(
            DEFAULT_EVICTION_HARD
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
    }
    for (signal, Text(value)) in raw.eviction_hard.unwrap_or_default() {
        statements.insert(signal, value);
    }
    let mut eviction_hard = Vec::new();
    for (signal, value) in &statements {
        match eviction::parse_threshold(signal, value) {
            Ok(Some(threshold)) => eviction_hard.push(threshold),
            Ok(None) => {}
            Err(e) => return Err(field(&format!("evictionHard.{signal}"), e.to_string())),
        }
    }

    let reserved_system_cpus_text = raw.reserved_system_cpus.unwrap_or_default();
    let cgroups_per_qos = raw.cgroups_per_qos.unwrap_or(true);
    let mut cgroup_root = raw.cgroup_root.unwrap_or_default();
    if cgroups_per_qos && cgroup_root.is_empty() {
        cgroup_root = "/".to_owned();
    }
    let non_empty = |s: Option<String>| s.filter(|s| !s.is_empty());
    let system_reserved_cgroup = non_empty(raw.system_reserved_cgroup);
    let kube_reserved_cgroup = non_empty(raw.kube_reserved_cgroup);
    let or_default = |s: Option<String>, default: &str| {
        s.filter(|s| !s.is_empty())
            .unwrap_or_else(|| default.to_owned())
    };

    let mut errors = Vec::new();
    let enforce_list = raw
        .enforce_node_allocatable
        .unwrap_or_else(|| vec!["pods".to_owned()]);
    let enforce_node_allocatable = validate_enforcement(
        &enforce_list,
        cgroups_per_qos,
        system_reserved_cgroup.is_some(),
        kube_reserved_cgroup.is_some(),
        &mut errors,
    );

    let feature_gates = raw.feature_gates.unwrap_or_default();
    let gate = |name: &str| feature_gates.get(name).copied().unwrap_or(false);

    let cpu_cfs_quota_period = raw
        .cpu_cfs_quota_period
        .map_or(DEFAULT_CFS_QUOTA_PERIOD, |d| d.0);
    if !gate(FEATURE_CUSTOM_CPU_CFS_QUOTA_PERIOD)
        && cpu_cfs_quota_period != DEFAULT_CFS_QUOTA_PERIOD
    {
        errors.push(format!(
            "cpuCFSQuotaPeriod (--cpu-cfs-quota-period) {cpu_cfs_quota_period:?} requires feature gate \
             {FEATURE_CUSTOM_CPU_CFS_QUOTA_PERIOD}"
        ));
    }
    if gate(FEATURE_CUSTOM_CPU_CFS_QUOTA_PERIOD)
        && !(Duration::from_millis(1)..=Duration::from_secs(1)).contains(&cpu_cfs_quota_period)
    {
        errors.push(format!(
            "cpuCFSQuotaPeriod (--cpu-cfs-quota-period) {cpu_cfs_quota_period:?} must be between 1ms and \
             1sec, inclusive"
        ));
    }

    let max_pods = match raw.max_pods {
        None | Some(0) => 110,
        Some(n) => i64::from(n),
    };
    if max_pods < 0 {
        errors.push(format!(
            "maxPods (--max-pods) {max_pods} must not be a negative number"
        ));
    }

    let memory_throttling_factor = raw
        .memory_throttling_factor
        .unwrap_or(DEFAULT_MEMORY_THROTTLING_FACTOR);
    if !(memory_throttling_factor > 0.0 && memory_throttling_factor <= 1.0) {
        errors.push(format!(
            "memoryThrottlingFactor {memory_throttling_factor} must be greater than 0 and less than or equal to 1.0"
        ));
    }

    let topology_manager_policy = or_default(raw.topology_manager_policy, "none");
    const TOPOLOGY_POLICIES: [&str; 4] = ["none", "best-effort", "restricted", "single-numa-node"];
    if !TOPOLOGY_POLICIES.contains(&topology_manager_policy.as_str()) {
        errors.push(format!(
            "topologyManagerPolicy (--topology-manager-policy) {topology_manager_policy:?} must be one of: \
             {TOPOLOGY_POLICIES:?}"
        ));
    }
    let topology_manager_scope = or_default(raw.topology_manager_scope, "container");
    if !["container", "pod"].contains(&topology_manager_scope.as_str()) {
        errors.push(format!(
            "topologyManagerScope (--topology-manager-scope) {topology_manager_scope:?} must be one of: \
             \"container\", or \"pod\""
        ));
    }

    let mut reserved_system_cpus = CpuSet::new();
    if !reserved_system_cpus_text.is_empty() {
        if system_reserved_cgroup.is_some() || kube_reserved_cgroup.is_some() {
            errors.push(
                "can't use reservedSystemCPUs (--reserved-cpus) with systemReservedCgroup \
                 (--system-reserved-cgroup) or kubeReservedCgroup (--kube-reserved-cgroup)"
                    .to_owned(),
            );
        }
        match CpuSet::parse(&reserved_system_cpus_text) {
            Ok(cpus) => reserved_system_cpus = cpus,
            Err(e) => errors.push(format!(
                "unable to parse reservedSystemCPUs (--reserved-cpus): {e}"
            )),
        }
    }

    let reserved_memory =
        validate_reserved_memory(raw.reserved_memory.unwrap_or_default(), &mut errors);
    let options = |map: Option<BTreeMap<String, Text>>| -> BTreeMap<String, String> {
        map.unwrap_or_default()
            .into_iter()
            .map(|(k, Text(v))| (k, v))
            .collect()
    };

    if !errors.is_empty() {
        return Err(BuildFailure::Validation(errors));
    }
    Ok(KubeletConfiguration {
        system_reserved: raw.system_reserved.unwrap_or_default(),
        kube_reserved: raw.kube_reserved.unwrap_or_default(),
        eviction_hard,
        enforce_node_allocatable,
        system_reserved_cgroup,
        kube_reserved_cgroup,
        cgroup_driver,
        cgroup_root,
        cgroups_per_qos,
        feature_gates,
        memory_throttling_factor,
        pod_pids_limit: raw.pod_pids_limit.filter(|n| *n >= 0).unwrap_or(-1),
        cpu_cfs_quota: raw.cpu_cfs_quota.unwrap_or(true),
        cpu_cfs_quota_period,
        reserved_system_cpus,
        cpu_manager_policy: or_default(raw.cpu_manager_policy, "none"),
        memory_manager_policy: or_default(raw.memory_manager_policy, "None"),
        topology_manager_policy,
        topology_manager_scope,
        cpu_manager_policy_options: options(raw.cpu_manager_policy_options),
        topology_manager_policy_options: options(raw.topology_manager_policy_options),
        reserved_memory,
        max_pods,
    })
}

/// kubelet's `validateReservedMemoryConfiguration`: only `memory` and `hugepages-<size>`, no
/// zero values, no NUMA node and resource given twice; a negative node id is refused too.
pub(super) fn validate_reserved_memory(
    raw: Vec<RawMemoryReservation>,
    errors: &mut Vec<String>,
) -> Vec<MemoryReservation> {
    let mut seen: BTreeSet<(i32, String)> = BTreeSet::new();
    let mut out = Vec::new();
    for (i, entry) in raw.into_iter().enumerate() {
        let node = entry.numa_node;
        let mut limits = BTreeMap::new();
        for (resource, NonNegativeQuantity(quantity)) in entry.limits {
            if resource != "memory" && !resource.starts_with("hugepages-") {
                errors.push(format!(
                    "reservedMemory[{i}]: the limit type {resource:?} for NUMA node {node} is not supported, only [memory hugepages-<HugePageSize>] is accepted"
                ));
            }
            if quantity.is_zero() {
                errors.push(format!(
                    "reservedMemory[{i}]: reserved memory may not be zero for NUMA node {node} and resource {resource:?}"
                ));
            }
            if !seen.insert((node, resource.clone())) {
                errors.push(format!(
                    "reservedMemory[{i}]: the reserved memory has a duplicate value for NUMA node {node} and resource {resource:?}"
                ));
            }
            limits.insert(resource, quantity);
        }
        match u32::try_from(node) {
            Ok(numa_node) => out.push(MemoryReservation { numa_node, limits }),
            Err(_) => errors.push(format!(
                "reservedMemory[{i}].numaNode: {node} is not a NUMA node id"
            )),
        }
    }
    out
}

/// kubelet's `enforceNodeAllocatable` checks, in its order and with its messages.
pub(super) fn validate_enforcement(
    list: &[String],
    cgroups_per_qos: bool,
    has_system_reserved_cgroup: bool,
    has_kube_reserved_cgroup: bool,
    errors: &mut Vec<String>,
) -> BTreeSet<EnforcementKey> {
    const FLAG: &str = "in enforceNodeAllocatable (--enforce-node-allocatable)";
    let has = |name: &str| list.iter().any(|v| v == name);
    for (plain, compressible) in [
        ("system-reserved", "system-reserved-compressible"),
        ("kube-reserved", "kube-reserved-compressible"),
    ] {
        if has(plain) && has(compressible) {
            errors.push(format!(
                "both {plain:?} and {compressible:?} cannot be specified together {FLAG}"
            ));
        }
    }
    let mut seen = BTreeSet::new();
    let mut keys = BTreeSet::new();
    for value in list {
        if !seen.insert(value.as_str()) {
            errors.push(format!("duplicated enforcements {value:?} {FLAG}"));
            continue;
        }
        if value == "none" {
            if list.len() > 1 {
                errors.push(
                    "enforceNodeAllocatable (--enforce-node-allocatable) may not contain additional \
                     enforcements when \"none\" is specified"
                    .to_owned(),
                );
            }
            continue;
        }
        let Some(key) = EnforcementKey::from_name(value) else {
            errors.push(format!(
                "option {value:?} specified for enforceNodeAllocatable (--enforce-node-allocatable). Valid \
                 options are \"pods\", \"system-reserved\", \"system-reserved-compressible\", \"kube-reserved\", \
                 \"kube-reserved-compressible\" or \"none\""
            ));
            continue;
        };
        match key {
            EnforcementKey::Pods => {}
            EnforcementKey::SystemReserved | EnforcementKey::SystemReservedCompressible => {
                if !has_system_reserved_cgroup {
                    errors.push(format!(
                        "systemReservedCgroup (--system-reserved-cgroup) must be specified when \
                         \"system-reserved\" or \"system-reserved-compressible\" included {FLAG}"
                    ));
                }
            }
            EnforcementKey::KubeReserved | EnforcementKey::KubeReservedCompressible => {
                if !has_kube_reserved_cgroup {
                    errors.push(format!(
                        "kubeReservedCgroup (--kube-reserved-cgroup) must be specified when \
                         \"kube-reserved\" or \"kube-reserved-compressible\" included {FLAG}"
                    ));
                }
            }
        }
        if !cgroups_per_qos {
            errors.push(format!(
                "cgroupsPerQOS (--cgroups-per-qos) must be set to true when {value:?} contained {FLAG}"
            ));
        }
        keys.insert(key);
    }
    keys
}
