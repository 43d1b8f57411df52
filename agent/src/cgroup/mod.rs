//! cgroup filesystem knowledge: which hierarchies are mounted where ([`layout`]) and how a
//! kernel cgroup id maps back to a cgroup path ([`hierarchy`]).
pub mod hierarchy;
pub mod layout;

pub use hierarchy::{CgroupPaths, HierarchyError};
pub use layout::{CgroupLayout, LayoutError, LayoutKind};
