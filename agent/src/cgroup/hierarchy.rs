//! Maps kernel cgroup ids to cgroup paths by walking a mounted hierarchy.
//!
//! A cgroup's id (`kernfs_node.id`, what the kernel programs record) is the inode number of its
//! directory, on v2 and on v1 alike (64-bit kernels), so one `stat` per directory recovers it
//! (the walk is [`super::walk`]'s).
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::walk::Walk;

/// Errors while walking a cgroup hierarchy.
#[derive(Debug, thiserror::Error)]
pub enum HierarchyError {
    #[error("reading cgroup hierarchy root {path}: {source}")]
    Root {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// cgroup id -> path relative to the hierarchy root, written `/a/b` (the root itself is `/`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupPaths {
    by_id: HashMap<u64, String>,
}

impl CgroupPaths {
    /// Walks the hierarchy mounted at `root`. Directories that vanish during the walk (cgroups
    /// removed meanwhile) are skipped; only an unreadable root is an error.
    pub fn scan(root: &Path) -> Result<Self, HierarchyError> {
        let root_error = |source| HierarchyError::Root {
            path: root.to_owned(),
            source,
        };
        let found = super::walk::walk(root, None).map_err(root_error)?;
        Self::from_walk(root, &found)
    }

    /// The ids and paths of a walk of the hierarchy mounted at `root` (an empty walk: the
    /// root is missing).
    pub fn from_walk(root: &Path, found: &Walk) -> Result<Self, HierarchyError> {
        if found.dirs.is_empty() {
            return Err(HierarchyError::Root {
                path: root.to_owned(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            });
        }
        let by_id = found
            .dirs
            .iter()
            .map(|dir| (dir.ino, dir.relative.clone()))
            .collect();
        Ok(Self { by_id })
    }

    /// The path of the cgroup with this id, if it existed at the last scan.
    #[must_use]
    pub fn path(&self, cgroup_id: u64) -> Option<&str> {
        self.by_id.get(&cgroup_id).map(String::as_str)
    }

    /// Every (cgroup id, path) found, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &str)> {
        self.by_id.iter().map(|(id, path)| (*id, path.as_str()))
    }

    /// Number of cgroups found.
    #[must_use]
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// True when the scan found nothing (never the case for a readable root).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    #[test]
    fn ids_are_directory_inodes_with_root_relative_paths() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("kubepods/burstable")).expect("mkdir");
        std::fs::write(root.path().join("kubepods/cpu.shares"), "1024").expect("write file");
        let paths = CgroupPaths::scan(root.path()).expect("scan");
        let ino = |p: &str| std::fs::metadata(root.path().join(p)).expect("stat").ino();
        assert_eq!(paths.path(ino("")), Some("/"));
        assert_eq!(paths.path(ino("kubepods")), Some("/kubepods"));
        assert_eq!(
            paths.path(ino("kubepods/burstable")),
            Some("/kubepods/burstable")
        );
        assert_eq!(paths.len(), 3, "files are not cgroups");
    }

    #[test]
    fn missing_root_names_the_path() {
        let err = CgroupPaths::scan(Path::new("/nonexistent/qosd-test")).expect_err("must fail");
        assert!(err.to_string().contains("/nonexistent/qosd-test"), "{err}");
    }
}
