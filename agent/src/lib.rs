//! qosd: a node agent that runs pod cgroups the way kubelet's container manager does and
//! measures them with eBPF.
//!
//! Modules:
//! - [`cgroup`]: cgroup layout detection and cgroup id -> path resolution.
//! - [`probes`]: the embedded kernel object, BTF offsets, attach-mode selection, map readers.
//! - [`metrics`]: the Prometheus registry, collectors and the HTTP endpoint.
//! - [`check`]: the `qosd check` report.
//! - [`daemon`]: `qosd run`, start-up and clean shutdown.
pub mod cgroup;
pub mod check;
pub mod daemon;
pub mod metrics;
pub mod probes;
