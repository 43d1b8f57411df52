//! Table tests replaying kubelet's pkg/kubelet/cm/cpumanager/cpu_assignment_test.go: each row
//! names the kubelet case it mirrors; topologies, inputs and expected CPUs are kubelet's.
// Table rows are tuples of the kubelet case name and its data.
#![allow(
    clippy::type_complexity,
    reason = "table-driven test cases: one tuple per kubelet case"
)]
use super::*;
use crate::cm::cpu::testing::*;

fn packed_acc<'a>(topo: &'a CpuTopology, avail: &str) -> Accumulator<'a> {
    Accumulator::new(topo, &cpus(avail), 0, SortingStrategy::Packed)
}

#[test]
fn free_sockets_mirror_test_cpu_accumulator_free_sockets() {
    let rows: &[(&str, CpuTopology, &str, &[u32])] = &[
        (
            "single socket HT, 1 socket free",
            topo_single_socket_ht(),
            "0-7",
            &[0],
        ),
        (
            "single socket HT, 0 sockets free",
            topo_single_socket_ht(),
            "1-7",
            &[],
        ),
        (
            "dual socket HT, 2 sockets free",
            topo_dual_socket_ht(),
            "0-11",
            &[0, 1],
        ),
        (
            "dual socket HT, 1 socket free",
            topo_dual_socket_ht(),
            "0-9,11",
            &[1],
        ),
        (
            "dual socket HT, 0 sockets free",
            topo_dual_socket_ht(),
            "0,2-9,11",
            &[],
        ),
        (
            "dual socket, multi numa per socket, HT, 2 sockets free",
            topo_dual_socket_multi_numa_per_socket_ht(),
            "0-79",
            &[0, 1],
        ),
        (
            "dual socket, multi numa per socket, HT, 1 sockets free",
            topo_dual_socket_multi_numa_per_socket_ht(),
            "1-79",
            &[1],
        ),
        (
            "dual socket, multi numa per socket, HT, 0 sockets free",
            topo_dual_socket_multi_numa_per_socket_ht(),
            "1-78",
            &[],
        ),
        (
            "dual numa, multi socket per per socket, HT, 4 sockets free",
            fake_topo_multi_socket_dual_socket_per_numa_ht(),
            "0-79",
            &[0, 1, 2, 3],
        ),
        (
            "dual numa, multi socket per per socket, HT, 3 sockets free",
            fake_topo_multi_socket_dual_socket_per_numa_ht(),
            "0-19,21-79",
            &[0, 1, 3],
        ),
        (
            "dual numa, multi socket per per socket, HT, 2 sockets free",
            fake_topo_multi_socket_dual_socket_per_numa_ht(),
            "0-59,61-78",
            &[0, 1],
        ),
        (
            "dual numa, multi socket per per socket, HT, 1 sockets free",
            fake_topo_multi_socket_dual_socket_per_numa_ht(),
            "1-19,21-38,41-60,61-78",
            &[1],
        ),
        (
            "dual numa, multi socket per per socket, HT, 0 sockets free",
            fake_topo_multi_socket_dual_socket_per_numa_ht(),
            "0-40,42-49,51-68,71-79",
            &[],
        ),
    ];
    for (name, topo, avail, expect) in rows {
        let mut got = packed_acc(topo, avail).free_sockets();
        got.sort_unstable();
        assert_eq!(got, *expect, "{name}");
    }
}

#[test]
fn free_numa_nodes_mirror_test_cpu_accumulator_free_numa_nodes() {
    let rows: &[(&str, CpuTopology, &str, &[u32])] = &[
        (
            "single socket HT, 1 NUMA node free",
            topo_single_socket_ht(),
            "0-7",
            &[0],
        ),
        (
            "single socket HT, 0 NUMA Node free",
            topo_single_socket_ht(),
            "1-7",
            &[],
        ),
        (
            "dual socket HT, 2 NUMA Node free",
            topo_dual_socket_ht(),
            "0-11",
            &[0, 1],
        ),
        (
            "dual socket HT, 1 NUMA Node free",
            topo_dual_socket_ht(),
            "0-9,11",
            &[1],
        ),
        (
            "dual socket HT, 0 NUMA node free",
            topo_dual_socket_ht(),
            "0,2-9,11",
            &[],
        ),
        (
            "dual socket, multi numa per socket, HT, 4 NUMA Node free",
            topo_dual_socket_multi_numa_per_socket_ht(),
            "0-79",
            &[0, 1, 2, 3],
        ),
        (
            "dual socket, multi numa per socket, HT, 3 NUMA node free",
            topo_dual_socket_multi_numa_per_socket_ht(),
            "1-79",
            &[1, 2, 3],
        ),
        (
            "dual socket, multi numa per socket, HT, 2 NUMA node free",
            topo_dual_socket_multi_numa_per_socket_ht(),
            "1-9,11-79",
            &[2, 3],
        ),
        (
            "dual socket, multi numa per socket, HT, 1 NUMA node free",
            topo_dual_socket_multi_numa_per_socket_ht(),
            "1-9,11-59,61-79",
            &[3],
        ),
        (
            "dual socket, multi numa per socket, HT, 0 NUMA node free",
            topo_dual_socket_multi_numa_per_socket_ht(),
            "1-9,11-59,61-78",
            &[],
        ),
        (
            "dual numa, multi socket per per socket, HT, 2 NUMA node free",
            fake_topo_multi_socket_dual_socket_per_numa_ht(),
            "0-79",
            &[0, 1],
        ),
        (
            "dual numa, multi socket per per socket, HT, 1 NUMA node free",
            fake_topo_multi_socket_dual_socket_per_numa_ht(),
            "0-9,11-79",
            &[1],
        ),
        (
            "dual numa, multi socket per per socket, HT, 0 sockets free",
            fake_topo_multi_socket_dual_socket_per_numa_ht(),
            "0-9,11-59,61-79",
            &[],
        ),
    ];
    for (name, topo, avail, expect) in rows {
        assert_eq!(packed_acc(topo, avail).free_numa_nodes(), *expect, "{name}");
    }
}

#[test]
fn free_cores_mirror_test_cpu_accumulator_free_cores() {
    let rows: &[(&str, CpuTopology, &str, &[u32])] = &[
        (
            "single socket HT, 4 cores free",
            topo_single_socket_ht(),
            "0-7",
            &[0, 1, 2, 3],
        ),
        (
            "single socket HT, 3 cores free",
            topo_single_socket_ht(),
            "0-2,4-6",
            &[0, 1, 2],
        ),
        (
            "single socket HT, 3 cores free (1 partially consumed)",
            topo_single_socket_ht(),
            "0-6",
            &[0, 1, 2],
        ),
        (
            "single socket HT, 0 cores free",
            topo_single_socket_ht(),
            "",
            &[],
        ),
        (
            "single socket HT, 0 cores free (4 partially consumed)",
            topo_single_socket_ht(),
            "0-3",
            &[],
        ),
        (
            "dual socket HT, 6 cores free",
            topo_dual_socket_ht(),
            "0-11",
            &[0, 2, 4, 1, 3, 5],
        ),
        (
            "dual socket HT, 5 cores free (1 consumed from socket 0)",
            topo_dual_socket_ht(),
            "1-5,7-11",
            &[2, 4, 1, 3, 5],
        ),
        (
            "dual socket HT, 4 cores free (1 consumed from each socket)",
            topo_dual_socket_ht(),
            "2-5,8-11",
            &[2, 4, 3, 5],
        ),
    ];
    for (name, topo, avail, expect) in rows {
        assert_eq!(packed_acc(topo, avail).free_cores(), *expect, "{name}");
    }
}

#[test]
fn free_cpus_mirror_test_cpu_accumulator_free_cpus() {
    let rows: &[(&str, CpuTopology, &str, &[u32])] = &[
        (
            "single socket HT, 8 cpus free",
            topo_single_socket_ht(),
            "0-7",
            &[0, 4, 1, 5, 2, 6, 3, 7],
        ),
        (
            "single socket HT, 5 cpus free",
            topo_single_socket_ht(),
            "3-7",
            &[4, 5, 6, 3, 7],
        ),
        (
            "dual socket HT, 12 cpus free",
            topo_dual_socket_ht(),
            "0-11",
            &[0, 6, 2, 8, 4, 10, 1, 7, 3, 9, 5, 11],
        ),
        (
            "dual socket HT, 11 cpus free",
            topo_dual_socket_ht(),
            "1-11",
            &[6, 2, 8, 4, 10, 1, 7, 3, 9, 5, 11],
        ),
        (
            "dual socket HT, 10 cpus free",
            topo_dual_socket_ht(),
            "1-5,7-11",
            &[2, 8, 4, 10, 1, 7, 3, 9, 5, 11],
        ),
        (
            "triple socket HT, 12 cpus free",
            topo_triple_socket_ht(),
            "0-3,6-13",
            &[12, 13, 0, 1, 2, 3, 6, 7, 8, 9, 10, 11],
        ),
    ];
    for (name, topo, avail, expect) in rows {
        assert_eq!(packed_acc(topo, avail).sorted_cpus(), *expect, "{name}");
    }
}

/// Mirrors `TestCPUAccumulatorTake`.
#[test]
fn take_updates_need_and_availability() {
    let topo = topo_single_socket_ht();
    let rows: &[(&str, &str, &[&str], usize, bool, bool)] = &[
        (
            "take 0 cpus from a single socket HT, require 1",
            "0-7",
            &[""],
            1,
            false,
            false,
        ),
        (
            "take 0 cpus from a single socket HT, require 1, none available",
            "",
            &[""],
            1,
            false,
            true,
        ),
        (
            "take 1 cpu from a single socket HT, require 1",
            "0-7",
            &["0"],
            1,
            true,
            false,
        ),
        (
            "take 1 cpu from a single socket HT, require 2",
            "0-7",
            &["0"],
            2,
            false,
            false,
        ),
        (
            "take 2 cpu from a single socket HT, require 4, expect failed",
            "0-2",
            &["0", "1"],
            4,
            false,
            true,
        ),
        (
            "take all cpus one at a time from a single socket HT, require 8",
            "0-7",
            &["0", "1", "2", "3", "4", "5", "6", "7"],
            8,
            true,
            false,
        ),
    ];
    for (name, avail, takes, need, satisfied, failed) in rows {
        let mut acc = Accumulator::new(&topo, &cpus(avail), *need, SortingStrategy::Packed);
        let mut taken = 0;
        for t in *takes {
            let set = cpus(t);
            acc.take(&set);
            taken += set.len();
            assert!(!acc.avail.intersects(&set), "{name}");
            assert!(set.is_subset(&acc.result), "{name}");
        }
        assert_eq!(acc.is_satisfied(), *satisfied, "{name}");
        assert_eq!(acc.is_failed(), *failed, "{name}");
        assert_eq!(acc.needed, *need as i64 - taken as i64, "{name}");
    }
}

/// (kubelet case, topology, prefer uncore, spread, available, request, expected or error).
type PackedRow = (
    &'static str,
    CpuTopology,
    bool,
    bool,
    &'static str,
    usize,
    Result<&'static str, &'static str>,
);

/// kubelet's `commonTakeByTopologyTestCases`.
fn common_rows() -> Vec<PackedRow> {
    vec![
        (
            "take more cpus than are available from single socket with HT",
            topo_single_socket_ht(),
            false,
            false,
            "0,2,4,6",
            5,
            Err("not enough cpus available to satisfy request: requested=5, available=4"),
        ),
        (
            "take zero cpus from single socket with HT",
            topo_single_socket_ht(),
            false,
            false,
            "0-7",
            0,
            Ok(""),
        ),
        (
            "take one cpu from single socket with HT",
            topo_single_socket_ht(),
            false,
            false,
            "0-7",
            1,
            Ok("0"),
        ),
        (
            "take one cpu from single socket with HT, some cpus are taken",
            topo_single_socket_ht(),
            false,
            false,
            "1,3,5-7",
            1,
            Ok("6"),
        ),
        (
            "take two cpus from single socket with HT",
            topo_single_socket_ht(),
            false,
            false,
            "0-7",
            2,
            Ok("0,4"),
        ),
        (
            "take all cpus from single socket with HT",
            topo_single_socket_ht(),
            false,
            false,
            "0-7",
            8,
            Ok("0-7"),
        ),
        (
            "take two cpus from single socket with HT, only one core totally free",
            topo_single_socket_ht(),
            false,
            false,
            "0-3,6",
            2,
            Ok("2,6"),
        ),
        (
            "take a socket of cpus from dual socket with HT",
            topo_dual_socket_ht(),
            false,
            false,
            "0-11",
            6,
            Ok("0,2,4,6,8,10"),
        ),
        (
            "take a socket of cpus from dual socket with multi-numa-per-socket with HT",
            topo_dual_socket_multi_numa_per_socket_ht(),
            false,
            false,
            "0-79",
            40,
            Ok("0-19,40-59"),
        ),
        (
            "take a NUMA node of cpus from dual socket with multi-numa-per-socket with HT",
            topo_dual_socket_multi_numa_per_socket_ht(),
            false,
            false,
            "0-79",
            20,
            Ok("0-9,40-49"),
        ),
        (
            "take a NUMA node of cpus from dual socket with multi-numa-per-socket with HT, with 1 NUMA node already taken",
            topo_dual_socket_multi_numa_per_socket_ht(),
            false,
            false,
            "10-39,50-79",
            20,
            Ok("10-19,50-59"),
        ),
        (
            "take a socket and a NUMA node of cpus from dual socket with multi-numa-per-socket with HT",
            topo_dual_socket_multi_numa_per_socket_ht(),
            false,
            false,
            "0-79",
            60,
            Ok("0-29,40-69"),
        ),
        (
            "take a socket and a NUMA node of cpus from dual socket with multi-numa-per-socket with HT, a core taken",
            topo_dual_socket_multi_numa_per_socket_ht(),
            false,
            false,
            "1-39,41-79",
            60,
            Ok("10-39,50-79"),
        ),
    ]
}

fn check_packed(rows: Vec<PackedRow>) {
    for (name, topo, uncore, spread, avail, n, expected) in rows {
        let strategy = if spread {
            SortingStrategy::Spread
        } else {
            SortingStrategy::Packed
        };
        let got = take_packed(&topo, &cpus(avail), n, strategy, uncore);
        match expected {
            Ok(want) => assert_eq!(got, Ok(cpus(want)), "{name}"),
            Err(msg) => assert_eq!(
                got.map_err(|e| e.to_string()),
                Err(msg.to_owned()),
                "{name}"
            ),
        }
    }
}

/// `TestTakeByTopologyNUMAPacked`.
#[test]
fn take_packed_mirrors_test_take_by_topology_numa_packed() {
    let mut rows = common_rows();
    rows.extend([
        (
            "take one cpu from dual socket with HT - core from Socket 0",
            topo_dual_socket_ht(),
            false,
            false,
            "1-5,7-11",
            1,
            Ok("2"),
        ),
        (
            "allocate 4 full cores with 3 coming from the first NUMA node (filling it up) and 1 coming from the second NUMA node",
            topo_dual_socket_ht(),
            false,
            false,
            "0-11",
            8,
            Ok("0,6,2,8,4,10,1,7"),
        ),
        (
            "allocate 32 full cores with 30 coming from the first 3 NUMA nodes (filling them up) and 2 coming from the fourth NUMA node",
            topo_dual_socket_multi_numa_per_socket_ht(),
            false,
            false,
            "0-79",
            64,
            Ok("0-29,40-69,30,31,70,71"),
        ),
        (
            "take cpus from two full UncoreCaches and partial from a single UncoreCache",
            topo_uncore_single_socket_no_smt(),
            true,
            false,
            "1-15",
            10,
            Ok("1,2,4-11"),
        ),
        (
            "take one cpu from dual socket with HT - core from Socket 0 (PreferAlignByUncoreCache)",
            topo_dual_socket_ht(),
            true,
            false,
            "1-5,7-11",
            1,
            Ok("2"),
        ),
        (
            "take first available UncoreCache from first socket",
            topo_uncore_dual_socket_no_smt(),
            true,
            false,
            "0-15",
            4,
            Ok("0-3"),
        ),
        (
            "take all available UncoreCache from first socket",
            topo_uncore_dual_socket_no_smt(),
            true,
            false,
            "2-15",
            6,
            Ok("2-7"),
        ),
        (
            "take first available UncoreCache from second socket",
            topo_uncore_dual_socket_no_smt(),
            true,
            false,
            "8-15",
            4,
            Ok("8-11"),
        ),
        (
            "take first available UncoreCache from available NUMA",
            topo_uncore_single_socket_multi_numa(),
            true,
            false,
            "3,4-8,12",
            2,
            Ok("4,5"),
        ),
        (
            "take cpus from best available UncoreCache group of multi uncore cache single socket - SMT enabled",
            topo_uncore_single_socket_smt(),
            true,
            false,
            "2-3,10-11,4-7,12-15",
            6,
            Ok("4-6,12-14"),
        ),
        (
            "take cpus from multiple UncoreCache of single socket - SMT enabled",
            topo_uncore_single_socket_smt(),
            true,
            false,
            "1-7,9-15",
            10,
            Ok("4-7,12-15,1,9"),
        ),
    ]);
    check_packed(rows);
}

/// `TestTakeByTopologyWithSpreadPhysicalCPUsPreferredOption` (distribute-cpus-across-cores).
#[test]
fn take_spread_mirrors_test_take_by_topology_with_spread_physical_cpus_preferred_option() {
    check_packed(vec![
        (
            "take a socket of cpus from single socket with HT, 3 cpus",
            topo_single_socket_ht(),
            false,
            true,
            "0-7",
            3,
            Ok("0-2"),
        ),
        (
            "take a socket of cpus from dual socket with HT, 2 cpus",
            topo_dual_socket_ht(),
            false,
            true,
            "0-11",
            2,
            Ok("0,2"),
        ),
        (
            "take a socket of cpus from dual socket with HT, 3 cpus",
            topo_dual_socket_ht(),
            false,
            true,
            "0-11",
            3,
            Ok("0,2,4"),
        ),
        (
            "take a socket of cpus from dual socket with HT, 6 cpus",
            topo_dual_socket_ht(),
            false,
            true,
            "0-11",
            6,
            Ok("0,2,4,6,8,10"),
        ),
        (
            "take cpus from dual socket with HT, 8 cpus",
            topo_dual_socket_ht(),
            false,
            true,
            "0-11",
            8,
            Ok("0,2,4,6,8,10,1,3"),
        ),
        (
            "take a socket of cpus from dual socket without HT, 2 cpus",
            topo_dual_socket_no_ht(),
            false,
            true,
            "0-7",
            2,
            Ok("0,1"),
        ),
        (
            "take a socket of cpus from dual socket with multi numa per socket and HT, 12 cpus",
            topo_dual_socket_multi_numa_per_socket_ht(),
            false,
            true,
            "0-79",
            8,
            Ok("0-7"),
        ),
    ]);
}

/// (kubelet case, topology, available, request, group size, expected).
type DistributedRow = (
    &'static str,
    CpuTopology,
    &'static str,
    usize,
    usize,
    &'static str,
);

/// `TestTakeByTopologyNUMADistributed`, including `commonTakeByTopologyExtendedTestCases`.
#[test]
fn take_distributed_mirrors_test_take_by_topology_numa_distributed() {
    for (name, topo, _, _, avail, n, expected) in common_rows() {
        let got = take_distributed(&topo, &cpus(avail), n, 1, SortingStrategy::Packed);
        match expected {
            Ok(want) => assert_eq!(got, Ok(cpus(want)), "{name}"),
            Err(msg) => assert_eq!(
                got.map_err(|e| e.to_string()),
                Err(msg.to_owned()),
                "{name}"
            ),
        }
    }
    let multi = topo_dual_socket_multi_numa_per_socket_ht;
    let rows: Vec<DistributedRow> = vec![
        (
            "allocate 4 full cores with 2 distributed across each NUMA node",
            topo_dual_socket_ht(),
            "0-11",
            8,
            1,
            "0,6,2,8,1,7,3,9",
        ),
        (
            "allocate 32 full cores with 8 distributed across each NUMA node",
            multi(),
            "0-79",
            64,
            1,
            "0-7,10-17,20-27,30-37,40-47,50-57,60-67,70-77",
        ),
        (
            "allocate 24 full cores with 8 distributed across the first 3 NUMA nodes",
            multi(),
            "0-79",
            48,
            1,
            "0-7,10-17,20-27,40-47,50-57,60-67",
        ),
        (
            "allocate 24 full cores with 8 distributed across the first 3 NUMA nodes (taking all but 2 from the first NUMA node)",
            multi(),
            "1-29,32-39,41-69,72-79",
            48,
            1,
            "1-8,10-17,20-27,41-48,50-57,60-67",
        ),
        (
            "allocate 24 full cores with 8 distributed across the last 3 NUMA nodes (even though all 8 could be allocated from the first NUMA node)",
            multi(),
            "2-29,31-39,42-69,71-79",
            48,
            1,
            "10-17,20-27,31-38,50-57,60-67,71-78",
        ),
        (
            "allocate 8 full cores with 2 distributed across each NUMA node",
            multi(),
            "0-2,10-12,20-22,30-32,40-41,50-51,60-61,70-71",
            16,
            1,
            "0-1,10-11,20-21,30-31,40-41,50-51,60-61,70-71",
        ),
        (
            "take one cpu from dual socket with HT - core from Socket 0",
            topo_dual_socket_ht(),
            "1-5,7-11",
            1,
            1,
            "1",
        ),
        (
            "take one cpu from dual socket with HT - core from Socket 0 - cpuGroupSize 2",
            topo_dual_socket_ht(),
            "1-5,7-11",
            1,
            2,
            "2",
        ),
        (
            "allocate 13 full cores distributed across the first 2 NUMA nodes",
            multi(),
            "0-79",
            26,
            1,
            "0-6,10-16,40-45,50-55",
        ),
        (
            "allocate 13 full cores distributed across the first 2 NUMA nodes (cpuGroupSize 2)",
            multi(),
            "0-79",
            26,
            2,
            "0-6,10-15,40-46,50-55",
        ),
        (
            "allocate 31 full cores with 15 CPUs distributed across each NUMA node and 1 CPU spilling over to each of NUMA 0, 1",
            multi(),
            "0-79",
            62,
            1,
            "0-7,10-17,20-27,30-37,40-47,50-57,60-66,70-76",
        ),
        (
            "allocate 31 full cores with 14 CPUs distributed across each NUMA node and 2 CPUs spilling over to each of NUMA 0, 1, 2 (cpuGroupSize 2)",
            multi(),
            "0-79",
            62,
            2,
            "0-7,10-17,20-27,30-36,40-47,50-57,60-67,70-76",
        ),
        (
            "allocate 31 full cores with 15 CPUs distributed across each NUMA node and 1 CPU spilling over to each of NUMA 2, 3 (to keep balance)",
            multi(),
            "0-8,10-18,20-39,40-48,50-58,60-79",
            62,
            1,
            "0-7,10-17,20-27,30-37,40-46,50-56,60-67,70-77",
        ),
        (
            "allocate 31 full cores with 14 CPUs distributed across each NUMA node and 2 CPUs spilling over to each of NUMA 0, 2, 3 (to keep balance with cpuGroupSize 2)",
            multi(),
            "0-8,10-18,20-39,40-48,50-58,60-79",
            62,
            2,
            "0-7,10-16,20-27,30-37,40-47,50-56,60-67,70-77",
        ),
        (
            "ensure bestRemainder chosen with NUMA nodes that have enough CPUs to satisfy the request",
            multi(),
            "0-3,10-13,20-23,30-36,40-43,50-53,60-63,70-76",
            34,
            1,
            "0-3,10-13,20-23,30-34,40-43,50-53,60-63,70-74",
        ),
    ];
    for (name, topo, avail, n, group, want) in rows {
        let got = take_distributed(&topo, &cpus(avail), n, group, SortingStrategy::Packed);
        assert_eq!(got, Ok(cpus(want)), "{name}");
    }
}

#[test]
fn take_distributed_falls_back_to_packed_when_no_numa_combination_fits_whole_groups() {
    // Three NUMA nodes with 3 free CPUs each and 8 CPUs wanted in pairs: no combination holds
    // 4 pairs, so kubelet falls back to packing (whole cores, which are single CPUs here).
    let topo = CpuTopology::synthetic(1, 3, 4, 1, 1).unwrap();
    let got = take_distributed(&topo, &cpus("0-2,4-6,8-10"), 8, 2, SortingStrategy::Packed);
    assert_eq!(got, Ok(cpus("0-2,4-6,8-9")));
}

#[test]
fn packed_and_spread_takes_stay_within_what_is_available() {
    // Every kubelet row above, re-run on halves of the available CPUs: results are subsets of
    // what was available and have the requested size, or the request is refused.
    for (name, topo, uncore, spread, avail, _, _) in common_rows() {
        let avail = cpus(avail);
        let half: Cpus = avail.iter().step_by(2).collect();
        for n in 0..=half.len() + 1 {
            for strategy in [SortingStrategy::Packed, SortingStrategy::Spread] {
                let got = take_packed(&topo, &half, n, strategy, uncore || spread);
                match got {
                    Ok(set) => {
                        assert_eq!(set.len(), n, "{name}");
                        assert!(set.is_subset(&half), "{name}");
                    }
                    Err(_) => assert!(n > half.len(), "{name}: {n} of {}", half.len()),
                }
            }
        }
    }
}
