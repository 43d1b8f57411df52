//! CPU -> node and page frame -> node, from the kernel's sysfs and procfs files.
//!
//! - CPUs: `/sys/devices/system/node/node<N>/cpulist`. A kernel without NUMA support has no
//!   `node` directory; then every possible CPU (`/sys/devices/system/cpu/possible`) is node 0.
//! - Page frames: the memory blocks linked from each node directory (`memory<M>` covers block
//!   `M` of `/sys/devices/system/memory/block_size_bytes`), exact to the block; where the kernel
//!   has no memory blocks (no memory hotplug support) or they merge into more ranges than the
//!   kernel program searches, the zone spans of `/proc/zoneinfo` (`start_pfn` + `spanned`,
//!   holes included). Ranges of one node that touch are merged; ranges of different nodes that
//!   overlap are an error (the kernel program could not tell them apart).
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use qosd_common::{MAX_CPUS, MAX_PFN_RANGES, NumaConfig, PfnRange};

use crate::cgroup::CpuSet;

/// Why a layout has no page-frame ranges: the [`NodeLayoutError`] met reading them, kept as its
/// text so the layout stays comparable and clonable (the probe reports it as its reason).
#[derive(Clone, Debug, PartialEq, Eq)]
struct RangesProblem(String);

/// Errors while reading the NUMA layout.
#[derive(Debug, thiserror::Error)]
pub enum NodeLayoutError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Malformed { path: PathBuf, reason: String },
    #[error("no page-frame range found: no memory blocks and no zone spans in /proc/zoneinfo")]
    NoRanges,
    #[error("page-frame ranges of nodes {first} and {second} overlap at pfn {pfn:#x}")]
    Overlap { first: u32, second: u32, pfn: u64 },
    #[error(
        "{count} page-frame ranges after merging, more than the {MAX_PFN_RANGES} the kernel program searches"
    )]
    TooManyRanges { count: usize },
    #[error("CPU {cpu} is beyond the {MAX_CPUS} CPUs the kernel programs know")]
    CpuTooHigh { cpu: u32 },
}

/// Where the page-frame ranges came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeSource {
    /// Memory blocks linked from the node directories (exact to one block).
    MemoryBlocks,
    /// Zone spans from `/proc/zoneinfo` (holes included).
    ZoneInfo,
}

impl std::fmt::Display for RangeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::MemoryBlocks => "memory blocks",
            Self::ZoneInfo => "/proc/zoneinfo zone spans",
        })
    }
}

/// The files the layout is read from; [`LayoutPaths::system`] on a real machine, a fixture
/// tree in tests.
#[derive(Clone, Debug)]
pub struct LayoutPaths {
    /// `/sys/devices/system/node`.
    pub node_dir: PathBuf,
    /// `/sys/devices/system/memory`.
    pub memory_dir: PathBuf,
    /// `/sys/devices/system/cpu/possible`.
    pub cpu_possible: PathBuf,
    /// `/proc/zoneinfo`.
    pub zoneinfo: PathBuf,
}

impl LayoutPaths {
    /// The running system's files.
    #[must_use]
    pub fn system() -> Self {
        Self {
            node_dir: PathBuf::from("/sys/devices/system/node"),
            memory_dir: PathBuf::from("/sys/devices/system/memory"),
            cpu_possible: PathBuf::from("/sys/devices/system/cpu/possible"),
            zoneinfo: PathBuf::from("/proc/zoneinfo"),
        }
    }

    /// The same files below `root` (a fixture tree).
    #[must_use]
    pub fn under(root: &Path) -> Self {
        Self {
            node_dir: root.join("sys/devices/system/node"),
            memory_dir: root.join("sys/devices/system/memory"),
            cpu_possible: root.join("sys/devices/system/cpu/possible"),
            zoneinfo: root.join("proc/zoneinfo"),
        }
    }
}

/// The machine's NUMA layout: CPU -> node and page-frame ranges -> node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLayout {
    cpu_node: BTreeMap<u32, u32>,
    ranges: Vec<PfnRange>,
    /// Where the ranges came from, or (rendered) why there are none.
    source: Result<RangeSource, RangesProblem>,
}

impl NodeLayout {
    /// Reads the running system's layout.
    pub fn read_system() -> Result<Self, NodeLayoutError> {
        Self::read(&LayoutPaths::system(), page_size())
    }

    /// Reads the layout from `paths`; `page_size` converts memory blocks to page frames. Only
    /// the CPU table is required: when no usable page-frame ranges are found the layout has
    /// none and [`Self::ranges_problem`] says why (the page-allocation probe then cannot run,
    /// everything else can).
    pub fn read(paths: &LayoutPaths, page_size: u64) -> Result<Self, NodeLayoutError> {
        let cpu_node = read_cpu_nodes(paths)?;
        let (ranges, source) = match read_ranges(paths, page_size) {
            Ok((ranges, source)) => (ranges, Ok(source)),
            Err(e) => (Vec::new(), Err(RangesProblem(e.to_string()))),
        };
        Ok(Self {
            cpu_node,
            ranges,
            source,
        })
    }

    /// A layout from known parts (tests and synthetic machines). Ranges are merged as when read.
    pub fn from_parts(
        cpu_node: BTreeMap<u32, u32>,
        ranges: Vec<PfnRange>,
    ) -> Result<Self, NodeLayoutError> {
        Ok(Self {
            cpu_node,
            ranges: merge(ranges)?,
            source: Ok(RangeSource::MemoryBlocks),
        })
    }

    /// The node of `cpu`, if the CPU exists.
    #[must_use]
    pub fn node_of_cpu(&self, cpu: u32) -> Option<u32> {
        self.cpu_node.get(&cpu).copied()
    }

    /// Every node that has a CPU or memory.
    #[must_use]
    pub fn nodes(&self) -> BTreeSet<u32> {
        self.cpu_node
            .values()
            .copied()
            .chain(self.ranges.iter().map(|r| r.node))
            .collect()
    }

    /// Every CPU the layout knows.
    #[must_use]
    pub fn cpus(&self) -> CpuSet {
        self.cpu_node.keys().copied().collect()
    }

    /// The nodes of a set of CPUs (CPUs the layout does not know are ignored).
    #[must_use]
    pub fn nodes_of(&self, cpus: &CpuSet) -> BTreeSet<u32> {
        cpus.iter().filter_map(|c| self.node_of_cpu(c)).collect()
    }

    /// The merged page-frame ranges, sorted by start.
    #[must_use]
    pub fn ranges(&self) -> &[PfnRange] {
        &self.ranges
    }

    /// Where the ranges came from; `None` when there are none.
    #[must_use]
    pub fn range_source(&self) -> Option<RangeSource> {
        self.source.as_ref().ok().copied()
    }

    /// Why no page-frame ranges could be read, if so.
    #[must_use]
    pub fn ranges_problem(&self) -> Option<&str> {
        self.source.as_ref().err().map(|p| p.0.as_str())
    }

    /// The node of page frame `pfn`, the same lookup the kernel program makes.
    #[must_use]
    pub fn node_of_pfn(&self, pfn: u64) -> Option<u32> {
        let after = self.ranges.partition_point(|r| r.start <= pfn);
        let range = self.ranges.get(after.checked_sub(1)?)?;
        (pfn < range.end).then_some(range.node)
    }

    /// Writes the CPU and page-frame tables into the kernel programs' configuration.
    pub fn fill(&self, config: &mut NumaConfig) -> Result<(), NodeLayoutError> {
        for (&cpu, &node) in &self.cpu_node {
            let slot = config
                .cpu_node
                .get_mut(cpu as usize)
                .ok_or(NodeLayoutError::CpuTooHigh { cpu })?;
            *slot = node;
        }
        let count = self.ranges.len();
        if count > config.ranges.len() {
            return Err(NodeLayoutError::TooManyRanges { count });
        }
        config.ranges[..count].copy_from_slice(&self.ranges);
        config.nr_ranges =
            u32::try_from(count).map_err(|_| NodeLayoutError::TooManyRanges { count })?;
        Ok(())
    }
}

/// The system's page size.
#[must_use]
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|s| *s > 0).unwrap_or(4096)
}

/// Page-frame ranges from memory blocks, else from zone spans.
fn read_ranges(
    paths: &LayoutPaths,
    page_size: u64,
) -> Result<(Vec<PfnRange>, RangeSource), NodeLayoutError> {
    if let Some(blocks) = read_memory_blocks(paths, page_size)? {
        let ranges = merge(blocks)?;
        if ranges.len() <= MAX_PFN_RANGES as usize {
            return Ok((ranges, RangeSource::MemoryBlocks));
        }
        tracing::info!(
            ranges = ranges.len(),
            "memory blocks merge into too many ranges; using zone spans"
        );
    }
    let ranges = merge(parse_zoneinfo(&read(&paths.zoneinfo)?))?;
    if ranges.len() > MAX_PFN_RANGES as usize {
        return Err(NodeLayoutError::TooManyRanges {
            count: ranges.len(),
        });
    }
    if ranges.is_empty() {
        return Err(NodeLayoutError::NoRanges);
    }
    Ok((ranges, RangeSource::ZoneInfo))
}

fn read(path: &Path) -> Result<String, NodeLayoutError> {
    std::fs::read_to_string(path).map_err(|source| NodeLayoutError::Read {
        path: path.to_owned(),
        source,
    })
}

/// `node<N>` directories: (N, path).
fn node_dirs(node_dir: &Path) -> Result<Vec<(u32, PathBuf)>, NodeLayoutError> {
    let entries = std::fs::read_dir(node_dir).map_err(|source| NodeLayoutError::Read {
        path: node_dir.to_owned(),
        source,
    })?;
    let mut nodes: Vec<(u32, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let id = name.to_str()?.strip_prefix("node")?.parse().ok()?;
            Some((id, e.path()))
        })
        .collect();
    nodes.sort();
    Ok(nodes)
}

fn read_cpu_nodes(paths: &LayoutPaths) -> Result<BTreeMap<u32, u32>, NodeLayoutError> {
    let mut cpu_node = BTreeMap::new();
    if !paths.node_dir.exists() {
        // No NUMA support in the kernel: one node with every CPU.
        let text = read(&paths.cpu_possible)?;
        let cpus = CpuSet::parse(&text).map_err(|e| NodeLayoutError::Malformed {
            path: paths.cpu_possible.clone(),
            reason: e.to_string(),
        })?;
        cpu_node.extend(cpus.iter().map(|c| (c, 0)));
        return Ok(cpu_node);
    }
    for (node, dir) in node_dirs(&paths.node_dir)? {
        let file = dir.join("cpulist");
        let cpus = CpuSet::parse(&read(&file)?).map_err(|e| NodeLayoutError::Malformed {
            path: file.clone(),
            reason: e.to_string(),
        })?;
        cpu_node.extend(cpus.iter().map(|c| (c, node)));
    }
    Ok(cpu_node)
}

/// One range per memory block linked from a node directory; `None` when the kernel has no
/// memory blocks.
fn read_memory_blocks(
    paths: &LayoutPaths,
    page_size: u64,
) -> Result<Option<Vec<PfnRange>>, NodeLayoutError> {
    let size_file = paths.memory_dir.join("block_size_bytes");
    if !size_file.exists() || !paths.node_dir.exists() {
        return Ok(None);
    }
    let text = read(&size_file)?;
    let block_bytes =
        u64::from_str_radix(text.trim(), 16).map_err(|e| NodeLayoutError::Malformed {
            path: size_file.clone(),
            reason: format!("{:?} is not a hexadecimal size: {e}", text.trim()),
        })?;
    let block_pages = block_bytes / page_size.max(1);
    if block_pages == 0 {
        return Err(NodeLayoutError::Malformed {
            path: size_file,
            reason: format!("block size {block_bytes} is below one page"),
        });
    }
    let mut ranges = Vec::new();
    for (node, dir) in node_dirs(&paths.node_dir)? {
        let entries = std::fs::read_dir(&dir).map_err(|source| NodeLayoutError::Read {
            path: dir.clone(),
            source,
        })?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(block) = name
                .to_str()
                .and_then(|n| n.strip_prefix("memory"))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            ranges.push(PfnRange {
                start: block.saturating_mul(block_pages),
                end: block.saturating_add(1).saturating_mul(block_pages),
                node,
                pad: 0,
            });
        }
    }
    Ok((!ranges.is_empty()).then_some(ranges))
}

/// Zone spans: `Node N, zone NAME`, then `spanned S` and `start_pfn: P` (zones with nothing
/// spanned print no start).
fn parse_zoneinfo(text: &str) -> Vec<PfnRange> {
    let mut ranges = Vec::new();
    let (mut node, mut spanned) = (None, 0u64);
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("Node ") {
            node = rest.split(',').next().and_then(|n| n.trim().parse().ok());
            spanned = 0;
        } else if let Some(rest) = line.strip_prefix("spanned") {
            spanned = rest.trim().parse().unwrap_or(0);
        } else if let Some(rest) = line.strip_prefix("start_pfn:")
            && let (Some(node), Ok(start)) = (node, rest.trim().parse::<u64>())
            && spanned > 0
        {
            ranges.push(PfnRange {
                start,
                end: start.saturating_add(spanned),
                node,
                pad: 0,
            });
        }
    }
    ranges
}

/// Sorts ranges and merges those of one node that touch or overlap.
fn merge(mut ranges: Vec<PfnRange>) -> Result<Vec<PfnRange>, NodeLayoutError> {
    ranges.retain(|r| r.end > r.start);
    ranges.sort_by_key(|r| (r.start, r.end));
    let mut merged: Vec<PfnRange> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match merged.last_mut() {
            Some(last) if range.start <= last.end && range.node == last.node => {
                last.end = last.end.max(range.end);
            }
            Some(last) if range.start < last.end => {
                return Err(NodeLayoutError::Overlap {
                    first: last.node,
                    second: range.node,
                    pfn: range.start,
                });
            }
            _ => merged.push(range),
        }
    }
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 4096;

    /// The guests' layout: 2 nodes of 1 GiB, CPUs 0-1 and 2-3, 128 MiB memory blocks.
    fn fixture(blocks: bool) -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("tempdir");
        let paths = LayoutPaths::under(root.path());
        for (node, cpus, first_block) in [(0, "0-1\n", 0), (1, "2-3\n", 8)] {
            let dir = paths.node_dir.join(format!("node{node}"));
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join("cpulist"), cpus).expect("write");
            if blocks {
                for b in first_block..first_block + 8 {
                    std::fs::create_dir(dir.join(format!("memory{b}"))).expect("mkdir");
                }
            }
        }
        // Not a node.
        std::fs::create_dir_all(paths.node_dir.join("power")).expect("mkdir");
        if blocks {
            std::fs::create_dir_all(&paths.memory_dir).expect("mkdir");
            std::fs::write(paths.memory_dir.join("block_size_bytes"), "8000000\n").expect("write");
        }
        std::fs::create_dir_all(root.path().join("proc")).expect("mkdir");
        std::fs::write(&paths.zoneinfo, include_str!("testdata/zoneinfo-2-nodes")).expect("write");
        root
    }

    #[test]
    fn cpus_and_memory_blocks_map_to_their_nodes() {
        let root = fixture(true);
        let layout = NodeLayout::read(&LayoutPaths::under(root.path()), PAGE).expect("layout");
        assert_eq!(layout.range_source(), Some(RangeSource::MemoryBlocks));
        assert_eq!(
            layout.ranges(),
            &[
                PfnRange {
                    start: 0,
                    end: 0x40000,
                    node: 0,
                    pad: 0
                },
                PfnRange {
                    start: 0x40000,
                    end: 0x80000,
                    node: 1,
                    pad: 0
                },
            ],
            "eight 128 MiB blocks per node merge into one range each"
        );
        assert_eq!(layout.node_of_cpu(1), Some(0));
        assert_eq!(layout.node_of_cpu(2), Some(1));
        assert_eq!(layout.node_of_cpu(4), None);
        assert_eq!(layout.nodes(), BTreeSet::from([0, 1]));
        assert_eq!(
            layout.nodes_of(&CpuSet::parse("0-1").expect("cpus")),
            BTreeSet::from([0])
        );
        assert_eq!(layout.node_of_pfn(0x3ffff), Some(0));
        assert_eq!(layout.node_of_pfn(0x40000), Some(1));
        assert_eq!(layout.node_of_pfn(0x80000), None, "beyond the last block");
    }

    #[test]
    fn zoneinfo_spans_are_the_fallback() {
        let root = fixture(false);
        let layout = NodeLayout::read(&LayoutPaths::under(root.path()), PAGE).expect("layout");
        assert_eq!(layout.range_source(), Some(RangeSource::ZoneInfo));
        // Node 0: DMA 1..4096 and DMA32 4096..262144 merge; node 1: DMA32 from 262144.
        assert_eq!(
            layout
                .ranges()
                .iter()
                .map(|r| (r.start, r.end, r.node))
                .collect::<Vec<_>>(),
            vec![(1, 262_144, 0), (262_144, 524_256, 1)]
        );
        assert_eq!(layout.node_of_pfn(0), None, "pfn 0 is in no zone");
    }

    #[test]
    fn without_numa_support_every_cpu_is_node_zero() {
        let root = tempfile::tempdir().expect("tempdir");
        let paths = LayoutPaths::under(root.path());
        std::fs::create_dir_all(paths.cpu_possible.parent().expect("parent")).expect("mkdir");
        std::fs::write(&paths.cpu_possible, "0-3\n").expect("write");
        std::fs::create_dir_all(root.path().join("proc")).expect("mkdir");
        std::fs::write(
            &paths.zoneinfo,
            "Node 0, zone   Normal\n  pages free 1\n        spanned  100\n  start_pfn:  4096\n",
        )
        .expect("write");
        let layout = NodeLayout::read(&paths, PAGE).expect("layout");
        assert_eq!(layout.nodes(), BTreeSet::from([0]));
        assert_eq!(layout.node_of_cpu(3), Some(0));
        assert_eq!(layout.node_of_pfn(4195), Some(0));
    }

    #[test]
    fn overlapping_nodes_and_too_many_ranges_are_errors() {
        let r = |start, end, node| PfnRange {
            start,
            end,
            node,
            pad: 0,
        };
        let err = merge(vec![r(0, 10, 0), r(5, 20, 1)]).expect_err("overlap");
        assert!(err.to_string().contains("overlap at pfn 0x5"), "{err}");
        assert_eq!(
            merge(vec![r(10, 20, 0), r(0, 10, 0), r(20, 20, 1)]).expect("merge"),
            vec![r(0, 20, 0)],
            "touching ranges of one node merge, empty ones go"
        );
        // Alternating nodes cannot merge: more than the kernel program searches.
        let many = (0..=u64::from(MAX_PFN_RANGES))
            .map(|i| r(i * 10, i * 10 + 10, u32::try_from(i % 2).expect("node")))
            .collect();
        let layout = NodeLayout::from_parts(BTreeMap::new(), many).expect("layout");
        let mut config = NumaConfig::EMPTY;
        let err = layout.fill(&mut config).expect_err("too many");
        assert!(err.to_string().contains("more than the 64"), "{err}");
    }

    #[test]
    fn missing_ranges_leave_the_cpu_table_usable() {
        let root = fixture(false);
        std::fs::write(
            LayoutPaths::under(root.path()).zoneinfo,
            "Node 0, zone DMA\n",
        )
        .expect("write");
        let layout = NodeLayout::read(&LayoutPaths::under(root.path()), PAGE).expect("layout");
        assert!(layout.ranges().is_empty());
        assert_eq!(layout.range_source(), None);
        assert!(
            layout
                .ranges_problem()
                .is_some_and(|why| why.contains("no page-frame range")),
            "{layout:?}"
        );
        assert_eq!(layout.node_of_cpu(3), Some(1));
    }

    #[test]
    fn fill_writes_both_tables() {
        let layout = NodeLayout::from_parts(
            BTreeMap::from([(0, 0), (1, 0), (2, 1), (3, 1)]),
            vec![PfnRange {
                start: 0,
                end: 100,
                node: 1,
                pad: 0,
            }],
        )
        .expect("layout");
        let mut config = NumaConfig::EMPTY;
        layout.fill(&mut config).expect("fill");
        assert_eq!(&config.cpu_node[..5], &[0, 0, 1, 1, qosd_common::NO_NODE]);
        assert_eq!(config.nr_ranges, 1);
        assert_eq!(config.ranges[0].end, 100);
        let too_high =
            NodeLayout::from_parts(BTreeMap::from([(MAX_CPUS, 0)]), Vec::new()).expect("layout");
        assert!(too_high.fill(&mut config).is_err());
    }
}
