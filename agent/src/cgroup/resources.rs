//! What a cgroup should be limited to ([`ResourceConfig`], kubelet's `ResourceConfig`) and the
//! unit conversions kubelet applies between Kubernetes quantities and cgroup values:
//! milli-CPU to CFS shares and quota, and v1 shares to the v2 `cpu.weight`.
//!
//! Values here are version-neutral; [`super::files`] owns how each is spelled on disk.
use std::collections::BTreeMap;
use std::fmt;

use super::cpuset::CpuSet;
use super::files::Setting;

/// Smallest `cpu.shares` the kernel accepts (also what kubelet gives a zero CPU request).
pub const MIN_SHARES: u64 = 2;
/// Largest `cpu.shares` the kernel accepts.
pub const MAX_SHARES: u64 = 262_144;
/// Shares of one whole CPU.
pub const SHARES_PER_CPU: u64 = 1024;
/// Milli-CPU in one CPU.
pub const MILLI_CPU_TO_CPU: i64 = 1000;
/// Default CFS period: 100 ms, in microseconds.
pub const QUOTA_PERIOD: u64 = 100_000;
/// Smallest CFS quota kubelet writes: 1 ms, in microseconds.
pub const MIN_QUOTA_PERIOD: i64 = 1000;
/// Smallest and largest v2 `cpu.weight`.
pub const MIN_CPU_WEIGHT: u64 = 1;
pub const MAX_CPU_WEIGHT: u64 = 10_000;

/// A limit that may be lifted entirely (`max` / `-1` on disk).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Limit {
    /// No limit.
    Max,
    /// A limit in the setting's unit (bytes, microseconds, processes).
    Value(u64),
}

impl Limit {
    /// kubelet's signed convention: a negative value is unlimited.
    #[must_use]
    pub fn from_signed(value: i64) -> Self {
        u64::try_from(value).map_or(Self::Max, Self::Value)
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Max => f.write_str("max"),
            Self::Value(v) => write!(f, "{v}"),
        }
    }
}

/// The resources of one cgroup. `None` leaves a setting as it is on disk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceConfig {
    /// v1 `cpu.shares`; on v2 converted with [`cpu_shares_to_weight`].
    pub cpu_shares: Option<u64>,
    /// CFS quota in microseconds per period.
    pub cpu_quota: Option<Limit>,
    /// CFS period in microseconds.
    pub cpu_period: Option<u64>,
    /// CFS burst in microseconds (kernel 5.14+).
    pub cpu_burst: Option<u64>,
    /// `cpu.idle` (kernel 5.15+): the cgroup's tasks are treated as SCHED_IDLE against its
    /// siblings' (they never preempt them on wakeup and yield to them at once).
    pub cpu_idle: Option<bool>,
    /// CPUs the cgroup may run on.
    pub cpuset_cpus: Option<CpuSet>,
    /// NUMA nodes the cgroup may allocate from.
    pub cpuset_mems: Option<CpuSet>,
    /// v1 `cpuset.memory_migrate`: pages move with a change of `cpuset.mems` (v2 always moves
    /// them, so nothing is written there).
    pub cpuset_memory_migrate: Option<bool>,
    /// Memory limit in bytes.
    pub memory_limit: Option<Limit>,
    /// v2 `memory.min` in bytes (no v1 equivalent).
    pub memory_min: Option<u64>,
    /// v2 `memory.low` in bytes (no v1 equivalent).
    pub memory_low: Option<u64>,
    /// v2 `memory.high` in bytes (no v1 equivalent).
    pub memory_high: Option<Limit>,
    /// Process-count limit.
    pub pids_limit: Option<Limit>,
    /// Huge page size in bytes -> limit in bytes. Only the sizes listed are written (kubelet's
    /// manager also limits every omitted size to 0; here the caller lists every size it means).
    pub hugetlb_limits: BTreeMap<u64, Limit>,
}

impl ResourceConfig {
    /// True when nothing is set.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The settings this config sets.
    #[must_use]
    pub fn settings(&self) -> Vec<Setting> {
        let set = [
            (self.cpu_shares.is_some(), Setting::CpuShares),
            (self.cpu_quota.is_some(), Setting::CpuQuota),
            (self.cpu_period.is_some(), Setting::CpuPeriod),
            (self.cpu_burst.is_some(), Setting::CpuBurst),
            (self.cpu_idle.is_some(), Setting::CpuIdle),
            (self.cpuset_cpus.is_some(), Setting::CpusetCpus),
            (self.cpuset_mems.is_some(), Setting::CpusetMems),
            (
                self.cpuset_memory_migrate.is_some(),
                Setting::CpusetMemoryMigrate,
            ),
            (self.memory_limit.is_some(), Setting::MemoryLimit),
            (self.memory_min.is_some(), Setting::MemoryMin),
            (self.memory_low.is_some(), Setting::MemoryLow),
            (self.memory_high.is_some(), Setting::MemoryHigh),
            (self.pids_limit.is_some(), Setting::PidsLimit),
            (!self.hugetlb_limits.is_empty(), Setting::HugetlbLimit),
        ];
        set.into_iter()
            .filter(|(on, _)| *on)
            .map(|(_, s)| s)
            .collect()
    }

    /// `self` with every setting `over` sets replaced by `over`'s (hugetlb per page size).
    #[must_use]
    pub fn overlaid(mut self, over: &Self) -> Self {
        // Destructured so that a new field cannot be forgotten here.
        let Self {
            cpu_shares,
            cpu_quota,
            cpu_period,
            cpu_burst,
            cpu_idle,
            cpuset_cpus,
            cpuset_mems,
            cpuset_memory_migrate,
            memory_limit,
            memory_min,
            memory_low,
            memory_high,
            pids_limit,
            hugetlb_limits,
        } = over;
        fn set<T: Clone>(base: &mut Option<T>, over: &Option<T>) {
            if let Some(value) = over {
                *base = Some(value.clone());
            }
        }
        set(&mut self.cpu_shares, cpu_shares);
        set(&mut self.cpu_quota, cpu_quota);
        set(&mut self.cpu_period, cpu_period);
        set(&mut self.cpu_burst, cpu_burst);
        set(&mut self.cpu_idle, cpu_idle);
        set(&mut self.cpuset_cpus, cpuset_cpus);
        set(&mut self.cpuset_mems, cpuset_mems);
        set(&mut self.cpuset_memory_migrate, cpuset_memory_migrate);
        set(&mut self.memory_limit, memory_limit);
        set(&mut self.memory_min, memory_min);
        set(&mut self.memory_low, memory_low);
        set(&mut self.memory_high, memory_high);
        set(&mut self.pids_limit, pids_limit);
        self.hugetlb_limits
            .extend(hugetlb_limits.iter().map(|(k, v)| (*k, *v)));
        self
    }
}

/// The settings a config sets, with their values, for people (`qosd inspect`):
/// `cpu burst 20000 us, cpu.idle 1`; `-` when nothing is set.
impl fmt::Display for ResourceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Destructured so that a new field cannot be forgotten here.
        let Self {
            cpu_shares,
            cpu_quota,
            cpu_period,
            cpu_burst,
            cpu_idle,
            cpuset_cpus,
            cpuset_mems,
            cpuset_memory_migrate,
            memory_limit,
            memory_min,
            memory_low,
            memory_high,
            pids_limit,
            hugetlb_limits,
        } = self;
        let mut parts = Vec::new();
        let mut add = |name: &str, value: Option<String>| {
            if let Some(value) = value {
                parts.push(format!("{name} {value}"));
            }
        };
        add("cpu shares", cpu_shares.map(|v| v.to_string()));
        add("cpu quota", cpu_quota.map(|v| with_unit(v, "us")));
        add("cpu period", cpu_period.map(|v| format!("{v} us")));
        add("cpu burst", cpu_burst.map(|v| format!("{v} us")));
        add("cpu.idle", cpu_idle.map(|v| u8::from(v).to_string()));
        add("cpus", cpuset_cpus.as_ref().map(ToString::to_string));
        add(
            "memory nodes",
            cpuset_mems.as_ref().map(ToString::to_string),
        );
        add(
            "memory_migrate",
            cpuset_memory_migrate.map(|v| u8::from(v).to_string()),
        );
        add("memory limit", memory_limit.map(|v| with_unit(v, "bytes")));
        add("memory.min", memory_min.map(|v| format!("{v} bytes")));
        add("memory.low", memory_low.map(|v| format!("{v} bytes")));
        add("memory.high", memory_high.map(|v| with_unit(v, "bytes")));
        add("pids limit", pids_limit.map(|v| v.to_string()));
        for (size, limit) in hugetlb_limits {
            add(
                &format!("hugetlb {size}-byte pages"),
                Some(with_unit(*limit, "bytes")),
            );
        }
        if parts.is_empty() {
            return f.write_str("-");
        }
        f.write_str(&parts.join(", "))
    }
}

/// `max`, or the value and its unit.
fn with_unit(limit: Limit, unit: &str) -> String {
    match limit {
        Limit::Max => "max".to_owned(),
        Limit::Value(v) => format!("{v} {unit}"),
    }
}

/// kubelet's `MilliCPUToShares`: `milli * 1024 / 1000`, at least [`MIN_SHARES`] (also for a
/// zero or negative request) and at most [`MAX_SHARES`].
#[must_use]
pub fn milli_cpu_to_shares(milli_cpu: i64) -> u64 {
    if milli_cpu <= 0 {
        return MIN_SHARES;
    }
    let shares = i128::from(milli_cpu) * i128::from(SHARES_PER_CPU) / i128::from(MILLI_CPU_TO_CPU);
    u64::try_from(shares).map_or(MAX_SHARES, |s| s.clamp(MIN_SHARES, MAX_SHARES))
}

/// kubelet's `MilliCPUToQuota` (with the configurable period of `CPUCFSQuotaPeriod`): the
/// quota in microseconds for `milli_cpu` over `period` microseconds; 0 (no quota) for a zero
/// limit, otherwise at least [`MIN_QUOTA_PERIOD`].
#[must_use]
pub fn milli_cpu_to_quota(milli_cpu: i64, period: u64) -> i64 {
    if milli_cpu == 0 {
        return 0;
    }
    let quota = i128::from(milli_cpu) * i128::from(period) / i128::from(MILLI_CPU_TO_CPU);
    let quota = i64::try_from(quota).unwrap_or(i64::MAX);
    quota.max(MIN_QUOTA_PERIOD)
}

/// kubelet's `getCPUWeight`: v1 shares in [2, 262144] mapped linearly onto the v2 weight range
/// [1, 10000], `1 + ((shares - 2) * 9999) / 262142`. Shares outside the kernel's range are
/// clamped first, as the kernel would.
#[must_use]
pub fn cpu_shares_to_weight(shares: u64) -> u64 {
    let shares = shares.clamp(MIN_SHARES, MAX_SHARES);
    MIN_CPU_WEIGHT + ((shares - MIN_SHARES) * 9999) / (MAX_SHARES - MIN_SHARES)
}

/// The fewest shares [`cpu_shares_to_weight`] maps to `weight` (clamped to [1, 10000]): how a
/// v2 weight read back is carried as shares, so writing it gives the same weight.
#[must_use]
pub fn cpu_weight_to_shares(weight: u64) -> u64 {
    let weight = weight.clamp(MIN_CPU_WEIGHT, 10_000);
    MIN_SHARES + ((weight - MIN_CPU_WEIGHT) * (MAX_SHARES - MIN_SHARES)).div_ceil(9999)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_weight_read_back_as_shares_gives_the_same_weight() {
        for weight in [1, 2, 4, 39, 100, 9999, 10_000] {
            assert_eq!(cpu_shares_to_weight(cpu_weight_to_shares(weight)), weight);
        }
        // kubelet's BestEffort tier: 2 shares, weight 1.
        assert_eq!(cpu_weight_to_shares(1), 2);
        assert_eq!(cpu_shares_to_weight(cpu_weight_to_shares(0)), 1);
    }

    #[test]
    fn a_config_reads_as_its_settings_and_values() {
        let config = ResourceConfig {
            cpu_burst: Some(20_000),
            cpu_idle: Some(true),
            cpu_quota: Some(Limit::Max),
            cpuset_mems: Some(CpuSet::parse("1").expect("list")),
            ..ResourceConfig::default()
        };
        assert_eq!(
            config.to_string(),
            "cpu quota max, cpu burst 20000 us, cpu.idle 1, memory nodes 1"
        );
        assert_eq!(ResourceConfig::default().to_string(), "-");
    }

    #[test]
    fn an_overlay_replaces_only_what_it_sets() {
        let base = ResourceConfig {
            cpu_shares: Some(512),
            cpu_quota: Some(Limit::Value(50_000)),
            cpu_burst: Some(0),
            hugetlb_limits: BTreeMap::from([(2 << 20, Limit::Max)]),
            ..ResourceConfig::default()
        };
        let over = ResourceConfig {
            cpu_burst: Some(50_000),
            cpu_idle: Some(true),
            hugetlb_limits: BTreeMap::from([(1 << 30, Limit::Value(0))]),
            ..ResourceConfig::default()
        };
        let merged = base.clone().overlaid(&over);
        assert_eq!(merged.cpu_shares, Some(512));
        assert_eq!(merged.cpu_quota, Some(Limit::Value(50_000)));
        assert_eq!(merged.cpu_burst, Some(50_000));
        assert_eq!(merged.cpu_idle, Some(true));
        assert_eq!(merged.hugetlb_limits.len(), 2);
        assert_eq!(base.clone().overlaid(&ResourceConfig::default()), base);
    }

    /// Rows of kubelet's TestMilliCPUToShares (pkg/kubelet/cm/helpers_linux_test.go).
    #[test]
    fn milli_cpu_to_shares_matches_kubelet() {
        let rows: &[(&str, i64, u64)] = &[
            ("zero milliCPU returns MinShares", 0, MIN_SHARES),
            ("1 milliCPU rounds down to MinShares", 1, MIN_SHARES),
            ("2 milliCPU computes to exactly MinShares", 2, MIN_SHARES),
            ("3 milliCPU computes to 3 shares", 3, 3),
            ("5 milliCPU (older table)", 5, 5),
            ("10 milliCPU (older table)", 10, 10),
            ("100 milliCPU maps to 102 shares", 100, 102),
            ("200 milliCPU (older table)", 200, 204),
            ("500 milliCPU maps to 512 shares", 500, 512),
            ("1000 milliCPU (1 CPU) maps to 1024 shares", 1000, 1024),
            ("2000m (2 CPUs) returns 2048 shares", 2000, 2048),
            (
                "255999 milliCPU just below MaxShares",
                255_999,
                255_999 * 1024 / 1000,
            ),
            (
                "256000 milliCPU hits exactly MaxShares",
                256_000,
                MAX_SHARES,
            ),
            ("256001 milliCPU clamped to MaxShares", 256_001, MAX_SHARES),
            (
                "1000000 milliCPU clamped to MaxShares",
                1_000_000,
                MAX_SHARES,
            ),
            ("negative milliCPU clamped to MinShares", -1, MIN_SHARES),
            (
                "large negative clamped to MinShares",
                -1_000_000,
                MIN_SHARES,
            ),
            ("i64::MAX does not overflow", i64::MAX, MAX_SHARES),
        ];
        for (row, milli, shares) in rows {
            assert_eq!(milli_cpu_to_shares(*milli), *shares, "{row}");
        }
    }

    /// Rows of kubelet's TestMilliCPUToQuota (cm) and TestMilliCPUToQuotaWithCustomCPUCFSQuotaPeriod
    /// (kuberuntime), plus the tuned-period quotas of TestResourceConfigForPod.
    #[test]
    fn milli_cpu_to_quota_matches_kubelet() {
        let rows: &[(&str, i64, u64, i64)] = &[
            ("all-zero", 0, 0, 0),
            (
                "zero limit with a period is still no quota",
                0,
                QUOTA_PERIOD,
                0,
            ),
            ("5 input default quota and period", 5, 100_000, 1000),
            ("9 input default quota and period", 9, 100_000, 1000),
            ("10 input default quota and period", 10, 100_000, 1000),
            (
                "200 input 20k quota and default period",
                200,
                100_000,
                20_000,
            ),
            (
                "500 input 50k quota and default period",
                500,
                100_000,
                50_000,
            ),
            (
                "1k input 100k quota and default period",
                1000,
                100_000,
                100_000,
            ),
            (
                "1500 input 150k quota and default period",
                1500,
                100_000,
                150_000,
            ),
            (
                "5 input 10k period and default quota expected",
                5,
                10_000,
                1000,
            ),
            (
                "5 input 5k period and default quota expected",
                5,
                5000,
                1000,
            ),
            (
                "9 input 10k period and default quota expected",
                9,
                10_000,
                1000,
            ),
            (
                "10 input 200k period and 2000 quota expected",
                10,
                200_000,
                2000,
            ),
            ("200 input 200k period and 40k quota", 200, 200_000, 40_000),
            (
                "500 input 20k period and 20k expected quota",
                500,
                20_000,
                10_000,
            ),
            (
                "1000 input 10k period and 10k expected quota",
                1000,
                10_000,
                10_000,
            ),
            (
                "1500 input 5000 period and 7500 expected quota",
                1500,
                5000,
                7500,
            ),
            (
                "burstable-with-limits-with-tuned-quota (200m, 5ms)",
                200,
                5000,
                1000,
            ),
            ("guaranteed-with-tuned-quota (100m, 5ms)", 100, 5000, 1000),
        ];
        for (row, milli, period, quota) in rows {
            assert_eq!(milli_cpu_to_quota(*milli, *period), *quota, "{row}");
        }
    }

    /// Rows of kubelet's TestGetCpuWeight (cgroup_manager_linux_test.go; its nil row is
    /// `cpu_shares: None`, which writes no weight), plus values between the ends.
    #[test]
    fn shares_to_weight_matches_kubelet() {
        let rows: &[(&str, u64, u64)] = &[
            ("2 -> 1", 2, 1),
            ("262144 -> 10000", 262_144, 10_000),
            ("1000000000 -> 10000", 1_000_000_000, 10_000),
            ("1024 shares (1 CPU)", 1024, 1 + (1022 * 9999) / 262_142),
            ("102 shares (100m)", 102, 4),
            ("51 shares (50m)", 51, 2),
            ("256 shares (250m)", 256, 10),
            ("below the kernel minimum is clamped", 0, 1),
        ];
        for (row, shares, weight) in rows {
            assert_eq!(cpu_shares_to_weight(*shares), *weight, "{row}");
        }
        assert_eq!(cpu_shares_to_weight(1024), 39);
    }

    #[test]
    fn signed_limits_follow_kubelet_convention() {
        assert_eq!(Limit::from_signed(-1), Limit::Max);
        assert_eq!(Limit::from_signed(50_000), Limit::Value(50_000));
        assert_eq!(Limit::Max.to_string(), "max");
        assert!(ResourceConfig::default().is_empty());
        let config = ResourceConfig {
            cpu_shares: Some(2),
            ..ResourceConfig::default()
        };
        assert!(!config.is_empty());
    }
}
