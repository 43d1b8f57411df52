//! CFS bandwidth counters of every cgroup that has had a quota, from the cgroups' own
//! `cpu.stat` (v1 and v2 formats), over one walk of the cpu hierarchy ([`super::walk`]).
use super::stats::{self, CpuStats, StatsError};
use super::walk::{CgroupDir, Walk};

/// Errors of the `cpu.stat` reader.
#[derive(Debug, thiserror::Error)]
pub enum CfsError {
    #[error(transparent)]
    Stats(#[from] StatsError),
}

/// One cgroup's CFS bandwidth counters, cAdvisor's meaning.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CfsCounters {
    /// Path relative to the hierarchy root (`/a/b`).
    pub path: String,
    /// Inode of the cgroup directory (its cgroup id).
    pub cgroup_id: u64,
    /// Enforcement periods that elapsed (`nr_periods`).
    pub periods: u64,
    /// Periods in which the cgroup was throttled (`nr_throttled`).
    pub throttled_periods: u64,
    /// Total time throttled, nanoseconds (`throttled_time`, v2 `throttled_usec` * 1000).
    pub throttled_ns: u64,
}

/// Reads `cpu.stat` of every cgroup of a walk of the cpu hierarchy ([`super::walk::walk`], or
/// the scrape's shared one) that has had a CFS quota (a non-zero `nr_periods`). `v1` selects
/// the v1 file format.
pub fn read_cfs_counters(found: &Walk, v1: bool) -> Result<Vec<CfsCounters>, CfsError> {
    let mut out = Vec::new();
    for dir in &found.dirs {
        let stats = match read_one(dir, v1) {
            Ok(stats) => stats,
            // A cgroup removed during the walk.
            Err(_) if !dir.path.exists() => None,
            Err(e) => return Err(e.into()),
        };
        if let Some(stats) = stats
            && let Some(periods) = stats.nr_periods.filter(|p| *p > 0)
        {
            out.push(CfsCounters {
                path: dir.relative.clone(),
                cgroup_id: dir.ino,
                periods,
                throttled_periods: stats.nr_throttled.unwrap_or_default(),
                throttled_ns: stats.throttled_ns.unwrap_or_default(),
            });
        }
    }
    Ok(out)
}

/// `cpu.stat` of one cgroup, opened relative to the directory where the tree holds it.
fn read_one(dir: &CgroupDir, v1: bool) -> Result<Option<CpuStats>, StatsError> {
    let read = |source| StatsError::Read {
        path: dir.path.join(CPU_STAT),
        source,
    };
    let Some(text) = dir.read(CPU_STAT).map_err(read)? else {
        return Ok(None);
    };
    let parsed = if v1 {
        stats::parse_cpu_stat_v1(&text, None)
    } else {
        stats::parse_cpu_stat_v2(&text)
    };
    parsed.map(Some).map_err(|e| e.at(&dir.path.join(CPU_STAT)))
}

const CPU_STAT: &str = "cpu.stat";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::walk::walk;

    #[test]
    fn cgroups_with_a_quota_are_read_in_either_format() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("a/b")).expect("mkdir");
        std::fs::create_dir_all(root.path().join("c")).expect("mkdir");
        std::fs::write(
            root.path().join("a/b/cpu.stat"),
            "usage_usec 5\nnr_periods 10\nnr_throttled 4\nthrottled_usec 250\n",
        )
        .expect("write");
        std::fs::write(
            root.path().join("c/cpu.stat"),
            "usage_usec 5\nnr_periods 0\n",
        )
        .expect("write");
        let found =
            read_cfs_counters(&walk(root.path(), None).expect("walk"), false).expect("read");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].path, "/a/b");
        assert_eq!(found[0].periods, 10);
        assert_eq!(found[0].throttled_periods, 4);
        assert_eq!(found[0].throttled_ns, 250_000);

        std::fs::write(
            root.path().join("c/cpu.stat"),
            "nr_periods 3\nnr_throttled 1\nthrottled_time 777\n",
        )
        .expect("write");
        std::fs::remove_file(root.path().join("a/b/cpu.stat")).expect("rm");
        let found = read_cfs_counters(&walk(root.path(), None).expect("walk"), true).expect("read");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].path.as_str(), found[0].throttled_ns), ("/c", 777));
    }
}
