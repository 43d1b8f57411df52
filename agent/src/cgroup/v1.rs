//! cgroup v1 specifics of the cgroupfs manager: a new cgroup in the cpuset hierarchy starts with
//! empty `cpuset.cpus` and `cpuset.mems`, and no task can join it until both are set, so each
//! cgroup the manager owns gets its parent's values where its own are empty.
use std::path::Path;

use super::backend::{CgroupError, Written};
use super::cgroupfs::{read_optional, write_file};

/// The cpuset files a v1 cgroup needs before tasks can join it.
const INHERITED: [&str; 2] = ["cpuset.cpus", "cpuset.mems"];

/// For each directory of `dirs` (outermost first, each one's parent being the previous one or
/// an existing cgroup), copies `cpuset.cpus` / `cpuset.mems` from the parent when its own are
/// empty or absent. Returns the writes made.
pub(super) fn inherit_cpusets(dirs: &[std::path::PathBuf]) -> Result<Vec<Written>, CgroupError> {
    let mut written = Vec::new();
    for dir in dirs {
        let Some(parent) = dir.parent() else {
            continue;
        };
        for file in INHERITED {
            if let Some(w) = inherit_one(dir, parent, file)? {
                written.push(w);
            }
        }
    }
    Ok(written)
}

fn inherit_one(dir: &Path, parent: &Path, file: &str) -> Result<Option<Written>, CgroupError> {
    let path = dir.join(file);
    let own = read_optional(&path)?.unwrap_or_default();
    if !own.trim().is_empty() {
        return Ok(None);
    }
    let inherited = read_optional(&parent.join(file))?.unwrap_or_default();
    let value = inherited.trim();
    if value.is_empty() {
        return Ok(None);
    }
    write_file(&path, value)?;
    Ok(Some(Written {
        path,
        value: value.to_owned(),
    }))
}
