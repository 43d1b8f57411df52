//! Pods: the pod model, QoS classification, resource quantities and pod sources.
//!
//! - [`model`]: the Pod subset qosd uses, defaults, effective requests;
//! - [`qos`]: kubelet's QoS classes;
//! - [`validate`]: name, uid and resource validation;
//! - [`source`]: the seam every pod source implements ([`source::PodSource`]): pod events
//!   with their origin;
//! - [`manifest`]: the manifest-directory pod source (parse, scan, watch);
//! - [`kubernetes`]: the API server's watch and kubelet's `/pods` as pod sources;
//! - [`quantity`]: Kubernetes resource quantities.
pub mod kubernetes;
pub mod manifest;
pub mod model;
pub mod qos;
pub mod quantity;
pub mod source;
pub mod validate;
