//! Pod admission against node allocatable: the resource part of kubelet's
//! `pkg/kubelet/lifecycle/predicate.go` (`predicateAdmitHandler.Admit`), which runs the
//! scheduler's `noderesources` fit check (`fitsRequest`) against the node's allocatable and the
//! requests of the pods already admitted, and rejects with the first insufficient resource:
//! reason `OutOfpods`, `OutOfcpu` or `OutOfmemory`, message
//! `Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000`.
//!
//! The caller computes each pod's effective requests (containers summed, init containers maxed,
//! overhead added) from the pod model; this module only compares numbers.
use std::fmt;

use super::allocatable::NodeAllocatable;

/// A pod's effective requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PodRequests {
    pub milli_cpu: i64,
    pub memory_bytes: i64,
}

/// A resource admission checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionResource {
    Pods,
    Cpu,
    Memory,
}

impl AdmissionResource {
    /// The Kubernetes resource name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionResource::Pods => "pods",
            AdmissionResource::Cpu => "cpu",
            AdmissionResource::Memory => "memory",
        }
    }
}

impl fmt::Display for AdmissionResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a pod is not admitted (kubelet's `InsufficientResourceError`). Units: pods, millicores,
/// bytes; `capacity` is the node's allocatable amount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
)]
pub struct AdmissionRejection {
    pub resource: AdmissionResource,
    pub requested: i64,
    pub used: i64,
    pub capacity: i64,
}

impl AdmissionRejection {
    /// The pod status reason kubelet sets: `OutOfpods`, `OutOfcpu`, `OutOfmemory`.
    #[must_use]
    pub fn reason(&self) -> String {
        format!("OutOf{}", self.resource)
    }

    /// The pod status message (the error text).
    #[must_use]
    pub fn message(&self) -> String {
        self.to_string()
    }
}

/// Every resource the pod does not fit, in kubelet's order (pods, cpu, memory).
#[must_use]
pub fn insufficient_resources(
    pod: &PodRequests,
    admitted: &[PodRequests],
    allocatable: &NodeAllocatable,
) -> Vec<AdmissionRejection> {
    let mut out = Vec::new();
    let pod_count = i64::try_from(admitted.len()).unwrap_or(i64::MAX);
    if pod_count.saturating_add(1) > allocatable.pods {
        out.push(AdmissionRejection {
            resource: AdmissionResource::Pods,
            requested: 1,
            used: pod_count,
            capacity: allocatable.pods,
        });
    }
    // A pod requesting nothing fits whatever is used (fitsRequest returns early).
    if pod.milli_cpu == 0 && pod.memory_bytes == 0 {
        return out;
    }
    let used = admitted
        .iter()
        .fold(PodRequests::default(), |sum, p| PodRequests {
            milli_cpu: sum.milli_cpu.saturating_add(p.milli_cpu),
            memory_bytes: sum.memory_bytes.saturating_add(p.memory_bytes),
        });
    for (resource, requested, used, capacity) in [
        (
            AdmissionResource::Cpu,
            pod.milli_cpu,
            used.milli_cpu,
            allocatable.milli_cpu,
        ),
        (
            AdmissionResource::Memory,
            pod.memory_bytes,
            used.memory_bytes,
            allocatable.memory_bytes,
        ),
    ] {
        if requested > 0 && requested > capacity.saturating_sub(used) {
            out.push(AdmissionRejection {
                resource,
                requested,
                used,
                capacity,
            });
        }
    }
    out
}

/// Whether a pod fits next to the pods already admitted; the rejection is the first
/// insufficient resource, as kubelet reports it.
pub fn fits(
    pod: &PodRequests,
    admitted: &[PodRequests],
    allocatable: &NodeAllocatable,
) -> Result<(), AdmissionRejection> {
    match insufficient_resources(pod, admitted, allocatable)
        .into_iter()
        .next()
    {
        Some(rejection) => Err(rejection),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(milli_cpu: i64, memory_bytes: i64, pods: i64) -> NodeAllocatable {
        NodeAllocatable {
            milli_cpu,
            memory_bytes,
            pods,
            ..NodeAllocatable::default()
        }
    }

    fn req(milli_cpu: i64, memory_bytes: i64) -> PodRequests {
        PodRequests {
            milli_cpu,
            memory_bytes,
        }
    }

    fn rejection(
        resource: AdmissionResource,
        requested: i64,
        used: i64,
        capacity: i64,
    ) -> AdmissionRejection {
        AdmissionRejection {
            resource,
            requested,
            used,
            capacity,
        }
    }

    /// Rows of the scheduler's noderesources `fit_test.go` `TestEnoughRequests` (and kubelet's
    /// former `TestPodFitsResources`): allocatable cpu 10m, memory 20, 32 pods.
    #[test]
    fn enough_requests() {
        use AdmissionResource::{Cpu, Memory};
        let cases: Vec<(&str, PodRequests, Vec<PodRequests>, Vec<AdmissionRejection>)> = vec![
            (
                "no resources requested always fits",
                req(0, 0),
                vec![req(10, 20)],
                vec![],
            ),
            (
                "too many resources fails",
                req(1, 1),
                vec![req(10, 20)],
                vec![rejection(Cpu, 1, 10, 10), rejection(Memory, 1, 20, 20)],
            ),
            ("both resources fit", req(1, 1), vec![req(5, 5)], vec![]),
            (
                "one resource memory fits",
                req(2, 1),
                vec![req(9, 5)],
                vec![rejection(Cpu, 2, 9, 10)],
            ),
            (
                "one resource cpu fits",
                req(1, 2),
                vec![req(5, 19)],
                vec![rejection(Memory, 2, 19, 20)],
            ),
            ("equal edge case", req(5, 1), vec![req(5, 19)], vec![]),
            (
                "requests summed over admitted pods",
                req(3, 1),
                vec![req(4, 1), req(4, 1)],
                vec![rejection(Cpu, 3, 8, 10)],
            ),
            (
                "zero cpu request ignores cpu use",
                req(0, 1),
                vec![req(12, 1)],
                vec![],
            ),
        ];
        for (name, pod, admitted, want) in cases {
            assert_eq!(
                insufficient_resources(&pod, &admitted, &node(10, 20, 32)),
                want,
                "{name}"
            );
            assert_eq!(
                fits(&pod, &admitted, &node(10, 20, 32)),
                want.first().map_or(Ok(()), |r| Err(*r)),
                "{name}"
            );
        }
    }

    /// `TestEnoughRequests` pod-count rows: allocatable pods = 1 with one pod admitted.
    #[test]
    fn too_many_pods() {
        let full = node(10, 20, 1);
        let pods = rejection(AdmissionResource::Pods, 1, 1, 1);
        assert_eq!(
            insufficient_resources(&req(0, 0), &[req(10, 20)], &full),
            vec![pods],
            "even without specified resources, predicate fails when there's no space for additional pod"
        );
        assert_eq!(
            insufficient_resources(&req(1, 1), &[req(5, 5)], &full),
            vec![pods],
            "even if both resources fit, predicate fails when there's no space for additional pod"
        );
        // kubelet reports the first reason: pods before cpu.
        let err = fits(&req(11, 1), &[req(0, 0)], &full).unwrap_err();
        assert_eq!(
            (err.reason(), err.message()),
            (
                "OutOfpods".to_owned(),
                "Node didn't have enough resource: pods, requested: 1, used: 1, capacity: 1"
                    .to_owned()
            )
        );
    }

    #[test]
    fn reasons_and_messages_are_kubelets() {
        let allocatable = node(2000, 4 << 30, 110);
        let err = fits(&req(1500, 0), &[req(1000, 0)], &allocatable).unwrap_err();
        assert_eq!(err.reason(), "OutOfcpu");
        assert_eq!(
            err.message(),
            "Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000"
        );
        let err = fits(&req(100, 3 << 30), &[req(100, 2 << 30)], &allocatable).unwrap_err();
        assert_eq!(err.reason(), "OutOfmemory");
        assert_eq!(
            err.message(),
            "Node didn't have enough resource: memory, requested: 3221225472, used: 2147483648, capacity: 4294967296"
        );
        assert_eq!(
            fits(&req(1000, 2 << 30), &[req(1000, 2 << 30)], &allocatable),
            Ok(())
        );
    }

    /// After a configuration change lowers allocatable below what is already admitted, nothing
    /// requesting that resource fits (the free amount is negative).
    #[test]
    fn over_committed_node_rejects_new_requests() {
        let allocatable = node(1000, 1 << 30, 110);
        let err = fits(&req(1, 0), &[req(1500, 0)], &allocatable).unwrap_err();
        assert_eq!((err.requested, err.used, err.capacity), (1, 1500, 1000));
        assert_eq!(fits(&req(0, 1), &[req(1500, 0)], &allocatable), Ok(()));
    }
}
