//! The three managers together, as the container manager drives them: NUMA-aligned admission
//! on a two-node machine, all-or-nothing rejection, release, recovery of corrupt and missing
//! checkpoints from observed cpusets, takeover of a kubelet-format checkpoint, and the
//! metrics.
use std::collections::BTreeMap;
use std::path::Path;

use super::*;
use crate::cm::cpu::testing::{container, guaranteed, pod};
use crate::cm::cpu::{CpuPolicyName, CpuState, OptionGates};
use crate::cm::memory::{MEMORY_MANAGER_STATE_FILE, MemoryPolicyName, MemoryReservation};
use crate::machine::synthetic::vm_two_numa_four_cpus;
use crate::pods::model::MEMORY;

const MIB: u64 = 1 << 20;

/// The test guests' shape (CPUs 0-1 on node 0, 2-3 on node 1, 1 GiB each): static CPU policy
/// with one reserved CPU (CPU 0), Static memory policy with 128 MiB reserved on node 0,
/// `single-numa-node`.
fn config(state_dir: Option<&Path>) -> ResourceManagersConfig {
    ResourceManagersConfig {
        cpu: CpuManagerConfig {
            policy: CpuPolicyName::Static,
            policy_options: BTreeMap::new(),
            option_gates: OptionGates::default(),
            reserved_system_cpus: Cpus::new(),
            reserved_millicores: 1000,
            topology_manager_policy: "single-numa-node".to_owned(),
            state_dir: state_dir.map(Path::to_path_buf),
        },
        memory: MemoryManagerConfig {
            policy: MemoryPolicyName::Static,
            reserved_memory: vec![MemoryReservation {
                numa_node: 0,
                limits: BTreeMap::from([(MEMORY.to_owned(), 128 * MIB)]),
            }],
            node_allocatable_reservation: BTreeMap::from([(MEMORY.to_owned(), 128 * MIB)]),
            state_dir: state_dir.map(Path::to_path_buf),
        },
        topology_policy: "single-numa-node".to_owned(),
        topology_scope: "container".to_owned(),
        topology_options: BTreeMap::new(),
    }
}

fn managers(state_dir: Option<&Path>) -> (ResourceManagers, prometheus::Registry) {
    let registry = prometheus::Registry::new();
    let metrics = ResourceMetrics::register(&registry).expect("metrics");
    let machine = vm_two_numa_four_cpus().expect("topology");
    let managers = ResourceManagers::new(&config(state_dir), &machine, metrics).expect("start");
    (managers, registry)
}

fn set(text: &str) -> CpuSet {
    CpuSet::parse(text).expect("cpu list")
}

/// The value of one sample in the registry's text output.
fn sample(registry: &prometheus::Registry, series: &str) -> f64 {
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .expect("encode");
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

#[test]
fn guaranteed_pods_land_on_one_node_and_a_pod_that_cannot_is_rejected_without_side_effects() {
    let (mut m, registry) = managers(None);
    assert_eq!(m.shared_pool(), &Cpus::parse("0-3").expect("cpus"));
    assert_eq!(
        sample(&registry, "qosd_cpu_manager_shared_pool_size_millicores"),
        3000.0,
        "CPU 0 is reserved"
    );

    // Two CPUs and 256 MiB fit only on node 1 (node 0 has one CPU left after the reserve).
    let big = pod("big", vec![], vec![guaranteed("c", "2", "256Mi")]);
    m.admit(&big).expect("admitted");
    assert_eq!(
        m.cpusets("big", "c"),
        ContainerCpusets {
            cpus: Some(set("2-3")),
            mems: Some(set("1")),
        }
    );
    assert_eq!(m.shared_pool(), &Cpus::parse("0-1").expect("cpus"));

    // Shared containers follow the pool and keep their inherited memory nodes.
    let burstable = pod(
        "burst",
        vec![],
        vec![container("c", ("100m", "10Mi"), ("", ""))],
    );
    m.admit(&burstable).expect("admitted");
    assert_eq!(
        m.cpusets("burst", "c"),
        ContainerCpusets {
            cpus: Some(set("0-1")),
            mems: None,
        }
    );

    // Two more CPUs on one node do not exist any more: kubelet's TopologyAffinityError, and
    // the first pod's CPUs, the pool and its memory are untouched.
    let second = pod("second", vec![], vec![guaranteed("c", "2", "64Mi")]);
    let rejection = m.admit(&second).expect_err("no node has two free CPUs");
    assert_eq!(rejection.reason, "TopologyAffinityError");
    assert_eq!(
        rejection.message,
        "Resources cannot be allocated with Topology locality"
    );
    assert_eq!(m.cpusets("big", "c").cpus, Some(set("2-3")));
    assert_eq!(m.shared_pool(), &Cpus::parse("0-1").expect("cpus"));
    assert_eq!(
        m.cpusets("second", "c"),
        ContainerCpusets {
            cpus: Some(set("0-1")),
            mems: None
        }
    );

    // One CPU still fits on node 0, with its memory there.
    let small = pod("small", vec![], vec![guaranteed("c", "1", "64Mi")]);
    m.admit(&small).expect("admitted");
    assert_eq!(
        m.cpusets("small", "c"),
        ContainerCpusets {
            cpus: Some(set("1")),
            mems: Some(set("0")),
        }
    );
    assert_eq!(
        sample(&registry, "qosd_cpu_manager_exclusive_cpu_allocation_count"),
        3.0
    );
    assert_eq!(
        sample(&registry, "qosd_topology_manager_admission_requests_total"),
        4.0
    );
    assert_eq!(
        sample(&registry, "qosd_topology_manager_admission_errors_total"),
        1.0
    );
    assert_eq!(
        sample(&registry, "qosd_cpu_manager_pinning_requests_total"),
        2.0,
        "the rejected pod never reached the CPU manager's allocation"
    );
    assert_eq!(
        sample(&registry, "qosd_memory_manager_pinning_requests_total"),
        2.0
    );
    assert_eq!(
        sample(
            &registry,
            "qosd_topology_manager_admission_duration_seconds_count"
        ),
        4.0
    );

    // Release gives everything back.
    m.release("big");
    m.release("small");
    assert_eq!(m.shared_pool(), &Cpus::parse("0-3").expect("cpus"));
    assert_eq!(
        sample(&registry, "qosd_cpu_manager_shared_pool_size_millicores"),
        3000.0
    );
    assert_eq!(
        sample(&registry, "qosd_cpu_manager_exclusive_cpu_allocation_count"),
        0.0
    );
    assert_eq!(m.cpusets("big", "c").mems, None);
}

#[test]
fn corrupt_checkpoints_are_rebuilt_from_cgroupfs_and_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let big = pod("big", vec![], vec![guaranteed("c", "2", "256Mi")]);
    {
        let (mut m, _) = managers(Some(dir.path()));
        m.admit(&big).expect("admitted");
    }
    // A kill at the wrong moment on a broken disk: garbage in both files.
    std::fs::write(
        dir.path().join(cpu::CPU_MANAGER_STATE_FILE),
        b"{\"policyName\": \"sta",
    )
    .expect("write");
    std::fs::write(dir.path().join(MEMORY_MANAGER_STATE_FILE), b"\0\0\0").expect("write");

    let (mut m, registry) = managers(Some(dir.path()));
    assert!(m.needs_recovery());
    assert_eq!(m.cpusets("big", "c").mems, None, "nothing restored yet");
    // What the container's cgroup shows: its exclusive CPUs and its memory node.
    m.recover(&[ObservedContainer {
        pod: &big,
        container: "c",
        cpus: Some(set("2-3")),
        mems: Some(set("1")),
    }]);
    assert!(!m.needs_recovery());
    assert_eq!(
        m.cpusets("big", "c"),
        ContainerCpusets {
            cpus: Some(set("2-3")),
            mems: Some(set("1")),
        }
    );
    assert_eq!(
        sample(
            &registry,
            "qosd_checkpoint_recoveries_total{checkpoint=\"cpu_manager_state\",reason=\"corrupt\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(
            &registry,
            "qosd_checkpoint_recoveries_total{checkpoint=\"memory_manager_state\",reason=\"corrupt\"}"
        ),
        1.0
    );
    // Admission of the same pod confirms what it has.
    m.admit(&big).expect("re-admitted");
    assert_eq!(m.cpusets("big", "c").cpus, Some(set("2-3")));

    // The rebuilt state was checkpointed: the next start restores it without a recovery.
    drop(m);
    let (m, _) = managers(Some(dir.path()));
    assert!(!m.needs_recovery());
    assert_eq!(m.cpusets("big", "c").cpus, Some(set("2-3")));
    assert_eq!(m.cpusets("big", "c").mems, Some(set("1")));
}

#[test]
fn a_first_start_is_not_a_recovery() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut m, registry) = managers(Some(dir.path()));
    assert!(m.needs_recovery(), "no files yet");
    m.recover(&[]);
    assert_eq!(
        sample(
            &registry,
            "qosd_checkpoint_recoveries_total{checkpoint=\"cpu_manager_state\",reason=\"missing\"}"
        ),
        0.0
    );
    assert!(dir.path().join(cpu::CPU_MANAGER_STATE_FILE).is_file());
    assert!(dir.path().join(MEMORY_MANAGER_STATE_FILE).is_file());
}

#[test]
fn a_kubelet_format_checkpoint_is_taken_over() {
    // cpu_manager_state as kubelet writes it (its checksum algorithm is proved against
    // kubelet's own vectors in cm::cpu::state::tests): container "c" of pod "kpod" holds 2-3.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut state = CpuState {
        default_cpus: Cpus::parse("0-1").expect("cpus"),
        ..CpuState::default()
    };
    state.set("kpod", "c", Cpus::parse("2-3").expect("cpus"));
    let bytes = cpu::state::encode("static", &state).expect("encode");
    std::fs::write(dir.path().join(cpu::CPU_MANAGER_STATE_FILE), bytes).expect("write");

    let (mut m, _) = managers(Some(dir.path()));
    assert_eq!(m.cpusets("kpod", "c").cpus, Some(set("2-3")));
    assert_eq!(m.shared_pool(), &Cpus::parse("0-1").expect("cpus"));
    // A new pod cannot take them.
    let other = pod("other", vec![], vec![guaranteed("c", "2", "64Mi")]);
    assert!(m.admit(&other).is_err());
    // Once kubelet's pod is not in the pod source any more, they are released.
    m.remove_stale(|_, _| false);
    assert_eq!(m.shared_pool(), &Cpus::parse("0-3").expect("cpus"));
}
