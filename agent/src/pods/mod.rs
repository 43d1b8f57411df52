//! Pods: the pod model, QoS classification, resource quantities and pod sources.
pub mod quantity;
