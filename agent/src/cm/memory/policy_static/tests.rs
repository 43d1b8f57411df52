//! Table tests replaying kubelet's pkg/kubelet/cm/memorymanager/policy_static_test.go
//! (TestStaticPolicyNew, TestStaticPolicyStart, TestStaticPolicyAllocate): each row names the
//! kubelet case; machine states, pods and expectations are kubelet's.
use super::*;
use crate::cm::cpu::testing::{container, pod};
use crate::cm::memory::HugePages;
use crate::cm::memory::state::MemoryAssignments;
use crate::pods::quantity::Quantity;

const MB: u64 = 1024 * 1024;
const GB: u64 = 1024 * MB;
const HP1G: &str = "hugepages-1Gi";

/// kubelet's `getPod(podUID, containerName, requirements)`: `requirementsGuaranteed` is 1 CPU,
/// 1Gi memory, 1Gi of 1Gi huge pages; `requirementsBurstable` requests half its limits.
fn get_pod(uid: &str, name: &str, guaranteed: bool) -> Pod {
    let mut c = container(
        name,
        ("1", "1Gi"),
        ("1", if guaranteed { "1Gi" } else { "2Gi" }),
    );
    c.resources
        .requests
        .insert(HP1G.to_owned(), Quantity::parse("1Gi").unwrap());
    c.resources.limits.insert(
        HP1G.to_owned(),
        Quantity::parse(if guaranteed { "1Gi" } else { "2Gi" }).unwrap(),
    );
    pod(uid, vec![], vec![c])
}

fn table(
    allocatable: u64,
    free: u64,
    reserved: u64,
    system_reserved: u64,
    total: u64,
) -> MemoryTable {
    MemoryTable {
        total,
        system_reserved,
        allocatable,
        reserved,
        free,
    }
}

fn node(
    memory: MemoryTable,
    hugepages: MemoryTable,
    cells: &[u32],
    assignments: i64,
) -> NumaNodeState {
    NumaNodeState {
        number_of_assignments: assignments,
        memory_map: BTreeMap::from([(MEMORY.to_owned(), memory), (HP1G.to_owned(), hugepages)]),
        cells: cells.to_vec(),
    }
}

fn hp_free() -> MemoryTable {
    table(GB, GB, 0, 0, GB)
}

fn block(nodes: &[u32], resource: &str, size: u64) -> Block {
    Block {
        numa_affinity: nodes.to_vec(),
        resource: resource.to_owned(),
        size,
    }
}

fn reserved_on(nodes: &[u32]) -> BTreeMap<u32, BTreeMap<String, u64>> {
    nodes
        .iter()
        .map(|&n| (n, BTreeMap::from([(MEMORY.to_owned(), 512 * MB)])))
        .collect()
}

fn machine_info(nodes: &[(u32, u64, u64)]) -> Vec<NumaMemory> {
    nodes
        .iter()
        .map(|&(node, memory_bytes, pages)| NumaMemory {
            node,
            memory_bytes,
            hugepages: vec![HugePages {
                page_size_bytes: GB,
                count: pages,
            }],
        })
        .collect()
}

fn hint(nodes: Option<&[usize]>, preferred: bool) -> TopologyHint {
    TopologyHint {
        affinity: nodes.map(|n| NumaMask::new(n).unwrap()),
        preferred,
    }
}

#[test]
fn new_mirrors_test_static_policy_new() {
    assert!(
        StaticPolicy::new(vec![], BTreeMap::new()).is_none(),
        "should fail, when machine does not have reserved memory for the system workloads"
    );
    let reserved = BTreeMap::from([
        (0, BTreeMap::new()),
        (1, BTreeMap::from([(MEMORY.to_owned(), 512 * MB)])),
    ]);
    assert!(
        StaticPolicy::new(vec![], reserved).is_some(),
        "should succeed, when at least one NUMA node has reserved memory"
    );
}

#[test]
fn start_mirrors_test_static_policy_start() {
    let p = StaticPolicy::new(machine_info(&[(0, 3 * GB, 1)]), reserved_on(&[0])).unwrap();
    let mut s = MemoryState::default();
    s.set_blocks("pod", "container1", vec![block(&[0], MEMORY, 512 * MB)]);
    assert_eq!(
        p.validate_state(&mut s).map_err(|e| e.to_string()),
        Err(
            "[memorymanager] machine state can not be empty when it has memory assignments"
                .to_owned()
        ),
        "should fail, if machine state is empty, but it has memory assignments"
    );

    let mut s = MemoryState::default();
    p.validate_state(&mut s).unwrap();
    assert_eq!(
        s.machine,
        BTreeMap::from([(
            0,
            node(
                table(1536 * MB, 1536 * MB, 0, 512 * MB, 3 * GB),
                hp_free(),
                &[0],
                0
            )
        )]),
        "should fill the state with default values, when the state is empty"
    );

    let different = "[memorymanager] the expected machine state is different from the real one";
    let two_nodes = StaticPolicy::new(
        machine_info(&[(0, 2 * GB, 1), (1, 2 * GB, 1)]),
        reserved_on(&[0]),
    )
    .unwrap();
    let one_node = |total: u64, system_reserved: u64| {
        BTreeMap::from([(
            0,
            node(
                table(1536 * MB, 1536 * MB, 0, system_reserved, total),
                hp_free(),
                &[0],
                0,
            ),
        )])
    };
    let rows: Vec<(&str, &StaticPolicy, NumaNodeMap, MemoryAssignments)> = vec![
        (
            "should fail when machine state does not have all NUMA nodes",
            &two_nodes,
            one_node(2 * GB, 512 * MB),
            BTreeMap::new(),
        ),
        (
            "should fail when machine state has wrong size of total memory",
            &p,
            one_node(1536 * MB, 512 * MB),
            BTreeMap::new(),
        ),
        (
            "should fail when machine state has wrong size of system reserved memory",
            &p,
            one_node(2 * GB, 1024),
            BTreeMap::new(),
        ),
    ];
    for (name, policy, machine, assignments) in rows {
        let mut s = MemoryState {
            machine,
            assignments,
        };
        assert_eq!(
            policy.validate_state(&mut s).map_err(|e| e.to_string()),
            Err(different.to_owned()),
            "{name}"
        );
    }
    // "should fail when machine state reserved memory is different from the memory of all
    // containers memory assignments".
    let p2 = StaticPolicy::new(machine_info(&[(0, 2 * GB, 1)]), reserved_on(&[0])).unwrap();
    let mut s = MemoryState {
        machine: BTreeMap::from([(
            0,
            node(
                table(1536 * MB, 1536 * MB, 0, 512 * MB, 2 * GB),
                hp_free(),
                &[0],
                1,
            ),
        )]),
        assignments: BTreeMap::new(),
    };
    s.set_blocks("pod", "container1", vec![block(&[0], MEMORY, 512 * MB)]);
    assert_eq!(
        p2.validate_state(&mut s).map_err(|e| e.to_string()),
        Err(different.to_owned())
    );
    // And a consistent restored state passes.
    let mut s = MemoryState {
        machine: BTreeMap::from([(
            0,
            node(
                table(512 * MB, 0, 512 * MB, 512 * MB, 2 * GB),
                hp_free(),
                &[0],
                1,
            ),
        )]),
        assignments: BTreeMap::new(),
    };
    s.set_blocks("pod", "container1", vec![block(&[0], MEMORY, 512 * MB)]);
    assert_eq!(p2.validate_state(&mut s), Ok(()));
}

struct AllocRow {
    name: &'static str,
    machine: NumaNodeMap,
    assignments: MemoryAssignments,
    nodes: &'static [u32],
    pod: Pod,
    hint: TopologyHint,
    expected: Result<Option<Vec<Block>>, &'static str>,
    expected_machine: Option<NumaNodeMap>,
}

fn one(blocks: Vec<(&str, &str, Vec<Block>)>) -> MemoryAssignments {
    let mut a = MemoryAssignments::new();
    for (p, c, b) in blocks {
        a.entry(p.to_owned()).or_default().insert(c.to_owned(), b);
    }
    a
}

#[test]
fn allocate_mirrors_test_static_policy_allocate() {
    let three_nodes = || {
        BTreeMap::from([
            (
                0,
                node(
                    table(GB, 512 * MB, 512 * MB, 512 * MB, 1536 * MB),
                    hp_free(),
                    &[0],
                    1,
                ),
            ),
            (
                1,
                node(
                    table(512 * MB, 512 * MB, 0, 512 * MB, 1536 * MB),
                    hp_free(),
                    &[1],
                    0,
                ),
            ),
            (
                2,
                node(
                    table(512 * MB, 512 * MB, 0, 512 * MB, 1536 * MB),
                    hp_free(),
                    &[2],
                    0,
                ),
            ),
        ])
    };
    let rows = vec![
        AllocRow {
            name: "should do nothing for non-guaranteed pods",
            machine: BTreeMap::from([(
                0,
                node(
                    table(1536 * MB, 1536 * MB, 0, 512 * MB, 2 * GB),
                    hp_free(),
                    &[],
                    0,
                ),
            )]),
            assignments: BTreeMap::new(),
            nodes: &[0],
            pod: get_pod("pod1", "container1", false),
            hint: TopologyHint::default(),
            expected: Ok(None),
            expected_machine: None,
        },
        AllocRow {
            name: "should do nothing once container already exists under the state file",
            machine: BTreeMap::from([(
                0,
                node(
                    table(1536 * MB, 512 * MB, GB, 512 * MB, 2 * GB),
                    hp_free(),
                    &[],
                    0,
                ),
            )]),
            assignments: one(vec![("pod1", "container1", vec![block(&[0], MEMORY, GB)])]),
            nodes: &[0],
            pod: get_pod("pod1", "container1", true),
            hint: TopologyHint::default(),
            expected: Ok(Some(vec![block(&[0], MEMORY, GB)])),
            expected_machine: None,
        },
        AllocRow {
            name: "should calculate a default topology hint when no NUMA affinity was provided by the topology manager hint",
            machine: BTreeMap::from([(
                0,
                node(
                    table(1536 * MB, 1536 * MB, 0, 512 * MB, 2 * GB),
                    hp_free(),
                    &[0],
                    0,
                ),
            )]),
            assignments: BTreeMap::new(),
            nodes: &[0],
            pod: get_pod("pod1", "container1", true),
            hint: TopologyHint::default(),
            expected: Ok(Some(vec![block(&[0], HP1G, GB), block(&[0], MEMORY, GB)])),
            expected_machine: Some(BTreeMap::from([(
                0,
                node(
                    table(1536 * MB, 512 * MB, GB, 512 * MB, 2 * GB),
                    table(GB, 0, GB, 0, GB),
                    &[0],
                    2,
                ),
            )])),
        },
        AllocRow {
            name: "should fail when no NUMA affinity was provided under the topology manager hint and calculation of the default hint failed",
            machine: BTreeMap::from([(
                0,
                node(
                    table(1536 * MB, 512 * MB, GB, 512 * MB, 2 * GB),
                    table(GB, 0, GB, 0, GB),
                    &[0],
                    2,
                ),
            )]),
            assignments: one(vec![(
                "pod1",
                "container1",
                vec![block(&[0], MEMORY, GB), block(&[0], HP1G, GB)],
            )]),
            nodes: &[0],
            pod: get_pod("pod2", "container2", true),
            hint: TopologyHint::default(),
            expected: Err(
                "[memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough memory is available",
            ),
            expected_machine: None,
        },
        AllocRow {
            name: "should fail when no NUMA affinity was provided under the topology manager preferred hint and default hint has preferred false",
            machine: three_nodes(),
            assignments: one(vec![(
                "pod1",
                "container1",
                vec![block(&[0], MEMORY, 512 * MB)],
            )]),
            nodes: &[0, 1, 2],
            pod: get_pod("pod2", "container2", true),
            hint: hint(None, true),
            expected: Err("[memorymanager] failed to find the default preferred hint"),
            expected_machine: None,
        },
        AllocRow {
            name: "should fail when NUMA affinity provided under the topology manager hint did not satisfy container requirements and extended hint generation failed",
            machine: BTreeMap::from([
                (
                    0,
                    node(
                        table(512 * MB, 512 * MB, 0, 512 * MB, GB),
                        hp_free(),
                        &[0],
                        0,
                    ),
                ),
                (
                    1,
                    node(
                        table(1536 * MB, 512 * MB, GB, 512 * MB, 2 * GB),
                        hp_free(),
                        &[1, 2],
                        1,
                    ),
                ),
                (
                    2,
                    node(
                        table(1536 * MB, 512 * MB, GB, 512 * MB, 2 * GB),
                        hp_free(),
                        &[1, 2],
                        1,
                    ),
                ),
            ]),
            assignments: BTreeMap::new(),
            nodes: &[0, 1, 2],
            pod: get_pod("pod1", "container1", true),
            hint: hint(Some(&[0]), false),
            expected: Err(
                "[memorymanager] failed to find NUMA nodes to extend the current topology hint",
            ),
            expected_machine: None,
        },
        AllocRow {
            name: "should fail when the topology manager provided the preferred hint and extended hint has preferred false",
            machine: three_nodes(),
            assignments: one(vec![(
                "pod1",
                "container1",
                vec![block(&[0], MEMORY, 512 * MB)],
            )]),
            nodes: &[0, 1, 2],
            pod: get_pod("pod2", "container2", true),
            hint: hint(Some(&[1]), true),
            expected: Err("[memorymanager] failed to find the extended preferred hint"),
            expected_machine: None,
        },
    ];
    for r in rows {
        let mut p = StaticPolicy::new(vec![], reserved_on(r.nodes)).unwrap();
        let mut s = MemoryState {
            machine: r.machine.clone(),
            assignments: r.assignments.clone(),
        };
        let c = &r.pod.spec.containers[0];
        let got = p
            .allocate(&mut s, &r.pod, c, &r.hint)
            .map_err(|e| e.to_string());
        assert_eq!(got, r.expected.clone().map_err(str::to_owned), "{}", r.name);
        match (&r.expected, &r.expected_machine) {
            (_, Some(m)) => assert_eq!(&s.machine, m, "{}", r.name),
            (Ok(_), None) | (Err(_), None) => {
                assert_eq!(s.machine, r.machine, "{}: state changed", r.name);
            }
        }
    }
}

#[test]
fn multi_numa_allocation_groups_nodes_and_release_restores_them() {
    // Two nodes of 1Gi allocatable memory and a 1.5Gi container: it spans both nodes, which
    // then form a group a single-node container cannot use.
    let nodes = vec![
        NumaMemory {
            node: 0,
            memory_bytes: 1536 * MB,
            hugepages: vec![],
        },
        NumaMemory {
            node: 1,
            memory_bytes: 1536 * MB,
            hugepages: vec![],
        },
    ];
    let mut p = StaticPolicy::new(nodes, reserved_on(&[0, 1])).unwrap();
    let mut s = MemoryState::default();
    p.validate_state(&mut s).unwrap();
    let fresh = s.clone();
    let big = pod(
        "big",
        vec![],
        vec![container("c", ("1", "1536Mi"), ("1", "1536Mi"))],
    );
    let hints = p.hints(&s, &big, &big.spec.containers[0]);
    assert_eq!(
        hints.get(MEMORY),
        Some(&Some(vec![TopologyHint::new(
            NumaMask::new(&[0, 1]).unwrap(),
            true
        )]))
    );
    let blocks = p
        .allocate(
            &mut s,
            &big,
            &big.spec.containers[0],
            &hint(Some(&[0, 1]), true),
        )
        .unwrap()
        .unwrap();
    assert_eq!(blocks, vec![block(&[0, 1], MEMORY, 1536 * MB)]);
    assert_eq!(s.machine[&0].cells, vec![0, 1]);
    assert_eq!(s.machine[&0].memory_map[MEMORY].free, 0);
    assert_eq!(s.machine[&1].memory_map[MEMORY].free, 512 * MB);
    // A single-node container cannot use node 1 now, though 512Mi are free there.
    let small = pod(
        "small",
        vec![],
        vec![container("c", ("1", "256Mi"), ("1", "256Mi"))],
    );
    let hints = p.hints(&s, &small, &small.spec.containers[0]);
    assert_eq!(
        hints.get(MEMORY),
        Some(&Some(vec![TopologyHint::new(
            NumaMask::new(&[0, 1]).unwrap(),
            false
        )]))
    );
    assert!(p.remove_container(&mut s, "big", "c"));
    assert_eq!(s, fresh);
}

#[test]
fn init_container_memory_is_reused_by_app_containers() {
    let nodes = vec![NumaMemory {
        node: 0,
        memory_bytes: 4 * GB,
        hugepages: vec![],
    }];
    let mut p = StaticPolicy::new(nodes, reserved_on(&[0])).unwrap();
    let mut s = MemoryState::default();
    p.validate_state(&mut s).unwrap();
    let init = container("init", ("1", "1Gi"), ("1", "1Gi"));
    let app = container("app", ("1", "1Gi"), ("1", "1Gi"));
    let pod = pod("p", vec![init], vec![app]);
    let on0 = hint(Some(&[0]), true);
    p.allocate(&mut s, &pod, &pod.spec.init_containers[0], &on0)
        .unwrap();
    p.allocate(&mut s, &pod, &pod.spec.containers[0], &on0)
        .unwrap();
    // Only 1Gi is reserved for the pod: the app reused the init container's memory, whose
    // block shrank to 0 so the pod's blocks add up to what it holds.
    assert_eq!(s.machine[&0].memory_map[MEMORY].reserved, GB);
    assert_eq!(s.blocks("p", "init"), Some(&vec![block(&[0], MEMORY, 0)]));
    assert_eq!(s.blocks("p", "app"), Some(&vec![block(&[0], MEMORY, GB)]));
}

#[test]
fn pod_requested_resources_count_sidecars_and_the_init_peak() {
    let pod = pod(
        "p",
        vec![
            container("init", ("1", "3Gi"), ("1", "3Gi")),
            crate::cm::cpu::testing::sidecar(container("side", ("1", "1Gi"), ("1", "1Gi"))),
        ],
        vec![container("app", ("1", "1Gi"), ("1", "1Gi"))],
    );
    assert_eq!(
        pod_requested_resources(&pod).unwrap(),
        BTreeMap::from([(MEMORY.to_owned(), 3 * GB)])
    );
}

#[test]
fn hugepage_names_use_binary_suffixes() {
    assert_eq!(hugepage_resource_name(2 * MB), "hugepages-2Mi");
    assert_eq!(hugepage_resource_name(GB), "hugepages-1Gi");
    assert_eq!(hugepage_resource_name(64 * 1024), "hugepages-64Ki");
    assert_eq!(hugepage_resource_name(1536 * 1024), "hugepages-1536Ki");
}
