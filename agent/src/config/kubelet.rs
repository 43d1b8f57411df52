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

use serde::Deserialize;

use super::eviction::{self, DEFAULT_EVICTION_HARD, Threshold};
use crate::cgroup::cpuset::CpuSet;
use crate::pods::quantity::Quantity;

/// The only apiVersion accepted.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// The only kind accepted.
pub const KIND: &str = "KubeletConfiguration";

/// Feature gate honoured by qosd: cgroup v2 memory QoS (`memory.min`, `memory.high`).
pub const FEATURE_MEMORY_QOS: &str = "MemoryQoS";
/// Feature gate that allows a `cpuCFSQuotaPeriod` other than 100ms.
pub const FEATURE_CUSTOM_CPU_CFS_QUOTA_PERIOD: &str = "CustomCPUCFSQuotaPeriod";

/// The top-level fields qosd reads (besides `apiVersion` and `kind`).
pub const SUPPORTED_FIELDS: &[&str] = &[
    "systemReserved",
    "kubeReserved",
    "evictionHard",
    "mergeDefaultEvictionSettings",
    "enforceNodeAllocatable",
    "systemReservedCgroup",
    "kubeReservedCgroup",
    "cgroupDriver",
    "cgroupRoot",
    "cgroupsPerQOS",
    "featureGates",
    "memoryThrottlingFactor",
    "podPidsLimit",
    "cpuCFSQuota",
    "cpuCFSQuotaPeriod",
    "reservedSystemCPUs",
    "cpuManagerPolicy",
    "cpuManagerPolicyOptions",
    "memoryManagerPolicy",
    "reservedMemory",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "topologyManagerPolicyOptions",
    "maxPods",
];

/// The other top-level fields of v1beta1 `KubeletConfiguration`
/// (`staging/src/k8s.io/kubelet/config/v1beta1/types.go`): accepted, not acted on, reported.
pub const UNSUPPORTED_FIELDS: &[&str] = &[
    "enableServer",
    "staticPodPath",
    "podLogsDir",
    "syncFrequency",
    "fileCheckFrequency",
    "httpCheckFrequency",
    "staticPodURL",
    "staticPodURLHeader",
    "address",
    "port",
    "readOnlyPort",
    "tlsCertFile",
    "tlsPrivateKeyFile",
    "tlsCipherSuites",
    "tlsCurvePreferences",
    "tlsMinVersion",
    "rotateCertificates",
    "serverTLSBootstrap",
    "authentication",
    "authorization",
    "registryPullQPS",
    "registryBurst",
    "imagePullCredentialsVerificationPolicy",
    "preloadedImagesVerificationAllowlist",
    "eventRecordQPS",
    "eventBurst",
    "enableDebuggingHandlers",
    "enableContentionProfiling",
    "healthzPort",
    "healthzBindAddress",
    "oomScoreAdj",
    "clusterDomain",
    "clusterDNS",
    "streamingConnectionIdleTimeout",
    "nodeStatusUpdateFrequency",
    "nodeStatusReportFrequency",
    "nodeLeaseDurationSeconds",
    "imageMinimumGCAge",
    "imageMaximumGCAge",
    "imageGCHighThresholdPercent",
    "imageGCLowThresholdPercent",
    "volumeStatsAggPeriod",
    "kubeletCgroups",
    "systemCgroups",
    "singleProcessOOMKill",
    "cpuManagerReconcilePeriod",
    "draManagerReconcilePeriod",
    "qosReserved",
    "runtimeRequestTimeout",
    "hairpinMode",
    "podCIDR",
    "resolvConf",
    "runOnce",
    "nodeStatusMaxImages",
    "maxOpenFiles",
    "contentType",
    "kubeAPIQPS",
    "kubeAPIBurst",
    "serializeImagePulls",
    "maxParallelImagePulls",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionPressureTransitionPeriod",
    "evictionMaxPodGracePeriod",
    "evictionMinimumReclaim",
    "podsPerCore",
    "enableControllerAttachDetach",
    "protectKernelDefaults",
    "makeIPTablesUtilChains",
    "iptablesMasqueradeBit",
    "iptablesDropBit",
    "failSwapOn",
    "memorySwap",
    "containerLogMaxSize",
    "containerLogMaxFiles",
    "containerLogMaxWorkers",
    "containerLogMonitorInterval",
    "configMapAndSecretChangeDetectionStrategy",
    "showHiddenMetricsForVersion",
    "allowedUnsafeSysctls",
    "volumePluginDir",
    "providerID",
    "kernelMemcgNotification",
    "logging",
    "enableSystemLogHandler",
    "enableSystemLogQuery",
    "shutdownGracePeriod",
    "shutdownGracePeriodCriticalPods",
    "shutdownGracePeriodByPodPriority",
    "crashLoopBackOff",
    "enableProfilingHandler",
    "enableDebugFlagsHandler",
    "seccompDefault",
    "memoryReservationPolicy",
    "registerWithTaints",
    "registerNode",
    "tracing",
    "localStorageCapacityIsolation",
    "containerRuntimeEndpoint",
    "imageServiceEndpoint",
    "failCgroupV1",
    "userNamespaces",
];

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

impl<'de> Deserialize<'de> for ReservedResources {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = ReservedResources;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a map of resource name (cpu, memory, ephemeral-storage, pid) to quantity",
                )
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = ReservedResources::default();
                while let Some(name) = map.next_key::<String>()? {
                    let slot = match name.as_str() {
                        "cpu" => &mut out.cpu,
                        "memory" => &mut out.memory,
                        "ephemeral-storage" => &mut out.ephemeral_storage,
                        "pid" => &mut out.pid,
                        other => {
                            return Err(serde::de::Error::custom(format!(
                                "cannot reserve {other:?} resource (only cpu, memory, ephemeral-storage and pid can be)"
                            )));
                        }
                    };
                    *slot = Some(map.next_value::<NonNegativeQuantity>()?.0);
                }
                Ok(out)
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// A quantity that must not be negative (reservations).
struct NonNegativeQuantity(Quantity);

impl<'de> Deserialize<'de> for NonNegativeQuantity {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let q = Quantity::deserialize(deserializer)?;
        if q.is_negative() {
            return Err(serde::de::Error::custom(format!(
                "resource quantity cannot be negative: {q}"
            )));
        }
        Ok(Self(q))
    }
}

/// A string or a bare number in a `map[string]string` field (`pid.available: 1000`).
struct Text(String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string (quote values such as \"true\")")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Text, E> {
                Ok(Text(v.to_owned()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// A Go `time.Duration` string (`100ms`, `1m30s`, `1.5s`).
struct GoDuration(Duration);

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse_go_duration(&text)
            .map(Self)
            .map_err(serde::de::Error::custom)
    }
}

/// Parses a non-negative Go duration (`time.ParseDuration`): a sequence of decimal numbers with
/// units `ns`, `us` (`µs`), `ms`, `s`, `m`, `h`; `0` needs no unit.
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let invalid = || format!("invalid duration {text:?}");
    let mut s = text;
    if let Some(rest) = s.strip_prefix('+') {
        s = rest;
    } else if s.starts_with('-') {
        return Err(format!("duration {text:?} must not be negative"));
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut total: u128 = 0;
    while !s.is_empty() {
        let int_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (int_part, rest) = s.split_at(int_end);
        let (frac_part, rest) = match rest.strip_prefix('.') {
            Some(after) => {
                let end = after
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(after.len());
                after.split_at(end)
            }
            None => ("", rest),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(invalid());
        }
        let unit_end = rest
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (unit, rest) = rest.split_at(unit_end);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(format!("missing unit in duration {text:?}")),
            other => return Err(format!("unknown unit {other:?} in duration {text:?}")),
        };
        let whole: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| invalid())?
        };
        // Fraction digits beyond nanosecond precision cannot change the result; Go drops them too.
        let frac_digits = &frac_part[..frac_part.len().min(18)];
        let frac: u128 = if frac_digits.is_empty() {
            0
        } else {
            frac_digits.parse().map_err(|_| invalid())?
        };
        let scale = 10u128.pow(u32::try_from(frac_digits.len()).map_err(|_| invalid())?);
        total = whole
            .checked_mul(unit_nanos)
            .and_then(|v| v.checked_add(frac * unit_nanos / scale))
            .and_then(|v| total.checked_add(v))
            .ok_or_else(invalid)?;
        s = rest;
    }
    // Go durations are int64 nanoseconds.
    if total > u128::from(i64::MAX.unsigned_abs()) {
        return Err(invalid());
    }
    let nanos = u64::try_from(total).map_err(|_| invalid())?;
    Ok(Duration::from_nanos(nanos))
}

/// The supported fields as they appear in the file (all optional, defaults applied afterwards).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawKubeletConfiguration {
    system_reserved: Option<ReservedResources>,
    kube_reserved: Option<ReservedResources>,
    eviction_hard: Option<BTreeMap<String, Text>>,
    merge_default_eviction_settings: Option<bool>,
    enforce_node_allocatable: Option<Vec<String>>,
    system_reserved_cgroup: Option<String>,
    kube_reserved_cgroup: Option<String>,
    cgroup_driver: Option<String>,
    cgroup_root: Option<String>,
    #[serde(rename = "cgroupsPerQOS")]
    cgroups_per_qos: Option<bool>,
    feature_gates: Option<BTreeMap<String, bool>>,
    memory_throttling_factor: Option<f64>,
    pod_pids_limit: Option<i64>,
    #[serde(rename = "cpuCFSQuota")]
    cpu_cfs_quota: Option<bool>,
    #[serde(rename = "cpuCFSQuotaPeriod")]
    cpu_cfs_quota_period: Option<GoDuration>,
    #[serde(rename = "reservedSystemCPUs")]
    reserved_system_cpus: Option<String>,
    cpu_manager_policy: Option<String>,
    cpu_manager_policy_options: Option<BTreeMap<String, Text>>,
    memory_manager_policy: Option<String>,
    reserved_memory: Option<Vec<RawMemoryReservation>>,
    topology_manager_policy: Option<String>,
    topology_manager_scope: Option<String>,
    topology_manager_policy_options: Option<BTreeMap<String, Text>>,
    max_pods: Option<i32>,
}

/// One `reservedMemory` entry as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawMemoryReservation {
    numa_node: i32,
    #[serde(default)]
    limits: BTreeMap<String, NonNegativeQuantity>,
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

const DEFAULT_MEMORY_THROTTLING_FACTOR: f64 = 0.9;
const DEFAULT_CFS_QUOTA_PERIOD: Duration = Duration::from_millis(100);

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
        yaml_to_json(text).map_err(|reason| ConfigError::Syntax {
            path: path_buf(),
            reason,
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

/// YAML to a JSON value, as `sigs.k8s.io/yaml.YAMLToJSON` does before kubelet decodes. Duplicate
/// keys are rejected (go-yaml: "mapping key already defined").
fn yaml_to_json(text: &str) -> Result<serde_json::Value, String> {
    let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    serde_json::to_value(&yaml).map_err(|e| e.to_string())
}

fn json_type(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "nothing (null)",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "a mapping",
    }
}

enum BuildFailure {
    /// A malformed value, with its field path.
    Field { field: String, reason: String },
    /// kubelet's `ValidateKubeletConfiguration` findings (all of them, as kubelet aggregates).
    Validation(Vec<String>),
}

/// Applies the v1beta1 defaults, then validates like kubelet.
fn build(raw: RawKubeletConfiguration) -> Result<KubeletConfiguration, BuildFailure> {
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
fn validate_reserved_memory(
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
fn validate_enforcement(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::eviction::{Signal, ThresholdValue};

    const HEADER: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    fn parse(body: &str) -> Result<LoadedKubeletConfig, ConfigError> {
        parse_kubelet_config(
            &format!("{HEADER}{body}"),
            Path::new("/etc/kubernetes/kubelet.yaml"),
        )
    }

    fn config(body: &str) -> KubeletConfiguration {
        parse(body).unwrap_or_else(|e| panic!("{body}: {e}")).config
    }

    fn validation_errors(body: &str) -> Vec<String> {
        match parse(body) {
            Err(ConfigError::Validation { errors, .. }) => errors,
            other => panic!("{body}: expected validation errors, got {other:?}"),
        }
    }

    fn invalid(body: &str) -> (String, String, String) {
        match parse(body) {
            Err(e @ ConfigError::Invalid { .. }) => {
                let text = e.to_string();
                let ConfigError::Invalid { field, reason, .. } = e else {
                    unreachable!()
                };
                (field, reason, text)
            }
            other => panic!("{body}: expected an invalid field, got {other:?}"),
        }
    }

    fn q(text: &str) -> Option<Quantity> {
        Some(Quantity::parse(text).unwrap())
    }

    /// The node-allocatable example from the brief (and kubelet's reserve-compute-resources page).
    #[test]
    fn example_file_loads_unchanged() {
        let text = "\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
systemReserved: {cpu: \"500m\", memory: \"1Gi\"}
kubeReserved: {cpu: \"500m\", memory: \"1Gi\"}
enforceNodeAllocatable: [pods, kube-reserved, system-reserved]
systemReservedCgroup: /system.slice
kubeReservedCgroup: /kubelet.slice
";
        let loaded = parse_kubelet_config(text, Path::new("/etc/kubelet.yaml")).unwrap();
        assert!(loaded.unsupported_fields.is_empty());
        let c = loaded.config;
        assert_eq!(
            c.system_reserved,
            ReservedResources {
                cpu: q("500m"),
                memory: q("1Gi"),
                ..Default::default()
            }
        );
        assert_eq!(c.kube_reserved, c.system_reserved);
        assert_eq!(
            c.enforce_node_allocatable,
            BTreeSet::from([
                EnforcementKey::Pods,
                EnforcementKey::KubeReserved,
                EnforcementKey::SystemReserved
            ])
        );
        assert_eq!(c.system_reserved_cgroup.as_deref(), Some("/system.slice"));
        assert_eq!(c.kube_reserved_cgroup.as_deref(), Some("/kubelet.slice"));
        assert_eq!(c.system_reserved.milli_cpu(), 500);
        assert_eq!(c.kube_reserved.memory_bytes(), 1 << 30);
        // Everything else is kubelet's default.
        assert_eq!(c.cgroup_driver, CgroupDriver::Cgroupfs);
        assert_eq!(c.cgroup_root, "/");
        assert_eq!(c.eviction_hard.len(), DEFAULT_EVICTION_HARD.len());
    }

    /// `pkg/kubelet/apis/config/v1beta1/defaults_test.go` `TestSetDefaultsKubeletConfiguration`
    /// ("empty config"), for the fields qosd reads.
    #[test]
    fn empty_configuration_gets_kubelet_defaults() {
        let c = config("");
        assert_eq!(c, KubeletConfiguration::default());
        assert_eq!(c.system_reserved, ReservedResources::default());
        assert_eq!(
            c.enforce_node_allocatable,
            BTreeSet::from([EnforcementKey::Pods])
        );
        assert_eq!(c.system_reserved_cgroup, None);
        assert_eq!(c.cgroup_driver, CgroupDriver::Cgroupfs);
        assert_eq!(c.cgroup_root, "/");
        assert!(c.cgroups_per_qos);
        assert!(c.feature_gates.is_empty());
        assert!(!c.memory_qos());
        assert!((c.memory_throttling_factor - 0.9).abs() < f64::EPSILON);
        assert_eq!(c.pod_pids_limit, -1);
        assert!(c.cpu_cfs_quota);
        assert_eq!(c.cpu_cfs_quota_period, Duration::from_millis(100));
        assert!(c.reserved_system_cpus.is_empty());
        assert_eq!(c.cpu_manager_policy, "none");
        assert_eq!(c.memory_manager_policy, "None");
        assert_eq!(c.topology_manager_policy, "none");
        assert_eq!(c.topology_manager_scope, "container");
        assert_eq!(c.max_pods, 110);
        let memory = eviction::threshold_for(&c.eviction_hard, Signal::MemoryAvailable).unwrap();
        assert_eq!(
            memory.value,
            ThresholdValue::Quantity(Quantity::from_units(100 << 20))
        );
        let nodefs = eviction::threshold_for(&c.eviction_hard, Signal::NodeFsAvailable).unwrap();
        assert_eq!(nodefs.value, ThresholdValue::Percentage(0.1));
        assert!(eviction::threshold_for(&c.eviction_hard, Signal::PidAvailable).is_none());
    }

    #[test]
    fn every_supported_field_is_read() {
        let c = config(
            "\
systemReserved: {cpu: 1, memory: 2Gi, ephemeral-storage: 10Gi, pid: \"1000\"}
kubeReserved: {cpu: 250m}
evictionHard: {memory.available: 5%, pid.available: 500}
mergeDefaultEvictionSettings: false
enforceNodeAllocatable: [pods, system-reserved-compressible]
systemReservedCgroup: /system.slice
kubeReservedCgroup: \"\"
cgroupDriver: systemd
cgroupRoot: /qosd
cgroupsPerQOS: true
featureGates: {MemoryQoS: true, CustomCPUCFSQuotaPeriod: true}
memoryThrottlingFactor: 0.8
podPidsLimit: 4096
cpuCFSQuota: false
cpuCFSQuotaPeriod: 50ms
cpuManagerPolicy: static
memoryManagerPolicy: Static
topologyManagerPolicy: single-numa-node
topologyManagerScope: pod
maxPods: 250
",
        );
        assert_eq!(
            c.system_reserved,
            ReservedResources {
                cpu: q("1"),
                memory: q("2Gi"),
                ephemeral_storage: q("10Gi"),
                pid: q("1000")
            }
        );
        assert_eq!(c.kube_reserved.milli_cpu(), 250);
        assert_eq!(
            c.eviction_hard.len(),
            2,
            "no defaults without mergeDefaultEvictionSettings"
        );
        assert_eq!(
            eviction::threshold_for(&c.eviction_hard, Signal::PidAvailable)
                .unwrap()
                .value,
            ThresholdValue::Quantity(Quantity::from_units(500))
        );
        assert!(c.enforces(EnforcementKey::SystemReservedCompressible));
        assert!(!c.enforces(EnforcementKey::SystemReserved));
        assert_eq!(
            c.kube_reserved_cgroup, None,
            "an empty cgroup name is unset"
        );
        assert_eq!(c.cgroup_driver, CgroupDriver::Systemd);
        assert_eq!(c.cgroup_root, "/qosd");
        assert!(c.memory_qos());
        assert!((c.memory_throttling_factor - 0.8).abs() < f64::EPSILON);
        assert_eq!(c.pod_pids_limit, 4096);
        assert!(!c.cpu_cfs_quota);
        assert_eq!(c.cpu_cfs_quota_period, Duration::from_millis(50));
        assert_eq!(c.cpu_manager_policy, "static");
        assert_eq!(c.memory_manager_policy, "Static");
        assert_eq!(c.topology_manager_policy, "single-numa-node");
        assert_eq!(c.topology_manager_scope, "pod");
        assert_eq!(c.max_pods, 250);
    }

    #[test]
    fn resource_manager_options_and_reserved_memory_are_parsed() {
        let c = config(
            "cpuManagerPolicyOptions: {full-pcpus-only: \"true\", distribute-cpus-across-numa: \"true\"}\n\
             topologyManagerPolicyOptions: {max-allowable-numa-nodes: 16}\n\
             reservedMemory:\n\
             - numaNode: 0\n  limits: {memory: 1Gi, hugepages-2Mi: 4Mi}\n\
             - numaNode: 1\n  limits: {memory: 512Mi}\n",
        );
        assert_eq!(
            c.cpu_manager_policy_options,
            BTreeMap::from([
                ("distribute-cpus-across-numa".to_owned(), "true".to_owned()),
                ("full-pcpus-only".to_owned(), "true".to_owned()),
            ])
        );
        assert_eq!(
            c.topology_manager_policy_options
                .get("max-allowable-numa-nodes"),
            Some(&"16".to_owned())
        );
        assert_eq!(c.reserved_memory.len(), 2);
        assert_eq!(c.reserved_memory[0].numa_node, 0);
        assert_eq!(c.reserved_memory[0].limits["memory"].value(), 1 << 30);
        assert_eq!(
            c.reserved_memory[0].limits["hugepages-2Mi"].value(),
            4 << 20
        );
        assert_eq!(c.reserved_memory[1].limits["memory"].value(), 512 << 20);
    }

    #[test]
    fn reserved_memory_is_validated_like_kubelet() {
        let errors = validation_errors(
            "reservedMemory:\n\
             - numaNode: 0\n  limits: {memory: 1Gi, cpu: 1}\n\
             - numaNode: 0\n  limits: {memory: 0}\n\
             - numaNode: -1\n  limits: {memory: 1Gi}\n",
        );
        assert!(
            errors.iter().any(|e| e.contains("reservedMemory[0]")
                && e.contains("the limit type \"cpu\" for NUMA node 0 is not supported")),
            "{errors:?}"
        );
        assert!(
            errors.iter().any(|e| e.contains("reservedMemory[1]")
                && e.contains("may not be zero for NUMA node 0 and resource \"memory\"")),
            "{errors:?}"
        );
        assert!(
            errors.iter().any(|e| e.contains("reservedMemory[1]")
                && e.contains("duplicate value for NUMA node 0 and resource \"memory\"")),
            "{errors:?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e.contains("reservedMemory[2].numaNode")),
            "{errors:?}"
        );
        let (field, reason, _) = invalid("cpuManagerPolicyOptions: {full-pcpus-only: true}\n");
        assert_eq!(field, "cpuManagerPolicyOptions.full-pcpus-only");
        assert!(reason.contains("expected a string"), "{reason}");
        let (field, reason, _) =
            invalid("reservedMemory:\n- numaNode: 0\n  limit: {memory: 1Gi}\n");
        assert!(field.starts_with("reservedMemory[0]"), "{field}");
        assert!(reason.contains("unknown field `limit`"), "{reason}");
    }

    #[test]
    fn reserved_system_cpus_are_parsed_and_exclusive_with_reserved_cgroups() {
        let c = config("reservedSystemCPUs: 0-1,4\n");
        assert_eq!(c.reserved_system_cpus.to_vec(), vec![0, 1, 4]);
        let errors =
            validation_errors("reservedSystemCPUs: 0-1\nsystemReservedCgroup: /system.slice\n");
        assert!(
            errors[0].contains("can't use reservedSystemCPUs"),
            "{errors:?}"
        );
        let errors = validation_errors("reservedSystemCPUs: 3-1\n");
        assert!(
            errors[0].contains("unable to parse reservedSystemCPUs") && errors[0].contains("3-1"),
            "{errors:?}"
        );
    }

    #[test]
    fn json_is_read_like_yaml() {
        let json = r#"{
  "apiVersion": "kubelet.config.k8s.io/v1beta1",
  "kind": "KubeletConfiguration",
  "systemReserved": {"cpu": "500m", "memory": "1Gi"},
  "enforceNodeAllocatable": ["pods", "system-reserved"],
  "systemReservedCgroup": "/system.slice",
  "staticPodPath": "/etc/kubernetes/manifests"
}"#;
        let loaded = parse_kubelet_config(json, Path::new("kubelet.json")).unwrap();
        let yaml = parse(
            "systemReserved: {cpu: 500m, memory: 1Gi}\nenforceNodeAllocatable: [pods, system-reserved]\n\
             systemReservedCgroup: /system.slice\nstaticPodPath: /etc/kubernetes/manifests\n",
        )
        .unwrap();
        assert_eq!(loaded.config, yaml.config);
        assert_eq!(loaded.unsupported_fields, ["staticPodPath"]);
        let err = parse_kubelet_config("{\"apiVersion\": ", Path::new("kubelet.json")).unwrap_err();
        assert!(matches!(err, ConfigError::Syntax { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("kubelet config file kubelet.json: not valid YAML or JSON"),
            "{err}"
        );
    }

    #[test]
    fn unknown_fields_are_errors_naming_them() {
        let err =
            parse("systemReserved: {cpu: 1}\nsystemReservd: {cpu: 1}\nfooBar: 1\n").unwrap_err();
        let ConfigError::UnknownFields { fields, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(fields, &["fooBar", "systemReservd"]);
        assert_eq!(
            err.to_string(),
            "kubelet config file /etc/kubernetes/kubelet.yaml: strict decoding error: unknown field \"fooBar\", \
             unknown field \"systemReservd\""
        );
        // Field names are case-sensitive, as in kubelet's strict decoding.
        let err = parse("SystemReserved: {cpu: 1}\n").unwrap_err();
        assert!(
            err.to_string().contains("unknown field \"SystemReserved\""),
            "{err}"
        );
    }

    #[test]
    fn real_but_unsupported_fields_are_reported_by_name() {
        let loaded = parse(
            "address: 0.0.0.0\nstaticPodPath: /etc/kubernetes/manifests\nauthentication:\n  anonymous: {enabled: false}\n\
             maxPods: 50\n",
        )
        .unwrap();
        assert_eq!(
            loaded.unsupported_fields,
            ["address", "authentication", "staticPodPath"]
        );
        assert_eq!(loaded.config.max_pods, 50);
    }

    #[test]
    fn supported_and_unsupported_field_lists_match_the_decoder() {
        for name in SUPPORTED_FIELDS {
            assert!(
                !UNSUPPORTED_FIELDS.contains(name),
                "{name} is in both lists"
            );
            let value = serde_json::json!({ *name: null });
            let decoded: Result<RawKubeletConfiguration, _> = serde_json::from_value(value);
            assert!(decoded.is_ok(), "{name}: {:?}", decoded.err());
        }
        let unique: BTreeSet<_> = UNSUPPORTED_FIELDS.iter().collect();
        assert_eq!(
            unique.len(),
            UNSUPPORTED_FIELDS.len(),
            "duplicate in UNSUPPORTED_FIELDS"
        );
    }

    #[test]
    fn api_version_and_kind_are_checked() {
        let cases = [
            (
                "kind: KubeletConfiguration\n",
                "apiVersion is missing, expected \"kubelet.config.k8s.io/v1beta1\"",
            ),
            (
                "apiVersion: kubelet.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n",
                "apiVersion is \"kubelet.config.k8s.io/v1alpha1\", expected \"kubelet.config.k8s.io/v1beta1\"",
            ),
            (
                "apiVersion: kubelet.config.k8s.io/v1beta1\n",
                "kind is missing, expected \"KubeletConfiguration\"",
            ),
            (
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n",
                "kind is \"KubeProxyConfiguration\", expected \"KubeletConfiguration\"",
            ),
        ];
        for (text, want) in cases {
            let err = parse_kubelet_config(text, Path::new("k.yaml")).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("kubelet config file k.yaml: {want}"),
                "{text}"
            );
        }
    }

    #[test]
    fn malformed_values_name_file_field_and_reason() {
        let (field, reason, text) = invalid("systemReserved: {cpu: abc}\n");
        assert_eq!(field, "systemReserved.cpu");
        assert!(reason.contains("\"abc\""), "{reason}");
        assert!(
            text.starts_with(
                "kubelet config file /etc/kubernetes/kubelet.yaml: systemReserved.cpu: "
            ),
            "{text}"
        );

        let (field, reason, _) = invalid("kubeReserved: {memory: -1Gi}\n");
        assert_eq!(
            (field.as_str(), reason.as_str()),
            (
                "kubeReserved.memory",
                "resource quantity cannot be negative: -1073741824"
            )
        );

        let (field, reason, _) = invalid("systemReserved: {hugepages-2Mi: 1Gi}\n");
        assert_eq!(field, "systemReserved");
        assert!(
            reason.starts_with("cannot reserve \"hugepages-2Mi\" resource"),
            "{reason}"
        );

        let (field, reason, _) = invalid("cgroupsPerQOS: \"yes\"\n");
        assert_eq!(field, "cgroupsPerQOS");
        assert!(reason.contains("expected a boolean"), "{reason}");

        let (field, reason, _) = invalid("cpuCFSQuotaPeriod: 100 ms\n");
        assert_eq!(field, "cpuCFSQuotaPeriod");
        assert!(reason.contains("100 ms"), "{reason}");

        let (field, reason, _) = invalid("evictionHard: {memory.available: -1}\n");
        assert_eq!(field, "evictionHard.memory.available");
        assert_eq!(
            reason,
            "eviction threshold memory.available must be positive: -1"
        );

        let (field, reason, _) = invalid("evictionHard: {memory.free: 1Gi}\n");
        assert_eq!(
            (field.as_str(), reason.as_str()),
            (
                "evictionHard.memory.free",
                "unsupported eviction signal memory.free"
            )
        );

        let (field, reason, _) = invalid("cgroupDriver: systemdd\n");
        assert_eq!(field, "cgroupDriver");
        assert!(reason.contains("\"systemdd\""), "{reason}");

        let (field, _, _) = invalid("enforceNodeAllocatable: pods\n");
        assert_eq!(field, "enforceNodeAllocatable");

        let (field, _, _) = invalid("maxPods: 5000000000\n");
        assert_eq!(field, "maxPods");

        let (field, _, _) = invalid("featureGates: {MemoryQoS: 1}\n");
        assert_eq!(field, "featureGates.MemoryQoS");
    }

    /// Rows mirror `validation_test.go` `TestValidateKubeletConfiguration` cases on
    /// enforceNodeAllocatable and the other fields qosd validates.
    #[test]
    fn validation_like_kubelet() {
        let cases: &[(&str, &[&str])] = &[
            (
                "enforceNodeAllocatable: [system-reserved]\n",
                &[
                    "systemReservedCgroup (--system-reserved-cgroup) must be specified when \"system-reserved\" or \
                   \"system-reserved-compressible\" included in enforceNodeAllocatable (--enforce-node-allocatable)",
                ],
            ),
            (
                "enforceNodeAllocatable: [kube-reserved-compressible]\n",
                &[
                    "kubeReservedCgroup (--kube-reserved-cgroup) must be specified when \"kube-reserved\" or \
                   \"kube-reserved-compressible\" included in enforceNodeAllocatable (--enforce-node-allocatable)",
                ],
            ),
            (
                "enforceNodeAllocatable: [pods, none]\n",
                &[
                    "enforceNodeAllocatable (--enforce-node-allocatable) may not contain additional enforcements when \
                   \"none\" is specified",
                ],
            ),
            (
                "enforceNodeAllocatable: [pods, pods]\n",
                &[
                    "duplicated enforcements \"pods\" in enforceNodeAllocatable (--enforce-node-allocatable)",
                ],
            ),
            (
                "enforceNodeAllocatable: [illegal-key]\n",
                &[
                    "option \"illegal-key\" specified for enforceNodeAllocatable (--enforce-node-allocatable). Valid \
                   options are \"pods\", \"system-reserved\", \"system-reserved-compressible\", \"kube-reserved\", \
                   \"kube-reserved-compressible\" or \"none\"",
                ],
            ),
            (
                "enforceNodeAllocatable: [system-reserved, system-reserved-compressible]\nsystemReservedCgroup: /s\n",
                &[
                    "both \"system-reserved\" and \"system-reserved-compressible\" cannot be specified together in \
                   enforceNodeAllocatable (--enforce-node-allocatable)",
                ],
            ),
            // The default [pods] needs the QoS hierarchy.
            (
                "cgroupsPerQOS: false\n",
                &[
                    "cgroupsPerQOS (--cgroups-per-qos) must be set to true when \"pods\" contained in \
                   enforceNodeAllocatable (--enforce-node-allocatable)",
                ],
            ),
            (
                "cpuCFSQuotaPeriod: 50ms\n",
                &[
                    "cpuCFSQuotaPeriod (--cpu-cfs-quota-period) 50ms requires feature gate CustomCPUCFSQuotaPeriod",
                ],
            ),
            (
                "cpuCFSQuotaPeriod: 2s\nfeatureGates: {CustomCPUCFSQuotaPeriod: true}\n",
                &[
                    "cpuCFSQuotaPeriod (--cpu-cfs-quota-period) 2s must be between 1ms and 1sec, inclusive",
                ],
            ),
            (
                "maxPods: -1\n",
                &["maxPods (--max-pods) -1 must not be a negative number"],
            ),
            (
                "memoryThrottlingFactor: 1.1\n",
                &[
                    "memoryThrottlingFactor 1.1 must be greater than 0 and less than or equal to 1.0",
                ],
            ),
            (
                "memoryThrottlingFactor: 0\n",
                &["memoryThrottlingFactor 0 must be greater than 0 and less than or equal to 1.0"],
            ),
            (
                "topologyManagerPolicy: invalid-policy\n",
                &[
                    "topologyManagerPolicy (--topology-manager-policy) \"invalid-policy\" must be one of: [\"none\", \
                   \"best-effort\", \"restricted\", \"single-numa-node\"]",
                ],
            ),
            (
                "topologyManagerScope: invalid-scope\n",
                &[
                    "topologyManagerScope (--topology-manager-scope) \"invalid-scope\" must be one of: \"container\", or \"pod\"",
                ],
            ),
        ];
        for (body, want) in cases {
            assert_eq!(validation_errors(body), *want, "{body}");
        }
        // All findings are reported together, like kubelet's aggregate.
        let errors = validation_errors("maxPods: -1\nmemoryThrottlingFactor: 2\n");
        assert_eq!(errors.len(), 2, "{errors:?}");
        let err = parse("maxPods: -1\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "kubelet config file /etc/kubernetes/kubelet.yaml: invalid configuration: maxPods (--max-pods) -1 must \
             not be a negative number"
        );
        // Valid combinations.
        let c = config("cgroupsPerQOS: false\nenforceNodeAllocatable: []\n");
        assert!(c.enforce_node_allocatable.is_empty());
        assert_eq!(
            c.cgroup_root, "",
            "kubelet only defaults cgroupRoot with cgroupsPerQOS"
        );
        assert!(
            config("enforceNodeAllocatable: [none]\n")
                .enforce_node_allocatable
                .is_empty()
        );
        let c = config("cpuCFSQuotaPeriod: 1s\nfeatureGates: {CustomCPUCFSQuotaPeriod: true}\n");
        assert_eq!(c.cpu_cfs_quota_period, Duration::from_secs(1));
    }

    #[test]
    fn eviction_hard_defaults_and_merge() {
        let signals = |c: &KubeletConfiguration| -> Vec<&str> {
            c.eviction_hard.iter().map(|t| t.signal.as_str()).collect()
        };
        // Unset (or null): kubelet's defaults.
        assert_eq!(
            config("evictionHard:\n").eviction_hard,
            KubeletConfiguration::default().eviction_hard
        );
        // Set: only the given signals.
        let c = config("evictionHard: {memory.available: 1Gi}\n");
        assert_eq!(signals(&c), ["memory.available"]);
        assert_eq!(
            c.eviction_hard[0].value,
            ThresholdValue::Quantity(Quantity::from_units(1 << 30))
        );
        // Explicitly empty: none at all.
        assert!(config("evictionHard: {}\n").eviction_hard.is_empty());
        // Merged: defaults plus overrides; 0% switches a default off.
        let c = config(
            "evictionHard: {memory.available: 1Gi, nodefs.available: 0%}\nmergeDefaultEvictionSettings: true\n",
        );
        assert_eq!(
            signals(&c),
            [
                "imagefs.available",
                "imagefs.inodesFree",
                "memory.available",
                "nodefs.inodesFree"
            ]
        );
        assert_eq!(
            eviction::threshold_for(&c.eviction_hard, Signal::MemoryAvailable)
                .unwrap()
                .value,
            ThresholdValue::Quantity(Quantity::from_units(1 << 30))
        );
    }

    #[test]
    fn pod_pids_limit_and_max_pods_defaults() {
        assert_eq!(config("podPidsLimit: -5\n").pod_pids_limit, -1);
        assert_eq!(config("podPidsLimit: 0\n").pod_pids_limit, 0);
        assert_eq!(config("maxPods: 0\n").max_pods, 110);
    }

    #[test]
    fn documents_that_are_not_configurations() {
        let path = Path::new("k.yaml");
        assert!(matches!(
            parse_kubelet_config("", path),
            Err(ConfigError::Empty { .. })
        ));
        let err = parse_kubelet_config("# only a comment\n", path).unwrap_err();
        assert_eq!(
            err.to_string(),
            "kubelet config file k.yaml: expected a mapping of fields, found nothing (null)"
        );
        let err = parse_kubelet_config("- a\n- b\n", path).unwrap_err();
        assert_eq!(
            err.to_string(),
            "kubelet config file k.yaml: expected a mapping of fields, found a list"
        );
        let err = parse_kubelet_config("apiVersion: [\n", path).unwrap_err();
        assert!(matches!(err, ConfigError::Syntax { .. }), "{err}");
        // Duplicate keys are rejected, like go-yaml's "mapping key already defined".
        let err = parse("maxPods: 1\nmaxPods: 2\n").unwrap_err();
        assert!(matches!(err, ConfigError::Syntax { .. }), "{err}");
        assert!(err.to_string().contains("maxPods"), "{err}");
    }

    #[test]
    fn loads_from_a_file_and_names_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, format!("{HEADER}kubeReserved: {{memory: 512Mi}}\n")).unwrap();
        let loaded = load_kubelet_config(&path).unwrap();
        assert_eq!(loaded.path, path);
        assert_eq!(loaded.config.kube_reserved.memory_bytes(), 512 << 20);
        let missing = dir.path().join("nope.yaml");
        let err = load_kubelet_config(&missing).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }));
        assert!(
            err.to_string().contains(&missing.display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn go_durations() {
        let ok = [
            ("0", Duration::ZERO),
            ("100ms", Duration::from_millis(100)),
            ("1.5s", Duration::from_millis(1500)),
            (".5s", Duration::from_millis(500)),
            ("1m30s", Duration::from_secs(90)),
            ("2h", Duration::from_secs(7200)),
            ("250us", Duration::from_micros(250)),
            ("250µs", Duration::from_micros(250)),
            ("10ns", Duration::from_nanos(10)),
            ("+1s", Duration::from_secs(1)),
        ];
        for (text, want) in ok {
            assert_eq!(parse_go_duration(text), Ok(want), "{text}");
        }
        for bad in ["", "1", "s", "1x", "-1s", "1.2.3s", "100 ms", "9999999999h"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }
}
