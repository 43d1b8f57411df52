//! qosd: a node agent that runs pod cgroups the way kubelet's container manager does and
//! measures them with eBPF.
//!
//! Modules:
//! - [`cgroup`]: cgroup layout detection and cgroup id -> path resolution.
//! - [`cm`]: the container manager (QoS tiers, node allocatable, admission, lifecycle).
//! - [`config`]: agent configuration and KubeletConfiguration.
//! - [`probes`]: the embedded kernel object, BTF offsets, attach-mode selection, map readers.
//! - [`metrics`]: the Prometheus registry, collectors and the HTTP endpoint.
//! - [`pods`]: pod model, QoS, quantities, pod sources.
//! - [`runtime`]: the standalone runtime (container processes in their cgroups).
//! - [`check`]: the `qosd check` report.
//! - [`daemon`]: `qosd run`, start-up and clean shutdown.
pub mod cgroup;
pub mod check;
pub mod cm;
pub mod config;
pub mod daemon;
pub mod metrics;
pub mod pods;
pub mod probes;
pub mod runtime;
