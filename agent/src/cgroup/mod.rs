//! cgroup filesystem knowledge: which hierarchies are mounted where ([`layout`]) and how a
//! kernel cgroup id maps back to a cgroup path ([`hierarchy`]), through the one tree walker
//! ([`walk`]), whose live trees keep directories and their files open ([`open_dir`]); cgroup names and their spellings ([`name`]), resource settings ([`resources`])
//! and the files that hold them ([`files`]), CPU lists ([`cpuset`]), statistics readers
//! ([`stats`]) and the CFS counters of the whole tree ([`cfs`]), and the cgroup backends ([`backend`] the read and write interfaces,
//! [`cgroupfs`] the implementation on cgroupfs, with [`v1`] / [`v2`] specifics, and
//! [`systemd`] the one that asks systemd over D-Bus and reads through cgroupfs).
//!
//! This folder and the container manager are the only code that opens a cgroup file for
//! writing (`agent/tests/one_writer.rs` fails otherwise).
pub mod backend;
pub mod cfs;
pub mod cgroupfs;
pub mod cpuset;
#[cfg(test)]
pub mod fault;
pub mod files;
pub mod hierarchy;
pub mod layout;
pub mod name;
pub mod open_dir;
pub mod resources;
pub mod settings_writer;
pub mod stats;
pub mod systemd;
pub mod trees;
mod v1;
mod v2;
pub mod walk;

pub use backend::{
    CgroupError, CgroupJoin, CgroupJoiner, CgroupReader, CgroupStats, CgroupWriter, CreateReport,
    DestroyReport, Difference, NameStyle, Placement, Skipped, StatKinds, UpdateReport, Written,
};
pub use cgroupfs::{CgroupfsBackend, Hierarchies};
pub use cpuset::{CpuListError, CpuSet};
pub use files::{CgroupVersion, Controller, FilesError, Setting};
pub use hierarchy::{CgroupPaths, HierarchyError};
pub use layout::{CgroupLayout, LayoutError, LayoutKind};
pub use name::{CgroupName, NameError};
pub use resources::{
    Limit, ResourceConfig, cpu_shares_to_weight, milli_cpu_to_quota, milli_cpu_to_shares,
};
pub use stats::StatsError;
