//! qosd's kernel programs.
//!
//! `qosd_switch_*`: one handler on sched_switch serves two probes, so the switch, the
//! hottest path the scheduler has, pays for one program run and one walk to each task's
//! cgroup: [`cpu_time`] charges the slice that just ended to the cgroup of the task switched
//! out, and [`runq`] records the wait that preceded it and whether the task was preempted.
//! Two flavours of the same handler exist so user space can pick what the kernel allows:
//! `tp_btf` (BTF-typed raw tracepoint) and `raw_tp`. Both follow field offsets that user space
//! read from the running kernel's BTF ([`KernelOffsets`]), so this one object serves every
//! supported kernel.
//!
//! [`throttle`]: the CFS throttle-episode programs (fexit/fentry).
//! [`numa`]: NUMA hinting faults, page allocations and task migrations, local or remote.
#![no_std]
#![no_main]
#![allow(
    unreachable_pub,
    reason = "the programs are found by the loader through their exported symbols (aya's macros make them #[no_mangle]), not through a Rust path"
)]

mod cpu_time;
mod diag;
mod numa;
mod runq;
mod slots;
mod throttle;

use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::PerCpuArray,
    programs::{BtfTracePointContext, RawTracePointContext},
};
use qosd_common::{KernelOffsets, NO_SLOT, RunningTask, cgroup_mode};

/// The sched_switch handler's name in its diagnostics ([`diag`]).
pub(crate) const SWITCH: &str = "sched_switch";

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
    task_sum_exec_runtime: 0,
    task_prev_sum_exec_runtime: 0,
    task_policy: 0,
};

/// The task each CPU is running: its cgroup, slot and since when (shared by both probes).
#[map]
static RUNNING: PerCpuArray<RunningTask> = PerCpuArray::with_max_entries(1, 0);

#[btf_tracepoint(function = "sched_switch")]
#[expect(
    clippy::needless_pass_by_value,
    reason = "aya's program macros hand over the context by value"
)]
pub fn qosd_switch_btf(ctx: BtfTracePointContext) -> i32 {
    // sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next, ...)
    let preempt: u64 = ctx.arg(0);
    on_switch::<Direct>(preempt & 0xff != 0, ctx.arg(1), ctx.arg(2));
    0
}

#[raw_tracepoint(tracepoint = "sched_switch")]
#[expect(
    clippy::needless_pass_by_value,
    reason = "aya's program macros hand over the context by value"
)]
pub fn qosd_switch_raw(ctx: RawTracePointContext) -> i32 {
    let preempt: u64 = ctx.arg(0);
    on_switch::<Probed>(preempt & 0xff != 0, ctx.arg(1), ctx.arg(2));
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
        // Not only for the meaning: without it the compiler folds a null base into a load from
        // a constant address, which the verifier refuses.
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
fn offsets() -> &'static KernelOffsets {
    // SAFETY: QOSD_OFFSETS is a plain-data static that lives for the program's run. Loading its
    // address through a volatile read stops the compiler from folding the zero initialiser that
    // user space overwrites at load time, while each field is still read only where it is used
    // (copying the whole struct up front costs a stack spill per field on every event).
    unsafe { &*core::ptr::read_volatile(&&raw const QOSD_OFFSETS) }
}

/// One switch: `prev`'s slice is charged ([`cpu_time`]), `next` is noted in [`RUNNING`],
/// then `prev`'s wait and preemption are recorded ([`runq`], when user space configured it),
/// with `next`'s cgroup as the preemptor. `RUNNING` describes the task the previous switch on
/// this CPU switched in: while its css_set is the one seen then, its cgroup id and slot are
/// the ones remembered, and `next` in the same css_set shares them, so a switch walks at most
/// one task's cgroup chain and often none.
#[inline(always)]
fn on_switch<R: KernelRead>(preempt: bool, prev: *const u8, next: *const u8) {
    let Some(stats) = cpu_time::stats() else {
        return;
    };
    let Some(running) = RUNNING.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: a successful per-CPU array lookup; the program runs with preemption disabled,
    // so nothing else touches this CPU's element meanwhile.
    let running = unsafe { &mut *running };
    stats.events += 1;

    let off = offsets();
    if off.cgroup_mode == 0 {
        return;
    }
    let prev_task = cpu_time::charge_prev::<R>(prev, running, off, stats);
    let mut runq = runq::Switch::begin::<R>(preempt, prev, prev_task);

    let runtime = R::read::<u64>(next, off.task_sum_exec_runtime);
    let preemptor = match (remember::<R>(next, running, off, prev_task.cgroup), runtime) {
        (Ok(()), Ok(runtime)) => {
            running.start_runtime_ns = runtime;
            running.cgroup_id
        }
        _ => {
            diag::read_failed(SWITCH, diag::READ_ERRORS, &mut stats.read_errors);
            running.pid = 0;
            running.task = 0;
            runq.read_error();
            0
        }
    };
    runq.finish::<R>(prev, preemptor);
}

/// A task's css_set as read in this switch, and the cgroup id and counter slot behind it.
/// (Not an `Option`: the compiler may load an absent payload from the stack, which 5.10's
/// verifier refuses as a read of uninitialised stack.)
#[derive(Clone, Copy)]
pub(crate) struct TaskCgroup {
    /// `struct css_set *`; 0 when unknown.
    pub(crate) css_set: u64,
    pub(crate) cgroup_id: u64,
    pub(crate) slot: u32,
}

impl TaskCgroup {
    /// No task's cgroup: matches no css_set.
    pub(crate) const UNKNOWN: Self = Self {
        css_set: 0,
        cgroup_id: 0,
        slot: NO_SLOT,
    };
}

/// Notes in `running` the task switched in: its pid, css_set, cgroup id and slot (all 0 or
/// [`NO_SLOT`] for the idle task). `prev_cgroup` is the switched-out task's cgroup as read in
/// this switch: a task switching to one in the same css_set (threads of one container taking
/// turns) is in the same cgroup, so the walk to its id is skipped. The css_set is alive while
/// `prev` holds it, so its address cannot meanwhile have been reused for another.
#[inline(always)]
pub(crate) fn remember<R: KernelRead>(
    next: *const u8,
    running: &mut RunningTask,
    off: &KernelOffsets,
    prev_cgroup: TaskCgroup,
) -> Result<(), ()> {
    running.pid = 0;
    running.task = 0;
    let pid: u32 = R::read(next, off.task_pid)?;
    let cgroup = if pid == 0 {
        TaskCgroup::UNKNOWN
    } else {
        let css_set: u64 = R::read(next, off.task_cgroups)?;
        if css_set != 0 && css_set == prev_cgroup.css_set {
            prev_cgroup
        } else {
            css_set_cgroup::<R>(css_set, off)?
        }
    };
    running.cgroup_id = cgroup.cgroup_id;
    running.css_set = cgroup.css_set;
    running.slot = cgroup.slot;
    running.pid = pid;
    running.task = next as u64;
    Ok(())
}

/// The cgroup of `task` (pid `pid`, not 0), which `running` describes if the pid matches:
/// while its css_set is the one seen when it was switched in, so are its cgroup and slot, and
/// the walk is skipped.
#[inline(always)]
pub(crate) fn cgroup_and_slot<R: KernelRead>(
    task: *const u8,
    pid: u32,
    running: &RunningTask,
    off: &KernelOffsets,
) -> Result<TaskCgroup, ()> {
    let css_set: u64 = R::read(task, off.task_cgroups)?;
    if running.pid == pid && css_set == running.css_set {
        return Ok(TaskCgroup {
            css_set,
            cgroup_id: running.cgroup_id,
            slot: running.slot,
        });
    }
    css_set_cgroup::<R>(css_set, off)
}

/// The cgroup behind `css_set` (a task's, not the idle task's) and its slot.
#[inline(always)]
pub(crate) fn css_set_cgroup<R: KernelRead>(
    css_set: u64,
    off: &KernelOffsets,
) -> Result<TaskCgroup, ()> {
    let cgroup_id = css_set_cgroup_id::<R>(css_set as *const u8, off)?;
    let slot = match cgroup_id {
        0 => NO_SLOT,
        id => slots::slot_of(id),
    };
    Ok(TaskCgroup {
        css_set,
        cgroup_id,
        slot,
    })
}

/// The cgroup id of `task`, or 0 for the idle task (pid 0), which belongs to no workload.
#[inline(always)]
fn task_cgroup_id<R: KernelRead>(task: *const u8, off: &KernelOffsets) -> Result<u64, ()> {
    let pid: i32 = R::read(task, off.task_pid)?;
    if pid == 0 {
        return Ok(0);
    }
    let css_set: *const u8 = R::read(task, off.task_cgroups)?;
    css_set_cgroup_id::<R>(css_set, off)
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
