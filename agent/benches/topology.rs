//! Topology manager benchmarks: hint merging (the step kubelet enumerates as a cross product,
//! kubernetes/kubernetes#131738) and a whole admission through the manager.
//!
//! Hint lists are shaped like the CPU and memory managers' (every NUMA node alone, preferred,
//! plus a few wider masks), with cases where the providers agree (the preferred pass answers)
//! and where they do not (the reachable-mask pass runs). Target: under 10 ms per merge.
//! `cargo xtask bench` runs this and prints the figures.
use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use qosd::cm::topology_manager::TopologyManager;
use qosd::cm::topology_manager::hint::{
    AllocationError, HintProvider, NumaMask, ProviderHints, TopologyHint,
};
use qosd::cm::topology_manager::merge::{HintMerger, reference};
use qosd::cm::topology_manager::numa_info::NumaInfo;
use qosd::cm::topology_manager::policy::{Policy, PolicyName, PolicyOptions};
use qosd::cm::topology_manager::scope::ScopeName;
use qosd::machine::{MachineTopology, synthetic};
use qosd::pods::model::{Container, ObjectMeta, Pod, PodSpec};

fn single(node: usize) -> NumaMask {
    NumaMask::from_bits(1u64 << node)
}

/// The masks of `nodes` consecutive ids starting at each multiple of `width`.
fn blocks(nodes: usize, width: usize) -> Vec<NumaMask> {
    (0..nodes)
        .step_by(width)
        .map(|start| NumaMask::from_bits(((1u64 << width.min(nodes - start)) - 1) << start))
        .collect()
}

/// Every node alone (preferred), adjacent pairs, blocks of four, packages and the whole
/// machine (not preferred): what a provider answers for a request that fits on one node.
fn realistic(
    nodes: usize,
    packages: &[NumaMask],
    skip: impl Fn(usize) -> bool,
) -> Vec<TopologyHint> {
    let mut hints: Vec<TopologyHint> = (0..nodes)
        .filter(|&n| !skip(n))
        .map(|n| TopologyHint::new(single(n), true))
        .collect();
    for pair in 0..nodes.saturating_sub(1) {
        hints.push(TopologyHint::new(single(pair).or(single(pair + 1)), false));
    }
    hints.extend(
        blocks(nodes, 4)
            .into_iter()
            .map(|m| TopologyHint::new(m, false)),
    );
    hints.extend(packages.iter().map(|&m| TopologyHint::new(m, false)));
    hints.push(TopologyHint::new(NumaMask::first_n(nodes), false));
    hints
}

fn numa_info(topology: &MachineTopology) -> NumaInfo {
    NumaInfo::from_topology(topology, true).unwrap_or_else(|e| panic!("{e}"))
}

fn packages(topology: &MachineTopology) -> Vec<NumaMask> {
    topology
        .packages()
        .iter()
        .map(|p| NumaMask::new(&p.numa_nodes).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

fn merge_benches(c: &mut Criterion) {
    let eight = synthetic::eight_numa_256_cpus().unwrap_or_else(|e| panic!("{e}"));
    let thirty_four = synthetic::thirty_four_numa().unwrap_or_else(|e| panic!("{e}"));
    let mut group = c.benchmark_group("topology_merge");

    for (label, topology) in [("8numa", &eight), ("34numa", &thirty_four)] {
        let info = numa_info(topology);
        let n = topology.num_numa_nodes();
        let pkgs = packages(topology);
        let merger = HintMerger::new(&info, true);

        // 4 providers (cpu, memory, hugepages-1Gi, a device) all able to use every node,
        // except memory which is short on node 0: best is node 1.
        let aligned: Vec<Vec<TopologyHint>> = (0..4)
            .map(|p| realistic(n, &pkgs, |node| p == 1 && node == 0))
            .collect();
        assert_eq!(merger.merge(&aligned), TopologyHint::new(single(1), true));
        group.bench_function(format!("{label}_4providers_aligned"), |b| {
            b.iter(|| merger.merge(black_box(&aligned)));
        });

        // The providers' preferred nodes are disjoint: no preferred permutation, so every
        // reachable intersection is built and ranked.
        let conflicting: Vec<Vec<TopologyHint>> = (0..4)
            .map(|p| realistic(n, &pkgs, |node| node % 4 != p))
            .collect();
        let best = merger.merge(&conflicting);
        assert!(!best.preferred);
        group.bench_function(format!("{label}_4providers_conflicting"), |b| {
            b.iter(|| merger.merge(black_box(&conflicting)));
        });
    }

    // kubernetes#131738: 8 nodes, 4 providers, every one of the 255 masks from each
    // (255^4 = 4.2e9 permutations for kubelet, about 21 minutes).
    let info = numa_info(&eight);
    let merger = HintMerger::new(&info, false);
    let nodes: Vec<usize> = (0..8).collect();
    let mut every: Vec<TopologyHint> = Vec::new();
    NumaMask::for_each_subset(&nodes, |m| every.push(TopologyHint::new(m, m.count() == 3)));
    let every_subset = vec![every; 4];
    group.bench_function("8numa_4providers_every_subset", |b| {
        b.iter(|| merger.merge(black_box(&every_subset)));
    });
    let no_preferred: Vec<Vec<TopologyHint>> = every_subset
        .iter()
        .map(|l| {
            l.iter()
                .map(|h| TopologyHint {
                    preferred: false,
                    ..*h
                })
                .collect()
        })
        .collect();
    group.bench_function("8numa_4providers_every_subset_none_preferred", |b| {
        b.iter(|| merger.merge(black_box(&no_preferred)));
    });

    // The peer, in the same run: kubelet's enumeration on the largest every-subset case it
    // finishes quickly (4 nodes: 15^4 = 50,625 permutations), against qosd's merge.
    let four = NumaInfo::new(
        &[0, 1, 2, 3],
        &(0..4)
            .map(|a| (0..4).map(|b| if a == b { 10 } else { 20 }).collect())
            .collect::<Vec<Vec<u64>>>(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut every4: Vec<TopologyHint> = Vec::new();
    NumaMask::for_each_subset(&[0, 1, 2, 3], |m| {
        every4.push(TopologyHint::new(m, m.count() == 1));
    });
    let every4 = vec![every4; 4];
    let merger4 = HintMerger::new(&four, false);
    assert_eq!(
        merger4.merge(&every4),
        reference::merge(&four, false, &every4),
        "qosd and kubelet agree on the benchmarked case"
    );
    group.bench_function("4numa_4providers_every_subset/qosd", |b| {
        b.iter(|| merger4.merge(black_box(&every4)));
    });
    group.bench_function("4numa_4providers_every_subset/kubelet_enumeration", |b| {
        b.iter(|| reference::merge(&four, false, black_box(&every4)));
    });

    // 34 nodes, 4 providers offering all 561 pairs and no single node: the reachable pass
    // over a few thousand intersections.
    let info = numa_info(&thirty_four);
    let merger = HintMerger::new(&info, true);
    let mut pairs = Vec::new();
    for a in 0..34 {
        for b in a + 1..34 {
            pairs.push(TopologyHint::new(single(a).or(single(b)), false));
        }
    }
    let all_pairs = vec![pairs; 4];
    group.bench_function("34numa_4providers_all_pairs_none_preferred", |b| {
        b.iter(|| merger.merge(black_box(&all_pairs)));
    });
    group.finish();
}

/// A provider answering fixed hints and accepting every allocation.
struct Fixed {
    name: &'static str,
    hints: ProviderHints,
}

impl HintProvider for Fixed {
    fn name(&self) -> &str {
        self.name
    }
    fn hints(&self, _pod: &Pod, _container: &Container) -> ProviderHints {
        self.hints.clone()
    }
    fn pod_hints(&self, _pod: &Pod) -> ProviderHints {
        self.hints.clone()
    }
    fn allocate(
        &mut self,
        _pod: &Pod,
        _container: &Container,
        _affinity: &TopologyHint,
    ) -> Result<(), AllocationError> {
        Ok(())
    }
}

fn admit_benches(c: &mut Criterion) {
    let topology = synthetic::thirty_four_numa().unwrap_or_else(|e| panic!("{e}"));
    let pkgs = packages(&topology);
    let info = numa_info(&topology);
    let options = PolicyOptions {
        prefer_closest_numa: true,
        max_allowable_numa_nodes: 64,
    };
    let mut manager = TopologyManager::with_policy(
        Policy::new(PolicyName::Restricted, info, options),
        ScopeName::Container,
    );
    let resource = |name: &str, skip: usize| -> ProviderHints {
        BTreeMap::from([(
            name.to_string(),
            Some(realistic(34, &pkgs, |node| node < skip)),
        )])
    };
    let mut providers = [
        Fixed {
            name: "cpu",
            hints: resource("cpu", 0),
        },
        Fixed {
            name: "memory",
            hints: {
                let mut h = resource("memory", 2);
                h.extend(resource("hugepages-1Gi", 3));
                h
            },
        },
        Fixed {
            name: "devices",
            hints: resource("example.com/nic", 1),
        },
    ];
    let pod = Pod {
        metadata: ObjectMeta {
            name: "bench".into(),
            namespace: "default".into(),
            uid: "bench".into(),
            ..ObjectMeta::default()
        },
        status: qosd::pods::model::PodStatus::default(),
        spec: PodSpec {
            containers: ["a", "b", "c"]
                .iter()
                .map(|n| Container {
                    name: (*n).to_string(),
                    ..Container::default()
                })
                .collect(),
            ..PodSpec::default()
        },
    };
    // One admission outside the measurement, so the check below holds when a filter skips it.
    {
        let mut refs: Vec<&mut dyn HintProvider> = providers
            .iter_mut()
            .map(|p| p as &mut dyn HintProvider)
            .collect();
        assert!(manager.admit(&pod, &mut refs).admit);
    }
    c.bench_function("topology_admit/34numa_3providers_3containers", |b| {
        b.iter(|| {
            let mut refs: Vec<&mut dyn HintProvider> = providers
                .iter_mut()
                .map(|p| p as &mut dyn HintProvider)
                .collect();
            let result = manager.admit(black_box(&pod), &mut refs);
            assert!(result.admit);
        });
    });
    assert_eq!(
        manager.affinity("bench", "c"),
        TopologyHint::new(single(3), true)
    );
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
    targets = merge_benches, admit_benches
}
criterion_main!(benches);
