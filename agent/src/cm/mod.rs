//! The container manager: QoS tiers, node allocatable, admission, pod lifecycle, reconcile.
pub mod admission;
pub mod allocatable;
pub mod beside_kubelet;
pub mod capacity;
pub mod checkpoint;
pub mod cpu;
pub mod feedback_loop;
pub mod index;
pub mod manager;
pub mod memory;
pub mod metrics;
pub mod pod_resources;
pub mod qos_tiers;
pub mod resource_managers;
pub mod topology_manager;
mod tree;
