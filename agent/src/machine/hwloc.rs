//! The real machine's topology, read through hwloc (the `hwlocality` bindings to the system's
//! libhwloc).
//!
//! This module owns the translation from hwloc's object tree to [`MachineTopology`]: PUs
//! become CPUs, their Core / Package / L3Cache ancestors give core, package and uncore cache
//! ids, NUMA node objects give memory, huge page pools and (through their cpusets) the CPUs'
//! nodes, and hwloc's NUMA latency matrix gives distances. When hwloc has no distance matrix
//! (it omits it on single-node machines), [`load_host`] falls back to
//! `/sys/devices/system/node/nodeN/distance`, which is where cAdvisor reads them for kubelet.
use std::collections::BTreeMap;
use std::path::Path;

use hwlocality::Topology;
use hwlocality::object::TopologyObject;
use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::ObjectType;

use super::{CpuInfo, HugePages, MachineTopology, NumaNodeSpec, TopologyError};

/// Where Linux publishes NUMA node distances.
pub const SYSFS_NODE_DIR: &str = "/sys/devices/system/node";

/// Loads the running host's topology (hwloc, then sysfs for missing distances).
pub fn load_host() -> Result<MachineTopology, TopologyError> {
    let topology = Topology::new().map_err(|e| TopologyError::Hwloc(e.to_string()))?;
    let mut parts = read_parts(&topology)?;
    fill_distances_from_sysfs(&mut parts.nodes, Path::new(SYSFS_NODE_DIR));
    parts.build()
}

/// Translates an hwloc topology (the host's, or one hwloc built from a synthetic description
/// or XML). Distances hwloc does not know stay unknown, except on single-node machines where
/// the only distance is the local one (10).
pub fn from_hwloc(topology: &Topology) -> Result<MachineTopology, TopologyError> {
    read_parts(topology)?.build()
}

/// What hwloc told us, before checking.
struct Parts {
    cpus: Vec<CpuInfo>,
    nodes: Vec<NumaNodeSpec>,
    l3_sizes: BTreeMap<usize, u64>,
}

impl Parts {
    fn build(mut self) -> Result<MachineTopology, TopologyError> {
        if let [only] = self.nodes.as_mut_slice()
            && only.distances.is_empty()
        {
            only.distances = vec![super::LOCAL_DISTANCE];
        }
        MachineTopology::new(self.cpus, self.nodes, &self.l3_sizes)
    }
}

/// An object's OS index, or its logical index when the OS gives none.
fn index_of(obj: &TopologyObject) -> usize {
    obj.os_index().unwrap_or_else(|| obj.logical_index())
}

fn read_parts(topology: &Topology) -> Result<Parts, TopologyError> {
    // NUMA nodes: memory, huge pages, and the CPUs they hold.
    let mut nodes = Vec::new();
    let mut node_cpus: Vec<(usize, Vec<usize>)> = Vec::new();
    for node in topology.objects_with_type(ObjectType::NUMANode) {
        let id = index_of(node);
        let mut memory_bytes = 0;
        let mut hugepages = Vec::new();
        if let Some(ObjectAttributes::NUMANode(attrs)) = node.attributes() {
            memory_bytes = attrs.local_memory().map_or(0, |m| m.get());
            // page_types is sorted by size; the first entry is the base page size.
            let pages = attrs.page_types();
            if let Some((base, huge)) = pages.split_first() {
                hugepages = huge
                    .iter()
                    .filter(|p| p.size() > base.size())
                    .map(|p| HugePages {
                        page_size_bytes: p.size().get(),
                        count: p.count(),
                    })
                    .collect();
            }
        }
        let cpus = node
            .cpuset()
            .map(|set| set.iter_set().map(usize::from).collect())
            .unwrap_or_default();
        node_cpus.push((id, cpus));
        nodes.push(NumaNodeSpec {
            id,
            memory_bytes,
            hugepages,
            distances: Vec::new(),
        });
    }
    nodes.sort_by_key(|n| n.id);
    node_cpus.sort_by_key(|(id, _)| *id);
    fill_distances_from_hwloc(topology, &mut nodes)?;

    // CPUs: PUs with their core, package, L3 and node.
    let mut cpus = Vec::new();
    let mut l3_sizes = BTreeMap::new();
    for pu in topology.objects_with_type(ObjectType::PU) {
        let id = index_of(pu);
        let package = pu
            .first_ancestor_with_type(ObjectType::Package)
            .map_or(0, index_of);
        let core = match pu.first_ancestor_with_type(ObjectType::Core) {
            Some(core) => core
                .cpuset()
                .and_then(|set| set.first_set())
                .map_or(id, usize::from),
            None => id,
        };
        let uncore_cache = match pu.first_ancestor_with_type(ObjectType::L3Cache) {
            Some(l3) => {
                let size = match l3.attributes() {
                    Some(ObjectAttributes::Cache(cache)) => cache.size().map_or(0, |s| s.get()),
                    _ => 0,
                };
                l3_sizes.insert(l3.logical_index(), size);
                l3.logical_index()
            }
            None => package,
        };
        // The first (lowest) node whose cpuset holds the CPU, as sysfs' nodeN/cpulist.
        let numa_node = node_cpus
            .iter()
            .find(|(_, cpus)| cpus.contains(&id))
            .map(|(node, _)| *node)
            .or_else(|| nodes.first().map(|n| n.id))
            .ok_or(TopologyError::NoNumaNodes)?;
        cpus.push(CpuInfo {
            id,
            core,
            package,
            numa_node,
            uncore_cache,
        });
    }
    Ok(Parts {
        cpus,
        nodes,
        l3_sizes,
    })
}

/// Fills distance rows from hwloc's NUMA distance matrix (the first one covering every node;
/// latency, which is what the kernel's SLIT table gives, when several exist).
fn fill_distances_from_hwloc(
    topology: &Topology,
    nodes: &mut [NumaNodeSpec],
) -> Result<(), TopologyError> {
    let matrices = topology
        .distances_with_type(None, ObjectType::NUMANode)
        .map_err(|e| TopologyError::Hwloc(e.to_string()))?;
    let position: BTreeMap<usize, usize> =
        nodes.iter().enumerate().map(|(i, n)| (n.id, i)).collect();
    for matrix in &matrices {
        let ids: Vec<Option<usize>> = matrix.objects().map(|o| o.map(index_of)).collect();
        if ids.len() != nodes.len()
            || ids
                .iter()
                .any(|id| id.is_none_or(|id| !position.contains_key(&id)))
        {
            continue;
        }
        let mut rows = vec![vec![0u64; nodes.len()]; nodes.len()];
        for ((i, j), distance) in matrix.enumerate_distances() {
            let (Some(Some(a)), Some(Some(b))) = (ids.get(i), ids.get(j)) else {
                continue;
            };
            if let (Some(&pa), Some(&pb)) = (position.get(a), position.get(b))
                && let Some(cell) = rows.get_mut(pa).and_then(|row| row.get_mut(pb))
            {
                *cell = distance;
            }
        }
        for (node, row) in nodes.iter_mut().zip(rows) {
            node.distances = row;
        }
        return Ok(());
    }
    Ok(())
}

/// Fills missing distance rows from `<dir>/nodeN/distance` (one value per online node, in node
/// id order). Rows that cannot be read, or have the wrong length, stay empty.
pub fn fill_distances_from_sysfs(nodes: &mut [NumaNodeSpec], dir: &Path) {
    let count = nodes.len();
    for node in nodes.iter_mut().filter(|n| n.distances.is_empty()) {
        let path = dir.join(format!("node{}", node.id)).join("distance");
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let row: Result<Vec<u64>, _> = text.split_whitespace().map(str::parse).collect();
        if let Ok(row) = row
            && row.len() == count
        {
            node.distances = row;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_topology_loads() {
        // The development host: one package, one NUMA node, 2 CPUs. Assert what holds on any
        // Linux host, then the counts that must agree with the kernel's view.
        let t = load_host().unwrap();
        let online = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(t.num_cpus() >= online, "{} < {online}", t.num_cpus());
        assert!(t.num_numa_nodes() >= 1);
        assert!(t.num_cores() >= 1 && t.num_cores() <= t.num_cpus());
        assert!(t.has_distances());
        for node in t.numa_nodes() {
            assert_eq!(t.distance(node.id, node.id), Some(10));
        }
        let sysfs_nodes = std::fs::read_dir(SYSFS_NODE_DIR)
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| {
                        let name = e.file_name();
                        let name = name.to_string_lossy();
                        name.strip_prefix("node")
                            .is_some_and(|n| n.parse::<usize>().is_ok())
                    })
                    .count()
            })
            .unwrap_or(1);
        assert_eq!(t.num_numa_nodes(), sysfs_nodes);
        let total: u64 = t.numa_nodes().iter().map(|n| n.memory_bytes).sum();
        assert!(total > 0);
        // Every CPU's core, node and package are consistent with the derived lists.
        for cpu in t.cpus().values() {
            let core = t.cores().iter().find(|c| c.id == cpu.core).unwrap();
            assert!(core.threads.contains(&cpu.id));
            assert!(t.numa_node(cpu.numa_node).unwrap().cpus.contains(&cpu.id));
        }
    }

    #[test]
    fn hwloc_synthetic_multi_numa_topology_translates() {
        // hwloc's own synthetic backend exercises the multi-node paths the host lacks.
        let topology = Topology::builder()
            .from_synthetic("pack:2 [numa(memory=1GB)] l3:2 core:3 pu:2")
            .unwrap()
            .build()
            .unwrap();
        let t = from_hwloc(&topology).unwrap();
        assert_eq!(t.num_packages(), 2);
        assert_eq!(t.num_numa_nodes(), 2);
        assert_eq!(t.num_uncore_caches(), 4);
        assert_eq!(t.num_cores(), 12);
        assert_eq!(t.num_cpus(), 24);
        assert_eq!(t.cpus_per_core(), 2);
        assert_eq!(t.numa_node(1).unwrap().cpus.len(), 12);
        assert_eq!(t.numa_node(0).unwrap().memory_bytes, 1_000_000_000);
        for core in t.cores() {
            assert_eq!(core.threads.len(), 2);
            assert_eq!(core.id, core.threads[0]);
        }
        // No distance matrix in a synthetic hwloc topology with two nodes: unknown.
        assert!(!t.has_distances());
    }

    #[test]
    fn sysfs_distances_fill_missing_rows() {
        let dir = tempfile::tempdir().unwrap();
        for (id, row) in [(0, "10 21\n"), (1, "21 10\n")] {
            let node = dir.path().join(format!("node{id}"));
            std::fs::create_dir_all(&node).unwrap();
            std::fs::write(node.join("distance"), row).unwrap();
        }
        let spec = |id| NumaNodeSpec {
            id,
            memory_bytes: 0,
            hugepages: vec![],
            distances: vec![],
        };
        let mut nodes = vec![spec(0), spec(1), spec(2)];
        fill_distances_from_sysfs(&mut nodes, dir.path());
        // Rows of the wrong length (2 values for 3 nodes) and missing files stay empty.
        assert!(nodes.iter().all(|n| n.distances.is_empty()));
        let mut nodes = vec![spec(0), spec(1)];
        fill_distances_from_sysfs(&mut nodes, dir.path());
        assert_eq!(nodes[1].distances, vec![21, 10]);
    }
}
