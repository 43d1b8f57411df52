//! Moving a process's memory between NUMA nodes with `migrate_pages(2)`.
//!
//! A change of a cgroup's `cpuset.mems` migrates its tasks' pages on cgroup v1 with
//! `cpuset.memory_migrate` on, and on cgroup v2 only in newer kernels (measured: the 6.1 and
//! 6.12 guests move them, the 5.10 guest left 64 MiB on the old node). So after realigning a
//! container the manager asks the kernel to move each of its processes' pages itself; where
//! the kernel already moved them there is nothing left to move.
use std::collections::BTreeSet;

/// Bits in one word of a kernel node mask.
const WORD_BITS: u32 = libc::c_ulong::BITS;

/// Errors of a migration request.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("migrate_pages of pid {pid} to node {to}: {source}")]
    Syscall {
        pid: u32,
        to: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("node {node} is beyond the node masks qosd builds")]
    NodeTooHigh { node: u32 },
}

/// The node mask of `nodes` as the kernel reads it (bit n of word n / 64).
fn mask(nodes: impl IntoIterator<Item = u32>, words: usize) -> Vec<libc::c_ulong> {
    let mut mask = vec![0; words];
    for node in nodes {
        if let Some(word) = mask.get_mut((node / WORD_BITS) as usize) {
            *word |= 1 << (node % WORD_BITS);
        }
    }
    mask
}

/// Moves the pages of process `pid` that lie on any of `nodes` other than `to` onto `to`.
/// Returns how many pages could not be moved (the kernel's count; pages in use or pinned stay).
pub fn move_pages_to(pid: u32, to: u32, nodes: &BTreeSet<u32>) -> Result<u64, MigrateError> {
    let highest = nodes.iter().copied().chain([to]).max().unwrap_or(to);
    if highest >= 4096 {
        return Err(MigrateError::NodeTooHigh { node: highest });
    }
    let words = (highest / WORD_BITS + 1) as usize;
    let from = mask(nodes.iter().copied().filter(|n| *n != to), words);
    let target = mask([to], words);
    // The kernel reads `maxnode - 1` bits.
    let maxnode = libc::c_ulong::from(highest) + 2;
    let pid_arg = libc::c_long::from(pid);
    // SAFETY: both masks hold at least `maxnode - 1` bits and live across the call; the
    // kernel only reads them.
    let left = unsafe {
        libc::syscall(
            libc::SYS_migrate_pages,
            pid_arg,
            maxnode,
            from.as_ptr(),
            target.as_ptr(),
        )
    };
    u64::try_from(left).map_err(|_| MigrateError::Syscall {
        pid,
        to,
        source: std::io::Error::last_os_error(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_masks_set_one_bit_per_node() {
        assert_eq!(mask([0, 3], 1), vec![0b1001]);
        assert_eq!(mask([64, 1], 2), vec![0b10, 1]);
        assert_eq!(
            mask([200], 2),
            vec![0, 0],
            "nodes beyond the mask are ignored"
        );
    }

    /// Moving this test process's pages to the node they are on moves nothing and fails
    /// nothing (every machine has node 0).
    #[test]
    fn moving_to_the_only_node_is_a_no_op() {
        let left = move_pages_to(std::process::id(), 0, &BTreeSet::from([0]));
        assert_eq!(left.ok(), Some(0));
    }
}
