//! qosd's kernel programs.
//!
//! `cpu_time_*`: on every sched_switch, charge the time since the previous switch on this CPU to
//! the current cgroup of the task switched out, and note the cgroup of the task switched in
//! (user space adds the slice in progress to its readings).
//! Two flavours of the same handler exist so user space can pick what the kernel allows:
//! `tp_btf` (BTF-typed raw tracepoint) and `raw_tp`. Both read the task's cgroup id by
//! following field offsets that user space read from the running kernel's BTF
//! ([`KernelOffsets`]), so this one object serves every supported kernel.
//!
//! [`runq`]: run-queue latency, preemption pairs and CFS throttle episodes.
//! [`numa`]: NUMA hinting faults, page allocations and task migrations, local or remote.
#![no_std]
#![no_main]

mod numa;
mod runq;

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::{PerCpuArray, PerCpuHashMap},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use qosd_common::{KernelOffsets, MAX_CGROUPS, ProbeStats, RunningTask, cgroup_mode};

/// Field offsets, written by user space before load (see `qosd::probes::btf`).
#[unsafe(no_mangle)]
static QOSD_OFFSETS: KernelOffsets = KernelOffsets {
    task_pid: 0,
    task_cgroups: 0,
    css_set_dfl_cgrp: 0,
    css_set_cpu_css: 0,
    css_cgroup: 0,
    cgroup_kn: 0,
    kernfs_node_id: 0,
    cgroup_mode: 0,
};

/// cgroup id -> nanoseconds on CPU, one counter per CPU (no shared atomics on sched_switch).
#[map]
static CGROUP_CPU_NS: PerCpuHashMap<u64, u64> = PerCpuHashMap::with_max_entries(MAX_CGROUPS, 0);

/// The task each CPU is running: its cgroup and since when.
#[map]
static RUNNING: PerCpuArray<RunningTask> = PerCpuArray::with_max_entries(1, 0);

/// Health counters, one set per CPU.
#[map]
static CPU_TIME_STATS: PerCpuArray<ProbeStats> = PerCpuArray::with_max_entries(1, 0);

/// `BPF_ANY`: create or update. For per-CPU hashes an update from a program touches only the
/// current CPU's slot, so a racing insert from another CPU cannot lose time.
const BPF_ANY: u64 = 0;

#[btf_tracepoint(function = "sched_switch")]
#[expect(
    clippy::needless_pass_by_value,
    reason = "aya's program macros hand over the context by value"
)]
pub fn cpu_time_tp_btf(ctx: BtfTracePointContext) -> i32 {
    // sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next, ...)
    let prev: *const u8 = ctx.arg(1);
    let next: *const u8 = ctx.arg(2);
    on_switch::<Direct>(prev, next);
    0
}

#[raw_tracepoint(tracepoint = "sched_switch")]
#[expect(
    clippy::needless_pass_by_value,
    reason = "aya's program macros hand over the context by value"
)]
pub fn cpu_time_raw_tp(ctx: RawTracePointContext) -> i32 {
    let prev: *const u8 = ctx.arg(1);
    let next: *const u8 = ctx.arg(2);
    on_switch::<Probed>(prev, next);
    0
}

/// How a program reads the kernel structs it follows.
pub(crate) trait KernelRead {
    /// The `T` at `base + offset`; `Err` for a null base or a fault.
    fn read<T: Copy>(base: *const u8, offset: u32) -> Result<T, ()>;
}

/// Direct loads, for `tp_btf` programs: their arguments are BTF-typed kernel pointers, the
/// offsets come from the frozen `.rodata` (so the verifier knows them and checks each load
/// against the kernel's BTF), and a fault is caught by the JIT's exception table instead of
/// costing a helper call per field.
pub(crate) struct Direct;

impl KernelRead for Direct {
    #[inline(always)]
    fn read<T: Copy>(base: *const u8, offset: u32) -> Result<T, ()> {
        if base.is_null() {
            return Err(());
        }
        // SAFETY: `base` is a kernel pointer of the type whose BTF gives `offset`; the verifier
        // checks this load against that BTF and the JIT makes a faulting load read zero.
        Ok(unsafe { core::ptr::read_volatile(base.wrapping_add(offset as usize).cast::<T>()) })
    }
}

/// `bpf_probe_read_kernel`, for programs whose arguments are plain numbers (`raw_tp`).
pub(crate) struct Probed;

impl KernelRead for Probed {
    #[inline(always)]
    fn read<T: Copy>(base: *const u8, offset: u32) -> Result<T, ()> {
        read_at(base, offset)
    }
}

#[inline(always)]
fn offsets() -> KernelOffsets {
    // SAFETY: QOSD_OFFSETS is a plain-data static; the volatile read stops the compiler from
    // folding the zero initialiser that user space overwrites at load time.
    unsafe { core::ptr::read_volatile(&QOSD_OFFSETS) }
}

/// Charges the slice that just ended to `prev`'s cgroup as it is now (a task that moved
/// itself into a cgroup while running is charged to the new one), then starts timing `next`.
/// `prev` is the task the previous switch on this CPU switched in: while its css_set is the
/// one seen then, its cgroup id is the one remembered, so most switches walk one task's
/// cgroup chain instead of two.
#[inline(always)]
fn on_switch<R: KernelRead>(prev: *const u8, next: *const u8) {
    // SAFETY: bpf_ktime_get_ns has no preconditions; it reads CLOCK_MONOTONIC.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(stats) = CPU_TIME_STATS.get_ptr_mut(0) else {
        return;
    };
    let Some(running) = RUNNING.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: both pointers come from per-CPU array lookups that succeeded; the program runs
    // with preemption disabled, so nothing else touches this CPU's slots meanwhile.
    let (stats, running) = unsafe { (&mut *stats, &mut *running) };
    stats.events += 1;

    let off = offsets();
    if off.cgroup_mode == 0 {
        return;
    }

    if running.since_ns != 0 && now > running.since_ns {
        let prev_cgroup = match R::read::<u64>(prev, off.task_cgroups) {
            Ok(css_set) if css_set == running.css_set => Ok(running.cgroup_id),
            _ => task_cgroup_id::<R>(prev, &off),
        };
        match prev_cgroup {
            Ok(0) => {}
            Ok(id) => charge(id, now - running.since_ns, stats),
            Err(()) => stats.read_errors += 1,
        }
    }

    running.since_ns = now;
    (running.cgroup_id, running.css_set) = match task_cgroup_and_css_set::<R>(next, &off) {
        Ok(found) => found,
        Err(()) => {
            stats.read_errors += 1;
            (0, 0)
        }
    };
}

#[inline(always)]
fn charge(cgroup_id: u64, delta_ns: u64, stats: &mut ProbeStats) {
    if let Some(total) = CGROUP_CPU_NS.get_ptr_mut(cgroup_id) {
        // SAFETY: the pointer is this CPU's slot of an existing element; per-CPU slots are
        // only written by this CPU with preemption disabled.
        unsafe { *total += delta_ns };
    } else if CGROUP_CPU_NS.insert(cgroup_id, delta_ns, BPF_ANY).is_err() {
        stats.dropped += 1;
    }
}

/// The cgroup id of `task`, or 0 for the idle task (pid 0), which belongs to no workload.
#[inline(always)]
fn task_cgroup_id<R: KernelRead>(task: *const u8, off: &KernelOffsets) -> Result<u64, ()> {
    task_cgroup_and_css_set::<R>(task, off).map(|(id, _)| id)
}

/// [`task_cgroup_id`] and the css_set it was read through ((0, 0) for the idle task).
#[inline(always)]
fn task_cgroup_and_css_set<R: KernelRead>(
    task: *const u8,
    off: &KernelOffsets,
) -> Result<(u64, u64), ()> {
    let pid: i32 = R::read(task, off.task_pid)?;
    if pid == 0 {
        return Ok((0, 0));
    }
    let css_set: *const u8 = R::read(task, off.task_cgroups)?;
    Ok((css_set_cgroup_id::<R>(css_set, off)?, css_set as u64))
}

/// The cgroup id behind a css_set: the unified cgroup, or the v1 cpu controller's.
#[inline(always)]
fn css_set_cgroup_id<R: KernelRead>(css_set: *const u8, off: &KernelOffsets) -> Result<u64, ()> {
    let cgroup: *const u8 = if off.cgroup_mode == cgroup_mode::V1_CPU {
        let css: *const u8 = R::read(css_set, off.css_set_cpu_css)?;
        R::read(css, off.css_cgroup)?
    } else {
        R::read(css_set, off.css_set_dfl_cgrp)?
    };
    let kn: *const u8 = R::read(cgroup, off.cgroup_kn)?;
    R::read(kn, off.kernfs_node_id)
}

#[inline(always)]
fn read_at<T>(base: *const u8, offset: u32) -> Result<T, ()> {
    if base.is_null() {
        return Err(());
    }
    // SAFETY: bpf_probe_read_kernel copies from kernel memory and reports a fault as an error
    // instead of dereferencing; `base + offset` is never dereferenced directly.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize).cast::<T>()) }.map_err(|_| ())
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
