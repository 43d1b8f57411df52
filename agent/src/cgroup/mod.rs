//! cgroup filesystem knowledge: which hierarchies are mounted where ([`layout`]) and how a
//! kernel cgroup id maps back to a cgroup path ([`hierarchy`]); cgroup names and their
//! spellings ([`name`]), resource settings ([`resources`]) and the files that hold them
//! ([`files`]), CPU lists ([`cpuset`]), statistics readers ([`stats`]), and the cgroup manager
//! ([`manager`] the interface, [`cgroupfs`] the implementation, with [`v1`] / [`v2`] specifics).
pub mod cgroupfs;
pub mod cpuset;
pub mod files;
pub mod hierarchy;
pub mod layout;
pub mod manager;
pub mod name;
pub mod resources;
pub mod stats;
mod v1;
mod v2;

pub use cgroupfs::{CgroupfsManager, Hierarchies};
pub use cpuset::{CpuListError, CpuSet};
pub use files::{CgroupVersion, Controller, FilesError, Setting};
pub use hierarchy::{CgroupPaths, HierarchyError};
pub use layout::{CgroupLayout, LayoutError, LayoutKind};
pub use manager::{
    CgroupError, CgroupManager, CgroupStats, CreateReport, DestroyReport, NameStyle, Skipped,
    UpdateReport, Written,
};
pub use name::{CgroupName, NameError};
pub use resources::{
    Limit, ResourceConfig, cpu_shares_to_weight, milli_cpu_to_quota, milli_cpu_to_shares,
};
pub use stats::StatsError;
