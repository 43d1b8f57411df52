//! The machine's topology: packages (sockets), NUMA nodes with their distances and memory,
//! cores, SMT threads and L3 (uncore) caches, as one [`MachineTopology`] value.
//!
//! This module owns the topology data model and its invariants (the *machine* topology; the
//! topology *manager* is `cm::topology_manager`, the CPU manager's view `cm::cpu::cpu_topology`).
//! Two sources produce it: [`hwloc`] reads the real host through hwloc (hwlocality), and
//! `synthetic` (compiled for tests and with the `testing` feature, for benchmarks) builds the
//! shapes tests need without hwloc. [`bitmask`] holds [`NumaMask`], the NUMA node set
//! the topology manager and its hint providers exchange.
//!
//! Identifiers follow kubelet's `cpumanager/topology` (built from cAdvisor):
//! - a CPU is a logical CPU (hwloc PU), identified by its OS index (`/sys/devices/system/cpu/cpuN`);
//! - a core is identified by the lowest CPU id among its threads (kubelet's `getUniqueCoreID`),
//!   so core ids are unique across packages;
//! - a package (socket) by its physical package id, a NUMA node by its OS index;
//! - an uncore cache by the L3 cache's id, or, on machines without an L3, by the package id
//!   (kubelet's fallback).
pub mod bitmask;
pub mod hwloc;
#[cfg(any(test, feature = "testing"))]
pub mod synthetic;

/// The local SLIT distance (a node's distance to itself).
pub const LOCAL_DISTANCE: u64 = 10;

use std::collections::{BTreeMap, BTreeSet};

pub use bitmask::{MaskError, NumaMask};

/// Errors building a [`MachineTopology`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// hwloc failed to build or describe the topology.
    #[error("hwloc: {0}")]
    Hwloc(String),
    /// The topology has no CPU.
    #[error("the topology has no CPU")]
    NoCpus,
    /// The topology has no NUMA node.
    #[error("the topology has no NUMA node")]
    NoNumaNodes,
    /// The same CPU id appears twice.
    #[error("CPU {0} is listed twice")]
    DuplicateCpu(usize),
    /// The same NUMA node id appears twice.
    #[error("NUMA node {0} is listed twice")]
    DuplicateNumaNode(usize),
    /// A CPU names a NUMA node that is not in the node list.
    #[error("CPU {cpu} is on NUMA node {node}, which is not in the topology")]
    UnknownNumaNode {
        /// The CPU.
        cpu: usize,
        /// The node it names.
        node: usize,
    },
    /// A CPU's core (its lowest sibling) is not on the same package or NUMA node.
    #[error("CPU {cpu} and its core {core} disagree on package or NUMA node")]
    InconsistentCore {
        /// The CPU.
        cpu: usize,
        /// The core id it names.
        core: usize,
    },
    /// A CPU names a core that is not one of the CPUs of the topology.
    #[error("CPU {cpu} names core {core}, which is not a CPU of the topology")]
    UnknownCore {
        /// The CPU.
        cpu: usize,
        /// The core id it names.
        core: usize,
    },
    /// A NUMA node's distance row does not have one entry per node.
    #[error("NUMA node {node} has {got} distances, expected {expected} (one per node)")]
    DistanceRow {
        /// The node.
        node: usize,
        /// Entries given.
        got: usize,
        /// Number of NUMA nodes.
        expected: usize,
    },
    /// A synthetic topology description that cannot be built.
    #[error("invalid synthetic topology: {0}")]
    Synthetic(String),
}

/// One logical CPU (an SMT thread) and where it sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CpuInfo {
    /// OS index (`cpuN`).
    pub id: usize,
    /// Core id: the lowest CPU id among the core's threads.
    pub core: usize,
    /// Package (socket) id.
    pub package: usize,
    /// NUMA node id.
    pub numa_node: usize,
    /// Uncore (L3) cache id; the package id when the machine has no L3.
    pub uncore_cache: usize,
}

/// A huge page pool of one page size on one NUMA node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HugePages {
    /// Page size in bytes (2097152 for `hugepages-2Mi`).
    pub page_size_bytes: u64,
    /// Pages in the pool.
    pub count: u64,
}

/// What a source knows about one NUMA node (input of [`MachineTopology::new`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaNodeSpec {
    /// OS index.
    pub id: usize,
    /// Local memory in bytes (hugepage pools included, as the kernel's `MemTotal`).
    pub memory_bytes: u64,
    /// Huge page pools.
    pub hugepages: Vec<HugePages>,
    /// Distance to every node, in ascending node id order (ACPI SLIT values, 10 = local);
    /// empty when unknown.
    pub distances: Vec<u64>,
}

/// A NUMA node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaNode {
    /// OS index.
    pub id: usize,
    /// Local memory in bytes.
    pub memory_bytes: u64,
    /// Huge page pools.
    pub hugepages: Vec<HugePages>,
    /// Distance to every node, in ascending node id order; empty when unknown.
    pub distances: Vec<u64>,
    /// CPUs on this node, ascending (empty for memory-only nodes).
    pub cpus: Vec<usize>,
    /// Packages with CPUs on this node.
    pub packages: Vec<usize>,
}

/// A package (socket).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    /// Physical package id.
    pub id: usize,
    /// NUMA nodes with CPUs of this package.
    pub numa_nodes: Vec<usize>,
    /// CPUs, ascending.
    pub cpus: Vec<usize>,
}

/// A physical core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Core {
    /// The lowest CPU id among its threads.
    pub id: usize,
    /// Package id.
    pub package: usize,
    /// NUMA node id.
    pub numa_node: usize,
    /// Uncore cache id.
    pub uncore_cache: usize,
    /// Its SMT threads (CPU ids), ascending.
    pub threads: Vec<usize>,
}

/// An L3 (uncore) cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UncoreCache {
    /// Cache id (the package id on machines without an L3).
    pub id: usize,
    /// Size in bytes (0 when unknown or when standing for a package).
    pub size_bytes: u64,
    /// CPUs sharing it, ascending.
    pub cpus: Vec<usize>,
}

/// The machine's topology. Built by [`MachineTopology::new`] from CPUs and NUMA nodes, which
/// checks that every CPU is on a known node and that cores are consistent; packages, cores
/// and caches are derived from the CPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineTopology {
    cpus: BTreeMap<usize, CpuInfo>,
    numa_nodes: Vec<NumaNode>,
    packages: Vec<Package>,
    cores: Vec<Core>,
    uncore_caches: Vec<UncoreCache>,
}

impl MachineTopology {
    /// Builds and checks a topology. `l3_sizes` gives cache sizes by uncore cache id (missing
    /// ids have size 0).
    pub fn new(
        cpus: Vec<CpuInfo>,
        nodes: Vec<NumaNodeSpec>,
        l3_sizes: &BTreeMap<usize, u64>,
    ) -> Result<Self, TopologyError> {
        if cpus.is_empty() {
            return Err(TopologyError::NoCpus);
        }
        if nodes.is_empty() {
            return Err(TopologyError::NoNumaNodes);
        }
        let mut by_id = BTreeMap::new();
        for cpu in cpus {
            if by_id.insert(cpu.id, cpu).is_some() {
                return Err(TopologyError::DuplicateCpu(cpu.id));
            }
        }
        let mut node_specs: BTreeMap<usize, NumaNodeSpec> = BTreeMap::new();
        for node in nodes {
            let id = node.id;
            if node_specs.insert(id, node).is_some() {
                return Err(TopologyError::DuplicateNumaNode(id));
            }
        }
        let node_count = node_specs.len();
        for spec in node_specs.values() {
            if !spec.distances.is_empty() && spec.distances.len() != node_count {
                return Err(TopologyError::DistanceRow {
                    node: spec.id,
                    got: spec.distances.len(),
                    expected: node_count,
                });
            }
        }
        for cpu in by_id.values() {
            if !node_specs.contains_key(&cpu.numa_node) {
                return Err(TopologyError::UnknownNumaNode {
                    cpu: cpu.id,
                    node: cpu.numa_node,
                });
            }
            let Some(core) = by_id.get(&cpu.core) else {
                return Err(TopologyError::UnknownCore {
                    cpu: cpu.id,
                    core: cpu.core,
                });
            };
            if core.core != cpu.core
                || core.package != cpu.package
                || core.numa_node != cpu.numa_node
                || cpu.core > cpu.id
            {
                return Err(TopologyError::InconsistentCore {
                    cpu: cpu.id,
                    core: cpu.core,
                });
            }
        }

        let mut node_cpus: BTreeMap<usize, (Vec<usize>, BTreeSet<usize>)> = BTreeMap::new();
        let mut package_cpus: BTreeMap<usize, (Vec<usize>, BTreeSet<usize>)> = BTreeMap::new();
        let mut core_threads: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        let mut cache_cpus: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for cpu in by_id.values() {
            let node = node_cpus.entry(cpu.numa_node).or_default();
            node.0.push(cpu.id);
            node.1.insert(cpu.package);
            let package = package_cpus.entry(cpu.package).or_default();
            package.0.push(cpu.id);
            package.1.insert(cpu.numa_node);
            core_threads.entry(cpu.core).or_default().push(cpu.id);
            cache_cpus.entry(cpu.uncore_cache).or_default().push(cpu.id);
        }
        let numa_nodes = node_specs
            .into_values()
            .map(|spec| {
                let (cpus, packages) = node_cpus.remove(&spec.id).unwrap_or_default();
                NumaNode {
                    id: spec.id,
                    memory_bytes: spec.memory_bytes,
                    hugepages: spec.hugepages,
                    distances: spec.distances,
                    cpus,
                    packages: packages.into_iter().collect(),
                }
            })
            .collect();
        let packages = package_cpus
            .into_iter()
            .map(|(id, (cpus, nodes))| Package {
                id,
                numa_nodes: nodes.into_iter().collect(),
                cpus,
            })
            .collect();
        let cores = core_threads
            .into_iter()
            .filter_map(|(id, threads)| {
                let first = by_id.get(&id)?;
                Some(Core {
                    id,
                    package: first.package,
                    numa_node: first.numa_node,
                    uncore_cache: first.uncore_cache,
                    threads,
                })
            })
            .collect();
        let uncore_caches = cache_cpus
            .into_iter()
            .map(|(id, cpus)| UncoreCache {
                id,
                size_bytes: l3_sizes.get(&id).copied().unwrap_or(0),
                cpus,
            })
            .collect();
        Ok(MachineTopology {
            cpus: by_id,
            numa_nodes,
            packages,
            cores,
            uncore_caches,
        })
    }

    /// Every CPU, by id.
    pub fn cpus(&self) -> &BTreeMap<usize, CpuInfo> {
        &self.cpus
    }

    /// One CPU.
    pub fn cpu(&self, id: usize) -> Option<&CpuInfo> {
        self.cpus.get(&id)
    }

    /// NUMA nodes, by ascending id.
    pub fn numa_nodes(&self) -> &[NumaNode] {
        &self.numa_nodes
    }

    /// One NUMA node.
    pub fn numa_node(&self, id: usize) -> Option<&NumaNode> {
        self.numa_nodes.iter().find(|n| n.id == id)
    }

    /// NUMA node ids, ascending.
    pub fn numa_node_ids(&self) -> Vec<usize> {
        self.numa_nodes.iter().map(|n| n.id).collect()
    }

    /// Packages, by ascending id.
    pub fn packages(&self) -> &[Package] {
        &self.packages
    }

    /// Cores, by ascending id.
    pub fn cores(&self) -> &[Core] {
        &self.cores
    }

    /// Uncore (L3) caches, by ascending id.
    pub fn uncore_caches(&self) -> &[UncoreCache] {
        &self.uncore_caches
    }

    /// Number of logical CPUs.
    pub fn num_cpus(&self) -> usize {
        self.cpus.len()
    }

    /// Number of physical cores.
    pub fn num_cores(&self) -> usize {
        self.cores.len()
    }

    /// Number of packages (sockets).
    pub fn num_packages(&self) -> usize {
        self.packages.len()
    }

    /// Number of NUMA nodes.
    pub fn num_numa_nodes(&self) -> usize {
        self.numa_nodes.len()
    }

    /// Number of uncore caches.
    pub fn num_uncore_caches(&self) -> usize {
        self.uncore_caches.len()
    }

    /// Threads per core (kubelet's `CPUsPerCore`: CPUs / cores).
    pub fn cpus_per_core(&self) -> usize {
        self.num_cpus().checked_div(self.num_cores()).unwrap_or(0)
    }

    /// The SLIT distance between two NUMA nodes; `None` when unknown or for unknown nodes.
    pub fn distance(&self, from: usize, to: usize) -> Option<u64> {
        let row = &self.numa_node(from)?.distances;
        let col = self.numa_nodes.iter().position(|n| n.id == to)?;
        row.get(col).copied()
    }

    /// True when every node has a full distance row.
    pub fn has_distances(&self) -> bool {
        self.numa_nodes
            .iter()
            .all(|n| n.distances.len() == self.numa_nodes.len())
    }

    /// The set of all NUMA nodes as a mask (fails for node ids of 64 or more).
    pub fn numa_mask(&self) -> Result<NumaMask, MaskError> {
        NumaMask::new(&self.numa_node_ids())
    }

    /// The CPUs on the given NUMA nodes, ascending.
    pub fn cpus_in_numa_nodes(&self, nodes: NumaMask) -> Vec<usize> {
        self.cpus
            .values()
            .filter(|c| nodes.is_set(c.numa_node))
            .map(|c| c.id)
            .collect()
    }

    /// The NUMA nodes the given CPUs are on.
    pub fn numa_nodes_of_cpus(&self, cpus: &[usize]) -> Result<NumaMask, MaskError> {
        let nodes: Vec<usize> = cpus
            .iter()
            .filter_map(|c| self.cpus.get(c))
            .map(|c| c.numa_node)
            .collect();
        NumaMask::new(&nodes)
    }
}
