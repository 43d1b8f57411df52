//! [`CpuTopology`]: what the CPU manager needs to know about the machine — for every logical
//! CPU its core, socket, NUMA node and uncore (L3) cache — indexed for the allocator.
//!
//! This is kubelet's `cpumanager/topology.CPUTopology`, built from a list of CPUs rather than
//! from cAdvisor, so it can be filled from the machine topology module or synthetically in
//! tests and benchmarks. Core ids must be unique across the machine (kubelet uses the lowest
//! CPU id of the core, [`CpuTopology::from_threads`] does the same). Counts follow kubelet's
//! `Discover`: `num_cpus` logical CPUs, `num_cores` physical cores, and sockets, NUMA nodes and
//! uncore caches as the distinct ids seen.
use std::collections::{BTreeMap, BTreeSet};

use super::cpuset::Cpus;
use crate::machine::MachineTopology;

/// Errors building a topology.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("could not detect number of cpus")]
    NoCpus,
    #[error("cpu {cpu} is listed twice")]
    DuplicateCpu { cpu: u32 },
    #[error("core of cpus {threads:?} has no cpus or repeats one")]
    BadCore { threads: Vec<u32> },
    #[error("id {0} is too large")]
    IdOutOfRange(usize),
}

/// Where one logical CPU sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CpuInfo {
    /// Physical core id, unique on the machine.
    pub core: u32,
    pub socket: u32,
    pub numa: u32,
    /// Uncore (last-level) cache id; kubelet uses the socket id when the cache is unknown.
    pub uncore: u32,
}

/// The CPU topology, with per-core / socket / NUMA node / uncore cache CPU sets precomputed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuTopology {
    /// Logical CPUs.
    pub num_cpus: usize,
    /// Physical cores.
    pub num_cores: usize,
    pub num_sockets: usize,
    pub num_numa_nodes: usize,
    pub num_uncore_caches: usize,
    details: BTreeMap<u32, CpuInfo>,
    all: Cpus,
    cores: BTreeMap<u32, Cpus>,
    sockets: BTreeMap<u32, Cpus>,
    numa_nodes: BTreeMap<u32, Cpus>,
    uncores: BTreeMap<u32, Cpus>,
    // Parent -> children relations, each list ascending.
    sockets_of_numa: BTreeMap<u32, Vec<u32>>,
    numas_of_socket: BTreeMap<u32, Vec<u32>>,
    cores_of_socket: BTreeMap<u32, Vec<u32>>,
    cores_of_numa: BTreeMap<u32, Vec<u32>>,
    cores_of_uncore: BTreeMap<u32, Vec<u32>>,
    uncores_of_numa: BTreeMap<u32, Vec<u32>>,
}

/// One physical core of [`CpuTopology::from_threads`]: its threads and where it sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreThreads {
    pub threads: Vec<u32>,
    pub socket: u32,
    pub numa: u32,
    /// `None`: unknown, the socket id is used (as kubelet does).
    pub uncore: Option<u32>,
}

impl CpuTopology {
    /// A topology from every CPU's placement. Counts are derived as kubelet's `Discover` does.
    pub fn new(cpus: impl IntoIterator<Item = (u32, CpuInfo)>) -> Result<Self, TopologyError> {
        let mut details = BTreeMap::new();
        for (cpu, info) in cpus {
            if details.insert(cpu, info).is_some() {
                return Err(TopologyError::DuplicateCpu { cpu });
            }
        }
        if details.is_empty() {
            return Err(TopologyError::NoCpus);
        }
        let mut topo = Self {
            num_cpus: details.len(),
            num_cores: 0,
            num_sockets: 0,
            num_numa_nodes: 0,
            num_uncore_caches: 0,
            all: details.keys().copied().collect(),
            details,
            cores: BTreeMap::new(),
            sockets: BTreeMap::new(),
            numa_nodes: BTreeMap::new(),
            uncores: BTreeMap::new(),
            sockets_of_numa: BTreeMap::new(),
            numas_of_socket: BTreeMap::new(),
            cores_of_socket: BTreeMap::new(),
            cores_of_numa: BTreeMap::new(),
            cores_of_uncore: BTreeMap::new(),
            uncores_of_numa: BTreeMap::new(),
        };
        let mut rel: [BTreeMap<u32, BTreeSet<u32>>; 6] = Default::default();
        for (&cpu, info) in &topo.details {
            topo.cores.entry(info.core).or_default().insert(cpu);
            topo.sockets.entry(info.socket).or_default().insert(cpu);
            topo.numa_nodes.entry(info.numa).or_default().insert(cpu);
            topo.uncores.entry(info.uncore).or_default().insert(cpu);
            rel[0].entry(info.numa).or_default().insert(info.socket);
            rel[1].entry(info.socket).or_default().insert(info.numa);
            rel[2].entry(info.socket).or_default().insert(info.core);
            rel[3].entry(info.numa).or_default().insert(info.core);
            rel[4].entry(info.uncore).or_default().insert(info.core);
            rel[5].entry(info.numa).or_default().insert(info.uncore);
        }
        let to_lists = |m: &BTreeMap<u32, BTreeSet<u32>>| -> BTreeMap<u32, Vec<u32>> {
            m.iter()
                .map(|(k, v)| (*k, v.iter().copied().collect()))
                .collect()
        };
        topo.sockets_of_numa = to_lists(&rel[0]);
        topo.numas_of_socket = to_lists(&rel[1]);
        topo.cores_of_socket = to_lists(&rel[2]);
        topo.cores_of_numa = to_lists(&rel[3]);
        topo.cores_of_uncore = to_lists(&rel[4]);
        topo.uncores_of_numa = to_lists(&rel[5]);
        topo.num_cores = topo.cores.len();
        topo.num_sockets = topo.sockets.len();
        topo.num_numa_nodes = topo.numa_nodes.len();
        topo.num_uncore_caches = topo.uncores.len();
        Ok(topo)
    }

    /// A topology from physical cores and their threads, with kubelet's unique core id (the
    /// lowest CPU id of the core, `getUniqueCoreID`).
    pub fn from_threads(cores: &[CoreThreads]) -> Result<Self, TopologyError> {
        let mut cpus = Vec::new();
        for core in cores {
            let unique: BTreeSet<u32> = core.threads.iter().copied().collect();
            let Some(&id) = unique.first() else {
                return Err(TopologyError::BadCore {
                    threads: core.threads.clone(),
                });
            };
            if unique.len() != core.threads.len() {
                return Err(TopologyError::BadCore {
                    threads: core.threads.clone(),
                });
            }
            for &cpu in &core.threads {
                cpus.push((
                    cpu,
                    CpuInfo {
                        core: id,
                        socket: core.socket,
                        numa: core.numa,
                        uncore: core.uncore.unwrap_or(core.socket),
                    },
                ));
            }
        }
        Self::new(cpus)
    }

    /// From the machine topology ([`MachineTopology`]: cores, packages, NUMA nodes and L3
    /// caches with kubelet's ids).
    pub fn from_machine(machine: &MachineTopology) -> Result<Self, TopologyError> {
        let id = |v: usize| u32::try_from(v).map_err(|_| TopologyError::IdOutOfRange(v));
        let mut cpus = Vec::with_capacity(machine.num_cpus());
        for (&cpu, info) in machine.cpus() {
            cpus.push((
                id(cpu)?,
                CpuInfo {
                    core: id(info.core)?,
                    socket: id(info.package)?,
                    numa: id(info.numa_node)?,
                    uncore: id(info.uncore_cache)?,
                },
            ));
        }
        Self::new(cpus)
    }

    /// A regular machine: `sockets` x `numa_per_socket` NUMA nodes x `cores_per_numa` cores x
    /// `threads` threads, `uncores_per_numa` L3 caches per NUMA node. CPUs are numbered as
    /// Linux numbers x86 machines: first thread of every core (0..cores), then the second, ...
    #[must_use]
    pub fn synthetic(
        sockets: u32,
        numa_per_socket: u32,
        cores_per_numa: u32,
        threads: u32,
        uncores_per_numa: u32,
    ) -> Option<Self> {
        let total_cores = sockets * numa_per_socket * cores_per_numa;
        let uncores_per_numa = uncores_per_numa.max(1);
        let cores_per_uncore = cores_per_numa.div_ceil(uncores_per_numa).max(1);
        let mut cpus = Vec::new();
        for core in 0..total_cores {
            let numa = core / cores_per_numa;
            let socket = numa / numa_per_socket;
            let uncore = numa * uncores_per_numa + (core % cores_per_numa) / cores_per_uncore;
            for t in 0..threads {
                cpus.push((
                    t * total_cores + core,
                    CpuInfo {
                        core,
                        socket,
                        numa,
                        uncore,
                    },
                ));
            }
        }
        Self::new(cpus).ok()
    }

    /// kubelet's `CPUsPerCore`: `num_cpus / num_cores`.
    #[must_use]
    pub fn cpus_per_core(&self) -> usize {
        self.num_cpus.checked_div(self.num_cores).unwrap_or(0)
    }

    /// kubelet's `CPUsPerSocket`: `num_cpus / num_sockets`.
    #[must_use]
    pub fn cpus_per_socket(&self) -> usize {
        self.num_cpus.checked_div(self.num_sockets).unwrap_or(0)
    }

    /// kubelet's `CPUsPerUncore`: `num_cpus / num_uncore_caches`.
    #[must_use]
    pub fn cpus_per_uncore(&self) -> usize {
        self.num_cpus
            .checked_div(self.num_uncore_caches)
            .unwrap_or(0)
    }

    /// Every CPU.
    #[must_use]
    pub fn all_cpus(&self) -> &Cpus {
        &self.all
    }

    /// Where `cpu` sits.
    #[must_use]
    pub fn cpu(&self, cpu: u32) -> Option<CpuInfo> {
        self.details.get(&cpu).copied()
    }

    /// Every CPU with its placement, by CPU id.
    pub fn cpus(&self) -> impl Iterator<Item = (u32, CpuInfo)> + '_ {
        self.details.iter().map(|(&c, &i)| (c, i))
    }

    /// NUMA node ids, ascending.
    pub fn numa_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.numa_nodes.keys().copied()
    }

    /// The CPUs of a core (empty for an unknown id).
    #[must_use]
    pub fn core_cpus(&self, core: u32) -> &Cpus {
        self.cores.get(&core).unwrap_or(&EMPTY)
    }

    /// The CPUs of a socket.
    #[must_use]
    pub fn socket_cpus(&self, socket: u32) -> &Cpus {
        self.sockets.get(&socket).unwrap_or(&EMPTY)
    }

    /// The CPUs of a NUMA node.
    #[must_use]
    pub fn numa_cpus(&self, numa: u32) -> &Cpus {
        self.numa_nodes.get(&numa).unwrap_or(&EMPTY)
    }

    /// The CPUs of an uncore cache.
    #[must_use]
    pub fn uncore_cpus(&self, uncore: u32) -> &Cpus {
        self.uncores.get(&uncore).unwrap_or(&EMPTY)
    }

    /// The CPUs of several NUMA nodes.
    #[must_use]
    pub fn cpus_in_numa_nodes(&self, numas: impl IntoIterator<Item = u32>) -> Cpus {
        let mut out = Cpus::new();
        for n in numas {
            out.union_with(self.numa_cpus(n));
        }
        out
    }

    /// The CPUs of the cores of `cpus` (each CPU with its SMT siblings).
    #[must_use]
    pub fn cores_of(&self, cpus: &Cpus) -> Cpus {
        let mut out = Cpus::new();
        for cpu in cpus.iter() {
            if let Some(info) = self.details.get(&cpu) {
                out.union_with(self.core_cpus(info.core));
            }
        }
        out
    }

    /// NUMA nodes with at least one CPU in `cpus`, ascending.
    #[must_use]
    pub fn numa_nodes_of(&self, cpus: &Cpus) -> Vec<u32> {
        self.numa_nodes
            .iter()
            .filter(|(_, c)| c.intersects(cpus))
            .map(|(n, _)| *n)
            .collect()
    }

    /// Sockets with at least one CPU in `cpus`, ascending.
    #[must_use]
    pub fn sockets_of(&self, cpus: &Cpus) -> Vec<u32> {
        self.sockets
            .iter()
            .filter(|(_, c)| c.intersects(cpus))
            .map(|(n, _)| *n)
            .collect()
    }

    /// Sockets that hold CPUs of the NUMA node.
    #[must_use]
    pub fn sockets_of_numa(&self, numa: u32) -> &[u32] {
        self.sockets_of_numa.get(&numa).map_or(&[], Vec::as_slice)
    }

    /// NUMA nodes that hold CPUs of the socket.
    #[must_use]
    pub fn numas_of_socket(&self, socket: u32) -> &[u32] {
        self.numas_of_socket.get(&socket).map_or(&[], Vec::as_slice)
    }

    /// Cores of the socket.
    #[must_use]
    pub fn cores_of_socket(&self, socket: u32) -> &[u32] {
        self.cores_of_socket.get(&socket).map_or(&[], Vec::as_slice)
    }

    /// Cores of the NUMA node.
    #[must_use]
    pub fn cores_of_numa(&self, numa: u32) -> &[u32] {
        self.cores_of_numa.get(&numa).map_or(&[], Vec::as_slice)
    }

    /// Cores sharing the uncore cache.
    #[must_use]
    pub fn cores_of_uncore(&self, uncore: u32) -> &[u32] {
        self.cores_of_uncore.get(&uncore).map_or(&[], Vec::as_slice)
    }

    /// Uncore caches of the NUMA node.
    #[must_use]
    pub fn uncores_of_numa(&self, numa: u32) -> &[u32] {
        self.uncores_of_numa.get(&numa).map_or(&[], Vec::as_slice)
    }
}

static EMPTY: Cpus = Cpus::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_kubelet_discover() {
        let topo = CpuTopology::synthetic(2, 2, 4, 2, 2).unwrap();
        assert_eq!(topo.num_cpus, 32);
        assert_eq!(topo.num_cores, 16);
        assert_eq!(topo.num_sockets, 2);
        assert_eq!(topo.num_numa_nodes, 4);
        assert_eq!(topo.num_uncore_caches, 8);
        assert_eq!(topo.cpus_per_core(), 2);
        assert_eq!(topo.cpus_per_socket(), 16);
        assert_eq!(topo.cpus_per_uncore(), 4);
        // Linux-style numbering: CPU 0 and 16 are the two threads of core 0.
        assert_eq!(topo.core_cpus(0).to_string(), "0,16");
        assert_eq!(topo.numa_cpus(1).to_string(), "4-7,20-23");
        assert_eq!(topo.sockets_of_numa(3), &[1]);
        assert_eq!(topo.numas_of_socket(0), &[0, 1]);
        assert_eq!(topo.uncores_of_numa(0), &[0, 1]);
        assert_eq!(topo.cores_of_uncore(1), &[2, 3]);
    }

    #[test]
    fn from_threads_uses_the_lowest_thread_as_core_id_and_socket_as_default_uncore() {
        let topo = CpuTopology::from_threads(&[
            CoreThreads {
                threads: vec![4, 0],
                socket: 0,
                numa: 0,
                uncore: None,
            },
            CoreThreads {
                threads: vec![1, 5],
                socket: 1,
                numa: 1,
                uncore: Some(9),
            },
        ])
        .unwrap();
        assert_eq!(topo.cpu(4).unwrap().core, 0);
        assert_eq!(topo.cpu(5).unwrap().core, 1);
        assert_eq!(topo.cpu(4).unwrap().uncore, 0);
        assert_eq!(topo.cpu(1).unwrap().uncore, 9);
        assert_eq!(
            CpuTopology::from_threads(&[CoreThreads {
                threads: vec![1, 1],
                socket: 0,
                numa: 0,
                uncore: None
            }]),
            Err(TopologyError::BadCore {
                threads: vec![1, 1]
            })
        );
        assert_eq!(CpuTopology::new([]), Err(TopologyError::NoCpus));
    }

    #[test]
    fn from_machine_keeps_kubelets_ids() {
        let machine = crate::machine::synthetic::dual_socket_snc2().unwrap();
        let topo = CpuTopology::from_machine(&machine).unwrap();
        assert_eq!(topo.num_cpus, machine.num_cpus());
        assert_eq!(topo.num_cores, machine.num_cores());
        assert_eq!(topo.num_sockets, machine.num_packages());
        assert_eq!(topo.num_numa_nodes, machine.num_numa_nodes());
        assert_eq!(topo.num_uncore_caches, machine.num_uncore_caches());
        for (cpu, info) in machine.cpus() {
            let mine = topo.cpu(u32::try_from(*cpu).unwrap()).unwrap();
            assert_eq!(mine.core as usize, info.core);
            assert_eq!(mine.numa as usize, info.numa_node);
        }
    }
}
