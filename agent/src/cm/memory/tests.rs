//! The memory manager end to end: `reservedMemory` validation, restore and recovery, rebuild,
//! `cpuset.mems`, and a property test of the accounting.
use std::fs;

use proptest::prelude::*;

use super::*;
use crate::cm::cpu::testing::{container, pod};

const MB: u64 = 1024 * 1024;
const GB: u64 = 1024 * MB;

fn two_nodes() -> Vec<NumaMemory> {
    (0..2)
        .map(|node| NumaMemory {
            node,
            memory_bytes: 4 * GB,
            hugepages: vec![HugePages {
                page_size_bytes: 2 * MB,
                count: 512,
            }],
        })
        .collect()
}

fn config(dir: Option<&Path>) -> MemoryManagerConfig {
    MemoryManagerConfig {
        policy: MemoryPolicyName::Static,
        reserved_memory: vec![
            MemoryReservation {
                numa_node: 0,
                limits: BTreeMap::from([(MEMORY.to_owned(), 512 * MB)]),
            },
            MemoryReservation {
                numa_node: 1,
                limits: BTreeMap::from([(MEMORY.to_owned(), 512 * MB)]),
            },
        ],
        node_allocatable_reservation: BTreeMap::from([(MEMORY.to_owned(), GB)]),
        state_dir: dir.map(Path::to_path_buf),
    }
}

fn guaranteed(uid: &str, memory: &str) -> Pod {
    pod(
        uid,
        vec![],
        vec![container("c", ("1", memory), ("1", memory))],
    )
}

fn on(nodes: &[usize]) -> TopologyHint {
    TopologyHint::new(NumaMask::new(nodes).unwrap(), true)
}

/// `TestValidateReservedMemory`-style rows of kubelet's memory_manager_test.go.
#[test]
fn reserved_memory_must_match_node_allocatable() {
    let mut c = config(None);
    c.node_allocatable_reservation = BTreeMap::from([(MEMORY.to_owned(), 2 * GB)]);
    assert_eq!(
        MemoryManager::new(&c, two_nodes()).unwrap_err().to_string(),
        format!(
            "the total amount \"{}\" of type \"memory\" is not equal to the value \"{}\" determined by Node Allocatable feature",
            GB,
            2 * GB
        )
    );
    let mut c = config(None);
    c.reserved_memory.push(MemoryReservation {
        numa_node: 7,
        limits: BTreeMap::new(),
    });
    assert_eq!(
        MemoryManager::new(&c, two_nodes()).unwrap_err().to_string(),
        "the reserved memory configuration references a NUMA node 7 that does not exist on this machine"
    );
    let mut c = config(None);
    c.reserved_memory.clear();
    c.node_allocatable_reservation.clear();
    assert_eq!(
        MemoryManager::new(&c, two_nodes()).unwrap_err().to_string(),
        "[memorymanager] you should specify the system reserved memory"
    );
    assert_eq!(
        MemoryPolicyName::parse("static").unwrap_err().to_string(),
        "unknown policy: \"static\""
    );
}

#[test]
fn default_machine_state_subtracts_reservations_and_huge_pages() {
    let (m, _) = MemoryManager::new(&config(None), two_nodes()).unwrap();
    let n0 = &m.state().machine[&0];
    assert_eq!(n0.memory_map[MEMORY].allocatable, 4 * GB - 512 * MB - GB);
    assert_eq!(n0.memory_map["hugepages-2Mi"].allocatable, GB);
    assert_eq!(n0.cells, vec![0]);
    assert_eq!(m.allocatable_memory().len(), 4);
}

#[test]
fn guaranteed_memory_lands_on_the_chosen_node_and_survives_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(Some(dir.path()));
    let (mut m, recovery) = MemoryManager::new(&c, two_nodes()).unwrap();
    assert_eq!(recovery.unwrap().reason, RecoveryReason::Missing);
    m.rebuild(std::iter::empty());
    let p = guaranteed("p", "1Gi");
    HintProvider::allocate(&mut m, &p, &p.spec.containers[0], &on(&[1])).unwrap();
    assert_eq!(m.numa_nodes("p", "c"), NumaMask::new(&[1]).ok());
    assert_eq!(m.numa_nodes("p", "c").unwrap().to_string(), "1");
    // Burstable pods are not pinned.
    let b = pod("b", vec![], vec![container("c", ("1", "1Gi"), ("", ""))]);
    HintProvider::allocate(&mut m, &b, &b.spec.containers[0], &on(&[0])).unwrap();
    assert_eq!(m.numa_nodes("b", "c"), None);
    assert_eq!(
        m.pinning_counters(),
        PinningCounters {
            requests: 1,
            errors: 0
        }
    );

    let text = fs::read_to_string(dir.path().join(MEMORY_MANAGER_STATE_FILE)).unwrap();
    assert!(
        text.starts_with(r#"{"policyName":"Static","machineState":{"0":"#),
        "{text}"
    );
    let (mut m2, recovery) = MemoryManager::new(&c, two_nodes()).unwrap();
    assert!(recovery.is_none(), "{recovery:?}");
    assert_eq!(m2.state(), m.state());
    assert!(m2.remove_container("p", "c"));
    assert_eq!(m2.numa_nodes("p", "c"), None);
    assert_eq!(m2.state().machine[&1].memory_map[MEMORY].reserved, 0);
}

#[test]
fn unusable_checkpoints_are_reported_and_rebuild_adopts_cpuset_mems() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(MEMORY_MANAGER_STATE_FILE);
    let c = config(Some(dir.path()));
    for (bytes, reason) in [
        (&b"{"[..], RecoveryReason::Corrupt),
        (
            &br#"{"policyName":"Static","machineState":{},"checksum":7}"#[..],
            RecoveryReason::Checksum,
        ),
        (
            &br#"{"policyName":"None","machineState":{},"checksum":0}"#[..],
            RecoveryReason::PolicyChanged,
        ),
        (
            // Restored and verified (checksum 0), but the totals are not this machine's.
            &br#"{"policyName":"Static","machineState":{"0":{"numberOfAssignments":0,"memoryMap":{"memory":{"total":1,"systemReserved":0,"allocatable":1,"reserved":0,"free":1}},"cells":[0]}},"checksum":0}"#[..],
            RecoveryReason::Invalid,
        ),
    ] {
        fs::write(&path, bytes).unwrap();
        let (_, recovery) = MemoryManager::new(&c, two_nodes()).unwrap();
        assert_eq!(recovery.unwrap().reason, reason);
    }
    let (mut m, _) = MemoryManager::new(&c, two_nodes()).unwrap();
    let a = guaranteed("a", "1Gi");
    let b = guaranteed("b", "10Gi");
    let report = m.rebuild([
        (&a, "c", NumaMask::new(&[0]).unwrap()),
        (&b, "c", NumaMask::new(&[1]).unwrap()),
    ]);
    assert_eq!(
        report.adopted,
        vec![("a".to_owned(), "c".to_owned(), NumaMask::new(&[0]).unwrap())]
    );
    assert_eq!(report.rejected.len(), 1);
    assert_eq!(m.state().machine[&0].memory_map[MEMORY].reserved, GB);
    let (m2, recovery) = MemoryManager::new(&c, two_nodes()).unwrap();
    assert!(recovery.is_none(), "{recovery:?}");
    assert_eq!(m2.numa_nodes("a", "c"), NumaMask::new(&[0]).ok());
}

#[test]
fn policy_none_does_nothing() {
    let c = MemoryManagerConfig {
        policy: MemoryPolicyName::None,
        reserved_memory: vec![],
        node_allocatable_reservation: BTreeMap::new(),
        state_dir: None,
    };
    let (mut m, _) = MemoryManager::new(&c, two_nodes()).unwrap();
    let p = guaranteed("p", "1Gi");
    assert!(m.hints(&p, &p.spec.containers[0]).is_empty());
    assert_eq!(m.allocate(&p, &p.spec.containers[0], &on(&[0])), Ok(None));
    assert_eq!(m.numa_nodes("p", "c"), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Free + reserved stays equal to allocatable on every node, nothing is over-committed,
    /// and releasing every pod restores the initial machine state.
    #[test]
    fn accounting_invariants(ops in proptest::collection::vec((0usize..3, 1u64..2048), 1..30)) {
        let (mut m, _) = MemoryManager::new(&config(None), two_nodes()).unwrap();
        let initial = m.state().clone();
        let mut live = Vec::new();
        for (i, (node_choice, mib)) in ops.into_iter().enumerate() {
            let uid = format!("p{i}");
            let p = guaranteed(&uid, &format!("{mib}Mi"));
            let hint = match node_choice {
                0 => on(&[0]),
                1 => on(&[1]),
                _ => TopologyHint { affinity: None, preferred: false },
            };
            if m.allocate(&p, &p.spec.containers[0], &hint).is_ok() {
                live.push(uid);
            }
            for n in m.state().machine.values() {
                for t in n.memory_map.values() {
                    prop_assert_eq!(t.free + t.reserved, t.allocatable);
                }
            }
        }
        for uid in live {
            m.remove_pod(&uid);
        }
        prop_assert_eq!(m.state(), &initial);
    }
}

/// The VM shape of issue 4 (two NUMA nodes of 2 CPUs and 1 GiB) through the topology manager
/// with `single-numa-node`: each Guaranteed pod's CPUs and memory land on one node, the one the
/// merged hint names.
#[test]
fn cpu_and_memory_managers_as_topology_manager_providers() {
    use crate::cm::cpu::{
        CpuManager, CpuManagerConfig, CpuPolicyName, CpuTopology, Cpus, OptionGates,
    };
    use crate::cm::topology_manager::TopologyManager;

    let machine = crate::machine::synthetic::vm_two_numa_four_cpus().unwrap();
    let mut topology =
        TopologyManager::new(&machine, "single-numa-node", "container", &BTreeMap::new()).unwrap();
    let cpu_config = CpuManagerConfig {
        policy: CpuPolicyName::Static,
        policy_options: BTreeMap::new(),
        option_gates: OptionGates::default(),
        reserved_system_cpus: Cpus::new(),
        reserved_millicores: 1000,
        topology_manager_policy: "single-numa-node".to_owned(),
        state_dir: None,
    };
    let (mut cpu, _) =
        CpuManager::new(&cpu_config, CpuTopology::from_machine(&machine).unwrap()).unwrap();
    let nodes = numa_memory(&machine);
    let mem_config = MemoryManagerConfig {
        policy: MemoryPolicyName::Static,
        reserved_memory: nodes
            .iter()
            .map(|n| MemoryReservation {
                numa_node: n.node,
                limits: BTreeMap::from([(MEMORY.to_owned(), 256 * MB)]),
            })
            .collect(),
        node_allocatable_reservation: BTreeMap::from([(MEMORY.to_owned(), 512 * MB)]),
        state_dir: None,
    };
    let (mut mem, _) = MemoryManager::new(&mem_config, nodes).unwrap();

    let small = pod(
        "small",
        vec![],
        vec![container("c", ("1", "256Mi"), ("1", "256Mi"))],
    );
    let big = pod(
        "big",
        vec![],
        vec![container("c", ("2", "256Mi"), ("2", "256Mi"))],
    );
    for p in [&small, &big] {
        let result = topology.admit(p, &mut [&mut cpu, &mut mem]);
        assert!(
            result.admit,
            "{}: {} {}",
            p.metadata.name, result.reason, result.message
        );
    }
    let node_of = |uid: &str| topology.affinity(uid, "c").affinity.unwrap();
    assert_eq!(node_of("small"), NumaMask::single(0).unwrap());
    assert_eq!(cpu.exclusive_cpus("small", "c").unwrap().to_string(), "1");
    assert_eq!(mem.numa_nodes("small", "c"), Some(node_of("small")));
    assert_eq!(node_of("big"), NumaMask::single(1).unwrap());
    assert_eq!(cpu.exclusive_cpus("big", "c").unwrap().to_string(), "2-3");
    assert_eq!(mem.numa_nodes("big", "c"), Some(node_of("big")));
    // Nothing is left for another exclusive CPU: rejected with kubelet's reason, and nothing
    // already allocated moves.
    let third = pod(
        "third",
        vec![],
        vec![container("c", ("1", "256Mi"), ("1", "256Mi"))],
    );
    let result = topology.admit(&third, &mut [&mut cpu, &mut mem]);
    assert!(!result.admit);
    assert_eq!(result.reason, "TopologyAffinityError");
    assert_eq!(cpu.exclusive_cpus("big", "c").unwrap().to_string(), "2-3");
    assert!(cpu.exclusive_cpus("third", "c").is_none());
}
