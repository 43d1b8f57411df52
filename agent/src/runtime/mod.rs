//! The standalone container runtime: runs each container's `command`/`args`/`env` as a plain
//! process placed in its container cgroup (no images, no namespaces). It is the runtime for
//! single machines and tests; on Kubernetes the node's CRI runtime runs containers instead.
//!
//! - [`process`]: start a process inside given cgroups, signal its process group.
//! - [`supervisor`]: restart policy with kubelet's back-off, graceful stop (SIGTERM, then
//!   SIGKILL after the grace period).
pub mod backoff;
pub mod process;
pub mod supervisor;

pub use supervisor::{ContainerKey, ContainerSpec, ContainerState, RestartPolicy, Supervisor};
