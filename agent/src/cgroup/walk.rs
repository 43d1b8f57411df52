//! The one walker of cgroup directory trees: every place that lists cgroups (id -> path
//! resolution, destroy and process listing, children, the throttling and NUMA readers) goes
//! through [`walk`], so they agree on what a cgroup is (a directory, links not followed) and on
//! what a cgroup removed during the walk means (it is skipped, not an error).
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// One cgroup directory found by [`walk`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupDir {
    pub path: PathBuf,
    /// Path relative to the walk's root, written `/a/b` (the root itself is `/`).
    pub relative: String,
    /// 0 for the root.
    pub depth: usize,
    /// The directory's inode: the kernel's cgroup id on cgroupfs (64-bit kernels).
    pub ino: u64,
}

/// What [`walk`] found.
#[derive(Debug, Default)]
pub struct Walk {
    /// Parents before their children; empty when the root does not exist.
    pub dirs: Vec<CgroupDir>,
    /// Directories that exist but could not be listed (their children are missing from
    /// `dirs`), with the error.
    pub unreadable: Vec<(PathBuf, io::Error)>,
}

/// Lists `root` and every directory below it, at most `max_depth` levels down (`None`: all).
/// A root that does not exist gives an empty walk; one that cannot be read is an error.
/// Directories removed meanwhile are skipped.
pub fn walk(root: &Path, max_depth: Option<usize>) -> io::Result<Walk> {
    let meta = match std::fs::metadata(root) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Walk::default()),
        Err(e) => return Err(e),
    };
    let mut out = Walk::default();
    let first = std::fs::read_dir(root)?;
    out.dirs.push(CgroupDir {
        path: root.to_owned(),
        relative: "/".to_owned(),
        depth: 0,
        ino: meta.ino(),
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
            let Ok(meta) = entry.metadata() else {
                // Removed meanwhile.
                continue;
            };
            let child_relative = format!("{relative}/{}", entry.file_name().to_string_lossy());
            let path = entry.path();
            out.dirs.push(CgroupDir {
                path: path.clone(),
                relative: child_relative.clone(),
                depth: depth + 1,
                ino: meta.ino(),
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
}
