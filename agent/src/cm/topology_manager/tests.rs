//! Topology manager tests: construction (kubelet `TestNewManager`, `TestManagerScope`) and
//! admission (`TestAdmit`, scope tests) against recording fake providers.
use std::collections::BTreeMap;

use super::hint::{AllocationError, HintProvider, ProviderHints, TopologyHint};
use super::numa_info::NumaInfo;
use super::policy::{MAX_ALLOWABLE_NUMA_NODES, PREFER_CLOSEST_NUMA_NODES, Policy, PolicyName};
use super::scope::{ERROR_TOPOLOGY_AFFINITY, ScopeName, TOPOLOGY_AFFINITY_MESSAGE};
use super::*;
use crate::machine::{NumaMask, synthetic};
use crate::pods::model::{Container, ObjectMeta, Pod, PodSpec};

fn h(nodes: &[usize], preferred: bool) -> TopologyHint {
    TopologyHint::new(NumaMask::new(nodes).unwrap(), preferred)
}

fn container(name: &str) -> Container {
    Container {
        name: name.to_string(),
        ..Container::default()
    }
}

fn pod(init: &[&str], app: &[&str]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: "p".into(),
            namespace: "default".into(),
            uid: "uid-1".into(),
            ..ObjectMeta::default()
        },
        status: crate::pods::model::PodStatus::default(),
        spec: PodSpec {
            init_containers: init.iter().map(|n| container(n)).collect(),
            containers: app.iter().map(|n| container(n)).collect(),
            ..PodSpec::default()
        },
    }
}

/// A provider answering fixed hints (per container name, else `default`) and recording calls.
#[derive(Default)]
struct Fake {
    name: String,
    default: ProviderHints,
    per_container: BTreeMap<String, ProviderHints>,
    pod: ProviderHints,
    fail_on: Option<String>,
    hint_calls: std::cell::Cell<usize>,
    pod_hint_calls: std::cell::Cell<usize>,
    allocated: Vec<(String, TopologyHint)>,
}

impl Fake {
    fn with(name: &str, hints: ProviderHints) -> Self {
        Fake {
            name: name.into(),
            pod: hints.clone(),
            default: hints,
            ..Fake::default()
        }
    }
}

impl HintProvider for Fake {
    fn name(&self) -> &str {
        &self.name
    }

    fn hints(&self, _pod: &Pod, container: &Container) -> ProviderHints {
        self.hint_calls.set(self.hint_calls.get() + 1);
        self.per_container
            .get(&container.name)
            .cloned()
            .unwrap_or_else(|| self.default.clone())
    }

    fn pod_hints(&self, _pod: &Pod) -> ProviderHints {
        self.pod_hint_calls.set(self.pod_hint_calls.get() + 1);
        self.pod.clone()
    }

    fn allocate(
        &mut self,
        _pod: &Pod,
        container: &Container,
        affinity: &TopologyHint,
    ) -> Result<(), AllocationError> {
        if self.fail_on.as_deref() == Some(container.name.as_str()) {
            return Err(AllocationError::new(
                "SMTAlignmentError",
                "SMT Alignment Error: requested 3 cpus not multiple cpus per core = 2",
            ));
        }
        self.allocated.push((container.name.clone(), *affinity));
        Ok(())
    }
}

fn resource(hints: Vec<TopologyHint>) -> ProviderHints {
    BTreeMap::from([("resource".to_string(), Some(hints))])
}

fn two_nodes() -> NumaInfo {
    NumaInfo::new(&[0, 1], &[vec![10, 11], vec![11, 10]]).unwrap()
}

fn manager(policy: PolicyName, scope: ScopeName) -> TopologyManager {
    TopologyManager::with_policy(
        Policy::new(policy, two_nodes(), PolicyOptions::default()),
        scope,
    )
}

fn opts(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

#[test]
fn new_manager_mirrors_kubelet() {
    // kubelet TestNewManager rows.
    let t = synthetic::dual_socket_snc2().unwrap();
    for name in ["none", "best-effort", "restricted", "single-numa-node"] {
        let m = TopologyManager::new(&t, name, "container", &BTreeMap::new()).unwrap();
        assert_eq!(m.policy().name().as_str(), name);
    }
    let err = TopologyManager::new(&t, "unknown", "container", &BTreeMap::new()).unwrap_err();
    assert_eq!(err.to_string(), "unknown policy: \"unknown\"");
    for policy in ["best-effort", "restricted"] {
        let err = TopologyManager::new(
            &t,
            policy,
            "container",
            &opts(&[("unknown-option", "true")]),
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("unknown Topology Manager Policy option:")
        );
    }
    // "more than 8 NUMA nodes": 34 nodes fail by default, pass with the option, and the
    // `none` policy does not care.
    let big = synthetic::thirty_four_numa().unwrap();
    let err = TopologyManager::new(&big, "best-effort", "container", &BTreeMap::new()).unwrap_err();
    assert_eq!(err, TopologyManagerError::TooManyNumaNodes { max: 8 });
    assert_eq!(
        err.to_string(),
        "unsupported on machines with more than 8 NUMA Nodes"
    );
    assert!(TopologyManager::new(&big, "none", "container", &BTreeMap::new()).is_ok());
    let m = TopologyManager::new(
        &big,
        "single-numa-node",
        "pod",
        &opts(&[
            (MAX_ALLOWABLE_NUMA_NODES, "34"),
            (PREFER_CLOSEST_NUMA_NODES, "true"),
        ]),
    )
    .unwrap();
    assert_eq!(m.policy().numa_info().default_mask().count(), 34);
    assert_eq!(m.scope(), ScopeName::Pod);
    let err = TopologyManager::new(
        &big,
        "restricted",
        "pod",
        &opts(&[(MAX_ALLOWABLE_NUMA_NODES, "33")]),
    )
    .unwrap_err();
    assert_eq!(err, TopologyManagerError::TooManyNumaNodes { max: 33 });
}

#[test]
fn manager_scope_mirrors_kubelet() {
    // kubelet TestManagerScope rows.
    let t = synthetic::vm_two_numa_four_cpus().unwrap();
    for scope in ["container", "pod"] {
        let m = TopologyManager::new(&t, "best-effort", scope, &BTreeMap::new()).unwrap();
        assert_eq!(m.scope().as_str(), scope);
    }
    let err = TopologyManager::new(&t, "best-effort", "unknown", &BTreeMap::new()).unwrap_err();
    assert_eq!(err.to_string(), "unknown scope: \"unknown\"");
}

#[test]
fn admit_mirrors_kubelet() {
    // kubelet TestAdmit rows (QoS does not change the outcome); each row runs under both the
    // container and the pod scope.
    let preferred_0 = resource(vec![h(&[0], true), h(&[0, 1], false)]);
    let two_preferred = resource(vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]);
    let none_preferred = resource(vec![h(&[0, 1], false)]);
    let rows: Vec<(&str, PolicyName, Option<ProviderHints>, bool)> = vec![
        ("None Policy. No Hints.", PolicyName::None, None, true),
        (
            "single-numa-node Policy. No Hints.",
            PolicyName::SingleNumaNode,
            Some(ProviderHints::new()),
            true,
        ),
        (
            "Restricted Policy. No Hints.",
            PolicyName::Restricted,
            Some(ProviderHints::new()),
            true,
        ),
        (
            "BestEffort Policy. Preferred Affinity.",
            PolicyName::BestEffort,
            Some(preferred_0.clone()),
            true,
        ),
        (
            "BestEffort Policy. More than one Preferred Affinity.",
            PolicyName::BestEffort,
            Some(two_preferred.clone()),
            true,
        ),
        (
            "BestEffort Policy. No Preferred Affinity.",
            PolicyName::BestEffort,
            Some(none_preferred.clone()),
            true,
        ),
        (
            "Restricted Policy. Preferred Affinity.",
            PolicyName::Restricted,
            Some(preferred_0),
            true,
        ),
        (
            "Restricted Policy. More than one Preferred affinity.",
            PolicyName::Restricted,
            Some(two_preferred),
            true,
        ),
        (
            "Restricted Policy. No Preferred affinity.",
            PolicyName::Restricted,
            Some(none_preferred),
            false,
        ),
    ];
    for (name, policy, hints, expected) in rows {
        for scope in [ScopeName::Container, ScopeName::Pod] {
            let mut m = manager(policy, scope);
            let mut providers: Vec<Fake> = hints
                .iter()
                .map(|h| Fake::with("mock", h.clone()))
                .collect();
            let mut refs: Vec<&mut dyn HintProvider> = providers
                .iter_mut()
                .map(|p| p as &mut dyn HintProvider)
                .collect();
            let result = m.admit(&pod(&[], &["c"]), &mut refs);
            assert_eq!(result.admit, expected, "{name} ({scope})");
            if !expected {
                assert_eq!(result.reason, ERROR_TOPOLOGY_AFFINITY, "{name}");
                assert_eq!(result.message, TOPOLOGY_AFFINITY_MESSAGE);
                assert_eq!(m.counters().errors_total, 1);
            }
            assert_eq!(m.counters().requests_total, 1);
        }
    }
}

#[test]
fn container_scope_merges_per_container_and_allocates_in_order() {
    // kubelet TestContainerCalculateAffinity / scope_container: each container gets its own
    // hint; init containers go first.
    let mut m = manager(PolicyName::BestEffort, ScopeName::Container);
    let mut cpu = Fake::with("cpu", resource(vec![h(&[0], true), h(&[1], true)]));
    cpu.per_container.insert(
        "app".into(),
        resource(vec![h(&[1], true), h(&[0, 1], false)]),
    );
    let mut memory = Fake::with("memory", ProviderHints::new());
    let p = pod(&["init"], &["app"]);
    let result = m.admit(&p, &mut [&mut cpu, &mut memory]);
    assert!(result.admit);
    assert_eq!(cpu.hint_calls.get(), 2);
    assert_eq!(cpu.pod_hint_calls.get(), 0);
    let expected = vec![
        ("init".to_string(), h(&[0], true)),
        ("app".to_string(), h(&[1], true)),
    ];
    assert_eq!(cpu.allocated, expected);
    assert_eq!(memory.allocated, expected);
    assert_eq!(m.affinity("uid-1", "init"), h(&[0], true));
    assert_eq!(m.affinity("uid-1", "app"), h(&[1], true));
}

#[test]
fn pod_scope_merges_once_and_applies_to_every_container() {
    // kubelet scope_pod: one merge of pod hints, the same hint for every container.
    let mut m = manager(PolicyName::SingleNumaNode, ScopeName::Pod);
    let mut cpu = Fake::with("cpu", ProviderHints::new());
    cpu.pod = resource(vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]);
    let mut memory = Fake::with("memory", ProviderHints::new());
    memory.pod = resource(vec![h(&[1], true), h(&[0, 1], false)]);
    let p = pod(&["init"], &["a", "b"]);
    let result = m.admit(&p, &mut [&mut cpu, &mut memory]);
    assert!(result.admit);
    assert_eq!((cpu.pod_hint_calls.get(), cpu.hint_calls.get()), (1, 0));
    let names: Vec<&str> = memory.allocated.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["init", "a", "b"]);
    assert!(
        memory
            .allocated
            .iter()
            .all(|(_, hint)| *hint == h(&[1], true))
    );
    assert_eq!(m.affinity("uid-1", "b"), h(&[1], true));
}

#[test]
fn rejection_records_nothing_and_leaves_other_pods_alone() {
    let mut m = manager(PolicyName::SingleNumaNode, ScopeName::Container);
    let mut ok = Fake::with("cpu", resource(vec![h(&[0], true)]));
    assert!(m.admit(&pod(&[], &["c"]), &mut [&mut ok]).admit);
    // A second pod whose resources only fit across both nodes.
    let mut other = pod(&[], &["c"]);
    other.metadata.uid = "uid-2".into();
    let mut wide = Fake::with("cpu", resource(vec![h(&[0, 1], true)]));
    let result = m.admit(&other, &mut [&mut wide]);
    assert!(!result.admit);
    assert_eq!(result.reason, ERROR_TOPOLOGY_AFFINITY);
    assert!(wide.allocated.is_empty());
    assert_eq!(m.affinity("uid-2", "c"), TopologyHint::default());
    assert_eq!(m.affinity("uid-1", "c"), h(&[0], true));
    assert_eq!(
        m.counters(),
        AdmissionCounters {
            requests_total: 2,
            errors_total: 1
        }
    );
}

#[test]
fn allocation_errors_keep_the_providers_reason() {
    // kubelet admission.GetPodAdmitResult: a typed provider error keeps its reason.
    for policy in [PolicyName::None, PolicyName::BestEffort] {
        let mut m = manager(policy, ScopeName::Container);
        let mut cpu = Fake::with("cpu", resource(vec![h(&[0], true)]));
        cpu.fail_on = Some("b".into());
        let result = m.admit(&pod(&[], &["a", "b"]), &mut [&mut cpu]);
        assert!(!result.admit);
        assert_eq!(result.reason, "SMTAlignmentError");
        assert!(result.message.starts_with("SMT Alignment Error"));
        assert_eq!(cpu.allocated.len(), 1, "a was allocated before b failed");
        assert_eq!(m.affinity("uid-1", "a"), TopologyHint::default());
    }
    let unexpected = AllocationError::unexpected("no free CPUs");
    assert_eq!(unexpected.reason, "UnexpectedAdmissionError");
    assert_eq!(
        unexpected.message,
        "Allocate failed due to no free CPUs, which is unexpected"
    );
}

#[test]
fn none_policy_allocates_without_a_hint_and_records_nothing() {
    let mut m = manager(PolicyName::None, ScopeName::Pod);
    let mut cpu = Fake::with("cpu", resource(vec![h(&[1], true)]));
    assert!(m.admit(&pod(&["i"], &["c"]), &mut [&mut cpu]).admit);
    assert_eq!(cpu.hint_calls.get() + cpu.pod_hint_calls.get(), 0);
    assert_eq!(
        cpu.allocated,
        vec![
            ("i".to_string(), TopologyHint::default()),
            ("c".to_string(), TopologyHint::default())
        ]
    );
    assert_eq!(m.affinity("uid-1", "c"), TopologyHint::default());
}

#[test]
fn removal_forgets_affinities() {
    let mut m = manager(PolicyName::BestEffort, ScopeName::Container);
    let mut cpu = Fake::with("cpu", resource(vec![h(&[1], true)]));
    assert!(m.admit(&pod(&[], &["a", "b"]), &mut [&mut cpu]).admit);
    m.remove_container("uid-1", "a");
    assert_eq!(m.affinity("uid-1", "a"), TopologyHint::default());
    assert_eq!(m.affinity("uid-1", "b"), h(&[1], true));
    m.remove_pod("uid-1");
    assert_eq!(m.affinity("uid-1", "b"), TopologyHint::default());
}

#[test]
fn thirty_four_nodes_admit_with_the_option() {
    // 34 NUMA nodes, 3 providers each giving every single-node hint: aligned on node 0.
    let big = synthetic::thirty_four_numa().unwrap();
    let mut m = TopologyManager::new(
        &big,
        "restricted",
        "container",
        &opts(&[(MAX_ALLOWABLE_NUMA_NODES, "64")]),
    )
    .unwrap();
    let singles: Vec<TopologyHint> = (0..34).map(|n| h(&[n], true)).collect();
    let mut a = Fake::with("cpu", resource(singles.clone()));
    let mut b = Fake::with("memory", resource(singles[5..].to_vec()));
    let mut c = Fake::with("device", resource(vec![h(&[7, 8], true), h(&[7], true)]));
    let result = m.admit(&pod(&[], &["c"]), &mut [&mut a, &mut b, &mut c]);
    assert!(result.admit);
    assert_eq!(m.affinity("uid-1", "c"), h(&[7], true));
}
