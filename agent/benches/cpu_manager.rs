//! CPU and memory manager benchmarks on 256 CPUs / 8 NUMA nodes (the synthetic
//! `eight_numa_256_cpus` machine: 2 sockets x 4 NUMA nodes x 32 cores, two L3 caches per node).
//!
//! Each iteration allocates exclusive CPUs to one Guaranteed container and releases them again,
//! on a machine already half full of other pods (so the take works on a fragmented pool), with
//! the default packed take and with `distribute-cpus-across-numa`; plus hint generation and the
//! memory manager's allocate and release. Target: under 1 ms per allocate + release.
use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use qosd::cm::cpu::{CpuManager, CpuManagerConfig, CpuPolicyName, CpuTopology, Cpus, OptionGates};
use qosd::cm::memory::{
    MemoryManager, MemoryManagerConfig, MemoryPolicyName, MemoryReservation, numa_memory,
};
use qosd::cm::topology_manager::hint::{HintProvider, NumaMask, TopologyHint};
use qosd::machine::{MachineTopology, synthetic};
use qosd::pods::model::{Container, ObjectMeta, Pod, PodSpec};
use qosd::pods::quantity::Quantity;

fn machine() -> MachineTopology {
    synthetic::eight_numa_256_cpus().unwrap_or_else(|e| panic!("{e}"))
}

fn quantity(text: &str) -> Quantity {
    Quantity::parse(text).unwrap_or_else(|e| panic!("{e}"))
}

fn guaranteed_pod(uid: &str, cpus: usize, memory: &str) -> Pod {
    let mut container = Container {
        name: "app".into(),
        ..Container::default()
    };
    for list in [
        &mut container.resources.requests,
        &mut container.resources.limits,
    ] {
        list.insert("cpu".into(), quantity(&cpus.to_string()));
        list.insert("memory".into(), quantity(memory));
    }
    Pod {
        metadata: ObjectMeta {
            name: uid.into(),
            namespace: "default".into(),
            uid: uid.into(),
            ..ObjectMeta::default()
        },
        status: qosd::pods::model::PodStatus::default(),
        spec: PodSpec {
            containers: vec![container],
            ..PodSpec::default()
        },
    }
}

fn cpu_manager(options: &[(&str, &str)]) -> CpuManager {
    let topology = CpuTopology::from_machine(&machine()).unwrap_or_else(|e| panic!("{e}"));
    let config = CpuManagerConfig {
        policy: CpuPolicyName::Static,
        policy_options: options
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        option_gates: OptionGates::default(),
        reserved_system_cpus: Cpus::new(),
        reserved_millicores: 2000,
        topology_manager_policy: "none".into(),
        state_dir: None,
    };
    let (mut manager, _) = CpuManager::new(&config, topology).unwrap_or_else(|e| panic!("{e}"));
    // Half the machine taken by pods of assorted sizes.
    let any = TopologyHint::default();
    let mut taken = 0;
    for (i, size) in [3usize, 8, 5, 16, 7, 2, 11, 6, 9, 4, 13, 10, 8, 12, 6, 8]
        .iter()
        .enumerate()
    {
        let pod = guaranteed_pod(&format!("filler-{i}"), *size, "1Gi");
        manager
            .allocate(&pod, &pod.spec.containers[0], &any)
            .unwrap_or_else(|e| panic!("{e}"));
        taken += size;
    }
    assert_eq!(taken, 128);
    manager
}

fn cpu_benches(c: &mut Criterion) {
    let any = TopologyHint::default();
    for (name, options, cpus) in [
        ("packed_8cpus", &[][..], 8usize),
        ("packed_40cpus", &[][..], 40),
        (
            "distributed_32cpus",
            &[("distribute-cpus-across-numa", "true")][..],
            32,
        ),
        (
            "uncore_6cpus",
            &[("prefer-align-cpus-by-uncorecache", "true")][..],
            6,
        ),
    ] {
        let mut manager = cpu_manager(options);
        let pod = guaranteed_pod("bench", cpus, "1Gi");
        let before = manager.shared_pool().clone();
        c.bench_function(
            &format!("cpu_manager_allocate_release/256cpus_8numa_{name}"),
            |b| {
                b.iter(|| {
                    let got = manager.allocate(black_box(&pod), &pod.spec.containers[0], &any);
                    assert!(got.is_ok());
                    manager.remove_pod("bench");
                });
            },
        );
        assert_eq!(manager.shared_pool(), &before);
    }

    let manager = cpu_manager(&[]);
    let pod = guaranteed_pod("hints", 8, "1Gi");
    c.bench_function("cpu_manager_hints/256cpus_8numa_8cpus", |b| {
        b.iter(|| {
            let hints = manager.hints(black_box(&pod), &pod.spec.containers[0]);
            assert!(!hints.is_empty());
        });
    });
}

fn memory_benches(c: &mut Criterion) {
    let nodes = numa_memory(&machine());
    let config = MemoryManagerConfig {
        policy: MemoryPolicyName::Static,
        reserved_memory: nodes
            .iter()
            .map(|n| MemoryReservation {
                numa_node: n.node,
                limits: BTreeMap::from([("memory".to_owned(), 256 << 20)]),
            })
            .collect(),
        node_allocatable_reservation: BTreeMap::from([("memory".to_owned(), 256u64 << 20 << 3)]),
        state_dir: None,
    };
    let (mut manager, _) = MemoryManager::new(&config, nodes).unwrap_or_else(|e| panic!("{e}"));
    let pod = guaranteed_pod("bench", 4, "2Gi");
    let on_node_3 = TopologyHint::new(NumaMask::from_bits(1 << 3), true);
    c.bench_function("memory_manager_allocate_release/8numa_2Gi", |b| {
        b.iter(|| {
            let got = manager.allocate(black_box(&pod), &pod.spec.containers[0], &on_node_3);
            assert!(matches!(got, Ok(Some(_))));
            manager.remove_pod("bench");
        });
    });
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
}

criterion_group! {
    name = benches;
    config = config();
    targets = cpu_benches, memory_benches
}
criterion_main!(benches);
