//! The cgroup tree qosd's container manager builds under a test root, read the way each
//! cgroup layout spells it, and the cleanup that removes whatever a failed case left behind.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use qosd::cgroup::CgroupLayout;

/// Files a case writes outside cgroupfs (manifests, config, container logs), removed on drop.
pub(crate) struct TempPaths(pub Vec<PathBuf>);

impl Drop for TempPaths {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_dir_all(path).or_else(|_| std::fs::remove_file(path));
        }
    }
}

/// Where the test's cgroups live in each hierarchy, and how to read a setting on this layout.
pub(crate) struct Hierarchies {
    pub layout: CgroupLayout,
    /// The test root's name: qosd's `--cgroup-root` is `/<root_name>`.
    pub root_name: String,
}

impl Hierarchies {
    /// A uniquely named test root `<prefix>-<pid>-<nanos>` on the detected layout (created by
    /// qosd, not here).
    pub(crate) fn new(prefix: &str) -> Result<Self, String> {
        let layout = CgroupLayout::detect().map_err(|e| e.to_string())?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        Ok(Self {
            layout,
            root_name: format!("{prefix}-{}-{nanos}", std::process::id()),
        })
    }

    /// Mount points of the hierarchies the container manager writes.
    pub(crate) fn mounts(&self) -> Vec<PathBuf> {
        match &self.layout.unified {
            Some(u) if self.layout.v1.is_empty() => vec![u.clone()],
            _ => {
                let mut mounts: Vec<PathBuf> = ["cpu", "cpuacct", "cpuset", "memory", "pids"]
                    .iter()
                    .filter_map(|c| self.layout.v1.get(*c).cloned())
                    .collect();
                mounts.dedup();
                mounts
            }
        }
    }

    pub(crate) fn v2(&self) -> bool {
        self.layout.v1.is_empty()
    }

    /// Path of `relative` (under the test root) in the hierarchy holding `controller`.
    pub(crate) fn path(&self, controller: &str, relative: &str) -> PathBuf {
        let mount = if self.v2() {
            self.layout.unified.clone().unwrap_or_default()
        } else {
            self.layout.v1.get(controller).cloned().unwrap_or_default()
        };
        mount
            .join(&self.root_name)
            .join(relative.trim_start_matches('/'))
    }

    pub(crate) fn read(
        &self,
        controller: &str,
        relative: &str,
        file: &str,
    ) -> Result<String, String> {
        let path = self.path(controller, relative).join(file);
        std::fs::read_to_string(&path)
            .map(|s| s.trim().to_owned())
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// (controller, file, expected) for cpu weight and limit and memory limit on this layout.
    pub(crate) fn expected(
        &self,
        shares: u64,
        quota_us: Option<u64>,
        memory: Option<u64>,
    ) -> Vec<(&'static str, &'static str, String)> {
        if self.v2() {
            let weight = 1 + ((shares - 2) * 9999) / 262_142;
            vec![
                ("cpu", "cpu.weight", weight.to_string()),
                (
                    "cpu",
                    "cpu.max",
                    quota_us.map_or("max 100000".to_owned(), |q| format!("{q} 100000")),
                ),
                (
                    "memory",
                    "memory.max",
                    memory.map_or("max".to_owned(), |m| m.to_string()),
                ),
            ]
        } else {
            let mut v = vec![
                ("cpu", "cpu.shares", shares.to_string()),
                (
                    "cpu",
                    "cpu.cfs_quota_us",
                    quota_us.map_or("-1".to_owned(), |q| q.to_string()),
                ),
            ];
            if let Some(m) = memory {
                v.push(("memory", "memory.limit_in_bytes", m.to_string()));
            }
            v
        }
    }

    pub(crate) fn check(&self, relative: &str, expected: &[(&str, &str, String)]) -> Vec<String> {
        expected
            .iter()
            .filter_map(
                |(controller, file, want)| match self.read(controller, relative, file) {
                    Ok(got) if &got == want => None,
                    Ok(got) => Some(format!("{relative}/{file} = {got}, want {want}")),
                    Err(e) => Some(e),
                },
            )
            .collect()
    }

    /// Directories left under the test root in any hierarchy mounted, not only those the
    /// container manager writes (runc makes a container's cgroup in every one: blkio, devices,
    /// freezer, name=systemd, the unified hierarchy of a hybrid layout).
    pub(crate) fn leftovers(&self) -> Vec<PathBuf> {
        let mut mounts = self.mounts();
        for mount in every_cgroup_mount() {
            if !mounts.contains(&mount) {
                mounts.push(mount);
            }
        }
        existing_in(&mounts, &self.root_name)
    }
}

/// `top` in each of `mounts`, where it exists.
fn existing_in(mounts: &[PathBuf], top: &str) -> Vec<PathBuf> {
    mounts
        .iter()
        .map(|m| m.join(top))
        .filter(|p| p.exists())
        .collect()
}

impl Drop for Hierarchies {
    /// Last-resort cleanup when a case fails half-way: kill what is left, remove deepest first.
    fn drop(&mut self) {
        remove_trees(&self.leftovers());
    }
}

/// Removes the cgroup `top` (a directory at the top of a hierarchy, as a systemd slice of the
/// root is) from every hierarchy mounted: what systemd leaves when it stops a slice (on the
/// hybrid layout, the cpuset directories qosd made below it).
pub(crate) fn remove_top_cgroup(top: &str) {
    remove_trees(&existing_in(&every_cgroup_mount(), top));
}

/// Kills the processes of every cgroup below each of `roots` and removes them, deepest first.
fn remove_trees(roots: &[PathBuf]) {
    for root in roots {
        let mut dirs = Vec::new();
        collect_dirs(root, &mut dirs);
        for dir in dirs.iter().rev() {
            if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                for pid in procs
                    .split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok())
                {
                    // SAFETY: kill(2) on pids listed in our own test cgroup.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        std::thread::sleep(Duration::from_millis(200));
        for dir in dirs.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Every cgroup (v1) and cgroup2 mount point in this process's mount namespace.
fn every_cgroup_mount() -> Vec<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount = left.split_whitespace().nth(4)?;
            let fs_type = right.split_whitespace().next()?;
            matches!(fs_type, "cgroup" | "cgroup2").then(|| PathBuf::from(mount))
        })
        .collect();
    mounts.dedup();
    mounts
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_owned());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&e.path(), out);
            }
        }
    }
}

/// Polls `f` every 200 ms until it succeeds or `within` has passed (then its last error).
pub(crate) fn wait_for<T>(
    what: &str,
    within: Duration,
    mut f: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + within;
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() > deadline => return Err(format!("{what}: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}
