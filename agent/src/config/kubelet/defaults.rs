//! kubelet's v1beta1 defaults (`pkg/kubelet/apis/config/v1beta1/defaults.go`) for the fields
//! qosd reads.
use super::fields::RawKubeletConfiguration;
use super::validation::build;
use super::{CgroupDriver, EnforcementKey, KubeletConfiguration, ReservedResources};
use crate::cgroup::cpuset::CpuSet;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

impl Default for KubeletConfiguration {
    /// kubelet's defaults, i.e. what an empty v1beta1 file decodes to.
    fn default() -> Self {
        match build(RawKubeletConfiguration::default()) {
            Ok(config) => config,
            // The defaults are valid (tested); this arm only keeps `Default` panic-free.
            Err(_) => Self {
                system_reserved: ReservedResources::default(),
                kube_reserved: ReservedResources::default(),
                eviction_hard: Vec::new(),
                enforce_node_allocatable: BTreeSet::from([EnforcementKey::Pods]),
                system_reserved_cgroup: None,
                kube_reserved_cgroup: None,
                cgroup_driver: CgroupDriver::Cgroupfs,
                cgroup_root: "/".to_owned(),
                cgroups_per_qos: true,
                feature_gates: BTreeMap::new(),
                memory_throttling_factor: DEFAULT_MEMORY_THROTTLING_FACTOR,
                pod_pids_limit: -1,
                cpu_cfs_quota: true,
                cpu_cfs_quota_period: DEFAULT_CFS_QUOTA_PERIOD,
                reserved_system_cpus: CpuSet::new(),
                cpu_manager_policy: "none".to_owned(),
                memory_manager_policy: "None".to_owned(),
                topology_manager_policy: "none".to_owned(),
                topology_manager_scope: "container".to_owned(),
                cpu_manager_policy_options: BTreeMap::new(),
                topology_manager_policy_options: BTreeMap::new(),
                reserved_memory: Vec::new(),
                max_pods: 110,
            },
        }
    }
}

pub(super) const DEFAULT_MEMORY_THROTTLING_FACTOR: f64 = 0.9;
pub(super) const DEFAULT_CFS_QUOTA_PERIOD: Duration = Duration::from_millis(100);
