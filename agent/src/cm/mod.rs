//! The container manager: QoS tiers, node allocatable, admission, pod lifecycle, reconcile.
pub mod admission;
pub mod allocatable;
pub mod index;
