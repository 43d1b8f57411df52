//! A [`ResourceConfig`] as systemd unit properties: what the systemd backend sends with
//! `StartTransientUnit` and `SetUnitProperties`, and what is left for it to write to cgroupfs
//! because systemd has no property for it (or not in the version running).
//!
//! The conversions are those of kubelet's systemd path (kubelet computes the v2 weight itself,
//! runc's systemd manager passes it on) with two deliberate differences, both so that the
//! kernel files hold exactly what the cgroupfs backend would write and still do after a
//! `systemctl daemon-reload` (which re-applies every unit's properties from its drop-ins):
//!
//! - the CPU quota is sent per second of CPU rounded up to what systemd's drop-in keeps
//!   (`CPUQuota=` as a whole percent, truncated: 10 ms per second; runc rounds the same way),
//!   and the kernel files get what systemd writes from it (`quota = per-second × period /
//!   1 s`), not the exact quota runc writes after the call: a `daemon-reload` would put
//!   systemd's value back. kubelet's quotas of whole tens of milli-CPU are exact; any other
//!   quota (a feedback cap, a 15m limit) is up to 1 ms per 100 ms period higher, and
//!   [`Mapped::effective`] says so;
//! - `cpu.idle` on v2 is `CPUWeight=idle` (0) from systemd 252, which writes `cpu.idle` and
//!   resets it at every reload when the weight is not idle; before 252 systemd never touches
//!   `cpu.idle`, so it is written to cgroupfs.
//!
//! Settings systemd has no property for (`cpu.max.burst` / `cpu.cfs_burst_us`, v1
//! `cpuset.memory_migrate`, hugetlb, cpusets before 244 or on v1) come back in
//! [`Mapped::direct`] for the backend to write below the unit.
use super::super::cpuset::CpuSet;
use super::super::files::{CgroupVersion, Setting};
use super::super::resources::{Limit, QUOTA_PERIOD, ResourceConfig, cpu_shares_to_weight};

/// `infinity` on the wire: systemd's `USEC_INFINITY` / `CGROUP_LIMIT_MAX`.
pub const INFINITY: u64 = u64::MAX;
/// `CPUWeight=idle` (systemd 252+ on v2): the cgroup gets `cpu.idle` 1.
pub const CPU_WEIGHT_IDLE: u64 = 0;
/// What systemd's drop-in keeps of `CPUQuotaPerSecUSec`: 1% of a CPU, in µs per second.
/// Measured on systemd 252 in the systemd guest (248.2 ms per second came back as 240 ms after
/// a `daemon-reload`); runc rounds up to the same step.
pub const QUOTA_PER_SEC_RESOLUTION: u64 = 10_000;
const USEC_PER_SEC: u64 = 1_000_000;

/// First systemd versions with a property.
pub mod since {
    /// `CPUQuotaPeriodUSec`.
    pub const CPU_QUOTA_PERIOD: u32 = 242;
    /// `AllowedCPUs`, `AllowedMemoryNodes`.
    pub const ALLOWED_CPUS: u32 = 244;
    /// `MemoryMin`.
    pub const MEMORY_MIN: u32 = 240;
    /// `CPUWeight=idle`.
    pub const CPU_WEIGHT_IDLE: u32 = 252;
}

/// A property value, typed as systemd's D-Bus interface wants it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PropertyValue {
    /// `t`
    U64(u64),
    /// `b`
    Bool(bool),
    /// `s`
    Str(String),
    /// `as`
    Strs(Vec<String>),
    /// `ay` (CPU and memory node masks)
    Bytes(Vec<u8>),
    /// `au` (process ids)
    U32s(Vec<u32>),
}

/// One unit property.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Property {
    pub name: &'static str,
    pub value: PropertyValue,
    /// The settings whose kernel files systemd writes from it (none for a unit's own
    /// properties such as its description).
    pub carries: &'static [Setting],
}

impl Property {
    /// A property that carries no setting.
    #[must_use]
    pub fn new(name: &'static str, value: PropertyValue) -> Self {
        Self {
            name,
            value,
            carries: &[],
        }
    }

    fn u64(name: &'static str, value: u64, carries: &'static [Setting]) -> Self {
        Self {
            name,
            value: PropertyValue::U64(value),
            carries,
        }
    }
}

/// A config split between systemd and cgroupfs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mapped {
    /// What systemd is asked to hold.
    pub properties: Vec<Property>,
    /// What the backend writes to the unit's cgroup itself.
    pub direct: ResourceConfig,
    /// The config the kernel files end up holding (`config` with the CPU quota as systemd
    /// writes it back from the per-second value), for comparisons.
    pub effective: ResourceConfig,
}

/// Splits `config` for a unit on cgroup `version` under systemd `systemd_version`.
#[must_use]
pub fn map(config: &ResourceConfig, version: CgroupVersion, systemd_version: u32) -> Mapped {
    let v2 = version == CgroupVersion::V2;
    let mut properties = Vec::new();
    let mut direct = ResourceConfig::default();
    let mut effective = config.clone();

    let idle_by_weight = v2 && systemd_version >= since::CPU_WEIGHT_IDLE;
    if idle_by_weight && config.cpu_idle == Some(true) {
        properties.push(Property::u64(
            "CPUWeight",
            CPU_WEIGHT_IDLE,
            &[Setting::CpuIdle, Setting::CpuShares],
        ));
    } else {
        if let Some(shares) = config.cpu_shares {
            properties.push(if v2 {
                Property::u64(
                    "CPUWeight",
                    cpu_shares_to_weight(shares),
                    if idle_by_weight {
                        &[Setting::CpuShares, Setting::CpuIdle]
                    } else {
                        &[Setting::CpuShares]
                    },
                )
            } else {
                Property::u64("CPUShares", shares, &[Setting::CpuShares])
            });
        }
        // systemd 252+ on v2 writes `cpu.idle` 0 along with a weight; otherwise `cpu.idle`
        // is qosd's to write.
        if !(idle_by_weight && config.cpu_shares.is_some()) {
            direct.cpu_idle = config.cpu_idle;
        }
    }

    let period = config.cpu_period.unwrap_or(QUOTA_PERIOD);
    if let Some(p) = config.cpu_period {
        if systemd_version >= since::CPU_QUOTA_PERIOD {
            properties.push(Property::u64(
                "CPUQuotaPeriodUSec",
                p,
                &[Setting::CpuPeriod],
            ));
        } else {
            direct.cpu_period = Some(p);
        }
    }
    if let Some(quota) = config.cpu_quota {
        let per_sec = quota_per_sec(quota, period);
        properties.push(Property::u64(
            "CPUQuotaPerSecUSec",
            per_sec,
            &[Setting::CpuQuota],
        ));
        effective.cpu_quota = Some(kernel_quota(per_sec, period));
    }
    if let Some(burst) = config.cpu_burst {
        direct.cpu_burst = Some(burst);
    }

    let cpusets = v2 && systemd_version >= since::ALLOWED_CPUS;
    let cpuset_properties: [(_, _, &'static [Setting], _); 2] = [
        (
            &config.cpuset_cpus,
            "AllowedCPUs",
            &[Setting::CpusetCpus],
            &mut direct.cpuset_cpus,
        ),
        (
            &config.cpuset_mems,
            "AllowedMemoryNodes",
            &[Setting::CpusetMems],
            &mut direct.cpuset_mems,
        ),
    ];
    for (set, name, carries, slot) in cpuset_properties {
        if let Some(set) = set {
            if cpusets {
                properties.push(Property {
                    name,
                    value: PropertyValue::Bytes(mask_bytes(set)),
                    carries,
                });
            } else {
                *slot = Some(set.clone());
            }
        }
    }
    direct.cpuset_memory_migrate = config.cpuset_memory_migrate;

    if let Some(limit) = config.memory_limit {
        let name = if v2 { "MemoryMax" } else { "MemoryLimit" };
        properties.push(Property::u64(
            name,
            limit_value(limit),
            &[Setting::MemoryLimit],
        ));
    }
    if v2 {
        if let Some(min) = config.memory_min {
            if systemd_version >= since::MEMORY_MIN {
                properties.push(Property::u64("MemoryMin", min, &[Setting::MemoryMin]));
            } else {
                direct.memory_min = Some(min);
            }
        }
        if let Some(low) = config.memory_low {
            properties.push(Property::u64("MemoryLow", low, &[Setting::MemoryLow]));
        }
        if let Some(high) = config.memory_high {
            properties.push(Property::u64(
                "MemoryHigh",
                limit_value(high),
                &[Setting::MemoryHigh],
            ));
        }
    } else {
        // No v1 file: the cgroupfs writer reports them as it does without systemd.
        direct.memory_min = config.memory_min;
        direct.memory_low = config.memory_low;
        direct.memory_high = config.memory_high;
    }
    if let Some(pids) = config.pids_limit {
        // systemd refuses TasksMax=0; runc sends 1 for it, and so does qosd.
        let value = match pids {
            Limit::Max => INFINITY,
            Limit::Value(n) => n.max(1),
        };
        properties.push(Property::u64("TasksMax", value, &[Setting::PidsLimit]));
        if pids == Limit::Value(0) {
            effective.pids_limit = Some(Limit::Value(1));
        }
    }
    direct.hugetlb_limits = config.hugetlb_limits.clone();
    Mapped {
        properties,
        direct,
        effective,
    }
}

/// `CPUQuotaPerSecUSec` for a quota per period: infinity for no quota, else the quota per
/// second rounded up to [`QUOTA_PER_SEC_RESOLUTION`].
#[must_use]
pub fn quota_per_sec(quota: Limit, period: u64) -> u64 {
    match quota {
        Limit::Max => INFINITY,
        Limit::Value(quota) => {
            let period = u128::from(period.max(1));
            let exact = (u128::from(quota) * u128::from(USEC_PER_SEC)).div_ceil(period);
            let step = u128::from(QUOTA_PER_SEC_RESOLUTION);
            u64::try_from(exact.div_ceil(step) * step).unwrap_or(INFINITY)
        }
    }
}

/// The quota systemd writes to the kernel for `per_sec` over `period` (`cpu.max`'s first
/// field, `cpu.cfs_quota_us`).
#[must_use]
pub fn kernel_quota(per_sec: u64, period: u64) -> Limit {
    if per_sec == INFINITY {
        return Limit::Max;
    }
    let quota = u128::from(per_sec) * u128::from(period) / u128::from(USEC_PER_SEC);
    u64::try_from(quota).map_or(Limit::Max, Limit::Value)
}

/// A CPU or node set as systemd's `ay` mask: byte `n / 8`, bit `n % 8` (least significant
/// first), as runc's `RangeToBits` and systemd's `cpu_set_from_dbus` read it.
#[must_use]
pub fn mask_bytes(set: &CpuSet) -> Vec<u8> {
    let mut bytes = Vec::new();
    for id in set.iter() {
        let index = usize::try_from(id / 8).unwrap_or(usize::MAX);
        if index == usize::MAX {
            continue;
        }
        if bytes.len() <= index {
            bytes.resize(index + 1, 0);
        }
        bytes[index] |= 1 << (id % 8);
    }
    bytes
}

fn limit_value(limit: Limit) -> u64 {
    match limit {
        Limit::Max => INFINITY,
        Limit::Value(v) => v,
    }
}

#[cfg(test)]
mod tests;
