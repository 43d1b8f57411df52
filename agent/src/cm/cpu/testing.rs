//! Test fixtures: kubelet's test topologies (pkg/kubelet/cm/cpumanager/policy_test.go), built
//! from the formulas their literal tables follow, and pod builders.
//!
//! Counts (`NumNUMANodes` included) are derived from the CPUs, as kubelet's current fixtures
//! set them.
use std::collections::BTreeMap;

use super::cpu_topology::{CpuInfo, CpuTopology};
use super::cpuset::Cpus;
use crate::pods::model::{Container, ContainerRestartPolicy, ObjectMeta, Pod, PodSpec};
use crate::pods::quantity::Quantity;

/// A topology from `(cpu, core, socket, numa, uncore)`.
pub(crate) fn kubelet_fixture(
    cpus: impl IntoIterator<Item = (u32, u32, u32, u32, u32)>,
) -> CpuTopology {
    CpuTopology::new(cpus.into_iter().map(|(cpu, core, socket, numa, uncore)| {
        (
            cpu,
            CpuInfo {
                core,
                socket,
                numa,
                uncore,
            },
        )
    }))
    .unwrap()
}

/// `topoSingleSocketHT`: 8 CPUs, 4 cores, 1 socket; CPU i on core i % 4.
pub(crate) fn topo_single_socket_ht() -> CpuTopology {
    kubelet_fixture((0..8).map(|c| (c, c % 4, 0, 0, 0)))
}

/// `topoDualSocketHT`: 12 CPUs, 6 cores; core i % 6, socket (and NUMA node) core % 2.
pub(crate) fn topo_dual_socket_ht() -> CpuTopology {
    kubelet_fixture((0..12).map(|c| (c, c % 6, (c % 6) % 2, (c % 6) % 2, 0)))
}

/// `topoDualSocketNoHT`: 8 CPUs, 8 cores; socket (and NUMA node) i / 4.
pub(crate) fn topo_dual_socket_no_ht() -> CpuTopology {
    kubelet_fixture((0..8).map(|c| (c, c, c / 4, c / 4, 0)))
}

/// `topoTripleSocketHT`: 18 CPUs, core i / 2; CPUs 0-5 socket 1, 6-11 socket 0, 12-17
/// socket 2 (NUMA node = socket).
pub(crate) fn topo_triple_socket_ht() -> CpuTopology {
    kubelet_fixture((0..18).map(|c| {
        let s = [1, 0, 2][(c / 6) as usize];
        (c, c / 2, s, s, 0)
    }))
}

/// `topoDualSocketMultiNumaPerSocketHT` (dual Xeon Gold 6230): 80 CPUs, core i % 40,
/// socket (i % 40) / 20, NUMA node (i % 40) / 10.
pub(crate) fn topo_dual_socket_multi_numa_per_socket_ht() -> CpuTopology {
    kubelet_fixture((0..80).map(|c| (c, c % 40, (c % 40) / 20, (c % 40) / 10, 0)))
}

/// `fakeTopoMultiSocketDualSocketPerNumaHT`: 80 CPUs, core i % 40, socket (i % 40) / 10,
/// NUMA node (i % 40) / 20.
pub(crate) fn fake_topo_multi_socket_dual_socket_per_numa_ht() -> CpuTopology {
    kubelet_fixture((0..80).map(|c| (c, c % 40, (c % 40) / 10, (c % 40) / 20, 0)))
}

/// `topoUncoreDualSocketNoSMT`: 16 CPUs, socket i / 8, one NUMA node, uncore i / 4.
pub(crate) fn topo_uncore_dual_socket_no_smt() -> CpuTopology {
    kubelet_fixture((0..16).map(|c| (c, c, c / 8, 0, c / 4)))
}

/// `topoUncoreSingleSocketMultiNuma`: 16 CPUs, NUMA node i / 8, uncore i / 4.
pub(crate) fn topo_uncore_single_socket_multi_numa() -> CpuTopology {
    kubelet_fixture((0..16).map(|c| (c, c, 0, c / 8, c / 4)))
}

/// `topoUncoreSingleSocketSMT`: 16 CPUs, 8 cores (core i % 8), uncore core / 4.
pub(crate) fn topo_uncore_single_socket_smt() -> CpuTopology {
    kubelet_fixture((0..16).map(|c| (c, c % 8, 0, 0, (c % 8) / 4)))
}

/// `topoUncoreSingleSocketNoSMT`: 16 CPUs, uncore i / 4.
pub(crate) fn topo_uncore_single_socket_no_smt() -> CpuTopology {
    kubelet_fixture((0..16).map(|c| (c, c, 0, 0, c / 4)))
}

/// Parses a CPU list.
pub(crate) fn cpus(text: &str) -> Cpus {
    Cpus::parse(text).unwrap()
}

fn resources(cpu: &str, memory: &str) -> BTreeMap<String, Quantity> {
    let mut list = BTreeMap::new();
    if !cpu.is_empty() {
        list.insert("cpu".to_owned(), Quantity::parse(cpu).unwrap());
    }
    if !memory.is_empty() {
        list.insert("memory".to_owned(), Quantity::parse(memory).unwrap());
    }
    list
}

/// A container with requests and limits.
pub(crate) fn container(name: &str, request: (&str, &str), limit: (&str, &str)) -> Container {
    let mut c = Container {
        name: name.to_owned(),
        ..Default::default()
    };
    c.resources.requests = resources(request.0, request.1);
    c.resources.limits = resources(limit.0, limit.1);
    c
}

/// A container whose requests equal its limits (`cpu`, `memory`).
pub(crate) fn guaranteed(name: &str, cpu: &str, memory: &str) -> Container {
    container(name, (cpu, memory), (cpu, memory))
}

/// A sidecar (init container with `restartPolicy: Always`).
pub(crate) fn sidecar(mut c: Container) -> Container {
    c.restart_policy = Some(ContainerRestartPolicy::Always);
    c
}

/// A pod with uid `uid`.
pub(crate) fn pod(uid: &str, init: Vec<Container>, containers: Vec<Container>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: uid.to_owned(),
            namespace: "default".to_owned(),
            uid: uid.to_owned(),
            ..Default::default()
        },
        status: crate::pods::model::PodStatus::default(),
        spec: PodSpec {
            containers,
            init_containers: init,
            ..Default::default()
        },
    }
}
