//! Machine capacity, read from procfs and sysfs under a root directory (`/` on a node, a
//! fixture tree in tests), as kubelet gets it from cAdvisor's machine info
//! (`pkg/kubelet/cadvisor/util.go` `CapacityFromMachineInfo`) plus the pid entry of its
//! internal capacity (`pkg/kubelet/stats/pidlimit`):
//! - cpu: the online CPUs (`/sys/devices/system/cpu/online`) × 1000 millicores;
//! - memory: `MemTotal` of `/proc/meminfo`;
//! - `hugepages-<size>`: `nr_hugepages` × size for each `/sys/kernel/mm/hugepages/hugepages-<n>kB`;
//! - pid: the smaller of `/proc/sys/kernel/pid_max` and `/proc/sys/kernel/threads-max`.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use super::allocatable::Capacity;
use crate::cgroup::cpuset::CpuSet;

/// Errors reading machine capacity; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    #[error("reading {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {reason}", .path.display())]
    Parse { path: PathBuf, reason: String },
}

/// Reads machine facts below a root directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineInfo {
    root: PathBuf,
}

impl MachineInfo {
    /// Machine facts below `root` (which holds `proc/` and `sys/`).
    #[must_use]
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// This machine.
    #[must_use]
    pub fn host() -> Self {
        Self::new("/")
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root.join(relative)
    }

    fn read(&self, path: &Path) -> Result<String, CapacityError> {
        std::fs::read_to_string(path).map_err(|source| CapacityError::Read {
            path: path.to_owned(),
            source,
        })
    }

    /// The online CPU ids.
    pub fn online_cpus(&self) -> Result<CpuSet, CapacityError> {
        let path = self.path("sys/devices/system/cpu/online");
        let text = self.read(&path)?;
        let cpus = CpuSet::parse(&text).map_err(|e| CapacityError::Parse {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        if cpus.is_empty() {
            return Err(CapacityError::Parse {
                path,
                reason: "no online CPU".to_owned(),
            });
        }
        Ok(cpus)
    }

    /// `MemTotal` in bytes.
    pub fn memory_total_bytes(&self) -> Result<i64, CapacityError> {
        let path = self.path("proc/meminfo");
        let text = self.read(&path)?;
        let parse_error = |reason: String| CapacityError::Parse {
            path: path.clone(),
            reason,
        };
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .ok_or_else(|| parse_error("no MemTotal line".to_owned()))?;
        let mut words = line.split_whitespace();
        let (Some(number), unit, None) = (words.next(), words.next(), words.next()) else {
            return Err(parse_error(format!(
                "MemTotal {:?} is not \"<number> kB\"",
                line.trim()
            )));
        };
        let multiplier: i64 = match unit {
            Some("kB") => 1024,
            None => 1,
            Some(other) => return Err(parse_error(format!("MemTotal has unknown unit {other:?}"))),
        };
        number
            .parse::<i64>()
            .ok()
            .and_then(|n| n.checked_mul(multiplier))
            .ok_or_else(|| parse_error(format!("MemTotal {number:?} is not a byte count")))
    }

    /// Pre-allocated huge pages: page size in bytes -> total bytes. No `hugepages` directory
    /// (no hugetlbfs support) means none.
    pub fn hugepages(&self) -> Result<BTreeMap<u64, i64>, CapacityError> {
        let dir = self.path("sys/kernel/mm/hugepages");
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(source) => return Err(CapacityError::Read { path: dir, source }),
        };
        let mut pages = BTreeMap::new();
        for entry in entries {
            let entry = entry.map_err(|source| CapacityError::Read {
                path: dir.clone(),
                source,
            })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let size_kib: u64 = name
                .strip_prefix("hugepages-")
                .and_then(|s| s.strip_suffix("kB"))
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| CapacityError::Parse {
                    path: entry.path(),
                    reason: "not a hugepages-<size>kB directory".to_owned(),
                })?;
            let count_path = entry.path().join("nr_hugepages");
            let count: i64 =
                self.read(&count_path)?
                    .trim()
                    .parse()
                    .map_err(|_| CapacityError::Parse {
                        path: count_path.clone(),
                        reason: "nr_hugepages is not a number".to_owned(),
                    })?;
            let size = size_kib.checked_mul(1024);
            let total = size
                .and_then(|s| i64::try_from(s).ok())
                .and_then(|s| s.checked_mul(count));
            let (Some(size), Some(total)) = (size, total) else {
                return Err(CapacityError::Parse {
                    path: count_path,
                    reason: "huge page total overflows".to_owned(),
                });
            };
            pages.insert(size, total);
        }
        Ok(pages)
    }

    /// The system-wide task limit, the smaller of `kernel.pid_max` and `kernel.threads-max`;
    /// like kubelet, a file that cannot be read or parsed is skipped, and `None` means neither was.
    #[must_use]
    pub fn max_pids(&self) -> Option<i64> {
        ["proc/sys/kernel/pid_max", "proc/sys/kernel/threads-max"]
            .into_iter()
            .filter_map(|f| {
                std::fs::read_to_string(self.path(f))
                    .ok()?
                    .trim()
                    .parse::<i64>()
                    .ok()
            })
            .min()
    }

    /// Node capacity.
    pub fn capacity(&self) -> Result<Capacity, CapacityError> {
        let cpus = i64::try_from(self.online_cpus()?.len()).unwrap_or(i64::MAX);
        Ok(Capacity {
            milli_cpu: cpus.saturating_mul(1000),
            memory_bytes: self.memory_total_bytes()?,
            hugepages: self.hugepages()?,
            pids: self.max_pids(),
        })
    }
}

/// The resource name of a huge page size (`v1helper.HugePageResourceName`): `hugepages-2Mi`,
/// `hugepages-1Gi`, `hugepages-64Ki` (the size in its canonical binary-SI form).
#[must_use]
pub fn hugepage_resource_name(page_size_bytes: u64) -> String {
    const SUFFIXES: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    for (suffix, shift) in SUFFIXES {
        let unit = 1u64 << shift;
        if page_size_bytes >= unit && page_size_bytes.is_multiple_of(unit) {
            return format!("hugepages-{}{suffix}", page_size_bytes / unit);
        }
    }
    format!("hugepages-{page_size_bytes}")
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixture {
        dir: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Self {
            Self {
                dir: tempfile::tempdir().unwrap(),
            }
        }

        fn write(&self, relative: &str, content: &str) -> &Self {
            let path = self.dir.path().join(relative);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
            self
        }

        fn machine(&self) -> MachineInfo {
            MachineInfo::new(self.dir.path())
        }

        /// A 4-CPU, 16 GiB machine with 512 2Mi pages and 2 1Gi pages.
        fn typical() -> Self {
            let f = Self::new();
            f.write("sys/devices/system/cpu/online", "0-3\n")
                .write(
                    "proc/meminfo",
                    "MemTotal:       16318820 kB\nMemFree:         1234567 kB\nHugePages_Total:     512\n",
                )
                .write("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "512\n")
                .write("sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages", "2\n")
                .write("proc/sys/kernel/pid_max", "4194304\n")
                .write("proc/sys/kernel/threads-max", "126733\n");
            f
        }
    }

    #[test]
    fn capacity_of_a_fixture_machine() {
        let f = Fixture::typical();
        let capacity = f.machine().capacity().unwrap();
        assert_eq!(capacity.milli_cpu, 4000);
        assert_eq!(capacity.memory_bytes, 16_318_820 * 1024);
        assert_eq!(
            capacity.hugepages,
            BTreeMap::from([(2 << 20, 512 * (2 << 20)), (1 << 30, 2 << 30)])
        );
        assert_eq!(capacity.hugepages_bytes(), (1 << 30) + (2 << 30));
        // threads-max is the smaller limit here.
        assert_eq!(capacity.pids, Some(126_733));
    }

    #[test]
    fn offline_cpus_are_not_counted() {
        let f = Fixture::typical();
        f.write("sys/devices/system/cpu/online", "0,2-3,8\n");
        assert_eq!(
            f.machine().online_cpus().unwrap().to_vec(),
            vec![0, 2, 3, 8]
        );
        assert_eq!(f.machine().capacity().unwrap().milli_cpu, 4000);
    }

    #[test]
    fn missing_or_malformed_files_are_errors_naming_them() {
        let f = Fixture::typical();
        std::fs::remove_file(f.dir.path().join("proc/meminfo")).unwrap();
        let err = f.machine().capacity().unwrap_err();
        assert!(matches!(err, CapacityError::Read { .. }), "{err}");
        assert!(err.to_string().contains("proc/meminfo"), "{err}");

        for meminfo in [
            "MemFree: 1 kB\n",
            "MemTotal: lots kB\n",
            "MemTotal: 1 MB\n",
            "MemTotal: 1 kB extra\n",
        ] {
            f.write("proc/meminfo", meminfo);
            let err = f.machine().memory_total_bytes().unwrap_err();
            assert!(
                matches!(err, CapacityError::Parse { .. }),
                "{meminfo}: {err}"
            );
        }

        f.write("proc/meminfo", "MemTotal: 1024 kB\n");
        for online in ["", "\n", "0-x\n"] {
            f.write("sys/devices/system/cpu/online", online);
            let err = f.machine().online_cpus().unwrap_err();
            assert!(
                err.to_string().contains("sys/devices/system/cpu/online"),
                "{online:?}: {err}"
            );
        }

        f.write("sys/devices/system/cpu/online", "0\n");
        f.write(
            "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
            "many\n",
        );
        let err = f.machine().hugepages().unwrap_err();
        assert!(
            err.to_string().contains("hugepages-2048kB/nr_hugepages"),
            "{err}"
        );
    }

    #[test]
    fn no_hugetlb_and_no_pid_files() {
        let f = Fixture::new();
        f.write("sys/devices/system/cpu/online", "0-1\n")
            .write("proc/meminfo", "MemTotal: 2048 kB\n");
        let capacity = f.machine().capacity().unwrap();
        assert_eq!(
            capacity,
            Capacity {
                milli_cpu: 2000,
                memory_bytes: 2 << 20,
                hugepages: BTreeMap::new(),
                pids: None
            }
        );
        // pid_max alone (threads-max unreadable or garbage) is used, as kubelet's pidlimit does.
        f.write("proc/sys/kernel/pid_max", "32768\n")
            .write("proc/sys/kernel/threads-max", "garbage\n");
        assert_eq!(f.machine().max_pids(), Some(32768));
    }

    /// `v1helper.HugePageResourceName` on the sizes Linux offers (x86 2M/1G, arm64 64K/32M/512M/16G).
    #[test]
    fn hugepage_resource_names() {
        let rows = [
            (2u64 << 20, "hugepages-2Mi"),
            (1 << 30, "hugepages-1Gi"),
            (64 << 10, "hugepages-64Ki"),
            (32 << 20, "hugepages-32Mi"),
            (512 << 20, "hugepages-512Mi"),
            (16 << 30, "hugepages-16Gi"),
            (1536 << 10, "hugepages-1536Ki"),
        ];
        for (size, want) in rows {
            assert_eq!(hugepage_resource_name(size), want);
        }
    }

    /// The real machine: whatever it has, it has CPUs and memory.
    #[test]
    fn host_capacity_is_readable() {
        let capacity = MachineInfo::host().capacity().unwrap();
        assert!(
            capacity.milli_cpu >= 1000 && capacity.milli_cpu % 1000 == 0,
            "{capacity:?}"
        );
        assert!(capacity.memory_bytes > 0, "{capacity:?}");
    }
}
