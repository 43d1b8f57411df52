//! The one walker of cgroup directory trees: every place that lists cgroups (id -> path
//! resolution, destroy and process listing, children, the throttling and NUMA readers) goes
//! through [`walk`], so they agree on what a cgroup is (a directory, links not followed) and on
//! what a cgroup removed during the walk means (it is skipped, not an error).
//!
//! [`super::trees::CgroupTrees`] keeps the readers' whole-hierarchy trees live from one walk.
use std::io;
use std::os::unix::fs::{DirEntryExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::open_dir::OpenDir;
use super::stats::read_kernel_file;

/// One cgroup directory found by [`walk`].
#[derive(Clone, Debug)]
pub struct CgroupDir {
    pub path: PathBuf,
    /// Path relative to the walk's root, written `/a/b` (the root itself is `/`).
    pub relative: String,
    /// 0 for the root.
    pub depth: usize,
    /// The directory's inode: the kernel's cgroup id on cgroupfs (64-bit kernels).
    pub ino: u64,
    /// The directory, open, where the tree keeps it (live trees): its files are then opened
    /// relative to it, one path step instead of the whole path, and kept open for the next read.
    pub handle: Option<Arc<OpenDir>>,
}

impl PartialEq for CgroupDir {
    /// The same directory; whether a descriptor is held does not matter.
    fn eq(&self, other: &Self) -> bool {
        (&self.path, &self.relative, self.depth, self.ino)
            == (&other.path, &other.relative, other.depth, other.ino)
    }
}

impl Eq for CgroupDir {}

impl CgroupDir {
    /// The text of the file `name` in this cgroup, `None` when it does not exist (as
    /// [`read_kernel_file`]).
    pub fn read(&self, name: &str) -> io::Result<Option<String>> {
        match &self.handle {
            Some(dir) => dir.read(name),
            None => read_kernel_file(&self.path.join(name)),
        }
    }
}

/// What [`walk`] found.
#[derive(Debug)]
pub struct Walk {
    /// Parents before their children; empty when the root does not exist.
    pub dirs: Vec<CgroupDir>,
    /// Directories that exist but could not be listed (their children are missing from
    /// `dirs`), with the error.
    pub unreadable: Vec<(PathBuf, io::Error)>,
    /// When the walk began: a cgroup removed before then is not in it.
    pub started: Instant,
}

impl Walk {
    fn empty(started: Instant) -> Self {
        Self {
            dirs: Vec::new(),
            unreadable: Vec::new(),
            started,
        }
    }
}

/// Lists `root` and every directory below it, at most `max_depth` levels down (`None`: all).
/// A root that does not exist gives an empty walk; one that cannot be read is an error.
/// A directory removed between its parent's listing and its own is listed without children
/// (as if it had been removed just after the walk). Costs per directory one open, its
/// `getdents64` calls and a close: no stat, the ids come from the directory entries (kernfs
/// gives a cgroup's id there as in `stat`; a directory something is mounted on would give the
/// id of the directory underneath, which cannot happen inside a cgroup hierarchy's tree).
pub fn walk(root: &Path, max_depth: Option<usize>) -> io::Result<Walk> {
    let started = Instant::now();
    let meta = match std::fs::metadata(root) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Walk::empty(started)),
        Err(e) => return Err(e),
    };
    let mut out = Walk::empty(started);
    let first = std::fs::read_dir(root)?;
    out.dirs.push(CgroupDir {
        path: root.to_owned(),
        relative: "/".to_owned(),
        depth: 0,
        ino: meta.ino(),
        handle: None,
    });
    let mut pending = vec![(first, String::new(), 0usize)];
    while let Some((entries, relative, depth)) = pending.pop() {
        if max_depth.is_some_and(|max| depth >= max) {
            continue;
        }
        for entry in entries {
            let Ok(entry) = entry else {
                continue;
            };
            // DirEntry::file_type does not follow links: a link is never a cgroup.
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let child_relative = format!("{relative}/{}", entry.file_name().to_string_lossy());
            let path = entry.path();
            out.dirs.push(CgroupDir {
                path: path.clone(),
                relative: child_relative.clone(),
                depth: depth + 1,
                // The inode number getdents gave: kernfs reports the node's id there as in
                // stat, so no stat per directory.
                ino: entry.ino(),
                handle: None,
            });
            if max_depth.is_some_and(|max| depth + 1 >= max) {
                continue;
            }
            match std::fs::read_dir(&path) {
                Ok(children) => pending.push((children, child_relative, depth + 1)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => out.unreadable.push((path, e)),
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relatives(walk: &Walk) -> Vec<(String, usize)> {
        let mut found: Vec<_> = walk
            .dirs
            .iter()
            .map(|d| (d.relative.clone(), d.depth))
            .collect();
        found.sort();
        found
    }

    #[test]
    fn lists_directories_with_depth_and_skips_files_and_links() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("a/b/c")).expect("mkdir");
        std::fs::create_dir(root.path().join("d")).expect("mkdir");
        std::fs::write(root.path().join("a/cpu.max"), "max").expect("file");
        std::os::unix::fs::symlink(root.path().join("a"), root.path().join("link")).expect("ln");
        let walk = walk(root.path(), None).expect("walk");
        assert_eq!(
            relatives(&walk),
            [
                ("/".into(), 0),
                ("/a".into(), 1),
                ("/a/b".into(), 2),
                ("/a/b/c".into(), 3),
                ("/d".into(), 1)
            ]
        );
        assert!(walk.unreadable.is_empty());
        let parents_first = walk
            .dirs
            .iter()
            .position(|d| d.relative == "/a")
            .expect("a")
            < walk
                .dirs
                .iter()
                .position(|d| d.relative == "/a/b")
                .expect("b");
        assert!(parents_first);
    }

    #[test]
    fn depth_limit_and_a_missing_root() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("a/b")).expect("mkdir");
        let one = walk(root.path(), Some(1)).expect("walk");
        assert_eq!(relatives(&one), [("/".into(), 0), ("/a".into(), 1)]);
        let gone = walk(&root.path().join("nope"), None).expect("missing root is empty");
        assert!(gone.dirs.is_empty());
    }

    #[test]
    fn ids_from_directory_entries_are_the_inodes_stat_reports() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("a/b")).expect("mkdir");
        // And on the real cgroupfs where there is one (kernfs gives the node id in both).
        let roots = [
            root.path().to_owned(),
            PathBuf::from("/sys/fs/cgroup/cpu"),
            PathBuf::from("/sys/fs/cgroup"),
        ];
        for dir in roots.iter().filter(|r| r == &root.path() || is_cgroupfs(r)) {
            let found = walk(dir, Some(2)).expect("walk");
            assert!(!found.dirs.is_empty(), "{}", dir.display());
            for d in &found.dirs {
                if let Ok(meta) = std::fs::metadata(&d.path) {
                    assert_eq!(d.ino, meta.ino(), "{}", d.path.display());
                }
            }
        }
    }

    fn is_cgroupfs(dir: &Path) -> bool {
        let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
            return false;
        };
        // SAFETY: statfs(2) reads the NUL-terminated path and fills the zeroed struct we own.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: as above; both pointers are valid for the call.
        let rc = unsafe { libc::statfs(c.as_ptr(), &raw mut fs) };
        rc == 0
            && matches!(
                fs.f_type,
                libc::CGROUP_SUPER_MAGIC | libc::CGROUP2_SUPER_MAGIC
            )
    }
}
