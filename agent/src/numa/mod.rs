//! The machine's NUMA layout as the kernel reports it, and where a cgroup's memory lives.
//!
//! This module owns the user-space half of qosd's cross-NUMA view:
//! - [`node_layout`]: which node each CPU belongs to (`/sys/devices/system/node/node*/cpulist`) and
//!   which node each physical page frame belongs to (memory blocks under
//!   `/sys/devices/system/node/node*/memory*`, else `/proc/zoneinfo` zone spans), as the
//!   tables the kernel programs look up ([`qosd_common::NumaConfig`]);
//! - [`memory`]: a cgroup's resident memory per node from `memory.numa_stat` (v1 and v2
//!   formats) and its locality against the nodes of the cgroup's CPUs
//!   (`cpuset.cpus.effective`, v1 `cpuset.effective_cpus`);
//! - [`migrate`]: moving a process's pages to one node (`migrate_pages(2)`);
//! - [`placement`]: where each cgroup's tasks ran, CPU time per node from the cpu-time
//!   probe's per-CPU counters, over recent windows.
//!
//! The machine topology for the resource managers (packages, cores, caches) comes from hwloc in
//! [`crate::machine`]; this module reads the kernel's own files because the probes need the
//! page-frame ranges hwloc does not give, and the kernel's numbering is what the probes see.
pub mod memory;
pub mod migrate;
pub mod node_layout;
pub mod placement;

pub use memory::{CgroupNumaMemory, MemoryError, NumaMemoryReader, NumaStat};
pub use node_layout::{NodeLayout, NodeLayoutError, RangeSource};

/// The machine's NUMA layout and where cgroups ran, as the container managers' feedback takes
/// them (both `None` where unreadable or on one node).
#[derive(Clone, Debug, Default)]
pub struct NumaContext {
    pub layout: Option<NodeLayout>,
    pub placement: Option<placement::CpuPlacement>,
}

/// Whether memory (or an event) is on the node of the CPU that uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Locality {
    Local,
    Remote,
}

impl Locality {
    /// The `locality` label value.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Remote => "remote",
        }
    }
}
