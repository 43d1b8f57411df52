//! Types shared by qosd's kernel programs (`qosd-ebpf`) and its user space (`qosd`).
//!
//! Everything here is `#[repr(C)]` plain data with an identical layout on both sides. With the
//! `user` feature the types implement `aya::Pod`, so user space can place them in globals and
//! read them from maps.
#![no_std]

/// How a kernel program finds the cgroup a task belongs to.
pub mod cgroup_mode {
    /// cgroup v2: `task->cgroups->dfl_cgrp`.
    pub const UNIFIED: u32 = 1;
    /// cgroup v1 or hybrid: the cgroup of the task's cpu controller,
    /// `task->cgroups->subsys[cpu_cgrp_id]->cgroup`.
    pub const V1_CPU: u32 = 2;
}

/// Byte offsets of the kernel struct fields the programs follow from a `task_struct` to its
/// cgroup id, read from the running kernel's BTF at load time. Rust eBPF has no CO-RE
/// relocations, so these are passed in as a global and one object serves every kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    /// `task_struct.pid` (`pid_t`).
    pub task_pid: u32,
    /// `task_struct.cgroups` (`struct css_set *`).
    pub task_cgroups: u32,
    /// `css_set.dfl_cgrp` (`struct cgroup *`), used in [`cgroup_mode::UNIFIED`].
    pub css_set_dfl_cgrp: u32,
    /// `css_set.subsys[cpu_cgrp_id]` (`struct cgroup_subsys_state *`), used in
    /// [`cgroup_mode::V1_CPU`]: the array's offset plus the element for the cpu controller.
    pub css_set_cpu_css: u32,
    /// `cgroup_subsys_state.cgroup` (`struct cgroup *`).
    pub css_cgroup: u32,
    /// `cgroup.kn` (`struct kernfs_node *`).
    pub cgroup_kn: u32,
    /// `kernfs_node.id` (`u64`): the cgroup id, equal to the cgroup directory's inode number.
    pub kernfs_node_id: u32,
    /// One of [`cgroup_mode`]; 0 means "not configured" and the programs count nothing.
    pub cgroup_mode: u32,
}

/// What one CPU's sched_switch program remembers about the task it switched in.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunningTask {
    /// cgroup id of the task now on this CPU; 0 for the idle task or when unknown.
    pub cgroup_id: u64,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) when it was switched in; 0 before the first switch.
    pub since_ns: u64,
}

/// Per-CPU health counters of the cpu-time probe.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeStats {
    /// sched_switch events handled.
    pub events: u64,
    /// Events whose cgroup could not be read from kernel memory.
    pub read_errors: u64,
    /// Time slices that could not be recorded because the per-cgroup map was full or busy.
    pub dropped: u64,
}

/// Capacity of the per-cgroup cpu-time map. User space removes entries of cgroups that are gone.
pub const MAX_CGROUPS: u32 = 16_384;

/// Names of the maps and globals in the kernel object, shared so both sides agree.
pub mod names {
    /// Global holding [`super::KernelOffsets`].
    pub const OFFSETS_GLOBAL: &str = "QOSD_OFFSETS";
    /// Per-CPU hash map: cgroup id (u64) -> nanoseconds on CPU (u64).
    pub const CPU_TIME_MAP: &str = "CGROUP_CPU_NS";
    /// Per-CPU array with one [`super::RunningTask`].
    pub const RUNNING_MAP: &str = "RUNNING";
    /// Per-CPU array with one [`super::ProbeStats`].
    pub const STATS_MAP: &str = "CPU_TIME_STATS";
    /// sched_switch program, BTF-typed raw tracepoint flavour.
    pub const SWITCH_TP_BTF: &str = "cpu_time_tp_btf";
    /// sched_switch program, raw tracepoint flavour.
    pub const SWITCH_RAW_TP: &str = "cpu_time_raw_tp";
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all three are #[repr(C)] structs of plain integers with no padding; every bit
    // pattern is a valid value.
    unsafe impl aya::Pod for super::KernelOffsets {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::RunningTask {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ProbeStats {}
}
