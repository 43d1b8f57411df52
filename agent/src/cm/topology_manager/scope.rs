//! Topology manager scopes (kubelet's `scope_container.go`, `scope_pod.go`, `scope_none.go`):
//! which hints are merged (per container, or once per pod), when a pod is rejected, and the
//! order in which providers allocate.
//!
//! This module owns the admission walk and its result ([`PodAdmitResult`]); the store of
//! chosen affinities lives in [`super::TopologyManager`].
use std::fmt;
use std::str::FromStr;

use crate::pods::model::{Container, Pod};

use super::TopologyManagerError;
use super::hint::{AllocationError, HintProvider, ProviderHints, TopologyHint};
use super::policy::{Policy, PolicyName};

/// kubelet's reason for a pod whose resources cannot be aligned.
pub const ERROR_TOPOLOGY_AFFINITY: &str = "TopologyAffinityError";
/// kubelet's message for [`ERROR_TOPOLOGY_AFFINITY`].
pub const TOPOLOGY_AFFINITY_MESSAGE: &str = "Resources cannot be allocated with Topology locality";

/// Where hints are merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScopeName {
    /// One merge per container (init containers first).
    Container,
    /// One merge for the whole pod, its hint applied to every container.
    Pod,
}

impl ScopeName {
    /// kubelet's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ScopeName::Container => "container",
            ScopeName::Pod => "pod",
        }
    }
}

impl fmt::Display for ScopeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ScopeName {
    type Err = TopologyManagerError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "container" => Ok(ScopeName::Container),
            "pod" => Ok(ScopeName::Pod),
            other => Err(TopologyManagerError::UnknownScope(other.to_string())),
        }
    }
}

/// The admission verdict (kubelet's `lifecycle.PodAdmitResult`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodAdmitResult {
    /// Admitted.
    pub admit: bool,
    /// The pod status reason when rejected (`TopologyAffinityError`, or the provider's).
    pub reason: String,
    /// The pod status message when rejected.
    pub message: String,
}

impl PodAdmitResult {
    /// Admitted.
    pub fn admitted() -> Self {
        PodAdmitResult {
            admit: true,
            reason: String::new(),
            message: String::new(),
        }
    }

    /// Rejected with `TopologyAffinityError`.
    pub fn topology_affinity_error() -> Self {
        PodAdmitResult {
            admit: false,
            reason: ERROR_TOPOLOGY_AFFINITY.to_string(),
            message: TOPOLOGY_AFFINITY_MESSAGE.to_string(),
        }
    }

    /// Rejected because a provider failed to allocate.
    pub fn allocation_failed(err: &AllocationError) -> Self {
        PodAdmitResult {
            admit: false,
            reason: err.reason.clone(),
            message: err.message.clone(),
        }
    }
}

/// The containers in admission order: init containers, then app containers.
pub fn containers_in_order(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod.spec
        .init_containers
        .iter()
        .chain(pod.spec.containers.iter())
}

/// What an admission walk decided, for the manager to record.
pub(super) struct Walk {
    pub(super) result: PodAdmitResult,
    /// (container name, hint) for every container whose hint was chosen, in order.
    pub(super) chosen: Vec<(String, TopologyHint)>,
    /// Whether this walk records hints (policy `none` does not).
    pub(super) records: bool,
}

fn allocate_all(
    pod: &Pod,
    container: &Container,
    hint: &TopologyHint,
    providers: &mut [&mut dyn HintProvider],
) -> Result<(), AllocationError> {
    for provider in providers.iter_mut() {
        provider.allocate(pod, container, hint)?;
    }
    Ok(())
}

/// Runs the admission walk of `scope` under `policy`.
pub(super) fn admit(
    policy: &Policy,
    scope: ScopeName,
    pod: &Pod,
    providers: &mut [&mut dyn HintProvider],
) -> Walk {
    let mut chosen = Vec::new();
    if policy.name() == PolicyName::None {
        // kubelet's noneScope: allocate without a hint, record nothing.
        let hint = TopologyHint::default();
        for container in containers_in_order(pod) {
            if let Err(err) = allocate_all(pod, container, &hint, providers) {
                return Walk {
                    result: PodAdmitResult::allocation_failed(&err),
                    chosen,
                    records: false,
                };
            }
        }
        return Walk {
            result: PodAdmitResult::admitted(),
            chosen,
            records: false,
        };
    }
    let pod_hint = match scope {
        ScopeName::Container => None,
        ScopeName::Pod => {
            let hints: Vec<ProviderHints> = providers.iter().map(|p| p.pod_hints(pod)).collect();
            let (hint, admit) = policy.merge(&hints);
            tracing::debug!(pod = %pod.full_name(), ?hint, admit, "pod topology hint");
            if !admit {
                return Walk {
                    result: PodAdmitResult::topology_affinity_error(),
                    chosen,
                    records: true,
                };
            }
            Some(hint)
        }
    };
    for container in containers_in_order(pod) {
        let hint = match pod_hint {
            Some(hint) => hint,
            None => {
                let hints: Vec<ProviderHints> =
                    providers.iter().map(|p| p.hints(pod, container)).collect();
                let (hint, admit) = policy.merge(&hints);
                tracing::debug!(
                    pod = %pod.full_name(),
                    container = %container.name,
                    ?hint,
                    admit,
                    "container topology hint"
                );
                if !admit {
                    return Walk {
                        result: PodAdmitResult::topology_affinity_error(),
                        chosen,
                        records: true,
                    };
                }
                hint
            }
        };
        chosen.push((container.name.clone(), hint));
        if let Err(err) = allocate_all(pod, container, &hint, providers) {
            return Walk {
                result: PodAdmitResult::allocation_failed(&err),
                chosen,
                records: true,
            };
        }
    }
    Walk {
        result: PodAdmitResult::admitted(),
        chosen,
        records: true,
    }
}
