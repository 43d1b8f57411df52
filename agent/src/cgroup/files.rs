//! The one table of which file holds each [`ResourceConfig`] setting on cgroup v1 (controller
//! hierarchy + file) and v2 (file in the unified hierarchy), and how values are spelled there.
//!
//! [`plan`] turns a config into the list of file writes for one cgroup version, in a safe order;
//! each [`PlannedWrite`] knows how to tell whether the value already on disk is equivalent
//! ([`PlannedWrite::is_satisfied_by`]): the kernel rounds memory limits down to whole pages,
//! spells "unlimited" as a huge number on v1 and normalises CPU lists.
use std::fmt;
use std::str::FromStr;

use super::cpuset::CpuSet;
use super::resources::{Limit, MAX_SHARES, MIN_SHARES, ResourceConfig, cpu_shares_to_weight};

/// A setting that cannot be written on this cgroup version, or a bad huge page size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilesError {
    #[error("{setting} has no cgroup {version} file: {hint}")]
    Unsupported {
        setting: Setting,
        version: CgroupVersion,
        hint: &'static str,
    },
    #[error("huge page size of {bytes} bytes is not a power of two of at least 1 KiB")]
    HugePageSize { bytes: u64 },
}

/// cgroup v1 (including the v1 half of hybrid hosts) or v2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CgroupVersion {
    V1,
    V2,
}

impl fmt::Display for CgroupVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::V1 => "v1",
            Self::V2 => "v2",
        })
    }
}

/// The controllers qosd manages. On v1 each has its own hierarchy (possibly co-mounted); on v2
/// all but `cpuacct` are enabled through `cgroup.subtree_control`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Controller {
    Cpu,
    Cpuacct,
    Cpuset,
    Memory,
    Pids,
    Hugetlb,
}

impl Controller {
    /// Every managed controller.
    pub const ALL: [Self; 6] = [
        Self::Cpu,
        Self::Cpuacct,
        Self::Cpuset,
        Self::Memory,
        Self::Pids,
        Self::Hugetlb,
    ];

    /// The kernel's name for it (v1 mount option, v2 `cgroup.controllers` entry).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cpuacct => "cpuacct",
            Self::Cpuset => "cpuset",
            Self::Memory => "memory",
            Self::Pids => "pids",
            Self::Hugetlb => "hugetlb",
        }
    }

    /// Whether the controller exists as such on v2 (`cpuacct` folded into `cpu`).
    #[must_use]
    pub fn exists_on_v2(self) -> bool {
        self != Self::Cpuacct
    }

    /// Whether kubelet treats it as required: a config that sets cpu or memory fails when the
    /// controller is missing; pids, hugetlb and cpuset settings are skipped (and reported).
    #[must_use]
    pub fn is_required(self) -> bool {
        matches!(self, Self::Cpu | Self::Memory)
    }
}

impl fmt::Display for Controller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Controller {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|c| c.name() == s).ok_or(())
    }
}

/// One [`ResourceConfig`] field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Setting {
    CpuShares,
    CpuPeriod,
    CpuQuota,
    CpuBurst,
    CpuIdle,
    CpusetCpus,
    CpusetMemoryMigrate,
    CpusetMems,
    MemoryLimit,
    MemoryMin,
    MemoryLow,
    MemoryHigh,
    PidsLimit,
    HugetlbLimit,
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::CpuShares => "cpu shares",
            Self::CpuPeriod => "cpu period",
            Self::CpuQuota => "cpu quota",
            Self::CpuBurst => "cpu burst",
            Self::CpuIdle => "cpu idle",
            Self::CpusetCpus => "cpuset cpus",
            Self::CpusetMemoryMigrate => "cpuset memory_migrate",
            Self::CpusetMems => "cpuset mems",
            Self::MemoryLimit => "memory limit",
            Self::MemoryMin => "memory.min",
            Self::MemoryLow => "memory.low",
            Self::MemoryHigh => "memory.high",
            Self::PidsLimit => "pids limit",
            Self::HugetlbLimit => "hugetlb limit",
        })
    }
}

/// Where one setting lives. Hugetlb file names hold `{size}`, replaced by the page size name
/// (`2MB`, `1GB`, see [`hugepage_size_name`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileSpec {
    pub setting: Setting,
    pub controller: Controller,
    /// File in the controller's v1 hierarchy; `None`: v1 has no equivalent.
    pub v1: Option<&'static str>,
    /// File in the unified hierarchy.
    pub v2: Option<&'static str>,
    /// v1 spelling of "unlimited", for limits that have one.
    pub v1_unlimited: Option<&'static str>,
}

/// The table, in the order files are written: cpusets first (a task may need them; v1's
/// `memory_migrate` before the `mems` whose change it makes move pages), the CFS period before
/// the quota it scales, the burst after the quota that bounds it.
#[rustfmt::skip]
pub const FILES: &[FileSpec] = &[
    //   setting               controller           v1 file                                v2 file                     v1 "unlimited"
    spec(Setting::CpusetCpus,   Controller::Cpuset,  Some("cpuset.cpus"),                   Some("cpuset.cpus"),        None),
    spec(Setting::CpusetMemoryMigrate, Controller::Cpuset, Some("cpuset.memory_migrate"),   None,                       None),
    spec(Setting::CpusetMems,   Controller::Cpuset,  Some("cpuset.mems"),                   Some("cpuset.mems"),        None),
    spec(Setting::CpuShares,    Controller::Cpu,     Some("cpu.shares"),                    Some("cpu.weight"),         None),
    spec(Setting::CpuPeriod,    Controller::Cpu,     Some("cpu.cfs_period_us"),             Some("cpu.max"),            None),
    spec(Setting::CpuQuota,     Controller::Cpu,     Some("cpu.cfs_quota_us"),              Some("cpu.max"),            Some("-1")),
    spec(Setting::CpuBurst,     Controller::Cpu,     Some("cpu.cfs_burst_us"),              Some("cpu.max.burst"),      None),
    spec(Setting::CpuIdle,      Controller::Cpu,     Some("cpu.idle"),                      Some("cpu.idle"),           None),
    spec(Setting::MemoryMin,    Controller::Memory,  None,                                  Some("memory.min"),         None),
    spec(Setting::MemoryLow,    Controller::Memory,  None,                                  Some("memory.low"),         None),
    spec(Setting::MemoryHigh,   Controller::Memory,  None,                                  Some("memory.high"),        None),
    spec(Setting::MemoryLimit,  Controller::Memory,  Some("memory.limit_in_bytes"),         Some("memory.max"),         Some("-1")),
    spec(Setting::PidsLimit,    Controller::Pids,    Some("pids.max"),                      Some("pids.max"),           Some("max")),
    spec(Setting::HugetlbLimit, Controller::Hugetlb, Some("hugetlb.{size}.limit_in_bytes"), Some("hugetlb.{size}.max"), Some("-1")),
];

const fn spec(
    setting: Setting,
    controller: Controller,
    v1: Option<&'static str>,
    v2: Option<&'static str>,
    v1_unlimited: Option<&'static str>,
) -> FileSpec {
    FileSpec {
        setting,
        controller,
        v1,
        v2,
        v1_unlimited,
    }
}

/// The table row of a setting.
#[must_use]
pub fn file_spec(setting: Setting) -> &'static FileSpec {
    // Every Setting has a row (checked by a test), so the fallback is never taken.
    FILES
        .iter()
        .find(|s| s.setting == setting)
        .unwrap_or(&FILES[0])
}

/// How the value on disk is compared with the one planned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compare {
    /// Same text after trimming.
    Exact,
    /// A byte count the kernel rounds down to `granularity`; "max", "-1" and values of 2^62 or
    /// more (v1's page-aligned `PAGE_COUNTER_MAX`) all mean unlimited.
    Bytes { granularity: u64 },
    /// The same set of ids.
    CpuList,
    /// v2 `cpu.max`: the same quota, and the same period when one is planned.
    CpuMax,
}

/// One file write for one cgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedWrite {
    pub setting: Setting,
    pub controller: Controller,
    /// File name inside the cgroup directory.
    pub file: String,
    /// What is written.
    pub value: String,
    pub compare: Compare,
}

impl PlannedWrite {
    /// True when `current` (the file's content) already means what [`Self::value`] means, so
    /// writing would change nothing.
    #[must_use]
    pub fn is_satisfied_by(&self, current: &str) -> bool {
        let current = current.trim();
        match self.compare {
            Compare::Exact => current == self.value,
            Compare::CpuList => match (CpuSet::parse(current), CpuSet::parse(&self.value)) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            },
            Compare::CpuMax => {
                let mut have = current.split_whitespace();
                let mut want = self.value.split_whitespace();
                want.next() == have.next()
                    && want.next().is_none_or(|period| have.next() == Some(period))
            }
            Compare::Bytes { granularity } => {
                match (parse_byte_limit(current), parse_byte_limit(&self.value)) {
                    (Some(Limit::Max), Some(Limit::Max)) => true,
                    (Some(Limit::Value(have)), Some(Limit::Value(want))) => {
                        have == want || (granularity > 0 && have == want - want % granularity)
                    }
                    _ => false,
                }
            }
        }
    }
}

/// Values from 2^62 up are "unlimited" as v1 reports it (`PAGE_COUNTER_MAX` times the page
/// size, e.g. 9223372036854771712).
const V1_UNLIMITED_THRESHOLD: u64 = 1 << 62;

fn parse_byte_limit(text: &str) -> Option<Limit> {
    match text {
        "max" | "-1" => Some(Limit::Max),
        _ => {
            let value: u64 = text.parse().ok()?;
            Some(if value >= V1_UNLIMITED_THRESHOLD {
                Limit::Max
            } else {
                Limit::Value(value)
            })
        }
    }
}

/// The kernel's name of a huge page size, as in `hugetlb.2MB.max`: the size in the largest
/// binary unit (KB, MB, GB) that divides it.
pub fn hugepage_size_name(bytes: u64) -> Result<String, FilesError> {
    if !bytes.is_power_of_two() || bytes < 1024 {
        return Err(FilesError::HugePageSize { bytes });
    }
    let mut value = bytes;
    let mut unit = 0;
    const UNITS: [&str; 6] = ["B", "KB", "MB", "GB", "TB", "PB"];
    while value >= 1024 && unit + 1 < UNITS.len() {
        value /= 1024;
        unit += 1;
    }
    Ok(format!("{value}{}", UNITS[unit]))
}

/// The writes that apply `config` on `version`, in [`FILES`] order. `page_size` is the
/// kernel's page size, the granularity of memory limits.
///
/// Fails for settings the version cannot express (memory.min/low/high on v1): they are
/// reported, never silently dropped.
pub fn plan(
    config: &ResourceConfig,
    version: CgroupVersion,
    page_size: u64,
) -> Result<Vec<PlannedWrite>, FilesError> {
    let mut writes = Vec::new();
    let mut push = |setting: Setting, value: String, compare: Compare| -> Result<(), FilesError> {
        let row = file_spec(setting);
        let file = file_name(row, version)?;
        writes.push(PlannedWrite {
            setting,
            controller: row.controller,
            file: file.to_owned(),
            value,
            compare,
        });
        Ok(())
    };
    let limit = |setting: Setting, limit: Limit| -> String {
        match (limit, version) {
            (Limit::Value(v), _) => v.to_string(),
            (Limit::Max, CgroupVersion::V2) => "max".to_owned(),
            (Limit::Max, CgroupVersion::V1) => {
                file_spec(setting).v1_unlimited.unwrap_or("-1").to_owned()
            }
        }
    };
    let memory = Compare::Bytes {
        granularity: page_size,
    };

    if let Some(cpus) = &config.cpuset_cpus {
        push(Setting::CpusetCpus, cpus.to_string(), Compare::CpuList)?;
    }
    // v2 moves pages with every change of cpuset.mems; it has no switch to write.
    if let (Some(migrate), CgroupVersion::V1) = (config.cpuset_memory_migrate, version) {
        push(
            Setting::CpusetMemoryMigrate,
            u8::from(migrate).to_string(),
            Compare::Exact,
        )?;
    }
    if let Some(mems) = &config.cpuset_mems {
        push(Setting::CpusetMems, mems.to_string(), Compare::CpuList)?;
    }
    // The kernel refuses weights for an idle group (it runs at the idle weight) and resets
    // the weight to the default when it stops being idle: cpu.idle goes first, a weight is
    // written only to a group that is not idle.
    if let Some(idle) = config.cpu_idle {
        push(Setting::CpuIdle, u8::from(idle).to_string(), Compare::Exact)?;
    }
    if let Some(shares) = config.cpu_shares.filter(|_| config.cpu_idle != Some(true)) {
        let value = match version {
            CgroupVersion::V1 => shares.clamp(MIN_SHARES, MAX_SHARES),
            CgroupVersion::V2 => cpu_shares_to_weight(shares),
        };
        push(Setting::CpuShares, value.to_string(), Compare::Exact)?;
    }
    match version {
        CgroupVersion::V1 => {
            if let Some(period) = config.cpu_period {
                push(Setting::CpuPeriod, period.to_string(), Compare::Exact)?;
            }
            if let Some(quota) = config.cpu_quota {
                push(
                    Setting::CpuQuota,
                    limit(Setting::CpuQuota, quota),
                    Compare::Exact,
                )?;
            }
        }
        CgroupVersion::V2 => {
            // One file holds both: "$QUOTA $PERIOD". Like runc, a period alone is written with
            // an unlimited quota, and a quota alone keeps the current period.
            if config.cpu_quota.is_some() || config.cpu_period.is_some() {
                let quota = limit(Setting::CpuQuota, config.cpu_quota.unwrap_or(Limit::Max));
                let value = match config.cpu_period {
                    Some(period) => format!("{quota} {period}"),
                    None => quota,
                };
                let setting = if config.cpu_quota.is_some() {
                    Setting::CpuQuota
                } else {
                    Setting::CpuPeriod
                };
                push(setting, value, Compare::CpuMax)?;
            }
        }
    }
    if let Some(burst) = config.cpu_burst {
        push(Setting::CpuBurst, burst.to_string(), Compare::Exact)?;
    }
    if let Some(min) = config.memory_min {
        push(Setting::MemoryMin, min.to_string(), memory)?;
    }
    if let Some(low) = config.memory_low {
        push(Setting::MemoryLow, low.to_string(), memory)?;
    }
    if let Some(high) = config.memory_high {
        push(
            Setting::MemoryHigh,
            limit(Setting::MemoryHigh, high),
            memory,
        )?;
    }
    if let Some(max) = config.memory_limit {
        push(
            Setting::MemoryLimit,
            limit(Setting::MemoryLimit, max),
            memory,
        )?;
    }
    if let Some(pids) = config.pids_limit {
        push(
            Setting::PidsLimit,
            limit(Setting::PidsLimit, pids),
            Compare::Exact,
        )?;
    }
    for (&page_size, &max) in &config.hugetlb_limits {
        let size = hugepage_size_name(page_size)?;
        let row = file_spec(Setting::HugetlbLimit);
        let file = file_name(row, version)?.replace("{size}", &size);
        writes.push(PlannedWrite {
            setting: Setting::HugetlbLimit,
            controller: Controller::Hugetlb,
            file,
            value: limit(Setting::HugetlbLimit, max),
            compare: Compare::Bytes {
                granularity: page_size,
            },
        });
    }
    Ok(writes)
}

fn file_name(row: &FileSpec, version: CgroupVersion) -> Result<&'static str, FilesError> {
    let file = match version {
        CgroupVersion::V1 => row.v1,
        CgroupVersion::V2 => row.v2,
    };
    file.ok_or(FilesError::Unsupported {
        setting: row.setting,
        version,
        hint: "memory protection (min/low/high) exists only in the unified hierarchy",
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const PAGE: u64 = 4096;
    const MB2: u64 = 2 << 20;

    fn files(writes: &[PlannedWrite]) -> Vec<(String, String)> {
        writes
            .iter()
            .map(|w| (w.file.clone(), w.value.clone()))
            .collect()
    }

    fn pair(file: &str, value: &str) -> (String, String) {
        (file.to_owned(), value.to_owned())
    }

    fn guaranteed_pod() -> ResourceConfig {
        ResourceConfig {
            cpu_shares: Some(1024),
            cpu_quota: Some(Limit::Value(50_000)),
            cpu_period: Some(100_000),
            cpu_burst: Some(10_000),
            cpuset_cpus: Some(CpuSet::parse("0-3,6").unwrap()),
            cpuset_mems: Some(CpuSet::parse("0").unwrap()),
            memory_limit: Some(Limit::Value(256 << 20)),
            pids_limit: Some(Limit::Max),
            hugetlb_limits: BTreeMap::from([(MB2, Limit::Value(4 << 20)), (1 << 30, Limit::Max)]),
            ..ResourceConfig::default()
        }
    }

    #[test]
    fn every_setting_has_exactly_one_row() {
        use Setting::*;
        for setting in [
            CpuShares,
            CpuPeriod,
            CpuQuota,
            CpuBurst,
            CpuIdle,
            CpusetCpus,
            CpusetMemoryMigrate,
            CpusetMems,
            MemoryLimit,
            MemoryMin,
            MemoryLow,
            MemoryHigh,
            PidsLimit,
            HugetlbLimit,
        ] {
            assert_eq!(
                FILES.iter().filter(|row| row.setting == setting).count(),
                1,
                "{setting}"
            );
            assert_eq!(file_spec(setting).setting, setting);
        }
    }

    /// The feedback settings: v1 turns on `memory_migrate` before it changes `mems`; v2 has
    /// no such switch (it always migrates) and writes only `mems`. `cpu.idle` is 0 or 1, and
    /// an idle group gets no weight written (the kernel refuses it).
    #[test]
    fn idle_and_memory_migration_files() {
        let config = ResourceConfig {
            cpu_idle: Some(true),
            cpuset_memory_migrate: Some(true),
            cpuset_mems: Some(CpuSet::parse("1").unwrap()),
            ..ResourceConfig::default()
        };
        let v1 = plan(&config, CgroupVersion::V1, PAGE).unwrap();
        assert_eq!(
            files(&v1),
            vec![
                pair("cpuset.memory_migrate", "1"),
                pair("cpuset.mems", "1"),
                pair("cpu.idle", "1"),
            ]
        );
        let v2 = plan(&config, CgroupVersion::V2, PAGE).unwrap();
        assert_eq!(
            files(&v2),
            vec![pair("cpuset.mems", "1"), pair("cpu.idle", "1")]
        );
        let off = ResourceConfig {
            cpu_idle: Some(false),
            cpu_shares: Some(2),
            ..ResourceConfig::default()
        };
        assert_eq!(
            files(&plan(&off, CgroupVersion::V2, PAGE).unwrap()),
            vec![pair("cpu.idle", "0"), pair("cpu.weight", "1")],
            "idle off first: the kernel refuses a weight while idle, and resets it when idle goes"
        );
        let idle_tier = ResourceConfig {
            cpu_idle: Some(true),
            cpu_shares: Some(2),
            ..ResourceConfig::default()
        };
        assert_eq!(
            files(&plan(&idle_tier, CgroupVersion::V1, PAGE).unwrap()),
            vec![pair("cpu.idle", "1")],
            "an idle group's weight is the kernel's; cpu.shares is not written"
        );
    }

    #[test]
    fn v1_files_and_values() {
        let writes = plan(&guaranteed_pod(), CgroupVersion::V1, PAGE).unwrap();
        assert_eq!(
            files(&writes),
            vec![
                pair("cpuset.cpus", "0-3,6"),
                pair("cpuset.mems", "0"),
                pair("cpu.shares", "1024"),
                pair("cpu.cfs_period_us", "100000"),
                pair("cpu.cfs_quota_us", "50000"),
                pair("cpu.cfs_burst_us", "10000"),
                pair("memory.limit_in_bytes", "268435456"),
                pair("pids.max", "max"),
                pair("hugetlb.2MB.limit_in_bytes", "4194304"),
                pair("hugetlb.1GB.limit_in_bytes", "-1"),
            ]
        );
        let controllers: Vec<_> = writes.iter().map(|w| w.controller).collect();
        assert_eq!(controllers[0], Controller::Cpuset);
        assert_eq!(controllers[2], Controller::Cpu);
        assert_eq!(controllers[6], Controller::Memory);
        assert_eq!(controllers[7], Controller::Pids);
        assert_eq!(controllers[9], Controller::Hugetlb);
    }

    #[test]
    fn v2_files_and_values() {
        let mut config = guaranteed_pod();
        config.memory_min = Some(128 << 20);
        config.memory_low = Some(64 << 20);
        config.memory_high = Some(Limit::Max);
        let writes = plan(&config, CgroupVersion::V2, PAGE).unwrap();
        assert_eq!(
            files(&writes),
            vec![
                pair("cpuset.cpus", "0-3,6"),
                pair("cpuset.mems", "0"),
                pair("cpu.weight", "39"),
                pair("cpu.max", "50000 100000"),
                pair("cpu.max.burst", "10000"),
                pair("memory.min", "134217728"),
                pair("memory.low", "67108864"),
                pair("memory.high", "max"),
                pair("memory.max", "268435456"),
                pair("pids.max", "max"),
                pair("hugetlb.2MB.max", "4194304"),
                pair("hugetlb.1GB.max", "max"),
            ]
        );
    }

    #[test]
    fn unlimited_spellings() {
        let config = ResourceConfig {
            cpu_quota: Some(Limit::Max),
            cpu_period: Some(100_000),
            memory_limit: Some(Limit::Max),
            ..ResourceConfig::default()
        };
        assert_eq!(
            files(&plan(&config, CgroupVersion::V1, PAGE).unwrap()),
            vec![
                pair("cpu.cfs_period_us", "100000"),
                pair("cpu.cfs_quota_us", "-1"),
                pair("memory.limit_in_bytes", "-1"),
            ]
        );
        assert_eq!(
            files(&plan(&config, CgroupVersion::V2, PAGE).unwrap()),
            vec![pair("cpu.max", "max 100000"), pair("memory.max", "max")]
        );
    }

    #[test]
    fn v2_cpu_max_with_only_one_half() {
        let quota_only = ResourceConfig {
            cpu_quota: Some(Limit::Value(20_000)),
            ..ResourceConfig::default()
        };
        assert_eq!(
            files(&plan(&quota_only, CgroupVersion::V2, PAGE).unwrap()),
            vec![pair("cpu.max", "20000")]
        );
        let period_only = ResourceConfig {
            cpu_period: Some(50_000),
            ..ResourceConfig::default()
        };
        let writes = plan(&period_only, CgroupVersion::V2, PAGE).unwrap();
        assert_eq!(files(&writes), vec![pair("cpu.max", "max 50000")]);
        assert_eq!(writes[0].setting, Setting::CpuPeriod);
    }

    #[test]
    fn memory_protection_is_unsupported_on_v1_not_dropped() {
        for (config, setting) in [
            (
                ResourceConfig {
                    memory_min: Some(1 << 20),
                    ..ResourceConfig::default()
                },
                Setting::MemoryMin,
            ),
            (
                ResourceConfig {
                    memory_low: Some(1 << 20),
                    ..ResourceConfig::default()
                },
                Setting::MemoryLow,
            ),
            (
                ResourceConfig {
                    memory_high: Some(Limit::Max),
                    ..ResourceConfig::default()
                },
                Setting::MemoryHigh,
            ),
        ] {
            let err = plan(&config, CgroupVersion::V1, PAGE).expect_err("v1");
            assert_eq!(
                err,
                FilesError::Unsupported {
                    setting,
                    version: CgroupVersion::V1,
                    hint: "memory protection (min/low/high) exists only in the unified hierarchy",
                }
            );
            assert!(err.to_string().contains("v1"), "{err}");
            assert_eq!(plan(&config, CgroupVersion::V2, PAGE).unwrap().len(), 1);
        }
    }

    #[test]
    fn shares_are_clamped_to_what_the_kernel_stores() {
        let config = ResourceConfig {
            cpu_shares: Some(1_000_000),
            ..ResourceConfig::default()
        };
        assert_eq!(
            files(&plan(&config, CgroupVersion::V1, PAGE).unwrap()),
            vec![pair("cpu.shares", "262144")]
        );
        assert_eq!(
            files(&plan(&config, CgroupVersion::V2, PAGE).unwrap()),
            vec![pair("cpu.weight", "10000")]
        );
    }

    #[test]
    fn hugepage_names() {
        assert_eq!(hugepage_size_name(64 << 10).unwrap(), "64KB");
        assert_eq!(hugepage_size_name(2 << 20).unwrap(), "2MB");
        assert_eq!(hugepage_size_name(32 << 20).unwrap(), "32MB");
        assert_eq!(hugepage_size_name(1 << 30).unwrap(), "1GB");
        assert_eq!(hugepage_size_name(16 << 30).unwrap(), "16GB");
        assert!(hugepage_size_name(3 << 20).is_err());
        assert!(hugepage_size_name(512).is_err());
        let config = ResourceConfig {
            hugetlb_limits: BTreeMap::from([(3 << 20, Limit::Max)]),
            ..ResourceConfig::default()
        };
        assert_eq!(
            plan(&config, CgroupVersion::V2, PAGE).unwrap_err(),
            FilesError::HugePageSize { bytes: 3 << 20 }
        );
    }

    fn write(value: &str, compare: Compare) -> PlannedWrite {
        PlannedWrite {
            setting: Setting::MemoryLimit,
            controller: Controller::Memory,
            file: "f".to_owned(),
            value: value.to_owned(),
            compare,
        }
    }

    #[test]
    fn equivalence_with_what_the_kernel_reads_back() {
        let bytes = Compare::Bytes { granularity: PAGE };
        // v1 reads unlimited back as PAGE_COUNTER_MAX pages.
        assert!(write("-1", bytes).is_satisfied_by("9223372036854771712\n"));
        assert!(write("max", bytes).is_satisfied_by("max\n"));
        assert!(!write("-1", bytes).is_satisfied_by("268435456\n"));
        assert!(!write("268435456", bytes).is_satisfied_by("max\n"));
        // Rounded down to whole pages.
        assert!(write("1000000", bytes).is_satisfied_by("999424"));
        assert!(write("1000000", bytes).is_satisfied_by("1000000"));
        assert!(!write("1000000", bytes).is_satisfied_by("995328"));
        // Lists compare as sets.
        assert!(write("0-1", Compare::CpuList).is_satisfied_by("0-1\n"));
        assert!(write("0,1", Compare::CpuList).is_satisfied_by("0-1\n"));
        assert!(!write("0", Compare::CpuList).is_satisfied_by("0-1\n"));
        assert!(!write("0", Compare::CpuList).is_satisfied_by("garbage"));
        // cpu.max: the period only when planned.
        assert!(write("50000 100000", Compare::CpuMax).is_satisfied_by("50000 100000\n"));
        assert!(!write("50000 100000", Compare::CpuMax).is_satisfied_by("50000 50000\n"));
        assert!(write("max", Compare::CpuMax).is_satisfied_by("max 100000\n"));
        assert!(!write("max", Compare::CpuMax).is_satisfied_by("1000 100000\n"));
        assert!(write("10", Compare::Exact).is_satisfied_by("10\n"));
        assert!(!write("10", Compare::Exact).is_satisfied_by("100\n"));
    }

    #[test]
    fn controller_names_round_trip() {
        for c in Controller::ALL {
            assert_eq!(c.name().parse::<Controller>(), Ok(c));
        }
        assert!("blkio".parse::<Controller>().is_err());
        assert!(!Controller::Cpuacct.exists_on_v2());
        assert!(Controller::Memory.is_required() && !Controller::Pids.is_required());
    }
}
