//! Table tests replaying kubelet's pkg/kubelet/cm/cpumanager/policy_static_test.go and
//! topology_hints_test.go; each row names the kubelet case (topologies, states, pods and
//! expected CPUs or errors are kubelet's).
// Table rows are tuples of the kubelet case name and its data.
#![allow(
    clippy::type_complexity,
    reason = "table-driven test cases: one tuple per kubelet case"
)]
use std::collections::BTreeMap;

use super::*;
use crate::cm::cpu::cpu_topology::CoreThreads;
use crate::cm::cpu::options::{self, OptionGates};
use crate::cm::cpu::testing::*;

fn policy(
    topo: CpuTopology,
    num_reserved: usize,
    reserved: &str,
    options: &[(&str, &str)],
) -> Result<StaticPolicy, PolicyError> {
    let map: BTreeMap<String, String> = options
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let opts = StaticPolicyOptions::parse(
        &map,
        OptionGates {
            alpha: true,
            beta: true,
        },
    )
    .unwrap();
    StaticPolicy::new(topo, num_reserved, &cpus(reserved), opts)
}

fn state(default: &str, entries: &[(&str, &str, &str)]) -> CpuState {
    let mut s = CpuState {
        default_cpus: cpus(default),
        ..Default::default()
    };
    for (pod, c, set) in entries {
        s.set(pod, c, cpus(set));
    }
    s
}

/// kubelet's `makePod(podUID, containerName, cpuRequest, cpuLimit)` (memory 1G).
fn make_pod(uid: &str, name: &str, request: &str, limit: &str) -> Pod {
    pod(
        uid,
        vec![],
        vec![container(name, (request, "1G"), (limit, "1G"))],
    )
}

#[test]
fn start_mirrors_test_static_policy_start() {
    let rows: &[(
        &str,
        usize,
        &[(&str, &str)],
        &str,
        &[(&str, &str, &str)],
        Result<&str, &str>,
    )] = &[
        (
            "non-corrupted state",
            0,
            &[],
            "1-11",
            &[("fakePod", "0", "0")],
            Ok("1-11"),
        ),
        ("empty cpuset", 1, &[], "", &[], Ok("0-11")),
        (
            "reserved cores 0 & 6 are not present in available cpuset",
            2,
            &[],
            "0-1",
            &[],
            Err(r#"not all reserved cpus: "0,6" are present in defaultCpuSet: "0-1""#),
        ),
        (
            "some of reserved cores are present in available cpuset (StrictCPUReservationOption)",
            2,
            &[(options::STRICT_CPU_RESERVATION, "true")],
            "0-1",
            &[],
            Err(r#"some of strictly reserved cpus: "0" are present in defaultCpuSet: "0-1""#),
        ),
        (
            "assigned core 2 is still present in available cpuset",
            0,
            &[],
            "2-11",
            &[("fakePod", "0", "0-2")],
            Err(r#"pod: fakePod, container: 0 cpuset: "0-2" overlaps with default cpuset "2-11""#),
        ),
        (
            "core 12 is not present in topology but is in state cpuset",
            0,
            &[],
            "5-12",
            &[("fakePod", "0", "0-2"), ("fakePod", "1", "3-4")],
            Err(r#"current set of available CPUs "0-11" doesn't match with CPUs in state "0-12""#),
        ),
        (
            "core 11 is present in topology but is not in state cpuset",
            0,
            &[],
            "5-10",
            &[("fakePod", "0", "0-2"), ("fakePod", "1", "3-4")],
            Err(r#"current set of available CPUs "0-11" doesn't match with CPUs in state "0-10""#),
        ),
    ];
    for (name, reserved, opts, default, entries, expected) in rows {
        let p = policy(topo_dual_socket_ht(), *reserved, "", opts).unwrap();
        let mut st = state(default, entries);
        match (p.validate_state(&mut st), expected) {
            (Ok(()), Ok(want)) => assert_eq!(st.default_cpus, cpus(want), "{name}"),
            (Err(got), Err(want)) => assert_eq!(got.to_string(), *want, "{name}"),
            (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn start_with_reserved_list_mirrors_test_static_policy_start_with_resv_list() {
    let strict = [(options::STRICT_CPU_RESERVATION, "true")];
    let p = policy(topo_dual_socket_ht(), 2, "0-1", &[]).unwrap();
    let mut st = state("", &[]);
    p.validate_state(&mut st).unwrap();
    assert_eq!(st.default_cpus, cpus("0-11"), "empty cpuset");

    let p = policy(topo_dual_socket_ht(), 2, "0-1", &strict).unwrap();
    let mut st = state("", &[]);
    p.validate_state(&mut st).unwrap();
    assert_eq!(
        st.default_cpus,
        cpus("2-11"),
        "empty cpuset with StrictCPUReservationOption enabled"
    );

    let p = policy(topo_dual_socket_ht(), 2, "0-1", &[]).unwrap();
    assert_eq!(
        p.validate_state(&mut state("2-5", &[]))
            .map_err(|e| e.to_string()),
        Err(r#"not all reserved cpus: "0-1" are present in defaultCpuSet: "2-5""#.to_owned()),
        "reserved cores 0 & 1 are not present in available cpuset"
    );
    let p = policy(topo_dual_socket_ht(), 2, "0-1", &strict).unwrap();
    assert_eq!(
        p.validate_state(&mut state("0-5", &[]))
            .map_err(|e| e.to_string()),
        Err(
            r#"some of strictly reserved cpus: "0-1" are present in defaultCpuSet: "0-5""#
                .to_owned()
        ),
        "reserved cores 0 & 1 are present in available cpuset with StrictCPUReservationOption enabled"
    );
    assert_eq!(
        policy(topo_dual_socket_ht(), 1, "0-1", &[])
            .unwrap_err()
            .to_string(),
        "[cpumanager] unable to reserve the required amount of CPUs (size of 0-1 did not equal 1)",
        "inconsistency between numReservedCPUs and reserved"
    );
}

/// (kubelet case, topology, reserved count, reserved list, state default, assignments, pod
/// uid/container/request/limit, hint, expected CPUs or error).
struct AddRow {
    name: &'static str,
    topo: CpuTopology,
    num_reserved: usize,
    reserved: &'static str,
    default: &'static str,
    entries: &'static [(&'static str, &'static str, &'static str)],
    pod: (&'static str, &'static str, &'static str),
    hint: Option<&'static [usize]>,
    expected: Result<Option<&'static str>, &'static str>,
}

fn row(
    name: &'static str,
    topo: CpuTopology,
    num_reserved: usize,
    default: &'static str,
    entries: &'static [(&'static str, &'static str, &'static str)],
    pod: (&'static str, &'static str, &'static str),
    expected: Result<Option<&'static str>, &'static str>,
) -> AddRow {
    AddRow {
        name,
        topo,
        num_reserved,
        reserved: "",
        default,
        entries,
        pod,
        hint: None,
        expected,
    }
}

fn run_add(r: &AddRow, options: &[(&str, &str)]) {
    let mut p = policy(r.topo.clone(), r.num_reserved, r.reserved, options).unwrap();
    let mut st = state(r.default, r.entries);
    let (name, request, limit) = r.pod;
    let pod = make_pod("fakePod", name, request, limit);
    let mask = r.hint.map(|nodes| NumaMask::new(nodes).unwrap());
    let got = p.allocate(&mut st, &pod, &pod.spec.containers[0], mask);
    match &r.expected {
        Ok(Some(want)) => {
            assert!(got.is_ok(), "{} {options:?}: {got:?}", r.name);
            let assigned = st
                .get("fakePod", name)
                .unwrap_or_else(|| panic!("{}", r.name));
            assert_eq!(assigned, &cpus(want), "{} {options:?}", r.name);
            assert!(!assigned.intersects(&st.default_cpus), "{}", r.name);
        }
        Ok(None) => {
            assert_eq!(got, Ok(Allocation::Shared), "{}", r.name);
            assert!(st.get("fakePod", name).is_none(), "{}", r.name);
        }
        Err(msg) => {
            assert_eq!(
                got.map_err(|e| e.to_string()),
                Err((*msg).to_owned()),
                "{}",
                r.name
            );
            assert!(st.get("fakePod", name).is_none(), "{}", r.name);
        }
    }
}

#[test]
fn add_mirrors_test_static_policy_add() {
    // optionsInsensitiveTestCases: run without options and with full-pcpus-only.
    let insensitive = vec![
        row(
            "GuPodMultipleCores, SingleSocketHT, ExpectAllocOneCore",
            topo_single_socket_ht(),
            1,
            "0-1,4-5",
            &[("fakePod", "fakeContainer100", "2-3,6-7")],
            ("fakeContainer3", "2000m", "2000m"),
            Ok(Some("1,5")),
        ),
        row(
            "GuPodMultipleCores, DualSocketHT, ExpectAllocOneSocket",
            topo_dual_socket_ht(),
            1,
            "0-1,3-11",
            &[("fakePod", "fakeContainer100", "2")],
            ("fakeContainer3", "6000m", "6000m"),
            Ok(Some("1,3,5,7,9,11")),
        ),
        row(
            "GuPodMultipleCores, DualSocketHT, ExpectAllocThreeCores",
            topo_dual_socket_ht(),
            1,
            "0,2-4,6-11",
            &[("fakePod", "fakeContainer100", "1,5")],
            ("fakeContainer3", "6000m", "6000m"),
            Ok(Some("2-4,8-10")),
        ),
        row(
            "GuPodMultipleCores, DualSocketNoHT, ExpectAllocOneSocket",
            topo_dual_socket_no_ht(),
            1,
            "0-1,3-7",
            &[("fakePod", "fakeContainer100", "")],
            ("fakeContainer1", "4000m", "4000m"),
            Ok(Some("4-7")),
        ),
        row(
            "GuPodMultipleCores, DualSocketNoHT, ExpectAllocFourCores",
            topo_dual_socket_no_ht(),
            1,
            "0-1,3,6-7",
            &[("fakePod", "fakeContainer100", "4-5")],
            ("fakeContainer1", "4000m", "4000m"),
            Ok(Some("1,3,6-7")),
        ),
        row(
            "GuPodMultipleCores, DualSocketHT, ExpectAllocOneSocketOneCore",
            topo_dual_socket_ht(),
            1,
            "0-1,3-11",
            &[("fakePod", "fakeContainer100", "2")],
            ("fakeContainer3", "8000m", "8000m"),
            Ok(Some("1,3-5,7,9-11")),
        ),
        row(
            "NonGuPod, SingleSocketHT, NoAlloc",
            topo_single_socket_ht(),
            1,
            "0-7",
            &[],
            ("fakeContainer1", "1000m", "2000m"),
            Ok(None),
        ),
        row(
            "GuPodNonIntegerCore, SingleSocketHT, NoAlloc",
            topo_single_socket_ht(),
            1,
            "0-7",
            &[],
            ("fakeContainer4", "977m", "977m"),
            Ok(None),
        ),
    ];
    for r in &insensitive {
        run_add(r, &[]);
        run_add(r, &[(options::FULL_PCPUS_ONLY, "true")]);
    }
    // defaultOptionsTestCases.
    for r in [
        row(
            "GuPodSingleCore, SingleSocketHT, ExpectAllocOneCPU",
            topo_single_socket_ht(),
            1,
            "0-7",
            &[],
            ("fakeContainer2", "1000m", "1000m"),
            Ok(Some("4")),
        ),
        row(
            "GuPodSingleCore, SingleSocketHT, ExpectError",
            topo_single_socket_ht(),
            1,
            "0-7",
            &[],
            ("fakeContainer2", "8000m", "8000m"),
            Err("not enough cpus available to satisfy request: requested=8, available=7"),
        ),
        row(
            "GuPodMultipleCores, SingleSocketHT, ExpectSameAllocation",
            topo_single_socket_ht(),
            1,
            "0-1,4-5",
            &[("fakePod", "fakeContainer3", "2-3,6-7")],
            ("fakeContainer3", "4000m", "4000m"),
            Ok(Some("2-3,6-7")),
        ),
        row(
            "GuPodMultipleCores, DualSocketHT, NoAllocExpectError",
            topo_dual_socket_ht(),
            1,
            "0,4-11",
            &[("fakePod", "fakeContainer100", "1-3")],
            ("fakeContainer5", "10000m", "10000m"),
            Err("not enough cpus available to satisfy request: requested=10, available=8"),
        ),
        row(
            "GuPodMultipleCores, SingleSocketHT, NoAllocExpectError",
            topo_single_socket_ht(),
            1,
            "0,7",
            &[("fakePod", "fakeContainer100", "1-6")],
            ("fakeContainer5", "2000m", "2000m"),
            Err("not enough cpus available to satisfy request: requested=2, available=1"),
        ),
    ] {
        run_add(&r, &[]);
    }
    // smtalignOptionTestCases.
    let full = [(options::FULL_PCPUS_ONLY, "true")];
    run_add(
        &row(
            "GuPodSingleCore, SingleSocketHT, ExpectAllocOneCPU (full-pcpus-only)",
            topo_single_socket_ht(),
            1,
            "0-7",
            &[],
            ("fakeContainer2", "1000m", "1000m"),
            Err("SMT Alignment Error: requested 1 cpus not multiple cpus per core = 2"),
        ),
        &full,
    );
    run_add(
        &AddRow {
            reserved: "1,6",
            ..row(
                "GuPodManyCores, topoDualSocketHT, ExpectDoNotAllocPartialCPU",
                topo_dual_socket_ht(),
                2,
                "0,2-5,7-11",
                &[],
                ("fakeContainerBug113537_1", "10000m", "10000m"),
                Err(
                    "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = 8, requested CPUs = 10, CPUs per core = 2",
                ),
            )
        },
        &full,
    );
    run_add(
        &row(
            "GuPodManyCores, topoDualSocketHT, AutoReserve, ExpectAllocAllCPUs",
            topo_dual_socket_ht(),
            2,
            "1-5,7-11",
            &[],
            ("fakeContainerBug113537_2", "10000m", "10000m"),
            Ok(Some("1-5,7-11")),
        ),
        &full,
    );
    run_add(
        &AddRow {
            reserved: "0,6",
            ..row(
                "GuPodManyCores, topoDualSocketHT, ExpectAllocAllCPUs",
                topo_dual_socket_ht(),
                2,
                "1-5,7-11",
                &[],
                ("fakeContainerBug113537_2", "10000m", "10000m"),
                Ok(Some("1-5,7-11")),
            )
        },
        &full,
    );
    // alignBySocketOptionTestCases.
    for (value, want) in [("true", "2,11"), ("false", "2,21")] {
        run_add(
            &AddRow {
                hint: Some(&[0, 2]),
                ..row(
                    "Align by socket: true/false, hint on NUMA nodes 0 and 2",
                    topo_dual_socket_multi_numa_per_socket_ht(),
                    1,
                    "2,11,21-22",
                    &[],
                    ("fakeContainer2", "2000m", "2000m"),
                    Ok(Some(want)),
                )
            },
            &[(options::ALIGN_BY_SOCKET, value)],
        );
    }
}

#[test]
fn add_with_reserved_list_mirrors_test_static_policy_add_with_resv_list() {
    let cases = [
        AddRow {
            reserved: "0",
            ..row(
                "GuPodSingleCore, SingleSocketHT, ExpectError",
                topo_single_socket_ht(),
                1,
                "0-7",
                &[],
                ("fakeContainer2", "8000m", "8000m"),
                Err("not enough cpus available to satisfy request: requested=8, available=7"),
            )
        },
        AddRow {
            reserved: "0-1",
            ..row(
                "GuPodSingleCore, SingleSocketHT, ExpectAllocOneCPU",
                topo_single_socket_ht(),
                2,
                "0-7",
                &[],
                ("fakeContainer2", "1000m", "1000m"),
                Ok(Some("4")),
            )
        },
        AddRow {
            reserved: "0-1",
            ..row(
                "GuPodMultipleCores, SingleSocketHT, ExpectAllocOneCore",
                topo_single_socket_ht(),
                2,
                "0-1,4-5",
                &[("fakePod", "fakeContainer100", "2-3,6-7")],
                ("fakeContainer3", "2000m", "2000m"),
                Ok(Some("4-5")),
            )
        },
    ];
    for r in &cases {
        run_add(r, &[]);
    }
}

#[test]
fn allocate_cpus_mirrors_test_topology_aware_allocate_cpus() {
    let rows: &[(&str, usize, Option<&[usize]>, &str)] = &[
        ("Request 2 CPUs, No BitMask", 2, None, "0,6"),
        ("Request 2 CPUs, BitMask on Socket 0", 2, Some(&[0]), "0,6"),
        ("Request 2 CPUs, BitMask on Socket 1", 2, Some(&[1]), "1,7"),
        (
            "Request 8 CPUs, BitMask on Socket 0",
            8,
            Some(&[0]),
            "0,6,2,8,4,10,1,7",
        ),
        (
            "Request 8 CPUs, BitMask on Socket 1",
            8,
            Some(&[1]),
            "1,7,3,9,5,11,0,6",
        ),
    ];
    for (name, n, mask, want) in rows {
        let p = policy(topo_dual_socket_ht(), 0, "", &[]).unwrap();
        let mut st = state("0-11", &[]);
        p.validate_state(&mut st).unwrap();
        let mask = mask.map(|m| NumaMask::new(m).unwrap());
        let got = p.allocate_cpus(&mut st, *n, mask, &Cpus::new()).unwrap();
        assert_eq!(got, cpus(want), "{name}");
    }
}

/// kubelet's `makeMultiContainerPod`: init containers `initContainer-i`, app containers
/// `appContainer-i`, pod uid `fakePod`.
fn multi_container_pod(init: &[(&str, bool)], apps: &[&str]) -> Pod {
    let init = init
        .iter()
        .enumerate()
        .map(|(i, (cpu, restartable))| {
            let c = guaranteed(&format!("initContainer-{i}"), cpu, "1G");
            if *restartable { sidecar(c) } else { c }
        })
        .collect();
    let apps = apps
        .iter()
        .enumerate()
        .map(|(i, cpu)| guaranteed(&format!("appContainer-{i}"), cpu, "1G"))
        .collect();
    pod("fakePod", init, apps)
}

fn allocate_all(p: &mut StaticPolicy, st: &mut CpuState, pod: &Pod) {
    for c in pod.spec.init_containers.iter().chain(&pod.spec.containers) {
        p.allocate(st, pod, c, None).unwrap();
    }
}

#[test]
fn reuse_mirrors_test_static_policy_reuse_cpus() {
    // "SingleSocketHT, DeAllocOneInitContainer".
    let mut p = policy(topo_single_socket_ht(), 0, "", &[]).unwrap();
    let mut st = state("0-7", &[]);
    let pod = multi_container_pod(&[("4000m", false)], &["2000m"]);
    allocate_all(&mut p, &mut st, &pod);
    assert_eq!(st.default_cpus, cpus("2-3,6-7"));
    assert_eq!(st.get("fakePod", "appContainer-0"), Some(&cpus("0,4")));
    p.remove_container(&mut st, "fakePod", "initContainer-0");
    assert_eq!(st.default_cpus, cpus("1-3,5-7"));
    assert!(st.get("fakePod", "initContainer-0").is_none());
}

#[test]
fn sidecars_are_not_reused_mirrors_test_static_policy_do_not_reuse_cpus() {
    // "SingleSocketHT, Don't reuse CPUs of a restartable init container".
    let mut p = policy(topo_single_socket_ht(), 0, "", &[]).unwrap();
    let mut st = state("0-7", &[]);
    let pod = multi_container_pod(&[("4000m", true)], &["2000m"]);
    allocate_all(&mut p, &mut st, &pod);
    assert_eq!(st.default_cpus, cpus("3,7"));
}

#[test]
fn remove_mirrors_test_static_policy_remove() {
    let rows: &[(&str, &str, &[(&str, &str, &str)], &str, &str)] = &[
        (
            "SingleSocketHT, DeAllocOneContainer",
            "fakeContainer1",
            &[("fakePod", "fakeContainer1", "1-3")],
            "4-7",
            "1-7",
        ),
        (
            "SingleSocketHT, DeAllocOneContainer, BeginEmpty",
            "fakeContainer1",
            &[
                ("fakePod", "fakeContainer1", "1-3"),
                ("fakePod", "fakeContainer2", "4-7"),
            ],
            "",
            "1-3",
        ),
        (
            "SingleSocketHT, DeAllocTwoContainer",
            "fakeContainer1",
            &[
                ("fakePod", "fakeContainer1", "1,3,5"),
                ("fakePod", "fakeContainer2", "2,4"),
            ],
            "6-7",
            "1,3,5-7",
        ),
        (
            "SingleSocketHT, NoDeAlloc",
            "fakeContainer2",
            &[("fakePod", "fakeContainer1", "1,3,5")],
            "2,4,6-7",
            "2,4,6-7",
        ),
    ];
    for (name, container, entries, default, want) in rows {
        let mut p = policy(topo_single_socket_ht(), 0, "", &[]).unwrap();
        let mut st = state(default, entries);
        p.remove_container(&mut st, "fakePod", container);
        assert_eq!(st.default_cpus, cpus(want), "{name}");
        assert!(st.get("fakePod", container).is_none(), "{name}");
    }
}

#[test]
fn pod_guaranteed_cpus_mirrors_test_pod_guaranteed_cpus() {
    let with = |init: &[(&str, bool)], apps: &[&str]| {
        pod_guaranteed_cpus(&multi_container_pod(init, apps))
    };
    assert_eq!(with(&[("2", false)], &["2"]), 2, "TestCase04");
    assert_eq!(with(&[("5", false)], &["5"]), 5, "TestCase05");
    assert_eq!(with(&[("2", false)], &["5"]), 5, "TestCase06");
    assert_eq!(with(&[("5", false)], &["2"]), 5, "TestCase07");
    assert_eq!(
        with(&[("2", false), ("4", false)], &["2", "4"]),
        6,
        "TestCase08"
    );
    assert_eq!(
        with(&[("1", true)], &["1"]),
        2,
        "TestCase09: restartable init + regular"
    );
    assert_eq!(
        with(
            &[("5", false), ("1", true), ("2", true), ("3", true)],
            &["1"]
        ),
        7,
        "TestCase09: multiple restartable init containers"
    );
    assert_eq!(
        with(
            &[
                ("5", false),
                ("1", true),
                ("2", true),
                ("5", false),
                ("3", true)
            ],
            &["1"]
        ),
        8,
        "TestCase11"
    );
    assert_eq!(
        with(&[("10", true), ("200", false)], &["100"]),
        210,
        "TestCase12"
    );
    // TestCase01-03: not Guaranteed.
    let burstable = pod("p", vec![], vec![container("c", ("2", "1G"), ("", ""))]);
    assert_eq!(pod_guaranteed_cpus(&burstable), 0, "TestCase02");
}

/// `returnMachineInfo()` of topology_hints_test.go: two NUMA nodes of three cores,
/// threads (0,6), (1,7), (2,8) on node 0 and (3,9), (4,10), (5,11) on node 1.
fn hints_topology() -> CpuTopology {
    let core = |threads: [u32; 2], node: u32| CoreThreads {
        threads: threads.to_vec(),
        socket: node,
        numa: node,
        uncore: None,
    };
    CpuTopology::from_threads(&[
        core([0, 6], 0),
        core([1, 7], 0),
        core([2, 8], 0),
        core([3, 9], 1),
        core([4, 10], 1),
        core([5, 11], 1),
    ])
    .unwrap()
}

fn hint(nodes: &[usize], preferred: bool) -> TopologyHint {
    TopologyHint::new(NumaMask::new(nodes).unwrap(), preferred)
}

fn sorted(mut hints: Vec<TopologyHint>) -> Vec<TopologyHint> {
    hints.sort_by(|a, b| {
        (!a.preferred, a.affinity.map(|m| (m.count(), m.bits())))
            .cmp(&(!b.preferred, b.affinity.map(|m| (m.count(), m.bits()))))
    });
    hints
}

#[test]
fn hints_mirror_test_get_topology_hints() {
    let p = policy(hints_topology(), 0, "", &[]).unwrap();
    let st = state("2-11", &[]);
    let rows: &[(&str, &str, Vec<TopologyHint>)] = &[
        (
            "Request 2 CPUs, 4 available on NUMA 0, 6 available on NUMA 1",
            "2",
            vec![hint(&[0], true), hint(&[1], true), hint(&[0, 1], false)],
        ),
        (
            "Request 5 CPUs, 4 available on NUMA 0, 6 available on NUMA 1",
            "5",
            vec![hint(&[1], true), hint(&[0, 1], false)],
        ),
        (
            "Request 7 CPUs, 4 available on NUMA 0, 6 available on NUMA 1",
            "7",
            vec![hint(&[0, 1], true)],
        ),
        (
            "Request 11 CPUs, 4 available on NUMA 0, 6 available on NUMA 1",
            "11",
            vec![],
        ),
    ];
    for (name, cpu, want) in rows {
        let pod = make_pod("fakePod", "fakeContainer", cpu, cpu);
        let got = p.hints(&st, &pod, &pod.spec.containers[0]).unwrap();
        assert_eq!(sorted(got), sorted(want.clone()), "{name}");
        let got = p.pod_hints(&st, &pod).unwrap();
        assert_eq!(sorted(got), sorted(want.clone()), "{name} (pod scope)");
    }
    // Not Guaranteed: no preference.
    let burstable = pod("b", vec![], vec![container("c", ("2", "1G"), ("", ""))]);
    assert_eq!(
        p.hints(&st, &burstable, &burstable.spec.containers[0]),
        None
    );
    // "Regenerating TopologyHints for CPUs already allocated" and the size mismatch.
    let pod2 = make_pod("fakePod", "fakeContainer", "2", "2");
    let st = state("2-11", &[("fakePod", "fakeContainer", "0,6")]);
    assert_eq!(
        p.hints(&st, &pod2, &pod2.spec.containers[0]),
        Some(vec![hint(&[0], true), hint(&[0, 1], false)])
    );
    let pod3 = make_pod("fakePod", "fakeContainer", "3", "3");
    assert_eq!(p.hints(&st, &pod3, &pod3.spec.containers[0]), Some(vec![]));
}

#[test]
fn hints_mirror_test_get_pod_topology_hints_with_policy_options() {
    let topo = topo_dual_socket_multi_numa_per_socket_ht();
    let all_with_0 = |pref01: bool| {
        vec![
            hint(&[0], true),
            hint(&[0, 1], pref01),
            hint(&[0, 2], false),
            hint(&[0, 3], false),
            hint(&[0, 1, 2], false),
            hint(&[0, 1, 3], false),
            hint(&[0, 2, 3], false),
            hint(&[0, 1, 2, 3], false),
        ]
    };
    let two = make_pod("fakePod", "fakeContainer", "2", "2");
    for (name, align, want) in [
        (
            "AlignBySocket:false, Preferred hints does not contains socket aligned hints",
            "false",
            all_with_0(false),
        ),
        (
            "AlignBySocket:true Preferred hints contains socket aligned hints",
            "true",
            all_with_0(true),
        ),
    ] {
        let p = policy(topo.clone(), 0, "", &[(options::ALIGN_BY_SOCKET, align)]).unwrap();
        let got = p.pod_hints(&state("2-3,11", &[]), &two).unwrap();
        assert_eq!(sorted(got), sorted(want), "{name}");
    }
    let p = policy(topo, 0, "", &[(options::ALIGN_BY_SOCKET, "true")]).unwrap();
    let big = make_pod("fakePod", "fakeContainer", "41", "41");
    let got = p.pod_hints(&state("0-28,40-57", &[]), &big).unwrap();
    assert_eq!(
        sorted(got),
        sorted(vec![hint(&[0, 1, 2], true), hint(&[0, 1, 2, 3], true)]),
        "AlignBySocket:true Preferred hints are spread across socket since 2 sockets are required"
    );
}

#[test]
fn hints_on_many_numa_nodes_are_bounded_and_keep_the_narrowest() {
    // 34 NUMA nodes x 2 CPUs: kubelet would enumerate 2^34 masks.
    let topo = CpuTopology::synthetic(2, 17, 2, 1, 1).unwrap();
    let p = policy(topo, 0, "", &[]).unwrap();
    let st = {
        let mut s = state("", &[]);
        p.validate_state(&mut s).unwrap();
        s
    };
    let pod = make_pod("fakePod", "c", "3", "3");
    let hints = p.hints(&st, &pod, &pod.spec.containers[0]).unwrap();
    assert!(hints.len() <= HINT_ENUMERATION_LIMIT + 1);
    // 3 CPUs need two 2-CPU nodes: every pair is a preferred hint.
    let preferred: Vec<_> = hints.iter().filter(|h| h.preferred).collect();
    assert_eq!(preferred.len(), 34 * 33 / 2);
    assert!(preferred.iter().all(|h| h.affinity.unwrap().count() == 2));
}
