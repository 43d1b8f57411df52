//! qosd: a node agent that runs pod cgroups the way kubelet's container manager does and
//! measures them with eBPF.
//!
//! Modules:
//! - [`cgroup`]: cgroup layout detection and cgroup id -> path resolution.
//! - [`cm`]: the container manager (QoS tiers, node allocatable, admission, lifecycle).
//! - [`config`]: agent configuration and KubeletConfiguration.
//! - [`feedback`]: policies that turn measurements into cgroup decisions, explained and logged.
//! - [`probes`]: the embedded kernel object, BTF offsets, attach-mode selection, map readers.
//! - [`metrics`]: the Prometheus registry, collectors and the HTTP endpoint.
//! - [`machine`]: machine topology (packages, NUMA nodes, cores, threads, caches) and NUMA masks.
//! - [`numa`]: the kernel's NUMA layout (CPU and page frame -> node) and a cgroup's memory per
//!   node with its locality.
//! - [`pods`]: pod model, QoS, quantities, pod sources.
//! - [`runtime`]: the standalone runtime (container processes in their cgroups).
//! - [`standalone`]: standalone mode, the container manager fed from a manifest directory.
//! - [`kubernetes`]: Kubernetes mode, qosd beside kubelet, fed from the API server or kubelet.
//! - [`check`]: the `qosd check` report.
//! - [`report`]: the document `/inspect` serves (tables and JSON).
//! - [`inspect`]: `qosd inspect`, the client side of the agent's `/inspect` endpoint.
//! - [`daemon`]: `qosd run`, start-up and clean shutdown.
pub mod cgroup;
pub mod check;
pub mod cm;
pub mod config;
pub mod daemon;
pub mod feedback;
pub mod inspect;
pub mod kubernetes;
pub mod machine;
pub mod metrics;
pub mod numa;
pub mod pods;
pub mod probes;
pub mod report;
pub mod runtime;
pub mod standalone;
