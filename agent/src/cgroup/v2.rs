//! cgroup v2 specifics of the cgroupfs manager: a controller's files appear in a cgroup only
//! when every ancestor enabled it in `cgroup.subtree_control`, and an ancestor can enable only
//! what its own `cgroup.controllers` lists. So before a cgroup is used, the managed controllers
//! that are available are enabled top-down from the hierarchy root to its parent; nothing is
//! ever disabled.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::backend::{CgroupError, Written};
use super::cgroupfs::{read_optional, write_file};
use super::files::Controller;

/// Controllers enabled for managed cgroups, in the order they are written.
pub(super) const ENABLED: [Controller; 5] = [
    Controller::Cpu,
    Controller::Cpuset,
    Controller::Memory,
    Controller::Pids,
    Controller::Hugetlb,
];

/// Controllers listed in a space-separated control file; `None` when the file is absent (a
/// fixture directory, not a cgroup). A leading `+` is ignored, so a fixture file that holds
/// what was written reads back as enabled.
pub(super) fn read_controllers(path: &Path) -> Result<Option<BTreeSet<String>>, CgroupError> {
    Ok(read_optional(path)?.map(|text| {
        text.split_whitespace()
            .map(|c| c.trim_start_matches('+').to_owned())
            .collect()
    }))
}

/// Enables the managed controllers available at each ancestor of `target` from `mount` down to
/// `target`'s parent. Ancestors without `cgroup.controllers` (fixtures) are left alone.
pub(super) fn enable_controllers(mount: &Path, target: &Path) -> Result<Vec<Written>, CgroupError> {
    let mut ancestors: Vec<PathBuf> = target
        .ancestors()
        .skip(1)
        .take_while(|a| a.starts_with(mount))
        .map(Path::to_path_buf)
        .collect();
    ancestors.reverse();
    let mut written = Vec::new();
    for dir in ancestors {
        let Some(available) = read_controllers(&dir.join("cgroup.controllers"))? else {
            continue;
        };
        let subtree = dir.join("cgroup.subtree_control");
        let enabled = read_controllers(&subtree)?.unwrap_or_default();
        let missing: Vec<String> = ENABLED
            .iter()
            .map(|c| c.name())
            .filter(|c| available.contains(*c) && !enabled.contains(*c))
            .map(|c| format!("+{c}"))
            .collect();
        if missing.is_empty() {
            continue;
        }
        let value = missing.join(" ");
        write_file(&subtree, &value)?;
        written.push(Written {
            path: subtree,
            value,
        });
    }
    Ok(written)
}
