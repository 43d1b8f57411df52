//! A cgroup's resident memory per NUMA node and its locality, read at scrape time.
//!
//! Resident memory per node comes from `memory.numa_stat` (parsed by
//! [`crate::cgroup::stats::parse_numa_stat`]): on v2 the `anon` plus `file` lines (bytes), on v1
//! the `hierarchical_total` line (pages, falling back to `total` where `memory.use_hierarchy`
//! is off), so both count the cgroup with its descendants, as v2 always does.
//!
//! A node is local when it is the node of one of the CPUs the cgroup may run on:
//! `cpuset.cpus.effective` (v2) or `cpuset.effective_cpus` (v1, in the cpuset hierarchy at the
//! same path). A cgroup without its own cpuset file (the controller is not enabled there, or
//! the v1 cpuset hierarchy has no cgroup at that path) uses the nearest ancestor's; with none,
//! every CPU of the machine. Each cpuset is read once per pass, and none on a machine with one
//! NUMA node (where every node is local).
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use super::{Locality, NodeLayout};
use crate::cgroup::stats::{self, NumaStat as KernelNumaStat, NumaUnit, StatsError};
use crate::cgroup::trees::CgroupTrees;
use crate::cgroup::walk::CgroupDir;
use crate::cgroup::{CgroupLayout, CpuSet, HierarchyError};

/// Errors while reading a cgroup's NUMA memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error(transparent)]
    Stats(#[from] StatsError),
    #[error(transparent)]
    Hierarchy(#[from] HierarchyError),
}

/// Resident bytes per node of one cgroup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NumaStat {
    pub bytes_by_node: BTreeMap<u32, u64>,
}

impl NumaStat {
    /// Resident memory per node from a parsed `memory.numa_stat`; `page_size` converts v1 pages.
    #[must_use]
    pub fn from_kernel(stat: &KernelNumaStat, page_size: u64) -> Self {
        let mut bytes_by_node: BTreeMap<u32, u64> = BTreeMap::new();
        let lines: &[&str] = match stat.unit {
            NumaUnit::Bytes => &["anon", "file"],
            NumaUnit::Pages if stat.entries.contains_key("hierarchical_total") => {
                &["hierarchical_total"]
            }
            NumaUnit::Pages => &["total"],
        };
        let scale = match stat.unit {
            NumaUnit::Bytes => 1,
            NumaUnit::Pages => page_size,
        };
        for line in lines {
            let Some(entry) = stat.entries.get(*line) else {
                continue;
            };
            for (&node, &value) in &entry.nodes {
                let slot = bytes_by_node.entry(node).or_default();
                *slot = slot.saturating_add(value.saturating_mul(scale));
            }
        }
        Self { bytes_by_node }
    }

    /// Resident bytes on every node.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.bytes_by_node
            .values()
            .copied()
            .fold(0, u64::saturating_add)
    }
}

/// One cgroup's resident memory per node with each node's locality.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupNumaMemory {
    /// Path relative to the hierarchy root (`/a/b`).
    pub path: String,
    /// The cgroup's id in the hierarchy qosd attributes to (the cpu hierarchy), 0 when the
    /// cgroup has no directory there.
    pub cgroup_id: u64,
    /// The CPUs the cgroup may run on.
    pub cpus: CpuSet,
    /// (node, resident bytes, locality), by node.
    pub nodes: Vec<(u32, u64, Locality)>,
}

/// Reads `memory.numa_stat` and the cpuset of every cgroup.
#[derive(Clone, Debug)]
pub struct NumaMemoryReader {
    /// Root of the hierarchy with the memory controller.
    pub memory_root: PathBuf,
    /// Root of the hierarchy with the cpuset controller, if mounted.
    pub cpuset_root: Option<PathBuf>,
    /// Root of the hierarchy whose directory inodes are qosd's cgroup ids (cpu).
    pub id_root: PathBuf,
    /// The hierarchies are v1 (file names and `memory.numa_stat` format).
    pub v1: bool,
    /// The machine's NUMA layout.
    pub layout: NodeLayout,
    /// Bytes per page (v1 counts pages).
    pub page_size: u64,
}

impl NumaMemoryReader {
    /// A reader for the system's cgroups; `None` when no hierarchy has the memory controller.
    #[must_use]
    pub fn for_layout(cgroups: &CgroupLayout, layout: NodeLayout) -> Option<Self> {
        let page_size = super::node_layout::page_size();
        if let Some(memory) = cgroups.v1.get("memory") {
            return Some(Self {
                memory_root: memory.clone(),
                cpuset_root: cgroups.v1.get("cpuset").cloned(),
                id_root: cgroups.cpu_hierarchy().unwrap_or(memory).to_owned(),
                v1: true,
                layout,
                page_size,
            });
        }
        let unified = cgroups.unified.clone()?;
        Some(Self {
            memory_root: unified.clone(),
            cpuset_root: Some(unified.clone()),
            id_root: unified,
            v1: false,
            layout,
            page_size,
        })
    }

    /// Every cgroup with resident memory, over the trees of the memory hierarchy and of the
    /// one the ids come from (`trees`: live, or walked once per scrape). A cgroup whose files cannot
    /// be read or understood is logged and left out; only an unreadable hierarchy root is an
    /// error.
    pub fn read_all(&self, trees: &CgroupTrees) -> Result<Vec<CgroupNumaMemory>, MemoryError> {
        let walked = |root: &Path| {
            trees.current(root).map_err(|source| HierarchyError::Root {
                path: root.to_owned(),
                source,
            })
        };
        let memory = walked(&self.memory_root)?;
        if memory.dirs.is_empty() {
            return Err(HierarchyError::Root {
                path: self.memory_root.clone(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            }
            .into());
        }
        let id_walk = walked(&self.id_root)?;
        let ids: HashMap<&str, u64> = id_walk
            .dirs
            .iter()
            .map(|d| (d.relative.as_str(), d.ino))
            .collect();
        let mut out = Vec::new();
        let mut cpusets = CpusetCache::default();
        for dir in &memory.dirs {
            let path = dir.relative.as_str();
            // A cgroup missing from the id hierarchy's walk is looked up on its own.
            match self.read_at(path, Some(dir), ids.get(path).copied(), &mut cpusets) {
                Ok(Some(memory)) => out.push(memory),
                Ok(None) => {}
                Err(e) => tracing::warn!(cgroup = path, error = %e, "reading NUMA memory"),
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// One cgroup (`/a/b`, relative to the hierarchy root); `None` when it has no
    /// `memory.numa_stat` (removed, or the memory controller is not enabled there) or no
    /// resident memory.
    pub fn read_one(&self, path: &str) -> Result<Option<CgroupNumaMemory>, MemoryError> {
        self.read_at(path, None, None, &mut CpusetCache::default())
    }

    /// [`Self::read_one`] with the memory hierarchy's directory from a tree when there is one
    /// (its files are opened relative to it), the cgroup's id when known (`None`: a `stat`
    /// finds it), and the cpusets read so far.
    fn read_at(
        &self,
        path: &str,
        tree_dir: Option<&CgroupDir>,
        cgroup_id: Option<u64>,
        cpusets: &mut CpusetCache,
    ) -> Result<Option<CgroupNumaMemory>, MemoryError> {
        let stat = match tree_dir {
            Some(dir) => {
                let file = dir.path.join(NUMA_STAT);
                dir.read(NUMA_STAT)
                    .map_err(|source| StatsError::Read {
                        path: file.clone(),
                        source,
                    })?
                    .map(|text| stats::parse_numa_stat(&text).map_err(|e| e.at(&file)))
                    .transpose()?
            }
            None => stats::read_numa_stat(&join(&self.memory_root, path))?,
        };
        let Some(stat) = stat else {
            return Ok(None);
        };
        let resident = NumaStat::from_kernel(&stat, self.page_size);
        if resident.total() == 0 {
            return Ok(None);
        }
        let cpus = self.cgroup_cpus(path, cpusets)?;
        let local = self.layout.nodes_of(&cpus);
        let nodes = resident
            .bytes_by_node
            .iter()
            .map(|(&node, &bytes)| {
                let locality = if local.contains(&node) {
                    Locality::Local
                } else {
                    Locality::Remote
                };
                (node, bytes, locality)
            })
            .collect();
        let cgroup_id = cgroup_id
            .unwrap_or_else(|| std::fs::metadata(join(&self.id_root, path)).map_or(0, |m| m.ino()));
        Ok(Some(CgroupNumaMemory {
            path: path.to_owned(),
            cgroup_id,
            cpus,
            nodes,
        }))
    }

    /// The CPUs of the nearest cgroup at or above `path` with an effective cpuset. On a
    /// machine with one NUMA node every CPU is on the node of every page, so no cpuset is read.
    fn cgroup_cpus(&self, path: &str, cache: &mut CpusetCache) -> Result<CpuSet, MemoryError> {
        let Some(root) = self
            .cpuset_root
            .as_ref()
            .filter(|_| self.layout.nodes().len() > 1)
        else {
            return Ok(self.layout.cpus());
        };
        let mut current = Some(path);
        let mut missing = Vec::new();
        let mut found = None;
        while let Some(p) = current {
            if let Some(cpus) = cache.0.get(p) {
                found = cpus.clone();
                break;
            }
            let dir = join(root, p);
            if let Some(cpus) =
                stats::read_effective_cpus(&dir, self.v1)?.filter(|cpus| !cpus.is_empty())
            {
                cache.0.insert(p.to_owned(), Some(cpus.clone()));
                found = Some(cpus);
                break;
            }
            missing.push(p.to_owned());
            current = parent(p);
        }
        // The cgroups on the way up without a cpuset of their own share what was found.
        for p in missing {
            cache.0.insert(p, found.clone());
        }
        Ok(found.unwrap_or_else(|| self.layout.cpus()))
    }
}

const NUMA_STAT: &str = "memory.numa_stat";

/// Effective cpusets read during one pass over the hierarchy, by path: `None` for a cgroup
/// whose nearest cpuset up to the root was not found (every CPU).
#[derive(Debug, Default)]
struct CpusetCache(HashMap<String, Option<CpuSet>>);

/// `root` joined with a hierarchy-relative path (`/` is the root itself).
fn join(root: &Path, path: &str) -> PathBuf {
    let relative = path.trim_start_matches('/');
    if relative.is_empty() {
        root.to_owned()
    } else {
        root.join(relative)
    }
}

/// `/a/b` -> `/a` -> `/` -> none.
fn parent(path: &str) -> Option<&str> {
    if path == "/" || path.is_empty() {
        return None;
    }
    match path.rfind('/') {
        Some(0) | None => Some("/"),
        Some(i) => Some(&path[..i]),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use qosd_common::PfnRange;

    const PAGE: u64 = 4096;

    /// v2 `memory.numa_stat` as the 6.1 guest prints it (trimmed): 64 MiB of anon on node 1.
    const NUMA_V2: &str = "\
anon N0=0 N1=67284992
file N0=4096 N1=0
kernel_stack N0=16384 N1=0
pagetables N0=0 N1=139264
shmem N0=0 N1=0
file_mapped N0=0 N1=0
anon_thp N0=0 N1=0
inactive_anon N0=0 N1=67280896
active_anon N0=0 N1=4096
unevictable N0=0 N1=0
";

    /// v1 `memory.numa_stat` of the host's memory root, one node, with hierarchical lines.
    const NUMA_V1: &str = "\
total=3454 N0=3454
file=154 N0=154
anon=374 N0=374
unevictable=2926 N0=2926
hierarchical_total=720664 N0=720664
hierarchical_file=716615 N0=716615
hierarchical_anon=1123 N0=1123
hierarchical_unevictable=2926 N0=2926
";

    fn two_nodes() -> NodeLayout {
        NodeLayout::from_parts(
            BTreeMap::from([(0, 0), (1, 0), (2, 1), (3, 1)]),
            vec![PfnRange {
                start: 0,
                end: 10,
                node: 0,
                pad: 0,
            }],
        )
        .expect("layout")
    }

    #[test]
    fn resident_bytes_from_either_format() {
        let v2 = NumaStat::from_kernel(&stats::parse_numa_stat(NUMA_V2).expect("v2"), PAGE);
        assert_eq!(
            v2.bytes_by_node,
            BTreeMap::from([(0, 4096), (1, 67_284_992)]),
            "anon + file; kernel stacks and page tables are not resident user memory"
        );
        let v1 = NumaStat::from_kernel(&stats::parse_numa_stat(NUMA_V1).expect("v1"), PAGE);
        assert_eq!(v1.total(), 720_664 * PAGE, "hierarchical_total, in pages");
        let flat = NumaStat::from_kernel(
            &stats::parse_numa_stat("total=10 N0=4 N1=6\nfile=1 N0=1 N1=0\n").expect("v1"),
            PAGE,
        );
        assert_eq!(
            flat.bytes_by_node,
            BTreeMap::from([(0, 4 * PAGE), (1, 6 * PAGE)]),
            "without hierarchical lines, total"
        );
    }

    #[test]
    fn locality_follows_the_nearest_cpuset_v2() {
        let root = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        std::fs::create_dir_all(r.join("pods/a/ctr")).expect("mkdir");
        std::fs::create_dir_all(r.join("other")).expect("mkdir");
        std::fs::write(r.join("cpuset.cpus.effective"), "0-3\n").expect("write");
        std::fs::write(r.join("pods/a/cpuset.cpus.effective"), "0-1\n").expect("write");
        // The container has no cpuset of its own (controller not enabled below the pod).
        std::fs::write(r.join("pods/a/ctr/memory.numa_stat"), NUMA_V2).expect("write");
        std::fs::write(r.join("other/memory.numa_stat"), NUMA_V2).expect("write");
        // No resident memory: left out.
        std::fs::write(
            r.join("pods/memory.numa_stat"),
            "anon N0=0 N1=0\nfile N0=0 N1=0\n",
        )
        .expect("write");
        let reader = NumaMemoryReader {
            memory_root: r.to_owned(),
            cpuset_root: Some(r.to_owned()),
            id_root: r.to_owned(),
            v1: false,
            layout: two_nodes(),
            page_size: PAGE,
        };
        let all = reader.read_all(&CgroupTrees::default()).expect("read");
        let paths: Vec<&str> = all.iter().map(|m| m.path.as_str()).collect();
        assert_eq!(paths, ["/other", "/pods/a/ctr"]);
        let ctr = &all[1];
        assert_eq!(ctr.cpus, CpuSet::parse("0-1").expect("cpus"));
        assert_eq!(
            ctr.nodes,
            vec![
                (0, 4096, Locality::Local),
                (1, 67_284_992, Locality::Remote)
            ]
        );
        assert_eq!(
            ctr.cgroup_id,
            std::fs::metadata(r.join("pods/a/ctr")).expect("stat").ino()
        );
        // The root's cpuset spans both nodes: everything is local.
        let other = &all[0];
        assert!(
            other.nodes.iter().all(|n| n.2 == Locality::Local),
            "{other:?}"
        );
    }

    #[test]
    fn one_node_needs_no_cpuset_every_page_is_local() {
        let root = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        std::fs::create_dir_all(r.join("job")).expect("mkdir");
        std::fs::write(r.join("job/memory.numa_stat"), "anon N0=8192\nfile N0=0\n").expect("write");
        // A cpuset file that would fail to parse: it must not be read at all.
        std::fs::write(r.join("job/cpuset.cpus.effective"), "garbage\n").expect("write");
        let one_node = NodeLayout::from_parts(
            BTreeMap::from([(0, 0), (1, 0)]),
            vec![PfnRange {
                start: 0,
                end: 10,
                node: 0,
                pad: 0,
            }],
        )
        .expect("layout");
        let reader = NumaMemoryReader {
            memory_root: r.to_owned(),
            cpuset_root: Some(r.to_owned()),
            id_root: r.to_owned(),
            v1: false,
            layout: one_node,
            page_size: PAGE,
        };
        let all = reader.read_all(&CgroupTrees::default()).expect("read");
        assert_eq!(all.len(), 1, "{all:?}");
        assert_eq!(all[0].nodes, vec![(0, 8192, Locality::Local)]);
        assert_eq!(all[0].cpus, CpuSet::parse("0-1").expect("cpus"));
        // With two nodes the same file is read (and its error named).
        let two = NumaMemoryReader {
            layout: two_nodes(),
            ..reader
        };
        let err = two.read_all(&CgroupTrees::default());
        assert!(
            err.as_ref().map_or(true, Vec::is_empty),
            "an unparsable cpuset leaves the cgroup out: {err:?}"
        );
    }

    #[test]
    fn v1_uses_the_cpuset_hierarchy_and_ids_from_the_cpu_hierarchy() {
        let root = tempfile::tempdir().expect("tempdir");
        let (memory, cpuset, cpu) = (
            root.path().join("memory"),
            root.path().join("cpuset"),
            root.path().join("cpu"),
        );
        for dir in [memory.join("job"), cpuset.join("job"), cpu.join("job")] {
            std::fs::create_dir_all(dir).expect("mkdir");
        }
        std::fs::write(
            memory.join("job/memory.numa_stat"),
            "total=5 N0=2 N1=3\nhierarchical_total=8 N0=2 N1=6\n",
        )
        .expect("write");
        std::fs::write(cpuset.join("job/cpuset.effective_cpus"), "2-3\n").expect("write");
        let reader = NumaMemoryReader {
            memory_root: memory,
            cpuset_root: Some(cpuset),
            id_root: cpu.clone(),
            v1: true,
            layout: two_nodes(),
            page_size: PAGE,
        };
        let job = reader.read_one("/job").expect("read").expect("resident");
        assert_eq!(
            job.nodes,
            vec![
                (0, 2 * PAGE, Locality::Remote),
                (1, 6 * PAGE, Locality::Local)
            ]
        );
        assert_eq!(
            job.cgroup_id,
            std::fs::metadata(cpu.join("job")).expect("stat").ino()
        );
        let nodes: BTreeSet<u32> = job.nodes.iter().map(|n| n.0).collect();
        assert_eq!(nodes, BTreeSet::from([0, 1]));
    }

    #[test]
    fn parents_walk_up_to_the_root() {
        assert_eq!(parent("/a/b"), Some("/a"));
        assert_eq!(parent("/a"), Some("/"));
        assert_eq!(parent("/"), None);
    }
}
