//! QoS classification: [`pod_qos`] gives a pod's class with kubelet's rules (`GetPodQOS`,
//! container-level resources only), and [`QosClass`] names it for metric labels and for
//! kubelet's API spelling.
use std::collections::BTreeMap;
use std::fmt;

use super::model::{CPU, MEMORY, PodSpec};
use super::quantity::Quantity;

/// A pod's quality-of-service class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QosClass {
    /// Every container has cpu and memory limits and requests equal to them.
    Guaranteed,
    /// Some request or limit, but not Guaranteed.
    Burstable,
    /// No cpu or memory request or limit anywhere.
    BestEffort,
}

impl QosClass {
    /// Every class, highest first.
    pub const ALL: [Self; 3] = [Self::Guaranteed, Self::Burstable, Self::BestEffort];

    /// The lower-case name used in metric labels (and kubelet's QoS cgroup names):
    /// `guaranteed`, `burstable`, `besteffort`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "guaranteed",
            Self::Burstable => "burstable",
            Self::BestEffort => "besteffort",
        }
    }

    /// The API's name (`status.qosClass`): `Guaranteed`, `Burstable`, `BestEffort`.
    #[must_use]
    pub fn kubelet_name(self) -> &'static str {
        match self {
            Self::Guaranteed => "Guaranteed",
            Self::Burstable => "Burstable",
            Self::BestEffort => "BestEffort",
        }
    }
}

impl fmt::Display for QosClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The pod's QoS class, as kubelet computes it:
///
/// - only `cpu` and `memory` count; app and init containers (sidecars included) all count;
/// - a request defaults to the limit when only the limit is set (API defaulting);
/// - quantities that are zero (or negative) are treated as unset;
/// - BestEffort: no positive cpu/memory request or limit anywhere;
/// - Guaranteed: every container has positive cpu and memory limits, and per resource the sum
///   of positive requests equals the sum of limits (with per-container `request <= limit`,
///   which validation enforces, that means each container's requests equal its limits);
/// - Burstable otherwise.
#[must_use]
pub fn pod_qos(spec: &PodSpec) -> QosClass {
    let mut requests: BTreeMap<&str, Quantity> = BTreeMap::new();
    let mut limits: BTreeMap<&str, Quantity> = BTreeMap::new();
    let mut every_container_limited = true;
    for container in spec.all_containers() {
        let mut limited = 0;
        for resource in [CPU, MEMORY] {
            if let Some(q) = container.request(resource).filter(is_positive) {
                let sum = requests.entry(resource).or_insert(Quantity::ZERO);
                *sum = sum.saturating_add(q);
            }
            if let Some(q) = container.limit(resource).filter(is_positive) {
                let sum = limits.entry(resource).or_insert(Quantity::ZERO);
                *sum = sum.saturating_add(q);
                limited += 1;
            }
        }
        if limited < 2 {
            every_container_limited = false;
        }
    }
    if requests.is_empty() && limits.is_empty() {
        QosClass::BestEffort
    } else if every_container_limited && requests == limits {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

fn is_positive(q: &Quantity) -> bool {
    *q > Quantity::ZERO
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::model::{Container, ResourceList, ResourceRequirements};

    /// `getResourceList(cpu, memory)` of qos_test.go: empty strings leave the resource out.
    fn list(cpu: &str, memory: &str) -> ResourceList {
        let mut l = ResourceList::new();
        if !cpu.is_empty() {
            l.insert(CPU.into(), Quantity::parse(cpu).unwrap());
        }
        if !memory.is_empty() {
            l.insert(MEMORY.into(), Quantity::parse(memory).unwrap());
        }
        l
    }

    fn with(mut l: ResourceList, name: &str, value: &str) -> ResourceList {
        l.insert(name.into(), Quantity::parse(value).unwrap());
        l
    }

    fn c(name: &str, requests: ResourceList, limits: ResourceList) -> Container {
        Container {
            name: name.into(),
            resources: ResourceRequirements { requests, limits },
            ..Container::default()
        }
    }

    fn spec(containers: Vec<Container>) -> PodSpec {
        PodSpec {
            containers,
            ..PodSpec::default()
        }
    }

    use QosClass::{BestEffort, Burstable, Guaranteed};

    /// Rows mirror `TestComputePodQOS` in kubernetes pkg/apis/core/v1/helper/qos/qos_test.go
    /// (the comment is the test pod's name); the pod-level-resources rows are left out (qosd
    /// rejects pod-level resources). Extra rows at the end cover requests defaulted from limits.
    #[test]
    fn classifies_like_kubelet() {
        let rows: Vec<(&str, PodSpec, QosClass)> = vec![
            // "guaranteed"
            (
                "guaranteed",
                spec(vec![c(
                    "guaranteed",
                    list("100m", "100Mi"),
                    list("100m", "100Mi"),
                )]),
                Guaranteed,
            ),
            // "guaranteed-guaranteed"
            (
                "guaranteed-guaranteed",
                spec(vec![
                    c("guaranteed", list("100m", "100Mi"), list("100m", "100Mi")),
                    c("guaranteed2", list("100m", "100Mi"), list("100m", "100Mi")),
                ]),
                Guaranteed,
            ),
            // "best-effort-best-effort"
            (
                "best-effort-best-effort",
                spec(vec![
                    c("best-effort", list("", ""), list("", "")),
                    c("best-effort2", list("", ""), list("", "")),
                ]),
                BestEffort,
            ),
            // "best-effort"
            (
                "best-effort",
                spec(vec![c("best-effort", list("", ""), list("", ""))]),
                BestEffort,
            ),
            // "best-effort-burstable"
            (
                "best-effort-burstable",
                spec(vec![
                    c("best-effort", list("", ""), list("", "")),
                    c("burstable", list("1", ""), list("2", "")),
                ]),
                Burstable,
            ),
            // "best-effort-guaranteed"
            (
                "best-effort-guaranteed",
                spec(vec![
                    c("best-effort", list("", ""), list("", "")),
                    c("guaranteed", list("10m", "100Mi"), list("10m", "100Mi")),
                ]),
                Burstable,
            ),
            // "burstable-cpu-guaranteed-memory"
            (
                "burstable-cpu-guaranteed-memory",
                spec(vec![c("burstable", list("", "100Mi"), list("", "100Mi"))]),
                Burstable,
            ),
            // "burstable-no-limits"
            (
                "burstable-no-limits",
                spec(vec![c("burstable", list("100m", "100Mi"), list("", ""))]),
                Burstable,
            ),
            // "burstable-guaranteed"
            (
                "burstable-guaranteed",
                spec(vec![
                    c("burstable", list("1", "100Mi"), list("2", "100Mi")),
                    c("guaranteed", list("100m", "100Mi"), list("100m", "100Mi")),
                ]),
                Burstable,
            ),
            // "burstable-unbounded-but-requests-match-limits"
            (
                "burstable-unbounded-but-requests-match-limits",
                spec(vec![
                    c("burstable", list("100m", "100Mi"), list("200m", "200Mi")),
                    c("burstable-unbounded", list("100m", "100Mi"), list("", "")),
                ]),
                Burstable,
            ),
            // "burstable-1"
            (
                "burstable-1",
                spec(vec![c(
                    "burstable",
                    list("10m", "100Mi"),
                    list("100m", "200Mi"),
                )]),
                Burstable,
            ),
            // "burstable-2": explicit zero requests are not defaulted from the limits.
            (
                "burstable-2",
                spec(vec![c("burstable", list("0", "0"), list("100m", "200Mi"))]),
                Burstable,
            ),
            // "best-effort-hugepages": only cpu and memory count.
            (
                "best-effort-hugepages",
                spec(vec![c(
                    "best-effort",
                    with(list("0", "0"), "hugepages-2Mi", "1Gi"),
                    with(list("0", "0"), "hugepages-2Mi", "1Gi"),
                )]),
                BestEffort,
            ),
            // "init-container": init containers count.
            (
                "init-container",
                PodSpec {
                    containers: vec![c("best-effort", list("", ""), list("", ""))],
                    init_containers: vec![c(
                        "burstable",
                        list("10m", "100Mi"),
                        list("100m", "200Mi"),
                    )],
                    ..PodSpec::default()
                },
                Burstable,
            ),
            // Not in qos_test.go: API defaulting copies limits into unset requests.
            (
                "limits-only-defaults-requests",
                spec(vec![c("guaranteed", list("", ""), list("1", "1Gi"))]),
                Guaranteed,
            ),
            // Not in qos_test.go: a guaranteed init container keeps the pod guaranteed...
            (
                "guaranteed-init-and-app",
                PodSpec {
                    containers: vec![c("app", list("1", "1Gi"), list("1", "1Gi"))],
                    init_containers: vec![c("init", list("", ""), list("500m", "64Mi"))],
                    ..PodSpec::default()
                },
                Guaranteed,
            ),
            // ...and an unlimited one makes it burstable.
            (
                "best-effort-init-guaranteed-app",
                PodSpec {
                    containers: vec![c("app", list("1", "1Gi"), list("1", "1Gi"))],
                    init_containers: vec![c("init", list("", ""), list("", ""))],
                    ..PodSpec::default()
                },
                Burstable,
            ),
            // Not in qos_test.go: quantities compare exactly, 1 == 1000m.
            (
                "equal-in-different-units",
                spec(vec![c("g", list("1", "1Gi"), list("1000m", "1073741824"))]),
                Guaranteed,
            ),
            // Not in qos_test.go: other resources do not affect the class.
            (
                "guaranteed-with-unequal-extended-resource",
                spec(vec![c(
                    "g",
                    with(list("1", "1Gi"), "example.com/gpu", "1"),
                    with(list("1", "1Gi"), "example.com/gpu", "2"),
                )]),
                Guaranteed,
            ),
        ];
        for (name, spec, want) in rows {
            assert_eq!(pod_qos(&spec), want, "{name}");
        }
    }

    #[test]
    fn names() {
        assert_eq!(Guaranteed.to_string(), "guaranteed");
        assert_eq!(Burstable.to_string(), "burstable");
        assert_eq!(BestEffort.to_string(), "besteffort");
        let api: Vec<_> = QosClass::ALL.iter().map(|c| c.kubelet_name()).collect();
        assert_eq!(api, ["Guaranteed", "Burstable", "BestEffort"]);
    }
}
