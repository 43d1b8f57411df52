//! The property mapping against the values kubelet's systemd path produces. Vectors named
//! after their origin: runc's (opencontainers/cgroups) `systemd/cpuset_test.go`
//! `TestRangeToBits` and `systemd/systemd_test.go` `TestAddCPUQuota` / `TestTasksMax`, and
//! kubelet's `pkg/kubelet/cm/cgroup_v2_manager_linux_test.go` `TestCpuSharesToCPUWeight`.
use super::*;

fn set(text: &str) -> CpuSet {
    CpuSet::parse(text).expect("cpu list")
}

fn props(mapped: &Mapped) -> Vec<(&'static str, PropertyValue)> {
    mapped
        .properties
        .iter()
        .map(|p| (p.name, p.value.clone()))
        .collect()
}

/// runc `TestRangeToBits`, the cases in the kernel's list format (runc's parser also takes
/// stray commas and blanks, which sysfs never writes).
#[test]
fn range_to_bits() {
    let mut high = vec![2u8];
    high.extend([0u8; 15]);
    high.push(7);
    for (list, want) in [
        ("0", vec![1u8]),
        ("1", vec![2]),
        ("0-1", vec![3]),
        ("0,1", vec![3]),
        ("0-3", vec![0x0f]),
        ("0,1,2-3", vec![0x0f]),
        ("4-7", vec![0xf0]),
        ("0-7", vec![0xff]),
        ("0-15", vec![0xff, 0xff]),
        ("16", vec![0, 0, 1]),
        ("0-3,32-33", vec![0x0f, 0, 0, 0, 3]),
        ("128-130,1", high),
    ] {
        assert_eq!(mask_bytes(&set(list)), want, "{list}");
    }
}

/// runc `TestAddCPUQuota`: the per-second quota rounded up to 10 ms (a whole percent, what
/// systemd's drop-in keeps), and the quota the kernel then gets.
#[test]
fn add_cpu_quota() {
    for (quota, period, per_sec, kernel) in [
        (500_000, 1_000_000, 500_000, 500_000),
        (123_456, 0, 1_240_000, 124_000),
        (500_000, 900_000, 560_000, 504_000),
    ] {
        let period = if period == 0 { QUOTA_PERIOD } else { period };
        let got = quota_per_sec(Limit::Value(quota), period);
        assert_eq!(got, per_sec, "quota {quota} per {period}");
        assert_eq!(kernel_quota(got, period), Limit::Value(kernel));
    }
    assert_eq!(quota_per_sec(Limit::Max, QUOTA_PERIOD), INFINITY);
    assert_eq!(kernel_quota(INFINITY, QUOTA_PERIOD), Limit::Max);
}

/// kubelet's quotas (milli-CPU × period / 1000) of whole tens of milli-CPU come back from
/// systemd unchanged, for the default period and kubelet's configurable ones; any other limit
/// gets the next ten milli-CPU, as kubelet's own pods do on the systemd driver once systemd
/// has applied its units again.
#[test]
fn kubelet_quotas_reach_the_kernel_as_systemd_keeps_them() {
    for period in [100_000u64, 50_000, 10_000, 1_000_000] {
        for (milli, kept) in [
            (10i64, 10i64),
            (100, 100),
            (250, 250),
            (1000, 1000),
            (1500, 1500),
            (64_000, 64_000),
            (1, 10),
            (333, 340),
            (15, 20),
        ] {
            let quota = crate::cgroup::resources::milli_cpu_to_quota(milli, period);
            let quota = u64::try_from(quota).expect("positive");
            let want = crate::cgroup::resources::milli_cpu_to_quota(kept, period);
            let per_sec = quota_per_sec(Limit::Value(quota), period);
            assert_eq!(
                kernel_quota(per_sec, period),
                Limit::Value(u64::try_from(want).expect("positive")),
                "{milli}m per {period} us"
            );
        }
    }
}

/// kubelet `TestCpuSharesToCPUWeight`: the weight sent as `CPUWeight` on v2.
#[test]
fn cpu_shares_to_cpu_weight() {
    for (shares, weight) in [
        (2u64, 1u64),
        (3, 1),
        (4, 1),
        (28, 1),
        (29, 2),
        (245, 10),
        (262_144, 10_000),
    ] {
        let config = ResourceConfig {
            cpu_shares: Some(shares),
            ..ResourceConfig::default()
        };
        let mapped = map(&config, CgroupVersion::V2, 252);
        assert_eq!(
            props(&mapped),
            vec![("CPUWeight", PropertyValue::U64(weight))],
            "{shares} shares"
        );
        let v1 = map(&config, CgroupVersion::V1, 252);
        assert_eq!(props(&v1), vec![("CPUShares", PropertyValue::U64(shares))]);
    }
}

/// runc `TestTasksMax`'s limits: a negative one is infinity, 0 (which systemd refuses) is 1.
#[test]
fn tasks_max() {
    for (limit, sent) in [
        (100i64, 100u64),
        (0, 1),
        (42, 42),
        (-1, INFINITY),
        (-99, INFINITY),
    ] {
        let config = ResourceConfig {
            pids_limit: Some(Limit::from_signed(limit)),
            ..ResourceConfig::default()
        };
        let mapped = map(&config, CgroupVersion::V2, 252);
        assert_eq!(props(&mapped), vec![("TasksMax", PropertyValue::U64(sent))]);
    }
}

/// A Burstable pod's config as kubelet's systemd path gives it on v2: every setting a
/// property, nothing left for cgroupfs, the kernel values those of the cgroupfs backend.
#[test]
fn a_kubelet_pod_on_v2_is_all_properties() {
    let config = ResourceConfig {
        cpu_shares: Some(1024),
        cpu_quota: Some(Limit::Value(150_000)),
        cpu_period: Some(100_000),
        memory_limit: Some(Limit::Value(512 << 20)),
        pids_limit: Some(Limit::Max),
        cpuset_cpus: Some(set("0-3")),
        cpuset_mems: Some(set("1")),
        ..ResourceConfig::default()
    };
    let mapped = map(&config, CgroupVersion::V2, 252);
    assert_eq!(
        props(&mapped),
        vec![
            ("CPUWeight", PropertyValue::U64(39)),
            ("CPUQuotaPeriodUSec", PropertyValue::U64(100_000)),
            ("CPUQuotaPerSecUSec", PropertyValue::U64(1_500_000)),
            ("AllowedCPUs", PropertyValue::Bytes(vec![0x0f])),
            ("AllowedMemoryNodes", PropertyValue::Bytes(vec![0x02])),
            ("MemoryMax", PropertyValue::U64(512 << 20)),
            ("TasksMax", PropertyValue::U64(INFINITY)),
        ]
    );
    assert!(mapped.direct.is_empty(), "{:?}", mapped.direct);
    assert_eq!(mapped.effective, config);
}

/// On v1 systemd has no cpusets (and before 244 none at all), no memory.min/low/high, and
/// no burst or hugetlb anywhere: those are written to cgroupfs.
#[test]
fn what_systemd_cannot_hold_is_written_directly() {
    let config = ResourceConfig {
        cpu_burst: Some(20_000),
        cpuset_cpus: Some(set("2-3")),
        cpuset_mems: Some(set("0")),
        cpuset_memory_migrate: Some(true),
        memory_limit: Some(Limit::Max),
        hugetlb_limits: [(2 << 20, Limit::Value(0))].into_iter().collect(),
        ..ResourceConfig::default()
    };
    let v1 = map(&config, CgroupVersion::V1, 252);
    assert_eq!(
        props(&v1),
        vec![("MemoryLimit", PropertyValue::U64(INFINITY))]
    );
    assert_eq!(
        v1.direct,
        ResourceConfig {
            memory_limit: None,
            ..config.clone()
        }
    );
    let old = map(&config, CgroupVersion::V2, 243);
    assert_eq!(old.direct.cpuset_cpus, Some(set("2-3")));
    assert_eq!(old.direct.cpu_burst, Some(20_000));
    let new = map(&config, CgroupVersion::V2, 252);
    assert_eq!(new.direct.cpuset_cpus, None);
    assert_eq!(new.direct.hugetlb_limits, config.hugetlb_limits);
}

/// `cpu.idle`: `CPUWeight=idle` from systemd 252 on v2 (a weight there resets it to 0 at
/// every reload, so it must be the unit's), written to cgroupfs otherwise.
#[test]
fn cpu_idle_is_the_weight_where_systemd_writes_it() {
    let idle = ResourceConfig {
        cpu_shares: Some(2),
        cpu_idle: Some(true),
        ..ResourceConfig::default()
    };
    let mapped = map(&idle, CgroupVersion::V2, 252);
    assert_eq!(
        props(&mapped),
        vec![("CPUWeight", PropertyValue::U64(CPU_WEIGHT_IDLE))]
    );
    assert!(mapped.direct.is_empty());

    let lifted = ResourceConfig {
        cpu_idle: Some(false),
        ..idle.clone()
    };
    let mapped = map(&lifted, CgroupVersion::V2, 252);
    assert_eq!(props(&mapped), vec![("CPUWeight", PropertyValue::U64(1))]);
    assert!(
        mapped.direct.is_empty(),
        "systemd writes cpu.idle 0 with a weight"
    );

    let older = map(&idle, CgroupVersion::V2, 251);
    assert_eq!(props(&older), vec![("CPUWeight", PropertyValue::U64(1))]);
    assert_eq!(older.direct.cpu_idle, Some(true));
}

/// A quota that is not a whole percent of a CPU is reported as what the kernel will hold
/// (the systemd guest saw 248.2 ms per second become 240 ms at a daemon-reload when it was
/// sent unrounded).
#[test]
fn the_effective_quota_is_what_systemd_writes() {
    let config = ResourceConfig {
        cpu_quota: Some(Limit::Value(25_175)),
        ..ResourceConfig::default()
    };
    let mapped = map(&config, CgroupVersion::V2, 252);
    assert_eq!(
        props(&mapped),
        vec![("CPUQuotaPerSecUSec", PropertyValue::U64(260_000))]
    );
    assert_eq!(mapped.effective.cpu_quota, Some(Limit::Value(26_000)));
}
