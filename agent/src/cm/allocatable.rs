//! Node allocatable: what the node offers pods once the system and kube reservations and the
//! hard eviction thresholds are taken out of machine capacity, and the absolute limits kubelet
//! enforces on cgroups for `enforceNodeAllocatable`, as `pkg/kubelet/cm/node_container_manager_linux.go`
//! (`GetNodeAllocatableReservation`, `GetNodeAllocatableAbsolute`, `enforceNodeAllocatableCgroups`,
//! `validateNodeAllocatable`) and `pkg/kubelet/nodestatus/setters.go` (allocatable in the node
//! status) compute them.
//!
//! Values are plain integers (millicores, bytes, pids, hugepage bytes by page size); mapping them
//! to cgroup files (CPU shares, `memory.max`, `pids.max`, hugetlb limits) is the cgroup layer's job.
//! [`Capacity`] is filled from the machine by [`crate::cm::capacity`].
use std::collections::BTreeMap;

use crate::config::eviction::{Signal, Threshold, threshold_for};
use crate::config::kubelet::{EnforcementKey, KubeletConfiguration, ReservedResources};

/// Errors in the node allocatable configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocatableError {
    /// kubelet's `validateNodeAllocatable`: reservations larger than capacity.
    #[error("invalid Node Allocatable configuration. {}", .problems.join(" "))]
    ReservationExceedsCapacity { problems: Vec<String> },
    /// A reserved cgroup is to be enforced but nothing is reserved for it
    /// (kubelet's `enforceExistingCgroup`: "cgroup is not configured properly").
    #[error(
        "{cgroup:?} cgroup is not configured properly: {key} is enforced but nothing is reserved"
    )]
    NothingReserved { key: EnforcementKey, cgroup: String },
    /// A reserved cgroup is to be enforced but has no name (the configuration validation
    /// prevents this for loaded files; the check guards hand-built configurations).
    #[error("{key} is enforced but no cgroup is named for it")]
    NoReservedCgroup { key: EnforcementKey },
}

/// Machine capacity, as the container manager sees it (`cm.capacity` plus the pid entry of
/// kubelet's `internalCapacity`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Capacity {
    /// Online CPUs × 1000.
    pub milli_cpu: i64,
    /// `MemTotal`, bytes.
    pub memory_bytes: i64,
    /// Pre-allocated huge pages: page size in bytes -> total bytes (pages × size).
    pub hugepages: BTreeMap<u64, i64>,
    /// The system-wide task limit (`min(kernel.pid_max, kernel.threads-max)`), if readable.
    pub pids: Option<i64>,
}

impl Capacity {
    /// Bytes of memory held by pre-allocated huge pages, all sizes together.
    #[must_use]
    pub fn hugepages_bytes(&self) -> i64 {
        self.hugepages
            .values()
            .fold(0i64, |sum, b| sum.saturating_add(*b))
    }
}

/// The part of the kubelet configuration node allocatable depends on (kubelet's
/// `NodeAllocatableConfig` plus the switches that change enforcement).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeAllocatableConfig {
    pub system_reserved: ReservedResources,
    pub kube_reserved: ReservedResources,
    pub hard_eviction_thresholds: Vec<Threshold>,
    pub enforce: std::collections::BTreeSet<EnforcementKey>,
    pub system_reserved_cgroup: Option<String>,
    pub kube_reserved_cgroup: Option<String>,
    pub cgroups_per_qos: bool,
    /// The MemoryQoS feature gate: reserved cgroups also get `memory.min` = their reservation.
    pub memory_qos: bool,
    /// `maxPods`: the pod count capacity.
    pub max_pods: i64,
}

impl NodeAllocatableConfig {
    /// The node allocatable settings of a loaded configuration.
    #[must_use]
    pub fn from_kubelet(config: &KubeletConfiguration) -> Self {
        Self {
            system_reserved: config.system_reserved,
            kube_reserved: config.kube_reserved,
            hard_eviction_thresholds: config.eviction_hard.clone(),
            enforce: config.enforce_node_allocatable.clone(),
            system_reserved_cgroup: config.system_reserved_cgroup.clone(),
            kube_reserved_cgroup: config.kube_reserved_cgroup.clone(),
            cgroups_per_qos: config.cgroups_per_qos,
            memory_qos: config.memory_qos(),
            max_pods: config.max_pods,
        }
    }
}

/// What is held back from scheduling (`GetNodeAllocatableReservation`): system + kube reserved +
/// hard eviction threshold, per resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reservation {
    pub milli_cpu: i64,
    /// Includes the `memory.available` threshold (a percentage is of memory capacity).
    pub memory_bytes: i64,
    /// Includes the `pid.available` threshold (a percentage is of pid capacity). kubelet keeps no
    /// pid reservation for scheduling; qosd uses this for [`NodeAllocatable::pids`].
    pub pids: i64,
}

/// Node allocatable for admission (kubelet's `node.status.allocatable`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeAllocatable {
    pub milli_cpu: i64,
    /// Capacity − reservation, then − the memory held by huge pages (nodestatus setters).
    pub memory_bytes: i64,
    /// Huge pages by page size (bytes); nothing can be reserved from them.
    pub hugepages: BTreeMap<u64, i64>,
    /// Pid capacity − reservation (qosd extension; `None` when pid capacity is unknown).
    pub pids: Option<i64>,
    /// How many pods may run (`maxPods`).
    pub pods: i64,
}

/// Absolute limits for one cgroup; `None` leaves the setting alone.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CgroupLimits {
    /// CPU weight source in millicores (kubelet writes `MilliCPUToShares` of it).
    pub milli_cpu: Option<i64>,
    /// Memory limit in bytes.
    pub memory_bytes: Option<i64>,
    /// cgroup v2 `memory.min` in bytes (MemoryQoS on reserved cgroups).
    pub memory_min_bytes: Option<i64>,
    /// Task limit.
    pub pids: Option<i64>,
    /// Huge page limits: page size in bytes -> bytes.
    pub hugepages: BTreeMap<u64, i64>,
}

impl CgroupLimits {
    /// The cgroup values of these limits (kubelet writes `MilliCPUToShares` of the CPU).
    #[must_use]
    pub fn to_resource_config(&self) -> crate::cgroup::resources::ResourceConfig {
        use crate::cgroup::resources::{Limit, ResourceConfig, milli_cpu_to_shares};
        ResourceConfig {
            cpu_shares: self.milli_cpu.map(milli_cpu_to_shares),
            memory_limit: self.memory_bytes.map(Limit::from_signed),
            memory_min: self.memory_min_bytes.and_then(|m| u64::try_from(m).ok()),
            pids_limit: self.pids.map(Limit::from_signed),
            hugetlb_limits: self
                .hugepages
                .iter()
                .map(|(size, bytes)| (*size, Limit::from_signed(*bytes)))
                .collect(),
            ..ResourceConfig::default()
        }
    }
}

/// A reserved cgroup and the limits it is held to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservedCgroupLimits {
    /// The configured name (`systemReservedCgroup` / `kubeReservedCgroup`), e.g. `/system.slice`.
    pub cgroup: String,
    pub limits: CgroupLimits,
}

/// Every cgroup limit node allocatable enforcement sets (`enforceNodeAllocatableCgroups`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Enforcement {
    /// The kubepods cgroup (under cgroupRoot). kubelet updates it whenever cgroupsPerQOS is on:
    /// with `pods` enforced it gets capacity − system reserved − kube reserved (the eviction
    /// threshold is not taken out), otherwise the whole capacity so its CPU weight is not the
    /// low default. `None` without cgroupsPerQOS (there is no kubepods cgroup).
    pub kubepods: Option<CgroupLimits>,
    /// `system-reserved` / `system-reserved-compressible`.
    pub system_reserved: Option<ReservedCgroupLimits>,
    /// `kube-reserved` / `kube-reserved-compressible`.
    pub kube_reserved: Option<ReservedCgroupLimits>,
}

fn threshold_units(thresholds: &[Threshold], signal: Signal, capacity: i64) -> i64 {
    threshold_for(thresholds, signal).map_or(0, |t| t.value.units_of(capacity))
}

/// `GetNodeAllocatableReservation`.
#[must_use]
pub fn reservation(capacity: &Capacity, config: &NodeAllocatableConfig) -> Reservation {
    let (system, kube) = (&config.system_reserved, &config.kube_reserved);
    let thresholds = &config.hard_eviction_thresholds;
    Reservation {
        milli_cpu: system.milli_cpu().saturating_add(kube.milli_cpu()),
        memory_bytes: system
            .memory_bytes()
            .saturating_add(kube.memory_bytes())
            .saturating_add(threshold_units(
                thresholds,
                Signal::MemoryAvailable,
                capacity.memory_bytes,
            )),
        pids: system
            .pids()
            .saturating_add(kube.pids())
            .saturating_add(threshold_units(
                thresholds,
                Signal::PidAvailable,
                capacity.pids.unwrap_or(0),
            )),
    }
}

/// Node allocatable for admission: capacity − reservation, clamped at 0, with huge pages taken
/// out of memory.
#[must_use]
pub fn node_allocatable(capacity: &Capacity, config: &NodeAllocatableConfig) -> NodeAllocatable {
    let reserved = reservation(capacity, config);
    let memory = clamp(capacity.memory_bytes.saturating_sub(reserved.memory_bytes));
    NodeAllocatable {
        milli_cpu: clamp(capacity.milli_cpu.saturating_sub(reserved.milli_cpu)),
        memory_bytes: clamp(memory.saturating_sub(capacity.hugepages_bytes())),
        hugepages: capacity.hugepages.clone(),
        pids: capacity
            .pids
            .map(|p| clamp(p.saturating_sub(reserved.pids))),
        pods: config.max_pods,
    }
}

/// `validateNodeAllocatable`: every reservation must fit in capacity.
pub fn validate(
    capacity: &Capacity,
    config: &NodeAllocatableConfig,
) -> Result<(), AllocatableError> {
    let reserved = reservation(capacity, config);
    let mut problems = Vec::new();
    let mut check = |name: &str, reservation: i64, capacity: i64, show: fn(i64) -> String| {
        if reservation > capacity {
            problems.push(format!(
                "Resource {name:?} has a reservation of {} but capacity of {}. Expected capacity >= reservation.",
                show(reservation),
                show(capacity)
            ));
        }
    };
    let millis = |v: i64| crate::pods::quantity::Quantity::from_millis(v).to_string();
    let units = |v: i64| v.to_string();
    check("cpu", reserved.milli_cpu, capacity.milli_cpu, millis);
    check(
        "memory",
        reserved.memory_bytes,
        capacity.memory_bytes,
        units,
    );
    if let Some(pids) = capacity.pids {
        check("pid", reserved.pids, pids, units);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(AllocatableError::ReservationExceedsCapacity { problems })
    }
}

/// The limits `enforceNodeAllocatableCgroups` writes.
pub fn enforcement(
    capacity: &Capacity,
    config: &NodeAllocatableConfig,
) -> Result<Enforcement, AllocatableError> {
    let kubepods = config.cgroups_per_qos.then(|| {
        let (system, kube) = (&config.system_reserved, &config.kube_reserved);
        let enforce_pods = config.enforce.contains(&EnforcementKey::Pods);
        // getNodeAllocatableInternalAbsolute: capacity − system − kube, clamped at 0.
        let minus = |cap: i64, sys: i64, kub: i64| {
            if enforce_pods {
                clamp(cap.saturating_sub(sys).saturating_sub(kub))
            } else {
                cap
            }
        };
        CgroupLimits {
            milli_cpu: Some(minus(
                capacity.milli_cpu,
                system.milli_cpu(),
                kube.milli_cpu(),
            )),
            memory_bytes: Some(minus(
                capacity.memory_bytes,
                system.memory_bytes(),
                kube.memory_bytes(),
            )),
            memory_min_bytes: None,
            pids: capacity.pids.map(|p| minus(p, system.pids(), kube.pids())),
            hugepages: capacity.hugepages.clone(),
        }
    });
    let reserved_cgroup = |plain: EnforcementKey,
                           compressible: EnforcementKey,
                           cgroup: &Option<String>,
                           reserved: &ReservedResources|
     -> Result<Option<ReservedCgroupLimits>, AllocatableError> {
        let key = if config.enforce.contains(&plain) {
            plain
        } else if config.enforce.contains(&compressible) {
            compressible
        } else {
            return Ok(None);
        };
        let cgroup = cgroup
            .clone()
            .ok_or(AllocatableError::NoReservedCgroup { key })?;
        if reserved.is_empty() {
            return Err(AllocatableError::NothingReserved { key, cgroup });
        }
        let limits = if key == compressible {
            CgroupLimits {
                milli_cpu: reserved.cpu.map(|q| q.milli_value()),
                ..CgroupLimits::default()
            }
        } else {
            let memory = reserved.memory.map(|q| q.value());
            CgroupLimits {
                milli_cpu: reserved.cpu.map(|q| q.milli_value()),
                memory_bytes: memory,
                memory_min_bytes: memory.filter(|_| config.memory_qos),
                pids: reserved.pid.map(|q| q.value()),
                hugepages: BTreeMap::new(),
            }
        };
        Ok(Some(ReservedCgroupLimits { cgroup, limits }))
    };
    Ok(Enforcement {
        kubepods,
        system_reserved: reserved_cgroup(
            EnforcementKey::SystemReserved,
            EnforcementKey::SystemReservedCompressible,
            &config.system_reserved_cgroup,
            &config.system_reserved,
        )?,
        kube_reserved: reserved_cgroup(
            EnforcementKey::KubeReserved,
            EnforcementKey::KubeReservedCompressible,
            &config.kube_reserved_cgroup,
            &config.kube_reserved,
        )?,
    })
}

fn clamp(v: i64) -> i64 {
    v.max(0)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::*;
    use crate::config::eviction::ThresholdValue;
    use crate::config::kubelet::parse_kubelet_config;
    use crate::pods::quantity::Quantity;

    const GI: i64 = 1 << 30;
    const MI: i64 = 1 << 20;

    fn reserved(cpu: &str, memory: &str) -> ReservedResources {
        let q = |s: &str| (!s.is_empty()).then(|| Quantity::parse(s).unwrap());
        ReservedResources {
            cpu: q(cpu),
            memory: q(memory),
            ..Default::default()
        }
    }

    fn capacity(milli_cpu: i64, memory_bytes: i64) -> Capacity {
        Capacity {
            milli_cpu,
            memory_bytes,
            hugepages: BTreeMap::new(),
            pids: None,
        }
    }

    fn memory_threshold(value: Option<ThresholdValue>) -> Vec<Threshold> {
        value
            .map(|value| Threshold {
                signal: Signal::MemoryAvailable,
                value,
            })
            .into_iter()
            .collect()
    }

    fn node_config(
        kube: ReservedResources,
        system: ReservedResources,
        thresholds: Vec<Threshold>,
    ) -> NodeAllocatableConfig {
        NodeAllocatableConfig {
            system_reserved: system,
            kube_reserved: kube,
            hard_eviction_thresholds: thresholds,
            enforce: BTreeSet::from([EnforcementKey::Pods]),
            system_reserved_cgroup: None,
            kube_reserved_cgroup: None,
            cgroups_per_qos: true,
            memory_qos: false,
            max_pods: 110,
        }
    }

    fn from_yaml(body: &str) -> NodeAllocatableConfig {
        let text = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{body}"
        );
        NodeAllocatableConfig::from_kubelet(
            &parse_kubelet_config(&text, Path::new("k.yaml"))
                .unwrap()
                .config,
        )
    }

    fn abs_100mi() -> Option<ThresholdValue> {
        Some(ThresholdValue::Quantity(Quantity::from_units(100 * MI)))
    }

    /// Rows of node_container_manager_linux_test.go `TestNodeAllocatableReservationForScheduling`
    /// (cpu/memory cases; the row whose capacity has no memory cannot occur on a machine).
    #[test]
    fn reservation_for_scheduling() {
        let five_percent = Some(ThresholdValue::Percentage(0.05));
        #[allow(
            clippy::type_complexity,
            reason = "table-driven test cases: one tuple per kubelet case"
        )]
        let rows: [(
            ReservedResources,
            ReservedResources,
            Option<ThresholdValue>,
            i64,
            i64,
        ); 6] = [
            (
                reserved("100m", "100Mi"),
                reserved("50m", "50Mi"),
                None,
                150,
                150 * MI,
            ),
            (
                reserved("100m", "100Mi"),
                reserved("50m", "50Mi"),
                abs_100mi(),
                150,
                250 * MI,
            ),
            (
                reserved("100m", "100Mi"),
                reserved("50m", "50Mi"),
                five_percent,
                150,
                694_157_320,
            ),
            (reserved("", ""), reserved("", ""), None, 0, 0),
            (
                reserved("", "100Mi"),
                reserved("50m", "50Mi"),
                None,
                50,
                150 * MI,
            ),
            (
                reserved("50m", "100Mi"),
                reserved("", "50Mi"),
                None,
                50,
                150 * MI,
            ),
        ];
        for (i, (kube, system, threshold, want_cpu, want_memory)) in rows.into_iter().enumerate() {
            let config = node_config(kube, system, memory_threshold(threshold));
            let got = reservation(&capacity(10_000, 10 * GI), &config);
            assert_eq!(
                (got.milli_cpu, got.memory_bytes),
                (want_cpu, want_memory),
                "test case {}",
                i + 1
            );
            let allocatable = node_allocatable(&capacity(10_000, 10 * GI), &config);
            assert_eq!(
                allocatable.milli_cpu,
                10_000 - want_cpu,
                "test case {}",
                i + 1
            );
            assert_eq!(
                allocatable.memory_bytes,
                10 * GI - want_memory,
                "test case {}",
                i + 1
            );
        }
    }

    /// Rows of `TestNodeAllocatableForEnforcement`: the kubepods limits ignore the eviction threshold.
    #[test]
    fn allocatable_for_enforcement() {
        let five_percent = Some(ThresholdValue::Percentage(0.05));
        #[allow(
            clippy::type_complexity,
            reason = "table-driven test cases: one tuple per kubelet case"
        )]
        let rows: [(
            ReservedResources,
            ReservedResources,
            Option<ThresholdValue>,
            i64,
            i64,
        ); 6] = [
            (
                reserved("100m", "100Mi"),
                reserved("50m", "50Mi"),
                None,
                9850,
                10090 * MI,
            ),
            (
                reserved("100m", "100Mi"),
                reserved("50m", "50Mi"),
                abs_100mi(),
                9850,
                10090 * MI,
            ),
            (
                reserved("100m", "100Mi"),
                reserved("50m", "50Mi"),
                five_percent,
                9850,
                10090 * MI,
            ),
            (reserved("", ""), reserved("", ""), None, 10_000, 10 * GI),
            (
                reserved("", "100Mi"),
                reserved("50m", "50Mi"),
                None,
                9950,
                10090 * MI,
            ),
            (
                reserved("50m", "100Mi"),
                reserved("", "50Mi"),
                None,
                9950,
                10090 * MI,
            ),
        ];
        for (i, (kube, system, threshold, want_cpu, want_memory)) in rows.into_iter().enumerate() {
            let config = node_config(kube, system, memory_threshold(threshold));
            let got = enforcement(&capacity(10_000, 10 * GI), &config).unwrap();
            let kubepods = got.kubepods.expect("kubepods");
            assert_eq!(kubepods.milli_cpu, Some(want_cpu), "test case {}", i + 1);
            assert_eq!(
                kubepods.memory_bytes,
                Some(want_memory),
                "test case {}",
                i + 1
            );
            assert_eq!((got.system_reserved, got.kube_reserved), (None, None));
        }
    }

    /// Rows of `TestNodeAllocatableInputValidation` (cpu/memory cases).
    #[test]
    fn input_validation() {
        let high = Some(ThresholdValue::Quantity(Quantity::from_units(2 * GI)));
        let five_percent = Some(ThresholdValue::Percentage(0.05));
        #[allow(
            clippy::type_complexity,
            reason = "table-driven test cases: one tuple per kubelet case"
        )]
        let rows: [(
            ReservedResources,
            ReservedResources,
            Option<ThresholdValue>,
            Capacity,
            bool,
        ); 7] = [
            (
                reserved("100m", "100Mi"),
                reserved("50m", "50Mi"),
                None,
                capacity(10_000, 10 * GI),
                false,
            ),
            (
                reserved("100m", "100Mi"),
                reserved("50m", "50Mi"),
                abs_100mi(),
                capacity(10_000, 10 * GI),
                false,
            ),
            (
                reserved("100m", "100Mi"),
                reserved("50m", "50Mi"),
                five_percent,
                capacity(10_000, 10 * GI),
                false,
            ),
            (
                reserved("", ""),
                reserved("", ""),
                None,
                capacity(10_000, 10 * GI),
                false,
            ),
            (
                reserved("", "100Mi"),
                reserved("50m", "50Mi"),
                None,
                capacity(10_000, 10 * GI),
                false,
            ),
            (
                reserved("50m", "100Mi"),
                reserved("", "50Mi"),
                None,
                capacity(10_000, 10 * GI),
                false,
            ),
            (
                reserved("5", "10Gi"),
                reserved("5", "10Gi"),
                high,
                capacity(10_000, 11 * GI),
                true,
            ),
        ];
        for (i, (kube, system, threshold, cap, invalid)) in rows.into_iter().enumerate() {
            let result = validate(
                &cap,
                &node_config(kube, system, memory_threshold(threshold)),
            );
            assert_eq!(result.is_err(), invalid, "test case {}: {result:?}", i + 1);
        }
        let err = validate(
            &capacity(10_000, 11 * GI),
            &node_config(
                reserved("5", "10Gi"),
                reserved("5500m", "10Gi"),
                memory_threshold(high),
            ),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid Node Allocatable configuration. Resource \"cpu\" has a reservation of 10500m but capacity of \
             10. Expected capacity >= reservation. Resource \"memory\" has a reservation of 23622320128 but \
             capacity of 11811160064. Expected capacity >= reservation."
        );
    }

    /// Node status allocatable memory excludes pre-allocated huge pages (nodestatus setters).
    #[test]
    fn hugepages_come_out_of_allocatable_memory() {
        let mut cap = capacity(4000, 8 * GI);
        cap.hugepages.insert(2 * MI as u64, 512 * MI);
        cap.hugepages.insert(GI as u64, GI);
        let config = node_config(
            reserved("", "1Gi"),
            reserved("", ""),
            memory_threshold(abs_100mi()),
        );
        let allocatable = node_allocatable(&cap, &config);
        assert_eq!(
            allocatable.memory_bytes,
            8 * GI - GI - 100 * MI - 512 * MI - GI
        );
        assert_eq!(allocatable.hugepages, cap.hugepages);
        // Clamped at zero, like kubelet.
        cap.hugepages.insert(2 * MI as u64, 16 * GI);
        assert_eq!(node_allocatable(&cap, &config).memory_bytes, 0);
        // The kubepods cgroup keeps all memory (huge pages are limited separately by hugetlb).
        let kubepods = enforcement(&cap, &config).unwrap().kubepods.unwrap();
        assert_eq!(kubepods.memory_bytes, Some(7 * GI));
        assert_eq!(kubepods.hugepages, cap.hugepages);
    }

    #[test]
    fn reservations_larger_than_capacity_clamp_at_zero() {
        let config = node_config(reserved("8", "6Gi"), reserved("4", "4Gi"), vec![]);
        let cap = capacity(10_000, 8 * GI);
        let allocatable = node_allocatable(&cap, &config);
        assert_eq!((allocatable.milli_cpu, allocatable.memory_bytes), (0, 0));
        let kubepods = enforcement(&cap, &config).unwrap().kubepods.unwrap();
        assert_eq!(
            (kubepods.milli_cpu, kubepods.memory_bytes),
            (Some(0), Some(0))
        );
        assert!(validate(&cap, &config).is_err());
    }

    #[test]
    fn pids_reserved_and_pid_eviction() {
        let mut cap = capacity(4000, 8 * GI);
        cap.pids = Some(100_000);
        let config = from_yaml(
            "systemReserved: {pid: \"1000\"}\nkubeReserved: {pid: 500}\nevictionHard: {pid.available: 10%}\n",
        );
        assert_eq!(reservation(&cap, &config).pids, 1500 + 10_000);
        assert_eq!(node_allocatable(&cap, &config).pids, Some(100_000 - 11_500));
        // kubepods' pids.max takes out the reservations only, not the eviction threshold.
        assert_eq!(
            enforcement(&cap, &config).unwrap().kubepods.unwrap().pids,
            Some(98_500)
        );
        // Without a known pid capacity there is no pid limit to compute.
        cap.pids = None;
        assert_eq!(node_allocatable(&cap, &config).pids, None);
        assert_eq!(
            enforcement(&cap, &config).unwrap().kubepods.unwrap().pids,
            None
        );
    }

    /// The brief's example: pods, kube-reserved and system-reserved all enforced.
    #[test]
    fn enforcement_of_reserved_cgroups() {
        let config = from_yaml(
            "systemReserved: {cpu: \"500m\", memory: \"1Gi\"}\nkubeReserved: {cpu: \"500m\", memory: \"1Gi\"}\n\
             enforceNodeAllocatable: [pods, kube-reserved, system-reserved]\nsystemReservedCgroup: /system.slice\n\
             kubeReservedCgroup: /kubelet.slice\n",
        );
        let cap = Capacity {
            milli_cpu: 4000,
            memory_bytes: 16 * GI,
            hugepages: BTreeMap::new(),
            pids: Some(4_194_304),
        };
        let got = enforcement(&cap, &config).unwrap();
        let kubepods = got.kubepods.unwrap();
        assert_eq!(kubepods.milli_cpu, Some(3000));
        assert_eq!(kubepods.memory_bytes, Some(14 * GI));
        assert_eq!(kubepods.pids, Some(4_194_304));
        let want = CgroupLimits {
            milli_cpu: Some(500),
            memory_bytes: Some(GI),
            ..CgroupLimits::default()
        };
        assert_eq!(
            got.system_reserved,
            Some(ReservedCgroupLimits {
                cgroup: "/system.slice".into(),
                limits: want.clone()
            })
        );
        assert_eq!(
            got.kube_reserved,
            Some(ReservedCgroupLimits {
                cgroup: "/kubelet.slice".into(),
                limits: want
            })
        );
        // Scheduling also takes out the default memory.available<100Mi.
        let allocatable = node_allocatable(&cap, &config);
        assert_eq!(
            (
                allocatable.milli_cpu,
                allocatable.memory_bytes,
                allocatable.pods
            ),
            (3000, 14 * GI - 100 * MI, 110)
        );
    }

    #[test]
    fn compressible_enforcement_limits_cpu_only_and_memory_qos_sets_memory_min() {
        let config = from_yaml(
            "systemReserved: {cpu: 1, memory: 2Gi, pid: 100}\nkubeReserved: {cpu: 250m, memory: 512Mi}\n\
             enforceNodeAllocatable: [pods, system-reserved-compressible, kube-reserved]\n\
             systemReservedCgroup: /system.slice\nkubeReservedCgroup: /kube.slice\nfeatureGates: {MemoryQoS: true}\n",
        );
        let got = enforcement(&capacity(8000, 32 * GI), &config).unwrap();
        assert_eq!(
            got.system_reserved.unwrap().limits,
            CgroupLimits {
                milli_cpu: Some(1000),
                ..CgroupLimits::default()
            }
        );
        assert_eq!(
            got.kube_reserved.unwrap().limits,
            CgroupLimits {
                milli_cpu: Some(250),
                memory_bytes: Some(512 * MI),
                memory_min_bytes: Some(512 * MI),
                ..CgroupLimits::default()
            }
        );
    }

    #[test]
    fn kubepods_without_pods_enforcement_or_qos_cgroups() {
        // Without `pods`, kubepods still gets the whole capacity (kubelet raises its CPU weight).
        let config =
            from_yaml("systemReserved: {cpu: 1, memory: 1Gi}\nenforceNodeAllocatable: []\n");
        let kubepods = enforcement(&capacity(8000, 32 * GI), &config)
            .unwrap()
            .kubepods
            .unwrap();
        assert_eq!(
            (kubepods.milli_cpu, kubepods.memory_bytes),
            (Some(8000), Some(32 * GI))
        );
        // ... while scheduling still honours the reservation.
        assert_eq!(
            node_allocatable(&capacity(8000, 32 * GI), &config).milli_cpu,
            7000
        );
        // Without cgroupsPerQOS there is no kubepods cgroup.
        let config = from_yaml("cgroupsPerQOS: false\nenforceNodeAllocatable: [none]\n");
        assert_eq!(
            enforcement(&capacity(8000, 32 * GI), &config).unwrap(),
            Enforcement::default()
        );
    }

    #[test]
    fn enforcing_a_reserved_cgroup_needs_a_reservation_and_a_name() {
        let config = from_yaml(
            "enforceNodeAllocatable: [system-reserved]\nsystemReservedCgroup: /system.slice\n",
        );
        let err = enforcement(&capacity(8000, 32 * GI), &config).unwrap_err();
        assert_eq!(
            err.to_string(),
            "\"/system.slice\" cgroup is not configured properly: system-reserved is enforced but nothing is reserved"
        );
        let mut config = from_yaml("kubeReserved: {cpu: 1}\n");
        config.enforce.insert(EnforcementKey::KubeReserved);
        let err = enforcement(&capacity(8000, 32 * GI), &config).unwrap_err();
        assert_eq!(
            err,
            AllocatableError::NoReservedCgroup {
                key: EnforcementKey::KubeReserved
            }
        );
    }
}
