//! qosd's kernel programs.
//!
//! `cpu_time_*`: on every sched_switch, charge the slice that just ended to the current cgroup
//! of the task switched out, and note the task switched in. A slice is the growth of the task's
//! `se.sum_exec_runtime` while it ran: the scheduler's own accounting, which cpuacct and
//! `cpu.stat` charge from, so no clock is read here (user space adds the slice in progress to
//! its readings). The nanoseconds go into the cgroup's counter slot ([`slots`]) or, for a
//! cgroup without one, into a per-CPU hash.
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
mod slots;

use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::{PerCpuArray, PerCpuHashMap},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use qosd_common::{
    KernelOffsets, MAX_CGROUPS, MAX_SLOTS, NO_SLOT, ProbeStats, RunningTask, cgroup_mode,
    is_fair_policy,
};

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

/// cgroup id -> nanoseconds on CPU, one counter per CPU (no shared atomics on sched_switch),
/// for cgroups without a counter slot.
#[map]
static CGROUP_CPU_NS: PerCpuHashMap<u64, u64> = PerCpuHashMap::with_max_entries(MAX_CGROUPS, 0);

/// slot -> nanoseconds on CPU, one counter per CPU.
#[map]
static CPU_NS_BY_SLOT: PerCpuArray<u64> = PerCpuArray::with_max_entries(MAX_SLOTS, 0);

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

/// Charges the slice that just ended to `prev`'s cgroup as it is now (a task that moved
/// itself into a cgroup while running is charged to the new one), then starts timing `next`.
/// `prev` is the task the previous switch on this CPU switched in: while its css_set is the
/// one seen then, its cgroup id and slot are the ones remembered, and `next` in the same
/// css_set shares them, so a switch walks at most one task's cgroup chain and often none.
#[inline(always)]
fn on_switch<R: KernelRead>(prev: *const u8, next: *const u8) {
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

    let prev_cgroup = charge_prev::<R>(prev, running, off, stats);
    let runtime = R::read::<u64>(next, off.task_sum_exec_runtime);
    match (remember::<R>(next, running, off, prev_cgroup), runtime) {
        (Ok(()), Ok(runtime)) => running.start_runtime_ns = runtime,
        _ => {
            stats.read_errors += 1;
            running.pid = 0;
            running.task = 0;
        }
    }
}

/// Charges `prev`'s slice and returns its cgroup as read now, or [`TaskCgroup::UNKNOWN`] (for
/// the idle task, or when it could not be read).
#[inline(always)]
fn charge_prev<R: KernelRead>(
    prev: *const u8,
    running: &RunningTask,
    off: &KernelOffsets,
    stats: &mut ProbeStats,
) -> TaskCgroup {
    // `prev` is the task the last switch here switched in, unless that switch could not read
    // it, this is the first, or the kernel did not deliver a switch in between: the address
    // says which, without a read.
    if prev as u64 != running.task {
        return charge_unchained::<R>(prev, off, stats);
    }
    let pid = running.pid;
    if pid == 0 {
        return TaskCgroup::UNKNOWN;
    }
    let Ok(runtime) = R::read::<u64>(prev, off.task_sum_exec_runtime) else {
        stats.read_errors += 1;
        return TaskCgroup::UNKNOWN;
    };
    let Ok(found) = cgroup_and_slot::<R>(prev, pid, running, off) else {
        stats.read_errors += 1;
        return TaskCgroup::UNKNOWN;
    };
    if runtime > running.start_runtime_ns && found.cgroup_id != 0 {
        add_cpu_ns(found, runtime - running.start_runtime_ns, stats);
    }
    found
}

/// Charges the slice of a task whose switch in was not seen here. Some kernels do not deliver
/// every switch to BPF (6.18 in a Firecracker sandbox never reports its init's threads leaving
/// a CPU), and the task that followed one arrived unseen. The fair scheduler itself noted
/// where the run began: `se.prev_sum_exec_runtime`, set when it picked the task. Tasks of
/// other classes keep no such mark, so their slice is counted as dropped.
#[inline(always)]
fn charge_unchained<R: KernelRead>(
    prev: *const u8,
    off: &KernelOffsets,
    stats: &mut ProbeStats,
) -> TaskCgroup {
    stats.unchained += 1;
    let (Ok(pid), Ok(policy), Ok(runtime), Ok(start), Ok(css_set)) = (
        R::read::<u32>(prev, off.task_pid),
        R::read::<u32>(prev, off.task_policy),
        R::read::<u64>(prev, off.task_sum_exec_runtime),
        R::read::<u64>(prev, off.task_prev_sum_exec_runtime),
        R::read::<u64>(prev, off.task_cgroups),
    ) else {
        stats.read_errors += 1;
        return TaskCgroup::UNKNOWN;
    };
    if pid == 0 {
        return TaskCgroup::UNKNOWN;
    }
    let Ok(found) = css_set_cgroup::<R>(css_set, off) else {
        stats.read_errors += 1;
        return TaskCgroup::UNKNOWN;
    };
    if !is_fair_policy(policy) {
        stats.dropped += 1;
    } else if runtime > start && found.cgroup_id != 0 {
        add_cpu_ns(found, runtime - start, stats);
    }
    found
}

/// Adds `delta` nanoseconds on CPU to `cgroup`'s counter.
#[inline(always)]
fn add_cpu_ns(cgroup: TaskCgroup, delta: u64, stats: &mut ProbeStats) {
    if let Some(total) = CPU_NS_BY_SLOT.get_ptr_mut(cgroup.slot) {
        // SAFETY: this CPU's element of the slot array; per-CPU elements are only written by
        // this CPU with preemption disabled.
        unsafe { *total += delta };
    } else if let Some(total) = CGROUP_CPU_NS.get_ptr_mut(cgroup.cgroup_id) {
        // SAFETY: this CPU's slot of an existing element, as above.
        unsafe { *total += delta };
    } else if CGROUP_CPU_NS
        .insert(cgroup.cgroup_id, delta, BPF_ANY)
        .is_err()
    {
        stats.dropped += 1;
    }
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
fn css_set_cgroup<R: KernelRead>(css_set: u64, off: &KernelOffsets) -> Result<TaskCgroup, ()> {
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
