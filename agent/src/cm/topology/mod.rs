//! The topology manager (kubelet's `pkg/kubelet/cm/topologymanager`): collects NUMA hints from
//! the resource managers ([`hint::HintProvider`]), merges them under a policy (`none`,
//! `best-effort`, `restricted`, `single-numa-node`) and a scope (`container`, `pod`), admits or
//! rejects the pod (`TopologyAffinityError`), and hands the chosen affinity to the providers.
pub mod hint;
