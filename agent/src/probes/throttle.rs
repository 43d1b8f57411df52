//! CFS throttling: episode durations from fexit on `throttle_cfs_rq` and fentry on
//! `unthrottle_cfs_rq` (where the kernel allows tracing programs), and the cgroups' own
//! `cpu.stat` counters (everywhere).
//!
//! The episode programs live in the sched_switch object ([`super::sched_switch::SwitchProbe`]);
//! this module attaches them and reads `cpu.stat`.
use std::path::{Path, PathBuf};

use aya::programs::{FEntry, FExit};
use aya::{Btf, Ebpf};
use qosd_common::names;

use super::{AttachError, ProbeMode, error_chain, program_as};
use crate::cgroup::stats::{self, CpuStats, StatsError};

/// The episode probe's name in `qosd check` and in `qosd_probe_info{probe}`.
pub const PROBE_NAME: &str = "cpu_throttle_episodes";

/// Errors of the cpu.stat reader.
#[derive(Debug, thiserror::Error)]
pub enum ThrottleError {
    #[error(transparent)]
    Stats(#[from] StatsError),
}

/// Attaches the episode programs; a refusal is returned as the unavailable mode with the
/// kernel's reason, and nothing stays attached.
pub fn attach_episodes(ebpf: &mut Ebpf) -> ProbeMode {
    match try_attach(ebpf) {
        Ok(()) => ProbeMode::Fentry,
        Err(reason) => {
            if let Some(program) = ebpf.program_mut(names::THROTTLE_FEXIT)
                && let Ok(program) = <&mut FExit>::try_from(program)
                && let Err(e) = program.unload()
            {
                tracing::debug!(error = %error_chain(&e), "unloading the fexit program");
            }
            if let Some(program) = ebpf.program_mut(names::UNTHROTTLE_FENTRY)
                && let Ok(program) = <&mut FEntry>::try_from(program)
                && let Err(e) = program.unload()
            {
                tracing::debug!(error = %error_chain(&e), "unloading the fentry program");
            }
            ProbeMode::Unavailable(reason.to_string())
        }
    }
}

fn try_attach(ebpf: &mut Ebpf) -> Result<(), AttachError> {
    let btf = Btf::from_sys_fs().map_err(AttachError::at("kernel BTF"))?;
    {
        let program: &mut FExit = program_as(ebpf, names::THROTTLE_FEXIT)?;
        program
            .load("throttle_cfs_rq", &btf)
            .map_err(AttachError::at("fexit throttle_cfs_rq"))?;
        program
            .attach()
            .map_err(AttachError::at("fexit throttle_cfs_rq"))?;
    }
    let program: &mut FEntry = program_as(ebpf, names::UNTHROTTLE_FENTRY)?;
    program
        .load("unthrottle_cfs_rq", &btf)
        .map_err(AttachError::at("fentry unthrottle_cfs_rq"))?;
    program
        .attach()
        .map_err(AttachError::at("fentry unthrottle_cfs_rq"))?;
    Ok(())
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

/// Reads `cpu.stat` of every cgroup under `root` that has had a CFS quota (a non-zero
/// `nr_periods`). `v1` selects the v1 file format.
pub fn read_cfs_counters(root: &Path, v1: bool) -> Result<Vec<CfsCounters>, ThrottleError> {
    use std::os::unix::fs::MetadataExt as _;
    let mut out = Vec::new();
    let mut pending: Vec<(PathBuf, String)> = vec![(root.to_owned(), String::new())];
    while let Some((dir, relative)) = pending.pop() {
        let stats = match read_one(&dir, v1) {
            Ok(stats) => stats,
            // A cgroup removed during the walk.
            Err(_) if !dir.exists() => None,
            Err(e) => return Err(e.into()),
        };
        if let Some(stats) = stats
            && let Some(periods) = stats.nr_periods.filter(|p| *p > 0)
            && let Ok(meta) = std::fs::metadata(&dir)
        {
            out.push(CfsCounters {
                path: if relative.is_empty() {
                    "/".to_owned()
                } else {
                    relative.clone()
                },
                cgroup_id: meta.ino(),
                periods,
                throttled_periods: stats.nr_throttled.unwrap_or_default(),
                throttled_ns: stats.throttled_ns.unwrap_or_default(),
            });
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let child = format!("{relative}/{}", entry.file_name().to_string_lossy());
                pending.push((entry.path(), child));
            }
        }
    }
    Ok(out)
}

fn read_one(dir: &Path, v1: bool) -> Result<Option<CpuStats>, StatsError> {
    if v1 {
        stats::read_cpu_v1(Some(dir), None)
    } else {
        stats::read_cpu_v2(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let found = read_cfs_counters(root.path(), false).expect("read");
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
        let found = read_cfs_counters(root.path(), true).expect("read");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].path.as_str(), found[0].throttled_ns), ("/c", 777));
    }
}
