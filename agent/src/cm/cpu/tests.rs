//! The CPU manager end to end: configuration, restore and recovery, rebuild from cgroupfs,
//! admission through the hint-provider interface, release, and property tests.
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use proptest::prelude::*;

use super::testing::*;
use super::*;
use crate::cm::topology_manager::hint::NumaMask;
use crate::pods::quantity::Quantity;

fn config(dir: Option<&Path>, reserved_millicores: i64) -> CpuManagerConfig {
    CpuManagerConfig {
        policy: CpuPolicyName::Static,
        policy_options: BTreeMap::new(),
        option_gates: OptionGates::default(),
        reserved_system_cpus: Cpus::new(),
        reserved_millicores,
        topology_manager_policy: "none".to_owned(),
        state_dir: dir.map(Path::to_path_buf),
    }
}

fn any() -> TopologyHint {
    TopologyHint {
        affinity: None,
        preferred: false,
    }
}

#[test]
fn config_from_kubelet_reserves_as_kubelet_does() {
    let mut kc = KubeletConfiguration {
        cpu_manager_policy: "static".to_owned(),
        ..Default::default()
    };
    kc.kube_reserved.cpu = Some(Quantity::parse("500m").unwrap());
    kc.system_reserved.cpu = Some(Quantity::parse("1200m").unwrap());
    let c = CpuManagerConfig::from_kubelet(&kc, None).unwrap();
    assert_eq!(c.reserved_millicores, 1700);
    assert_eq!(c.policy, CpuPolicyName::Static);
    // ceil(1.7) = 2 CPUs reserved, taken topologically (core 0 and its sibling).
    let (m, recovery) = CpuManager::new(&c, topo_single_socket_ht()).unwrap();
    assert!(recovery.is_none());
    assert_eq!(m.reserved_cpus(), cpus("0,4"));

    // reservedSystemCPUs overrides the reserved CPU quantity with its size.
    kc.reserved_system_cpus = "1,5,6".parse().unwrap();
    let c = CpuManagerConfig::from_kubelet(&kc, None).unwrap();
    assert_eq!(c.reserved_millicores, 3000);
    let (m, _) = CpuManager::new(&c, topo_single_socket_ht()).unwrap();
    assert_eq!(m.reserved_cpus(), cpus("1,5-6"));

    kc.cpu_manager_policy = "dynamic".to_owned();
    assert_eq!(
        CpuManagerConfig::from_kubelet(&kc, None)
            .unwrap_err()
            .to_string(),
        "unknown policy: \"dynamic\""
    );
}

#[test]
fn static_policy_needs_a_reservation() {
    let err = CpuManager::new(&config(None, 0), topo_single_socket_ht()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero"
    );
}

#[test]
fn allocation_is_checkpointed_and_restored_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(Some(dir.path()), 1000);
    let (mut m, recovery) = CpuManager::new(&c, topo_dual_socket_ht()).unwrap();
    assert_eq!(recovery.unwrap().reason, RecoveryReason::Missing);
    let report = m.rebuild(std::iter::empty());
    assert!(report.adopted.is_empty());
    let p = pod("uid-1", vec![], vec![guaranteed("app", "4", "1G")]);
    let got = m.allocate(&p, &p.spec.containers[0], &any()).unwrap();
    let Allocation::Exclusive(cpus_given) = got else {
        panic!("{got:?}")
    };
    assert_eq!(cpus_given.len(), 4);
    assert_eq!(m.cpuset("uid-1", "app"), Some(cpus_given.clone()));
    assert_eq!(
        m.cpuset("uid-1", "other"),
        Some(cpus("0-11").difference(&cpus_given))
    );
    assert_eq!(m.exclusive_cpu_allocation_count(), 4);
    assert_eq!(m.shared_pool_size_millicores(), 7000);

    // The file is kubelet's v2 layout.
    let text = fs::read_to_string(dir.path().join(CPU_MANAGER_STATE_FILE)).unwrap();
    assert!(
        text.starts_with(r#"{"policyName":"static","defaultCpuSet":""#),
        "{text}"
    );

    let (m2, recovery) = CpuManager::new(&c, topo_dual_socket_ht()).unwrap();
    assert!(recovery.is_none(), "{recovery:?}");
    assert_eq!(m2.state(), m.state());
    // Re-admission after the restart keeps the same CPUs.
    let mut m2 = m2;
    assert_eq!(
        m2.allocate(&p, &p.spec.containers[0], &any()),
        Ok(Allocation::AlreadyAssigned(cpus_given.clone()))
    );
    assert_eq!(m2.remove_pod("uid-1"), cpus_given);
    assert_eq!(m2.shared_pool(), &cpus("0-11"));
    let (m3, _) = CpuManager::new(&c, topo_dual_socket_ht()).unwrap();
    assert!(m3.state().assignments.is_empty());
}

#[test]
fn takes_over_a_kubelet_written_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    // A kubelet 1.18-1.35 file (checksum computed by kubelet's algorithm, here produced by
    // the encoder that reproduces kubelet's released vectors).
    let mut kubelet_state = CpuState {
        default_cpus: cpus("0,3-5,6,9-11"),
        ..Default::default()
    };
    kubelet_state.set("pod-a", "app", cpus("1-2,7-8"));
    fs::write(
        dir.path().join(CPU_MANAGER_STATE_FILE),
        state::encode("static", &kubelet_state).unwrap(),
    )
    .unwrap();
    let (m, recovery) =
        CpuManager::new(&config(Some(dir.path()), 1000), topo_dual_socket_ht()).unwrap();
    assert!(recovery.is_none(), "{recovery:?}");
    assert_eq!(m.exclusive_cpus("pod-a", "app"), Some(&cpus("1-2,7-8")));
}

#[test]
fn unusable_checkpoints_are_reported_not_fatal() {
    let topo = topo_dual_socket_ht;
    let rows: &[(&str, &[u8], RecoveryReason)] = &[
        ("garbage", b"not json", RecoveryReason::Corrupt),
        (
            "checksum mismatch",
            br#"{"policyName":"static","defaultCpuSet":"0-11","checksum":1}"#,
            RecoveryReason::Checksum,
        ),
        (
            "written by policy none",
            br#"{"policyName":"none","defaultCpuSet":"","checksum":0}"#,
            RecoveryReason::PolicyChanged,
        ),
        (
            "CPUs that this machine does not have",
            br#"{"policyName":"static","defaultCpuSet":"0-15","checksum":0}"#,
            RecoveryReason::Invalid,
        ),
    ];
    for (name, bytes, reason) in rows {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CPU_MANAGER_STATE_FILE);
        fs::write(&path, bytes).unwrap();
        let (m, recovery) = CpuManager::new(&config(Some(dir.path()), 1000), topo()).unwrap();
        let recovery = recovery.unwrap_or_else(|| panic!("{name}: restored"));
        assert_eq!(recovery.reason, *reason, "{name}: {recovery}");
        assert_eq!(recovery.path, path);
        // A fresh state until the caller rebuilds; the bad file is left for inspection.
        assert_eq!(m.shared_pool(), &cpus("0-11"), "{name}");
        assert_eq!(fs::read(&path).unwrap(), *bytes, "{name}");
    }
}

#[test]
fn rebuild_adopts_what_cgroupfs_shows_and_rejects_what_does_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(Some(dir.path()), 1000);
    let (mut m, _) = CpuManager::new(&c, topo_dual_socket_ht()).unwrap();
    let a = pod("a", vec![], vec![guaranteed("app", "2", "1G")]);
    let b = pod("b", vec![], vec![guaranteed("app", "2", "1G")]);
    let shared = pod("s", vec![], vec![container("app", ("1", "1G"), ("", ""))]);
    let wrong_size = pod("w", vec![], vec![guaranteed("app", "3", "1G")]);
    let reserved = pod("r", vec![], vec![guaranteed("app", "2", "1G")]);
    let report = m.rebuild([
        (&a, "app", cpus("1,7")),
        (&b, "app", cpus("1,3")),
        (&shared, "app", cpus("0-11")),
        (&wrong_size, "app", cpus("2,8")),
        (&reserved, "app", cpus("0,6")),
    ]);
    assert_eq!(
        report.adopted,
        vec![("a".to_owned(), "app".to_owned(), cpus("1,7"))]
    );
    let rejected: Vec<&str> = report.rejected.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(rejected, vec!["b", "w", "r"]);
    assert_eq!(m.shared_pool(), &cpus("0,2-6,8-11"));
    // Persisted: a restart restores the rebuilt state.
    let (m2, recovery) = CpuManager::new(&c, topo_dual_socket_ht()).unwrap();
    assert!(recovery.is_none());
    assert_eq!(m2.exclusive_cpus("a", "app"), Some(&cpus("1,7")));
}

#[test]
fn hint_provider_reports_kubelets_admission_reasons() {
    let mut c = config(None, 1000);
    c.policy_options
        .insert(options::FULL_PCPUS_ONLY.to_owned(), "true".to_owned());
    let (mut m, _) = CpuManager::new(&c, topo_dual_socket_ht()).unwrap();
    let odd = pod("p", vec![], vec![guaranteed("app", "3", "1G")]);
    let err = HintProvider::allocate(&mut m, &odd, &odd.spec.containers[0], &any()).unwrap_err();
    assert_eq!(err.reason, "SMTAlignmentError");
    assert_eq!(
        err.message,
        "SMT Alignment Error: requested 3 cpus not multiple cpus per core = 2"
    );
    assert_eq!(
        m.pinning_counters(),
        PinningCounters {
            requests: 1,
            errors: 1
        }
    );
    let (mut plain, _) = CpuManager::new(&config(None, 1000), topo_dual_socket_ht()).unwrap();
    let huge = pod("q", vec![], vec![guaranteed("app", "12", "1G")]);
    let err =
        HintProvider::allocate(&mut plain, &huge, &huge.spec.containers[0], &any()).unwrap_err();
    assert_eq!(err.reason, "UnexpectedAdmissionError");
    assert_eq!(
        err.message,
        "Allocate failed due to not enough cpus available to satisfy request: requested=12, \
         available=11, which is unexpected"
    );
    // Hints: keyed by "cpu"; no preference for shared containers.
    let ok = pod("r", vec![], vec![guaranteed("app", "2", "1G")]);
    let hints = m.hints(&ok, &ok.spec.containers[0]);
    assert_eq!(hints.keys().collect::<Vec<_>>(), vec!["cpu"]);
    let shared = pod("s", vec![], vec![container("app", ("1", "1G"), ("", ""))]);
    assert!(m.hints(&shared, &shared.spec.containers[0]).is_empty());
    assert_eq!(m.name(), "cpu");
}

#[test]
fn allocation_follows_the_topology_managers_affinity() {
    let (mut m, _) = CpuManager::new(&config(None, 1000), topo_dual_socket_ht()).unwrap();
    let p = pod("p", vec![], vec![guaranteed("app", "2", "1G")]);
    let on_node_1 = TopologyHint::new(NumaMask::single(1).unwrap(), true);
    HintProvider::allocate(&mut m, &p, &p.spec.containers[0], &on_node_1).unwrap();
    assert_eq!(m.exclusive_cpus("p", "app"), Some(&cpus("1,7")));
}

#[test]
fn policy_none_leaves_cpusets_alone() {
    let mut c = config(None, 0);
    c.policy = CpuPolicyName::None;
    let (mut m, recovery) = CpuManager::new(&c, topo_dual_socket_ht()).unwrap();
    assert!(recovery.is_none());
    let p = pod("p", vec![], vec![guaranteed("app", "2", "1G")]);
    assert_eq!(
        m.allocate(&p, &p.spec.containers[0], &any()),
        Ok(Allocation::Shared)
    );
    assert_eq!(m.cpuset("p", "app"), None);
    assert!(m.hints(&p, &p.spec.containers[0]).is_empty());
}

#[test]
fn stale_assignments_are_released() {
    let (mut m, _) = CpuManager::new(&config(None, 1000), topo_dual_socket_ht()).unwrap();
    for uid in ["a", "b"] {
        let p = pod(uid, vec![], vec![guaranteed("app", "2", "1G")]);
        m.allocate(&p, &p.spec.containers[0], &any()).unwrap();
    }
    let removed = m.remove_stale(|pod, _| pod == "a");
    assert_eq!(removed, vec![("b".to_owned(), "app".to_owned())]);
    assert!(m.exclusive_cpus("b", "app").is_none());
    assert!(m.exclusive_cpus("a", "app").is_some());
}

/// One step of the property tests: admit a pod (one Guaranteed container asking for `n`
/// CPUs, or a shared one when `n` is 0) or delete an earlier one.
#[derive(Debug, Clone)]
enum Op {
    Admit(usize),
    Delete(usize),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(
        prop_oneof![
            3 => (0usize..9).prop_map(Op::Admit),
            2 => (0usize..16).prop_map(Op::Delete),
        ],
        1..40,
    )
}

fn options_strategy() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop_oneof![
        Just(vec![]),
        Just(vec![(options::FULL_PCPUS_ONLY, "true")]),
        Just(vec![(options::DISTRIBUTE_CPUS_ACROSS_NUMA, "true")]),
        Just(vec![(options::STRICT_CPU_RESERVATION, "true")]),
        Just(vec![(options::PREFER_ALIGN_CPUS_BY_UNCORECACHE, "true")]),
        Just(vec![
            (options::FULL_PCPUS_ONLY, "true"),
            (options::DISTRIBUTE_CPUS_ACROSS_NUMA, "true")
        ]),
    ]
    .prop_map(|pairs| {
        pairs
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// No CPU is assigned twice, every allocation comes from what was free, reserved CPUs are
    /// never handed out, the pool and the assignments always partition the machine, and
    /// releasing everything restores the pool.
    #[test]
    fn allocate_release_invariants(ops in ops(), opts in options_strategy(), reserved in 1i64..4) {
        let topo = CpuTopology::synthetic(2, 2, 4, 2, 2).unwrap();
        let mut c = config(None, reserved * 1000);
        c.policy_options = opts;
        let (mut m, _) = CpuManager::new(&c, topo.clone()).unwrap();
        let initial = m.shared_pool().clone();
        let all = topo.all_cpus().clone();
        let mut live: Vec<String> = Vec::new();
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Admit(n) => {
                    let uid = format!("pod-{i}");
                    let p = if n == 0 {
                        pod(&uid, vec![], vec![container("app", ("500m", "1G"), ("", ""))])
                    } else {
                        pod(&uid, vec![], vec![guaranteed("app", &n.to_string(), "1G")])
                    };
                    let free_before = m.available_cpus();
                    match m.allocate(&p, &p.spec.containers[0], &any()) {
                        Ok(Allocation::Exclusive(got)) => {
                            prop_assert_eq!(got.len(), n);
                            prop_assert!(got.is_subset(&free_before), "{} not within free {}", got, free_before);
                            live.push(uid);
                        }
                        Ok(Allocation::Shared) => prop_assert_eq!(n, 0),
                        Ok(other) => prop_assert!(false, "unexpected {:?}", other),
                        Err(_) => prop_assert_eq!(m.available_cpus(), free_before),
                    }
                }
                Op::Delete(k) => {
                    if !live.is_empty() {
                        let uid = live.remove(k % live.len());
                        let before = m.shared_pool().clone();
                        let released = m.remove_pod(&uid);
                        prop_assert!(!released.intersects(&before));
                        prop_assert_eq!(m.shared_pool(), &before.union(&released));
                    }
                }
            }
            // Invariants after every step.
            let mut seen = Cpus::new();
            for cpus in m.state().assignments.values().flat_map(|c| c.values()) {
                prop_assert!(!seen.intersects(cpus), "CPU assigned twice: {} and {}", seen, cpus);
                prop_assert!(!cpus.intersects(&m.reserved_cpus()));
                seen.union_with(cpus);
            }
            prop_assert!(!seen.intersects(m.shared_pool()));
            let mut whole = seen.union(m.shared_pool());
            if c.policy_options.contains_key(options::STRICT_CPU_RESERVATION) {
                whole.union_with(&m.reserved_cpus());
            }
            prop_assert_eq!(&whole, &all);
        }
        for uid in live {
            m.remove_pod(&uid);
        }
        prop_assert_eq!(m.shared_pool(), &initial);
        prop_assert!(m.state().assignments.is_empty());
    }
}
