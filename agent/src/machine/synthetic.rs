//! Synthetic machine topologies for tests and benchmarks, built without hwloc: a regular
//! shape ([`SyntheticSpec`]) and the named shapes qosd is tested on.
//!
//! This module owns the shape description and the CPU numbering only. CPUs are numbered as
//! Linux numbers them on x86: the first thread of every core first, then the second thread
//! of every core (`cpu = thread * cores + core`), so SMT siblings are `c` and `c + cores`.
use std::collections::BTreeMap;

use super::{CpuInfo, HugePages, MachineTopology, NumaNodeSpec, TopologyError};

/// 2 MiB, the x86 default huge page size.
pub const HUGEPAGE_2M: u64 = 2 << 20;
/// 1 GiB huge pages.
pub const HUGEPAGE_1G: u64 = 1 << 30;

/// A regular machine: every package has the same number of NUMA nodes, every node the same
/// number of cores, every core the same number of threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntheticSpec {
    /// Packages (sockets).
    pub packages: usize,
    /// NUMA nodes per package.
    pub numa_per_package: usize,
    /// Cores per NUMA node.
    pub cores_per_numa: usize,
    /// Threads per core.
    pub threads_per_core: usize,
    /// Cores sharing one L3 (uncore) cache, within a NUMA node; 0 = one L3 per NUMA node.
    pub cores_per_l3: usize,
    /// L3 size in bytes.
    pub l3_bytes: u64,
    /// Memory per NUMA node in bytes.
    pub memory_per_node: u64,
    /// Huge page pools per NUMA node.
    pub hugepages_per_node: Vec<HugePages>,
    /// SLIT distance between nodes of the same package.
    pub same_package_distance: u64,
    /// SLIT distance between nodes of different packages.
    pub remote_package_distance: u64,
}

impl Default for SyntheticSpec {
    fn default() -> Self {
        SyntheticSpec {
            packages: 1,
            numa_per_package: 1,
            cores_per_numa: 1,
            threads_per_core: 1,
            cores_per_l3: 0,
            l3_bytes: 32 << 20,
            memory_per_node: 64 << 30,
            hugepages_per_node: Vec::new(),
            same_package_distance: 11,
            remote_package_distance: 21,
        }
    }
}

pub use super::LOCAL_DISTANCE;

impl SyntheticSpec {
    /// Builds the topology.
    pub fn build(&self) -> Result<MachineTopology, TopologyError> {
        if self.packages == 0
            || self.numa_per_package == 0
            || self.cores_per_numa == 0
            || self.threads_per_core == 0
        {
            return Err(TopologyError::Synthetic(format!(
                "every dimension must be at least 1: {self:?}"
            )));
        }
        let cores_per_l3 = if self.cores_per_l3 == 0 {
            self.cores_per_numa
        } else {
            self.cores_per_l3
        };
        let nodes = self.packages * self.numa_per_package;
        let cores = nodes * self.cores_per_numa;
        let l3_per_node = self.cores_per_numa.div_ceil(cores_per_l3);
        let mut cpus = Vec::with_capacity(cores * self.threads_per_core);
        let mut l3_sizes = BTreeMap::new();
        for core in 0..cores {
            let node = core / self.cores_per_numa;
            let package = node / self.numa_per_package;
            let l3 = node * l3_per_node + (core % self.cores_per_numa) / cores_per_l3;
            l3_sizes.insert(l3, self.l3_bytes);
            for thread in 0..self.threads_per_core {
                cpus.push(CpuInfo {
                    id: thread * cores + core,
                    core,
                    package,
                    numa_node: node,
                    uncore_cache: l3,
                });
            }
        }
        let node_specs = (0..nodes)
            .map(|node| NumaNodeSpec {
                id: node,
                memory_bytes: self.memory_per_node,
                hugepages: self.hugepages_per_node.clone(),
                distances: (0..nodes)
                    .map(|other| {
                        if other == node {
                            LOCAL_DISTANCE
                        } else if other / self.numa_per_package == node / self.numa_per_package {
                            self.same_package_distance
                        } else {
                            self.remote_package_distance
                        }
                    })
                    .collect(),
            })
            .collect();
        MachineTopology::new(cpus, node_specs, &l3_sizes)
    }
}

/// 2 sockets x 2 NUMA nodes x 16 cores x 2 threads: 128 CPUs, one L3 per NUMA node
/// (a sub-NUMA-clustered two-socket server).
pub fn dual_socket_snc2() -> Result<MachineTopology, TopologyError> {
    SyntheticSpec {
        packages: 2,
        numa_per_package: 2,
        cores_per_numa: 16,
        threads_per_core: 2,
        hugepages_per_node: vec![HugePages {
            page_size_bytes: HUGEPAGE_2M,
            count: 1024,
        }],
        ..SyntheticSpec::default()
    }
    .build()
}

/// 8 NUMA nodes x 32 cores (2 sockets x 4 nodes, no SMT): 256 CPUs, two L3 caches per node
/// (an AMD EPYC in NPS4 mode).
pub fn eight_numa_256_cpus() -> Result<MachineTopology, TopologyError> {
    SyntheticSpec {
        packages: 2,
        numa_per_package: 4,
        cores_per_numa: 32,
        threads_per_core: 1,
        cores_per_l3: 16,
        same_package_distance: 12,
        remote_package_distance: 32,
        ..SyntheticSpec::default()
    }
    .build()
}

/// 34 NUMA nodes (2 sockets x 17 nodes x 4 cores x 2 threads): 272 CPUs. Beyond kubelet's
/// default `max-allowable-numa-nodes` of 8.
pub fn thirty_four_numa() -> Result<MachineTopology, TopologyError> {
    SyntheticSpec {
        packages: 2,
        numa_per_package: 17,
        cores_per_numa: 4,
        threads_per_core: 2,
        memory_per_node: 16 << 30,
        ..SyntheticSpec::default()
    }
    .build()
}

/// The test VMs' shape (qemu `-smp 4` with two `-numa node` of 2 CPUs and 1 GiB each): one
/// socket, 4 cores without SMT, nodes 0 (CPUs 0-1) and 1 (CPUs 2-3) at qemu's default
/// distance of 20, one L3.
pub fn vm_two_numa_four_cpus() -> Result<MachineTopology, TopologyError> {
    let cpus = (0..4)
        .map(|id| CpuInfo {
            id,
            core: id,
            package: 0,
            numa_node: id / 2,
            uncore_cache: 0,
        })
        .collect();
    let nodes = (0..2)
        .map(|id| NumaNodeSpec {
            id,
            memory_bytes: 1 << 30,
            hugepages: Vec::new(),
            distances: if id == 0 { vec![10, 20] } else { vec![20, 10] },
        })
        .collect();
    MachineTopology::new(cpus, nodes, &BTreeMap::from([(0, 16 << 20)]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::NumaMask;

    #[test]
    fn dual_socket_snc2_shape() {
        let t = dual_socket_snc2().unwrap();
        assert_eq!(t.num_cpus(), 128);
        assert_eq!(t.num_cores(), 64);
        assert_eq!(t.num_packages(), 2);
        assert_eq!(t.num_numa_nodes(), 4);
        assert_eq!(t.num_uncore_caches(), 4);
        assert_eq!(t.cpus_per_core(), 2);
        // Siblings are c and c + 64; core ids are the lower sibling.
        let cpu = t.cpu(70).unwrap();
        assert_eq!((cpu.core, cpu.numa_node, cpu.package), (6, 0, 0));
        assert_eq!(t.cores()[6].threads, vec![6, 70]);
        // Nodes 0, 1 on package 0; 2, 3 on package 1.
        assert_eq!(t.packages()[1].numa_nodes, vec![2, 3]);
        assert_eq!(t.numa_node(3).unwrap().packages, vec![1]);
        assert_eq!(t.numa_node(1).unwrap().cpus.len(), 32);
        assert_eq!(t.distance(0, 0), Some(10));
        assert_eq!(t.distance(0, 1), Some(11));
        assert_eq!(t.distance(1, 2), Some(21));
        assert_eq!(t.numa_node(2).unwrap().hugepages[0].count, 1024);
        assert_eq!(t.numa_mask().unwrap(), NumaMask::first_n(4));
    }

    #[test]
    fn eight_numa_shape() {
        let t = eight_numa_256_cpus().unwrap();
        assert_eq!(t.num_cpus(), 256);
        assert_eq!(t.num_numa_nodes(), 8);
        assert_eq!(t.num_packages(), 2);
        assert_eq!(t.num_uncore_caches(), 16);
        assert_eq!(t.cpus_per_core(), 1);
        assert_eq!(t.cpu(47).unwrap().uncore_cache, 2);
        assert_eq!(t.cpu(47).unwrap().numa_node, 1);
        assert_eq!(t.distance(3, 4), Some(32));
        assert_eq!(
            t.cpus_in_numa_nodes(NumaMask::new(&[7]).unwrap()),
            (224..256).collect::<Vec<_>>()
        );
    }

    #[test]
    fn thirty_four_numa_shape() {
        let t = thirty_four_numa().unwrap();
        assert_eq!(t.num_numa_nodes(), 34);
        assert_eq!(t.num_cpus(), 272);
        assert!(t.has_distances());
        assert_eq!(t.numa_mask().unwrap().count(), 34);
        assert_eq!(t.distance(16, 17), Some(21));
        assert_eq!(t.distance(17, 33), Some(11));
    }

    #[test]
    fn vm_shape() {
        let t = vm_two_numa_four_cpus().unwrap();
        assert_eq!(t.num_cpus(), 4);
        assert_eq!(t.numa_node(1).unwrap().cpus, vec![2, 3]);
        assert_eq!(t.distance(1, 0), Some(20));
        assert_eq!(
            t.numa_nodes_of_cpus(&[1, 2]).unwrap(),
            NumaMask::new(&[0, 1]).unwrap()
        );
    }

    #[test]
    fn invalid_shapes_are_rejected() {
        let zero = SyntheticSpec {
            packages: 0,
            ..SyntheticSpec::default()
        };
        assert!(matches!(zero.build(), Err(TopologyError::Synthetic(_))));
        let cpu = |id, core, node| CpuInfo {
            id,
            core,
            package: 0,
            numa_node: node,
            uncore_cache: 0,
        };
        let node = |id| NumaNodeSpec {
            id,
            memory_bytes: 0,
            hugepages: vec![],
            distances: vec![],
        };
        let none = BTreeMap::new();
        assert_eq!(
            MachineTopology::new(vec![cpu(0, 0, 1)], vec![node(0)], &none),
            Err(TopologyError::UnknownNumaNode { cpu: 0, node: 1 })
        );
        assert_eq!(
            MachineTopology::new(vec![cpu(0, 0, 0), cpu(0, 0, 0)], vec![node(0)], &none),
            Err(TopologyError::DuplicateCpu(0))
        );
        // Siblings on different NUMA nodes.
        assert_eq!(
            MachineTopology::new(
                vec![cpu(0, 0, 0), cpu(1, 0, 1)],
                vec![node(0), node(1)],
                &none
            ),
            Err(TopologyError::InconsistentCore { cpu: 1, core: 0 })
        );
        let mut bad_row = node(0);
        bad_row.distances = vec![10, 20];
        assert_eq!(
            MachineTopology::new(vec![cpu(0, 0, 0)], vec![bad_row], &none),
            Err(TopologyError::DistanceRow {
                node: 0,
                got: 2,
                expected: 1
            })
        );
        assert_eq!(
            MachineTopology::new(vec![], vec![node(0)], &none),
            Err(TopologyError::NoCpus)
        );
    }
}
