//! The hint-provider interface between the topology manager and the resource managers (CPU,
//! memory, devices): [`TopologyHint`], [`ProviderHints`], [`HintProvider`] and
//! [`AllocationError`]. This is kubelet's `topologymanager.HintProvider` with one change: the
//! affinity chosen at admission is passed to [`HintProvider::allocate`] instead of being read
//! back from the manager's store.
//!
//! This module owns these types only; merging is in [`super::merge`], policies in
//! [`super::policy`].
use std::collections::BTreeMap;
use std::fmt;

use crate::pods::model::{Container, Pod};

pub use crate::machine::bitmask::{MaskError, NumaMask};

/// A provider's placement option for one resource: the NUMA nodes it could be satisfied from,
/// and whether that placement is preferred (typically: the narrowest possible).
///
/// `affinity: None` means "any node" (kubelet's `nil` mask).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TopologyHint {
    pub affinity: Option<NumaMask>,
    pub preferred: bool,
}

impl TopologyHint {
    /// A hint on `mask`.
    pub const fn new(mask: NumaMask, preferred: bool) -> Self {
        TopologyHint {
            affinity: Some(mask),
            preferred,
        }
    }

    /// The "no preference" hint (`{nil, true}`): any node will do.
    pub const fn any() -> Self {
        TopologyHint {
            affinity: None,
            preferred: true,
        }
    }
}

impl fmt::Debug for TopologyHint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.affinity {
            Some(mask) => write!(f, "{{{mask:?}, preferred: {}}}", self.preferred),
            None => write!(f, "{{any, preferred: {}}}", self.preferred),
        }
    }
}

/// One provider's hints, by resource name (`cpu`, `memory`, `hugepages-1Gi`, ...).
///
/// The value distinguishes what kubelet distinguishes with `nil` and empty slices:
/// - `None`: no preference for this resource (kubelet's `nil` slice), merged as `{any, true}`;
/// - `Some(vec![])`: the resource cannot be placed anywhere (kubelet's empty slice), merged as
///   `{any, false}`;
/// - `Some(hints)`: the options.
///
/// An empty map means the provider has no preference at all (merged as `{any, true}`).
pub type ProviderHints = BTreeMap<String, Option<Vec<TopologyHint>>>;

/// A resource manager that can say where it could place a container's (or pod's) resources,
/// and then place them where the topology manager decided.
///
/// The topology manager calls, per admission: [`hints`](Self::hints) (container scope) or
/// [`pod_hints`](Self::pod_hints) (pod scope) on every provider, merges, and if the pod is
/// admitted calls [`allocate`](Self::allocate) for each container (init containers first), with
/// the merged hint (for pod scope the pod's hint, for policy `none` `{any, false}`).
pub trait HintProvider {
    /// A short name for logs and metrics (`cpu`, `memory`).
    fn name(&self) -> &str;

    /// Hints for one container (kubelet's `GetTopologyHints`).
    fn hints(&self, pod: &Pod, container: &Container) -> ProviderHints;

    /// Hints for the whole pod (kubelet's `GetPodTopologyHints`).
    fn pod_hints(&self, pod: &Pod) -> ProviderHints;

    /// Allocates the container's resources within `affinity` (kubelet's `Allocate`, which reads
    /// the same hint from the manager's store).
    fn allocate(
        &mut self,
        pod: &Pod,
        container: &Container,
        affinity: &TopologyHint,
    ) -> Result<(), AllocationError>;
}

/// kubelet's reason for an allocation that failed for a reason the provider did not classify.
pub const REASON_UNEXPECTED: &str = "UnexpectedAdmissionError";

/// A failed [`HintProvider::allocate`], carrying the pod status reason and message kubelet
/// would set (kubelet's `admission.Error`: `Type()` and `Error()`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct AllocationError {
    /// The pod status reason (`SMTAlignmentError`, `UnexpectedAdmissionError`, ...).
    pub reason: String,
    /// The pod status message.
    pub message: String,
}

impl AllocationError {
    /// An error with its own reason (kubelet's typed admission errors).
    pub fn new(reason: impl Into<String>, message: impl Into<String>) -> Self {
        AllocationError {
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// Any other failure, worded as kubelet's `unexpectedAdmissionError`:
    /// `Allocate failed due to <err>, which is unexpected`.
    pub fn unexpected(err: impl fmt::Display) -> Self {
        AllocationError {
            reason: REASON_UNEXPECTED.to_string(),
            message: format!("Allocate failed due to {err}, which is unexpected"),
        }
    }
}
