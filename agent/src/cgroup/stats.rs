//! Readers for the kernel's per-cgroup statistics files, v1 and v2:
//!
//! - CPU: v1 `cpu.stat` (`nr_periods`, `nr_throttled`, `throttled_time` ns) and `cpuacct.usage`
//!   (ns); v2 `cpu.stat` (`usage_usec`, `user_usec`, `system_usec`, and the throttling counters
//!   once the cpu controller is enabled). Both are normalised into [`CpuStats`] in nanoseconds.
//! - Memory: `memory.stat` (every key/value pair) and `memory.numa_stat` in both formats
//!   (v1 `total=N N0=a N1=b`, counted in pages, including the `hierarchical_` lines; v2
//!   `anon N0=a N1=b`, in bytes).
//! - cpuset: the effective CPUs and memory nodes (v1 `cpuset.effective_cpus`/`effective_mems`,
//!   v2 `cpuset.cpus.effective`/`cpuset.mems.effective`).
//!
//! Parsers take the text; the `read_*` functions add the file, and say `None` when the file
//! does not exist (its controller is not enabled there).
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use super::cpuset::CpuSet;

/// A statistics file that could not be read or understood.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: line {line:?}: {reason}")]
    Parse {
        path: PathBuf,
        line: String,
        reason: String,
    },
}

/// A parse failure before the file is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    pub line: String,
    pub reason: String,
}

impl LineError {
    fn new(line: &str, reason: impl Into<String>) -> Self {
        Self {
            line: line.to_owned(),
            reason: reason.into(),
        }
    }

    pub(crate) fn at(self, path: &Path) -> StatsError {
        StatsError::Parse {
            path: path.to_owned(),
            line: self.line,
            reason: self.reason,
        }
    }
}

/// CPU usage and CFS throttling of a cgroup, in nanoseconds. Fields the kernel does not report
/// for this cgroup (v1 user/system split, v2 throttling without the cpu controller) are `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuStats {
    pub usage_ns: Option<u64>,
    pub user_ns: Option<u64>,
    pub system_ns: Option<u64>,
    pub nr_periods: Option<u64>,
    pub nr_throttled: Option<u64>,
    pub throttled_ns: Option<u64>,
    pub nr_bursts: Option<u64>,
    pub burst_ns: Option<u64>,
}

/// Per-NUMA-node counters of one `memory.numa_stat` line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NumaEntry {
    /// The `total=` column (v1 only).
    pub total: Option<u64>,
    /// Node id -> value.
    pub nodes: BTreeMap<u32, u64>,
}

impl NumaEntry {
    /// The total: the kernel's when given, else the sum over nodes.
    #[must_use]
    pub fn total_or_sum(&self) -> u64 {
        self.total
            .unwrap_or_else(|| self.nodes.values().copied().sum())
    }
}

/// The unit of `memory.numa_stat` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumaUnit {
    /// v1 counts pages.
    Pages,
    /// v2 counts bytes.
    Bytes,
}

/// A parsed `memory.numa_stat`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumaStat {
    pub unit: NumaUnit,
    /// Line key (`total`, `anon`, `hierarchical_file`, `active_anon`, ...) -> counters.
    pub entries: BTreeMap<String, NumaEntry>,
}

/// The CPUs and memory nodes a cgroup's tasks may actually use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EffectiveCpuset {
    pub cpus: Vec<u32>,
    pub mems: Vec<u32>,
}

/// Parses `key value` lines into a map (`cpu.stat`, `memory.stat`). Blank lines are skipped.
pub fn parse_flat_keyed(text: &str) -> Result<BTreeMap<String, u64>, LineError> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut fields = line.split_whitespace();
        let (Some(key), Some(value), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(LineError::new(line, "expected \"key value\""));
        };
        let value = value
            .parse::<u64>()
            .map_err(|e| LineError::new(line, format!("value: {e}")))?;
        out.insert(key.to_owned(), value);
    }
    Ok(out)
}

/// Parses a file holding a single unsigned number (`cpuacct.usage`).
pub fn parse_single_u64(text: &str) -> Result<u64, LineError> {
    let trimmed = text.trim();
    trimmed
        .parse()
        .map_err(|e| LineError::new(trimmed, format!("not an unsigned number: {e}")))
}

/// v1 `cpu.stat` (nanosecond `throttled_time`, `burst_time`) plus `cpuacct.usage`.
pub fn parse_cpu_stat_v1(
    cpu_stat: &str,
    cpuacct_usage: Option<&str>,
) -> Result<CpuStats, LineError> {
    let map = parse_flat_keyed(cpu_stat)?;
    Ok(CpuStats {
        usage_ns: cpuacct_usage.map(parse_single_u64).transpose()?,
        user_ns: None,
        system_ns: None,
        nr_periods: map.get("nr_periods").copied(),
        nr_throttled: map.get("nr_throttled").copied(),
        throttled_ns: map.get("throttled_time").copied(),
        nr_bursts: map.get("nr_bursts").copied(),
        burst_ns: map.get("burst_time").copied(),
    })
}

/// v2 `cpu.stat` (microsecond counters), converted to nanoseconds.
pub fn parse_cpu_stat_v2(cpu_stat: &str) -> Result<CpuStats, LineError> {
    let map = parse_flat_keyed(cpu_stat)?;
    let usec = |key: &str| map.get(key).map(|v| v.saturating_mul(1000));
    Ok(CpuStats {
        usage_ns: usec("usage_usec"),
        user_ns: usec("user_usec"),
        system_ns: usec("system_usec"),
        nr_periods: map.get("nr_periods").copied(),
        nr_throttled: map.get("nr_throttled").copied(),
        throttled_ns: usec("throttled_usec"),
        nr_bursts: map.get("nr_bursts").copied(),
        burst_ns: usec("burst_usec"),
    })
}

/// `memory.numa_stat`, either format; the unit follows the format (`key=` first column: v1).
pub fn parse_numa_stat(text: &str) -> Result<NumaStat, LineError> {
    let mut entries = BTreeMap::new();
    let mut unit = None;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else {
            continue;
        };
        let mut entry = NumaEntry::default();
        let (key, line_unit) = match first.split_once('=') {
            Some((key, total)) => {
                let total = total
                    .parse::<u64>()
                    .map_err(|e| LineError::new(line, format!("total: {e}")))?;
                entry.total = Some(total);
                (key, NumaUnit::Pages)
            }
            None => (first, NumaUnit::Bytes),
        };
        if *unit.get_or_insert(line_unit) != line_unit {
            return Err(LineError::new(line, "mixes the v1 and v2 formats"));
        }
        for field in fields {
            let parsed = field
                .strip_prefix('N')
                .and_then(|f| f.split_once('='))
                .and_then(|(node, value)| {
                    Some((node.parse::<u32>().ok()?, value.parse::<u64>().ok()?))
                });
            let Some((node, value)) = parsed else {
                return Err(LineError::new(
                    line,
                    format!("{field:?} is not N<node>=<value>"),
                ));
            };
            entry.nodes.insert(node, value);
        }
        entries.insert(key.to_owned(), entry);
    }
    Ok(NumaStat {
        unit: unit.unwrap_or(NumaUnit::Bytes),
        entries,
    })
}

/// Reads a file; `None` when it does not exist.
pub fn read_optional(path: &Path) -> Result<Option<String>, StatsError> {
    read_kernel_file(path).map_err(|source| StatsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The text of a cgroupfs (or sysfs) file, `None` when it does not exist: open, read until
/// the end, close. Unlike `std::fs::read_to_string` it asks no size first (kernfs files report
/// 4096 or 0 whatever they hold), which saves a `statx` per file on every read of the tree.
pub fn read_kernel_file(path: &Path) -> io::Result<Option<String>> {
    use std::io::Read as _;
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut text = String::with_capacity(512);
    // `Take` reads without the size hint `File` would ask for.
    file.take(u64::MAX).read_to_string(&mut text)?;
    Ok(Some(text))
}

/// v1 CPU statistics of the cgroup directories `cpu_dir` (cpu hierarchy) and `cpuacct_dir`.
pub fn read_cpu_v1(
    cpu_dir: Option<&Path>,
    cpuacct_dir: Option<&Path>,
) -> Result<Option<CpuStats>, StatsError> {
    let stat_path = cpu_dir.map(|d| d.join("cpu.stat"));
    let usage_path = cpuacct_dir.map(|d| d.join("cpuacct.usage"));
    let stat = stat_path
        .as_deref()
        .map(read_optional)
        .transpose()?
        .flatten();
    let usage = usage_path
        .as_deref()
        .map(read_optional)
        .transpose()?
        .flatten();
    if stat.is_none() && usage.is_none() {
        return Ok(None);
    }
    let mut stats = match (&stat, &stat_path) {
        (Some(text), Some(path)) => parse_cpu_stat_v1(text, None).map_err(|e| e.at(path))?,
        _ => CpuStats::default(),
    };
    if let (Some(text), Some(path)) = (&usage, &usage_path) {
        stats.usage_ns = Some(parse_single_u64(text).map_err(|e| e.at(path))?);
    }
    Ok(Some(stats))
}

/// v2 CPU statistics of a cgroup directory.
pub fn read_cpu_v2(dir: &Path) -> Result<Option<CpuStats>, StatsError> {
    let path = dir.join("cpu.stat");
    read_optional(&path)?
        .map(|text| parse_cpu_stat_v2(&text).map_err(|e| e.at(&path)))
        .transpose()
}

/// `memory.stat` of a cgroup directory (either version).
pub fn read_memory_stat(dir: &Path) -> Result<Option<BTreeMap<String, u64>>, StatsError> {
    let path = dir.join("memory.stat");
    read_optional(&path)?
        .map(|text| parse_flat_keyed(&text).map_err(|e| e.at(&path)))
        .transpose()
}

/// `memory.numa_stat` of a cgroup directory (either version).
pub fn read_numa_stat(dir: &Path) -> Result<Option<NumaStat>, StatsError> {
    let path = dir.join("memory.numa_stat");
    read_optional(&path)?
        .map(|text| parse_numa_stat(&text).map_err(|e| e.at(&path)))
        .transpose()
}

/// Effective CPUs and memory nodes from the cpuset files named `cpus_file` and `mems_file`.
fn read_effective(
    dir: &Path,
    cpus_file: &str,
    mems_file: &str,
) -> Result<Option<EffectiveCpuset>, StatsError> {
    let read_list = |file: &str| -> Result<Option<Vec<u32>>, StatsError> {
        let path = dir.join(file);
        read_optional(&path)?
            .map(|text| {
                CpuSet::parse(&text)
                    .map(|set| set.to_vec())
                    .map_err(|e| LineError::new(text.trim(), e.to_string()).at(&path))
            })
            .transpose()
    };
    match (read_list(cpus_file)?, read_list(mems_file)?) {
        (None, None) => Ok(None),
        (cpus, mems) => Ok(Some(EffectiveCpuset {
            cpus: cpus.unwrap_or_default(),
            mems: mems.unwrap_or_default(),
        })),
    }
}

/// The effective CPUs alone (`cpuset.effective_cpus` on v1, `cpuset.cpus.effective` on v2)
/// of a cgroup directory; `None` when the file is not there.
pub fn read_effective_cpus(dir: &Path, v1: bool) -> Result<Option<CpuSet>, StatsError> {
    let path = dir.join(if v1 {
        "cpuset.effective_cpus"
    } else {
        "cpuset.cpus.effective"
    });
    read_optional(&path)?
        .map(|text| {
            CpuSet::parse(&text).map_err(|e| LineError::new(text.trim(), e.to_string()).at(&path))
        })
        .transpose()
}

/// v1 `cpuset.effective_cpus` / `cpuset.effective_mems` of a cgroup directory.
pub fn read_effective_cpuset_v1(dir: &Path) -> Result<Option<EffectiveCpuset>, StatsError> {
    read_effective(dir, "cpuset.effective_cpus", "cpuset.effective_mems")
}

/// v2 `cpuset.cpus.effective` / `cpuset.mems.effective` of a cgroup directory.
pub fn read_effective_cpuset_v2(dir: &Path) -> Result<Option<EffectiveCpuset>, StatsError> {
    read_effective(dir, "cpuset.cpus.effective", "cpuset.mems.effective")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// v1 cpu.stat of a 6.x kernel (with the burst counters of 5.14+).
    const CPU_STAT_V1: &str = "nr_periods 1570\nnr_throttled 321\nthrottled_time 18573021412\nnr_bursts 0\nburst_time 0\n";

    /// v2 cpu.stat with the cpu controller enabled.
    const CPU_STAT_V2: &str = "usage_usec 2873140\nuser_usec 2616245\nsystem_usec 256895\nnr_periods 31\nnr_throttled 12\nthrottled_usec 1024611\nnr_bursts 0\nburst_usec 0\n";

    /// v2 cpu.stat of a cgroup whose parent did not enable cpu: usage only.
    const CPU_STAT_V2_CORE: &str = "usage_usec 4070\nuser_usec 1985\nsystem_usec 2085\n";

    /// v1 memory.numa_stat of a two-node machine.
    const NUMA_V1: &str = "\
total=3919 N0=3000 N1=919
file=517 N0=500 N1=17
anon=374 N0=300 N1=74
unevictable=3028 N0=2200 N1=828
hierarchical_total=889983 N0=800000 N1=89983
hierarchical_file=883451 N0=800000 N1=83451
hierarchical_anon=3504 N0=0 N1=3504
hierarchical_unevictable=3028 N0=2200 N1=828
";

    /// v2 memory.numa_stat (excerpt) of a two-node guest.
    const NUMA_V2: &str = "\
anon N0=1576960 N1=524288
file N0=8192000 N1=0
kernel_stack N0=16384 N1=16384
shmem N0=0 N1=0
active_anon N0=1572864 N1=524288
";

    #[test]
    fn v1_cpu_stat_and_cpuacct_usage() {
        let stats = parse_cpu_stat_v1(CPU_STAT_V1, Some("4242424242\n")).unwrap();
        assert_eq!(
            stats,
            CpuStats {
                usage_ns: Some(4_242_424_242),
                user_ns: None,
                system_ns: None,
                nr_periods: Some(1570),
                nr_throttled: Some(321),
                throttled_ns: Some(18_573_021_412),
                nr_bursts: Some(0),
                burst_ns: Some(0),
            }
        );
        // Pre-5.14 kernels have no burst lines.
        let old =
            parse_cpu_stat_v1("nr_periods 1\nnr_throttled 0\nthrottled_time 0\n", None).unwrap();
        assert_eq!(old.nr_bursts, None);
        assert_eq!(old.usage_ns, None);
    }

    #[test]
    fn v2_cpu_stat_in_nanoseconds() {
        let stats = parse_cpu_stat_v2(CPU_STAT_V2).unwrap();
        assert_eq!(stats.usage_ns, Some(2_873_140_000));
        assert_eq!(stats.user_ns, Some(2_616_245_000));
        assert_eq!(stats.system_ns, Some(256_895_000));
        assert_eq!(stats.nr_periods, Some(31));
        assert_eq!(stats.nr_throttled, Some(12));
        assert_eq!(stats.throttled_ns, Some(1_024_611_000));
        let core = parse_cpu_stat_v2(CPU_STAT_V2_CORE).unwrap();
        assert_eq!(core.usage_ns, Some(4_070_000));
        assert_eq!(core.nr_periods, None);
        assert_eq!(core.throttled_ns, None);
    }

    #[test]
    fn numa_stat_v1_with_hierarchical_lines() {
        let stat = parse_numa_stat(NUMA_V1).unwrap();
        assert_eq!(stat.unit, NumaUnit::Pages);
        assert_eq!(stat.entries.len(), 8);
        let total = &stat.entries["total"];
        assert_eq!(total.total, Some(3919));
        assert_eq!(total.nodes, BTreeMap::from([(0, 3000), (1, 919)]));
        let hier = &stat.entries["hierarchical_anon"];
        assert_eq!(hier.nodes[&1], 3504);
        assert_eq!(hier.total_or_sum(), 3504);
    }

    #[test]
    fn numa_stat_v2_in_bytes() {
        let stat = parse_numa_stat(NUMA_V2).unwrap();
        assert_eq!(stat.unit, NumaUnit::Bytes);
        let anon = &stat.entries["anon"];
        assert_eq!(anon.total, None);
        assert_eq!(anon.nodes, BTreeMap::from([(0, 1_576_960), (1, 524_288)]));
        assert_eq!(anon.total_or_sum(), 2_101_248);
        assert_eq!(stat.entries["file"].nodes[&1], 0);
    }

    #[test]
    fn malformed_lines_are_reported_with_the_line() {
        let err = parse_numa_stat("anon N0=1 Nx=2\n").unwrap_err();
        assert_eq!(err.line, "anon N0=1 Nx=2");
        assert!(err.reason.contains("Nx=2"), "{err:?}");
        assert!(parse_numa_stat("total=1 N0=1\nanon N0=1\n").is_err());
        assert!(parse_flat_keyed("usage_usec\n").is_err());
        assert!(parse_flat_keyed("usage_usec -5\n").is_err());
        assert!(parse_single_u64("12a").is_err());
    }

    #[test]
    fn readers_on_fixture_directories() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // Nothing there: the controller is not enabled.
        assert_eq!(read_cpu_v2(d).unwrap(), None);
        assert_eq!(read_memory_stat(d).unwrap(), None);
        assert_eq!(read_effective_cpuset_v2(d).unwrap(), None);
        assert_eq!(read_cpu_v1(Some(d), Some(d)).unwrap(), None);

        std::fs::write(d.join("cpu.stat"), CPU_STAT_V2).unwrap();
        std::fs::write(
            d.join("memory.stat"),
            "anon 2101248\nfile 8192000\npgfault 1234\n",
        )
        .unwrap();
        std::fs::write(d.join("memory.numa_stat"), NUMA_V2).unwrap();
        std::fs::write(d.join("cpuset.cpus.effective"), "0-2,5\n").unwrap();
        std::fs::write(d.join("cpuset.mems.effective"), "0-1\n").unwrap();
        assert_eq!(
            read_cpu_v2(d).unwrap().unwrap().usage_ns,
            Some(2_873_140_000)
        );
        let memory = read_memory_stat(d).unwrap().unwrap();
        assert_eq!(memory.len(), 3);
        assert_eq!(memory["pgfault"], 1234);
        assert_eq!(read_numa_stat(d).unwrap().unwrap().unit, NumaUnit::Bytes);
        assert_eq!(
            read_effective_cpuset_v2(d).unwrap().unwrap(),
            EffectiveCpuset {
                cpus: vec![0, 1, 2, 5],
                mems: vec![0, 1]
            }
        );

        std::fs::write(d.join("cpuacct.usage"), "99\n").unwrap();
        std::fs::write(d.join("cpu.stat"), CPU_STAT_V1).unwrap();
        std::fs::write(d.join("cpuset.effective_cpus"), "0-1\n").unwrap();
        std::fs::write(d.join("cpuset.effective_mems"), "0\n").unwrap();
        let v1 = read_cpu_v1(Some(d), Some(d)).unwrap().unwrap();
        assert_eq!((v1.usage_ns, v1.nr_throttled), (Some(99), Some(321)));
        assert_eq!(
            read_effective_cpuset_v1(d).unwrap().unwrap(),
            EffectiveCpuset {
                cpus: vec![0, 1],
                mems: vec![0]
            }
        );
    }

    #[test]
    fn file_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cpuset.cpus.effective"), "0-\n").unwrap();
        let err = read_effective_cpuset_v2(dir.path()).unwrap_err();
        assert!(err.to_string().contains("cpuset.cpus.effective"), "{err}");
        assert!(err.to_string().contains("0-"), "{err}");
        std::fs::write(dir.path().join("memory.stat"), "anon x\n").unwrap();
        let err = read_memory_stat(dir.path()).unwrap_err();
        assert!(err.to_string().contains("memory.stat"), "{err}");
        // A directory where a file is expected: a read error with its source.
        std::fs::create_dir(dir.path().join("cpu.stat")).unwrap();
        let err = read_cpu_v2(dir.path()).unwrap_err();
        assert!(matches!(err, StatsError::Read { .. }), "{err}");
        assert!(std::error::Error::source(&err).is_some());
    }
}
