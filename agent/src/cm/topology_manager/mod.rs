//! The topology manager (kubelet's `pkg/kubelet/cm/topologymanager`): collects NUMA hints from
//! the resource managers ([`hint::HintProvider`]), merges them under a policy (`none`,
//! `best-effort`, `restricted`, `single-numa-node`) and a scope (`container`, `pod`), admits or
//! rejects the pod (`TopologyAffinityError`), hands the chosen affinity to the providers, and
//! remembers it per container.
//!
//! Modules: [`hint`] (the provider interface), [`numa_info`] (nodes and distances), [`merge`]
//! (kubelet's merge without the cross product), [`policy`] (policies and options), [`scope`]
//! (the admission walk). This module owns construction ([`TopologyManager::new`], with
//! kubelet's start-up errors), the affinity store and the admission counters.
pub mod hint;
pub mod merge;
pub mod numa_info;
pub mod policy;
pub mod scope;

use std::collections::BTreeMap;

use crate::machine::{MachineTopology, MaskError};
use crate::pods::model::Pod;

use hint::{HintProvider, TopologyHint};
use numa_info::NumaInfo;
use policy::{Policy, PolicyName, PolicyOptions};
use scope::{PodAdmitResult, ScopeName};

/// Errors configuring the topology manager (kubelet's `NewManager` errors).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyManagerError {
    /// `topologyManagerPolicy` is not a known policy.
    #[error("unknown policy: \"{0}\"")]
    UnknownPolicy(String),
    /// `topologyManagerScope` is not a known scope.
    #[error("unknown scope: \"{0}\"")]
    UnknownScope(String),
    /// An unknown policy option.
    #[error("unknown Topology Manager Policy option: \"{0}\"")]
    UnknownOption(String),
    /// A boolean option with a value Go's `strconv.ParseBool` refuses.
    #[error("bad value for option \"{name}\": \"{value}\"")]
    BadOption {
        /// Option name.
        name: String,
        /// Its value.
        value: String,
    },
    /// An integer option that is not an integer.
    #[error("unable to convert policy option to integer \"{name}\": \"{value}\"")]
    NotAnInteger {
        /// Option name.
        name: String,
        /// Its value.
        value: String,
    },
    /// `max-allowable-numa-nodes` below kubelet's default of 8.
    #[error(
        "the minimum value of \"max-allowable-numa-nodes\" should not be less than {}",
        policy::DEFAULT_MAX_ALLOWABLE_NUMA_NODES
    )]
    MaxAllowableTooSmall,
    /// `prefer-closest-numa-nodes` on a machine whose NUMA distances are unknown.
    #[error("cannot discover NUMA topology: error getting NUMA distances")]
    NoDistances,
    /// More NUMA nodes than `max-allowable-numa-nodes` under a policy other than `none`.
    #[error("unsupported on machines with more than {max} NUMA Nodes")]
    TooManyNumaNodes {
        /// The limit in force.
        max: usize,
    },
    /// A NUMA node id a mask cannot hold.
    #[error("cannot discover NUMA topology: {0}")]
    Mask(#[from] MaskError),
}

/// Admission counters, with kubelet's metric meaning
/// (`topology_manager_admission_requests_total`, `..._errors_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AdmissionCounters {
    /// Admission requests.
    pub requests_total: u64,
    /// Rejections (affinity or allocation errors).
    pub errors_total: u64,
}

/// The topology manager.
#[derive(Debug, Clone)]
pub struct TopologyManager {
    policy: Policy,
    scope: ScopeName,
    /// Chosen affinity by pod uid, then container name.
    affinities: BTreeMap<String, BTreeMap<String, TopologyHint>>,
    counters: AdmissionCounters,
}

impl TopologyManager {
    /// Builds the manager from kubelet's configuration strings (`topologyManagerPolicy`,
    /// `topologyManagerScope`, `topologyManagerPolicyOptions`), checking them in kubelet's
    /// order: options, NUMA discovery, node count, policy, scope.
    pub fn new(
        topology: &MachineTopology,
        policy: &str,
        scope: &str,
        options: &BTreeMap<String, String>,
    ) -> Result<Self, TopologyManagerError> {
        let options = PolicyOptions::parse(options)?;
        let is_none = policy == PolicyName::None.as_str();
        // Policy `none` never merges: it does not need node ids to fit a mask.
        let numa = if is_none {
            NumaInfo::new(&[], &[])?
        } else {
            NumaInfo::from_topology(topology, options.prefer_closest_numa)?
        };
        if !is_none && topology.num_numa_nodes() > options.max_allowable_numa_nodes {
            return Err(TopologyManagerError::TooManyNumaNodes {
                max: options.max_allowable_numa_nodes,
            });
        }
        let policy: PolicyName = policy.parse()?;
        let scope: ScopeName = scope.parse()?;
        Ok(Self::with_policy(Policy::new(policy, numa, options), scope))
    }

    /// A manager with an explicit policy (tests, benchmarks).
    pub fn with_policy(policy: Policy, scope: ScopeName) -> Self {
        TopologyManager {
            policy,
            scope,
            affinities: BTreeMap::new(),
            counters: AdmissionCounters::default(),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The scope.
    pub fn scope(&self) -> ScopeName {
        self.scope
    }

    /// Admission counters so far.
    pub fn counters(&self) -> AdmissionCounters {
        self.counters
    }

    /// Admits or rejects `pod` (kubelet's `manager.Admit`): merges the providers' hints per the
    /// scope, and for an admitted pod has every provider allocate every container (init
    /// containers first) within the chosen hint and records it.
    ///
    /// On rejection nothing is recorded for the pod. Providers may already have allocated
    /// earlier containers of a pod rejected later in the walk (as in kubelet, where the
    /// resource managers drop the state of pods that are not running); the caller releases
    /// them.
    pub fn admit(&mut self, pod: &Pod, providers: &mut [&mut dyn HintProvider]) -> PodAdmitResult {
        self.counters.requests_total += 1;
        let walk = scope::admit(&self.policy, self.scope, pod, providers);
        let uid = pod.uid();
        if walk.result.admit {
            if walk.records {
                let entry = self.affinities.entry(uid).or_default();
                entry.extend(walk.chosen);
            }
        } else {
            self.counters.errors_total += 1;
            self.affinities.remove(&uid);
        }
        walk.result
    }

    /// The affinity chosen for a container (kubelet's `GetAffinity`): the zero hint
    /// `{any, false}` when none was recorded (policy `none`, or unknown container).
    pub fn affinity(&self, pod_uid: &str, container: &str) -> TopologyHint {
        self.affinities
            .get(pod_uid)
            .and_then(|c| c.get(container))
            .copied()
            .unwrap_or_default()
    }

    /// Forgets a container's affinity.
    pub fn remove_container(&mut self, pod_uid: &str, container: &str) {
        if let Some(containers) = self.affinities.get_mut(pod_uid) {
            containers.remove(container);
            if containers.is_empty() {
                self.affinities.remove(pod_uid);
            }
        }
    }

    /// Forgets every affinity of a pod.
    pub fn remove_pod(&mut self, pod_uid: &str) {
        self.affinities.remove(pod_uid);
    }
}

#[cfg(test)]
mod tests;
