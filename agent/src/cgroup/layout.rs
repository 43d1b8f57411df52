//! Detects the cgroup layout of the running system from `/proc/self/mountinfo`: pure v1, hybrid
//! (v1 controllers plus a cgroup2 mount without them) or unified v2, and where each is mounted.
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Errors while reading the mount table.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: no cgroup or cgroup2 filesystem is mounted")]
    NoCgroups { path: PathBuf },
}

/// The three shapes a Linux host's cgroups come in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutKind {
    /// Only cgroup v1 hierarchies.
    V1,
    /// cgroup v1 controllers plus a cgroup2 mount (systemd's "hybrid" mode).
    Hybrid,
    /// Only cgroup v2.
    Unified,
}

impl fmt::Display for LayoutKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::V1 => "v1",
            Self::Hybrid => "hybrid",
            Self::Unified => "v2",
        })
    }
}

/// Where the cgroup hierarchies of this system are mounted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupLayout {
    pub kind: LayoutKind,
    /// Mount point of the cgroup2 filesystem, if any.
    pub unified: Option<PathBuf>,
    /// v1 controller (or `name=` hierarchy) -> mount point. Co-mounted controllers
    /// (`cpu,cpuacct`) appear once per controller with the same mount point.
    pub v1: BTreeMap<String, PathBuf>,
}

/// The v1 mount options that are not controller names.
const V1_NON_CONTROLLER_OPTIONS: &[&str] = &[
    "rw",
    "ro",
    "nosuid",
    "nodev",
    "noexec",
    "relatime",
    "noatime",
    "nodiratime",
    "strictatime",
    "xattr",
    "clone_children",
    "noprefix",
    "cpuset_v2_mode",
    "favordynmods",
];

impl CgroupLayout {
    /// Reads the layout of the calling process's mount namespace.
    pub fn detect() -> Result<Self, LayoutError> {
        Self::from_mountinfo_file(Path::new("/proc/self/mountinfo"))
    }

    /// Reads the layout from a mountinfo file (a fixture in tests).
    pub fn from_mountinfo_file(path: &Path) -> Result<Self, LayoutError> {
        let text = std::fs::read_to_string(path).map_err(|source| LayoutError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse_mountinfo(&text).ok_or_else(|| LayoutError::NoCgroups {
            path: path.to_owned(),
        })
    }

    /// Parses mountinfo text; `None` when no cgroup filesystem is mounted.
    ///
    /// Format (proc(5)): `id parent major:minor root mount-point options [optional...] - fstype
    /// source super-options`.
    #[must_use]
    pub fn parse_mountinfo(text: &str) -> Option<Self> {
        let mut unified = None;
        let mut v1 = BTreeMap::new();
        for line in text.lines() {
            let Some((pre, post)) = line.split_once(" - ") else {
                continue;
            };
            let mut post_fields = post.split_whitespace();
            let fstype = post_fields.next().unwrap_or_default();
            let super_options = post_fields.nth(1).unwrap_or_default();
            let Some(mount_point) = pre.split_whitespace().nth(4) else {
                continue;
            };
            let mount_point = PathBuf::from(unescape_octal(mount_point));
            match fstype {
                "cgroup2" => {
                    unified.get_or_insert(mount_point);
                }
                "cgroup" => {
                    for option in super_options.split(',') {
                        if V1_NON_CONTROLLER_OPTIONS.contains(&option)
                            || option.starts_with("release_agent=")
                        {
                            continue;
                        }
                        v1.entry(option.to_owned())
                            .or_insert_with(|| mount_point.clone());
                    }
                }
                _ => {}
            }
        }
        let kind = match (unified.is_some(), v1.is_empty()) {
            (false, true) => return None,
            (true, true) => LayoutKind::Unified,
            (true, false) => LayoutKind::Hybrid,
            (false, false) => LayoutKind::V1,
        };
        Some(Self { kind, unified, v1 })
    }

    /// The hierarchy whose cgroups qosd attributes CPU time to: the v1 cpu controller's mount
    /// when there is one, the unified hierarchy otherwise.
    #[must_use]
    pub fn cpu_hierarchy(&self) -> Option<&Path> {
        self.v1
            .get("cpu")
            .map(PathBuf::as_path)
            .or(self.unified.as_deref())
    }

    /// True when CPU time is attributed through the v1 cpu controller's css.
    #[must_use]
    pub fn uses_v1_cpu_controller(&self) -> bool {
        self.v1.contains_key("cpu")
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\NNN` octal.
fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(value) = field
                .get(i + 1..i + 4)
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        {
            out.push(value);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mount table of the development host: v1 controllers each on their own mount, a named
    /// systemd hierarchy, and an empty cgroup2 at /sys/fs/cgroup/unified.
    const HYBRID: &str = "\
25 30 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:24 / /sys/fs/cgroup/systemd rw,nosuid shared:11 - cgroup cgroup rw,xattr,name=systemd
28 25 0:25 / /sys/fs/cgroup/cpu rw,relatime shared:12 - cgroup cgroup rw,cpu
29 25 0:26 / /sys/fs/cgroup/cpuacct rw,relatime shared:13 - cgroup cgroup rw,cpuacct
30 25 0:27 / /sys/fs/cgroup/memory rw,relatime shared:14 - cgroup cgroup rw,memory
";

    const COMOUNTED_V1: &str = "\
28 25 0:25 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:12 - cgroup cgroup rw,cpu,cpuacct
30 25 0:27 / /sys/fs/cgroup/memory rw,relatime shared:14 - cgroup cgroup rw,memory
";

    const UNIFIED: &str = "\
1 0 0:5 / / rw - rootfs rootfs rw
7 1 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    #[test]
    fn hybrid_host_has_v1_cpu_and_an_empty_unified_mount() {
        let layout = CgroupLayout::parse_mountinfo(HYBRID).expect("cgroups present");
        assert_eq!(layout.kind, LayoutKind::Hybrid);
        assert_eq!(
            layout.unified.as_deref(),
            Some(Path::new("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            layout.cpu_hierarchy(),
            Some(Path::new("/sys/fs/cgroup/cpu"))
        );
        assert_eq!(
            layout.v1.get("cpuacct").map(PathBuf::as_path),
            Some(Path::new("/sys/fs/cgroup/cpuacct"))
        );
        assert!(layout.v1.contains_key("name=systemd"));
        assert!(!layout.v1.contains_key("xattr"));
        assert!(layout.uses_v1_cpu_controller());
    }

    #[test]
    fn comounted_controllers_share_one_mount_point() {
        let layout = CgroupLayout::parse_mountinfo(COMOUNTED_V1).expect("cgroups present");
        assert_eq!(layout.kind, LayoutKind::V1);
        assert_eq!(layout.v1.get("cpu"), layout.v1.get("cpuacct"));
        assert_eq!(
            layout.cpu_hierarchy(),
            Some(Path::new("/sys/fs/cgroup/cpu,cpuacct"))
        );
    }

    #[test]
    fn unified_only_uses_the_cgroup2_mount() {
        let layout = CgroupLayout::parse_mountinfo(UNIFIED).expect("cgroups present");
        assert_eq!(layout.kind, LayoutKind::Unified);
        assert!(!layout.uses_v1_cpu_controller());
        assert_eq!(layout.cpu_hierarchy(), Some(Path::new("/sys/fs/cgroup")));
    }

    #[test]
    fn no_cgroup_mounts_is_none() {
        assert_eq!(
            CgroupLayout::parse_mountinfo("1 0 0:5 / / rw - ext4 /dev/vda rw\n"),
            None
        );
    }

    #[test]
    fn escaped_mount_points_are_decoded() {
        let text = "7 1 0:26 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n";
        let layout = CgroupLayout::parse_mountinfo(text).expect("cgroups present");
        assert_eq!(layout.unified.as_deref(), Some(Path::new("/mnt/cg two")));
    }
}
