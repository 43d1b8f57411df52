//! `KubeletConfiguration` (`kubelet.config.k8s.io/v1beta1`) read from a YAML or JSON file the way
//! kubelet's `--config` reads it (`cmd/kubelet/app/server.go` `loadConfigFile`, then the v1beta1
//! defaults of `pkg/kubelet/apis/config/v1beta1/defaults.go` and the checks of
//! `pkg/kubelet/apis/config/validation/validation.go`), restricted to the fields qosd acts on.
//!
//! Decoding is strict and field names are case-sensitive camelCase: YAML is first turned into
//! JSON (as `sigs.k8s.io/yaml` does), `apiVersion` and `kind` are checked, every top-level field
//! is then sorted into one of three sets:
//! - fields qosd reads ([`SUPPORTED_FIELDS`]), decoded with the field path of any bad value;
//! - real KubeletConfiguration fields qosd does not act on ([`UNSUPPORTED_FIELDS`]): returned by
//!   name in [`LoadedKubeletConfig::unsupported_fields`] so the caller warns about each one;
//! - anything else: an error naming the fields (kubelet's strict decoding error).
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::eviction::Threshold;
use crate::cgroup::cpuset::CpuSet;
use crate::pods::quantity::Quantity;
use decode::{json_type, yaml_to_json};
use fields::RawKubeletConfiguration;
use validation::{BuildFailure, build};

/// The only apiVersion accepted.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// The only kind accepted.
pub const KIND: &str = "KubeletConfiguration";

/// Feature gate honoured by qosd: cgroup v2 memory QoS (`memory.min`, `memory.high`).
pub const FEATURE_MEMORY_QOS: &str = "MemoryQoS";
/// Feature gate that allows a `cpuCFSQuotaPeriod` other than 100ms.
pub const FEATURE_CUSTOM_CPU_CFS_QUOTA_PERIOD: &str = "CustomCPUCFSQuotaPeriod";

mod decode;
mod defaults;
mod fields;
#[cfg(test)]
mod tests;
mod validation;

pub use decode::{DurationError, parse_go_duration};
pub use fields::{SUPPORTED_FIELDS, UNSUPPORTED_FIELDS};

/// Errors loading a KubeletConfiguration file; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading kubelet config file {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("kubelet config file {} was empty", .path.display())]
    Empty { path: PathBuf },
    #[error("kubelet config file {}: not valid YAML or JSON: {reason}", .path.display())]
    Syntax { path: PathBuf, reason: String },
    #[error("kubelet config file {}: expected a mapping of fields, found {found}", .path.display())]
    NotAMapping { path: PathBuf, found: &'static str },
    #[error("kubelet config file {}: apiVersion {}, expected {API_VERSION:?}", .path.display(), describe(.found.as_deref()))]
    ApiVersion {
        path: PathBuf,
        found: Option<String>,
    },
    #[error("kubelet config file {}: kind {}, expected {KIND:?}", .path.display(), describe(.found.as_deref()))]
    Kind {
        path: PathBuf,
        found: Option<String>,
    },
    #[error("kubelet config file {}: strict decoding error: {}", .path.display(), unknown_list(.fields))]
    UnknownFields { path: PathBuf, fields: Vec<String> },
    #[error("kubelet config file {}: {field}: {reason}", .path.display())]
    Invalid {
        path: PathBuf,
        field: String,
        reason: String,
    },
    #[error("kubelet config file {}: invalid configuration: {}", .path.display(), .errors.join("; "))]
    Validation { path: PathBuf, errors: Vec<String> },
}

fn describe(found: Option<&str>) -> String {
    match found {
        None => "is missing".to_owned(),
        Some(v) => format!("is {v:?}"),
    }
}

fn unknown_list(fields: &[String]) -> String {
    fields
        .iter()
        .map(|f| format!("unknown field {f:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The cgroup driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CgroupDriver {
    #[default]
    Cgroupfs,
    Systemd,
}

impl CgroupDriver {
    /// The configuration name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupDriver::Cgroupfs => "cgroupfs",
            CgroupDriver::Systemd => "systemd",
        }
    }
}

/// One `enforceNodeAllocatable` entry (`none` is the empty set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EnforcementKey {
    /// `pods`: the kubepods cgroup is limited to capacity minus the reservations.
    Pods,
    /// `system-reserved`: systemReservedCgroup is limited to systemReserved.
    SystemReserved,
    /// `system-reserved-compressible`: the same, CPU only.
    SystemReservedCompressible,
    /// `kube-reserved`: kubeReservedCgroup is limited to kubeReserved.
    KubeReserved,
    /// `kube-reserved-compressible`: the same, CPU only.
    KubeReservedCompressible,
}

impl EnforcementKey {
    /// The configuration name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            EnforcementKey::Pods => "pods",
            EnforcementKey::SystemReserved => "system-reserved",
            EnforcementKey::SystemReservedCompressible => "system-reserved-compressible",
            EnforcementKey::KubeReserved => "kube-reserved",
            EnforcementKey::KubeReservedCompressible => "kube-reserved-compressible",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [
            EnforcementKey::Pods,
            EnforcementKey::SystemReserved,
            EnforcementKey::SystemReservedCompressible,
            EnforcementKey::KubeReserved,
            EnforcementKey::KubeReservedCompressible,
        ]
        .into_iter()
        .find(|k| k.as_str() == name)
    }
}

impl fmt::Display for EnforcementKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `systemReserved` / `kubeReserved`: the resources kubelet lets one reserve
/// (`parseResourceList` in `cmd/kubelet/app/server.go`), none negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReservedResources {
    pub cpu: Option<Quantity>,
    pub memory: Option<Quantity>,
    pub ephemeral_storage: Option<Quantity>,
    pub pid: Option<Quantity>,
}

impl ReservedResources {
    /// True when nothing is reserved (kubelet's nil resource list).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.cpu.is_none()
            && self.memory.is_none()
            && self.ephemeral_storage.is_none()
            && self.pid.is_none()
    }

    /// Reserved CPU in millicores (0 when unset).
    #[must_use]
    pub fn milli_cpu(&self) -> i64 {
        self.cpu.map_or(0, |q| q.milli_value())
    }

    /// Reserved memory in bytes (0 when unset).
    #[must_use]
    pub fn memory_bytes(&self) -> i64 {
        self.memory.map_or(0, |q| q.value())
    }

    /// Reserved process ids (0 when unset).
    #[must_use]
    pub fn pids(&self) -> i64 {
        self.pid.map_or(0, |q| q.value())
    }
}

/// One `reservedMemory` entry: memory reserved for the system on a NUMA node, by resource
/// (`memory`, `hugepages-<size>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryReservation {
    pub numa_node: u32,
    pub limits: BTreeMap<String, Quantity>,
}

/// The KubeletConfiguration fields qosd acts on, defaulted and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeletConfiguration {
    /// `systemReserved`.
    pub system_reserved: ReservedResources,
    /// `kubeReserved`.
    pub kube_reserved: ReservedResources,
    /// `evictionHard` after defaulting and `mergeDefaultEvictionSettings`, without the
    /// thresholds switched off with `0%` / `100%`.
    pub eviction_hard: Vec<Threshold>,
    /// `enforceNodeAllocatable`; empty for `none`. Default: `{pods}`.
    pub enforce_node_allocatable: BTreeSet<EnforcementKey>,
    /// `systemReservedCgroup` (`None` when empty).
    pub system_reserved_cgroup: Option<String>,
    /// `kubeReservedCgroup` (`None` when empty).
    pub kube_reserved_cgroup: Option<String>,
    /// `cgroupDriver`. Default: cgroupfs.
    pub cgroup_driver: CgroupDriver,
    /// `cgroupRoot`. Default with cgroupsPerQOS: `/` (kubelet's server.go).
    pub cgroup_root: String,
    /// `cgroupsPerQOS`. Default: true.
    pub cgroups_per_qos: bool,
    /// `featureGates` as written.
    pub feature_gates: BTreeMap<String, bool>,
    /// `memoryThrottlingFactor`. Default: 0.9.
    pub memory_throttling_factor: f64,
    /// `podPidsLimit`; -1 (the default, also for any negative value) means node allocatable.
    pub pod_pids_limit: i64,
    /// `cpuCFSQuota`. Default: true.
    pub cpu_cfs_quota: bool,
    /// `cpuCFSQuotaPeriod`. Default: 100ms.
    pub cpu_cfs_quota_period: Duration,
    /// `reservedSystemCPUs`, parsed (empty when unset).
    pub reserved_system_cpus: CpuSet,
    /// `cpuManagerPolicy`. Default: `none`. Kept for the CPU manager.
    pub cpu_manager_policy: String,
    /// `memoryManagerPolicy`. Default: `None`. Kept for the memory manager.
    pub memory_manager_policy: String,
    /// `topologyManagerPolicy`. Default: `none`.
    pub topology_manager_policy: String,
    /// `topologyManagerScope`. Default: `container`.
    pub topology_manager_scope: String,
    /// `cpuManagerPolicyOptions` (checked by the CPU manager at start).
    pub cpu_manager_policy_options: BTreeMap<String, String>,
    /// `topologyManagerPolicyOptions` (checked by the topology manager at start).
    pub topology_manager_policy_options: BTreeMap<String, String>,
    /// `reservedMemory`, validated like kubelet (supported resources, non-zero, no duplicates).
    pub reserved_memory: Vec<MemoryReservation>,
    /// `maxPods`. Default: 110.
    pub max_pods: i64,
}

impl KubeletConfiguration {
    /// Whether a feature gate is on: its `featureGates` value, else kubelet's default for the
    /// gates qosd consults (MemoryQoS and CustomCPUCFSQuotaPeriod are alpha, off), else off.
    #[must_use]
    pub fn feature_enabled(&self, gate: &str) -> bool {
        self.feature_gates.get(gate).copied().unwrap_or(false)
    }

    /// The MemoryQoS feature gate.
    #[must_use]
    pub fn memory_qos(&self) -> bool {
        self.feature_enabled(FEATURE_MEMORY_QOS)
    }

    /// Whether `enforceNodeAllocatable` contains `key`.
    #[must_use]
    pub fn enforces(&self, key: EnforcementKey) -> bool {
        self.enforce_node_allocatable.contains(&key)
    }
}

/// A loaded configuration plus the real-but-unsupported fields it set (log one warning each).
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedKubeletConfig {
    pub path: PathBuf,
    pub config: KubeletConfiguration,
    pub unsupported_fields: Vec<String>,
}

/// Reads and validates a KubeletConfiguration file (YAML or JSON).
pub fn load_kubelet_config(path: impl AsRef<Path>) -> Result<LoadedKubeletConfig, ConfigError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_kubelet_config(&text, path)
}

/// Parses KubeletConfiguration text; `path` only names the origin in errors and the result.
pub fn parse_kubelet_config(text: &str, path: &Path) -> Result<LoadedKubeletConfig, ConfigError> {
    let path_buf = || path.to_owned();
    if text.trim().is_empty() {
        return Err(ConfigError::Empty { path: path_buf() });
    }
    let document: serde_json::Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| ConfigError::Syntax {
            path: path_buf(),
            reason: e.to_string(),
        })?
    } else {
        yaml_to_json(text).map_err(|e| ConfigError::Syntax {
            path: path_buf(),
            reason: e.to_string(),
        })?
    };
    let serde_json::Value::Object(mut fields) = document else {
        return Err(ConfigError::NotAMapping {
            path: path_buf(),
            found: json_type(&document),
        });
    };

    let type_field = |fields: &serde_json::Map<String, serde_json::Value>, name: &str| {
        fields.get(name).map(|v| match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    };
    let api_version = type_field(&fields, "apiVersion");
    if api_version.as_deref() != Some(API_VERSION) {
        return Err(ConfigError::ApiVersion {
            path: path_buf(),
            found: api_version,
        });
    }
    let kind = type_field(&fields, "kind");
    if kind.as_deref() != Some(KIND) {
        return Err(ConfigError::Kind {
            path: path_buf(),
            found: kind,
        });
    }
    fields.remove("apiVersion");
    fields.remove("kind");

    let mut unsupported_fields = Vec::new();
    let mut unknown = Vec::new();
    let names: Vec<String> = fields.keys().cloned().collect();
    for name in names {
        if SUPPORTED_FIELDS.contains(&name.as_str()) {
            continue;
        }
        fields.remove(&name);
        if UNSUPPORTED_FIELDS.contains(&name.as_str()) {
            unsupported_fields.push(name);
        } else {
            unknown.push(name);
        }
    }
    if !unknown.is_empty() {
        return Err(ConfigError::UnknownFields {
            path: path_buf(),
            fields: unknown,
        });
    }

    let raw: RawKubeletConfiguration =
        serde_path_to_error::deserialize(serde_json::Value::Object(fields)).map_err(|e| {
            ConfigError::Invalid {
                path: path_buf(),
                field: e.path().to_string(),
                reason: e.inner().to_string(),
            }
        })?;
    let config = build(raw).map_err(|failure| match failure {
        BuildFailure::Field { field, reason } => ConfigError::Invalid {
            path: path_buf(),
            field,
            reason,
        },
        BuildFailure::Validation(errors) => ConfigError::Validation {
            path: path_buf(),
            errors,
        },
    })?;
    Ok(LoadedKubeletConfig {
        path: path_buf(),
        config,
        unsupported_fields,
    })
}
