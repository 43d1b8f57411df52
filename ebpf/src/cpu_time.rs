//! CPU time per cgroup: the slice that just ended, charged at every sched_switch to the
//! current cgroup of the task switched out. A slice is the growth of the task's
//! `se.sum_exec_runtime` while it ran: the scheduler's own accounting, which cpuacct and
//! `cpu.stat` charge from, so no clock is read here (user space adds the slice in progress to
//! its readings). The nanoseconds go into the cgroup's counter slot ([`crate::slots`]) or, for
//! a cgroup without one, into a per-CPU hash.
use aya_ebpf::{
    macros::map,
    maps::{PerCpuArray, PerCpuHashMap},
};
use qosd_common::{
    KernelOffsets, MAX_CGROUPS, MAX_SLOTS, ProbeStats, RunningTask, is_fair_policy, names,
};

use crate::{KernelRead, SWITCH, TaskCgroup, cgroup_and_slot, css_set_cgroup};

/// cgroup id -> nanoseconds on CPU, one counter per CPU (no shared atomics on sched_switch),
/// for cgroups without a counter slot.
#[map]
static CGROUP_CPU_NS: PerCpuHashMap<u64, u64> = PerCpuHashMap::with_max_entries(MAX_CGROUPS, 0);

/// slot -> nanoseconds on CPU, one counter per CPU.
#[map]
static CPU_NS_BY_SLOT: PerCpuArray<u64> = PerCpuArray::with_max_entries(MAX_SLOTS, 0);

/// Health counters, one set per CPU.
#[map]
static CPU_TIME_STATS: PerCpuArray<ProbeStats> = PerCpuArray::with_max_entries(1, 0);

/// `BPF_ANY`: create or update. For per-CPU hashes an update from a program touches only the
/// current CPU's slot, so a racing insert from another CPU cannot lose time.
const BPF_ANY: u64 = 0;

/// This CPU's health counters.
#[inline(always)]
pub(crate) fn stats() -> Option<&'static mut ProbeStats> {
    let ptr = CPU_TIME_STATS.get_ptr_mut(0)?;
    // SAFETY: a successful per-CPU array lookup; programs run with preemption disabled, so
    // only this invocation touches this CPU's element meanwhile.
    Some(unsafe { &mut *ptr })
}

/// The task leaving the CPU, as the switch read it.
#[derive(Clone, Copy)]
pub(crate) struct PrevTask {
    /// 0 for the idle task, or when it could not be read.
    pub(crate) pid: u32,
    /// Its cgroup as read now; [`TaskCgroup::UNKNOWN`] with `pid` 0.
    pub(crate) cgroup: TaskCgroup,
}

impl PrevTask {
    const UNKNOWN: Self = Self {
        pid: 0,
        cgroup: TaskCgroup::UNKNOWN,
    };
}

/// Charges `prev`'s slice to its cgroup as it is now (a task that moved itself into another
/// cgroup while running is charged to the new one) and returns the task's pid and cgroup.
/// `running` describes the task the previous switch on this CPU switched in.
#[inline(always)]
pub(crate) fn charge_prev<R: KernelRead>(
    prev: *const u8,
    running: &RunningTask,
    off: &KernelOffsets,
    stats: &mut ProbeStats,
) -> PrevTask {
    // `prev` is the task the last switch here switched in, unless that switch could not read
    // it, this is the first, or the kernel did not deliver a switch in between: the address
    // says which, without a read.
    if prev as u64 != running.task {
        return charge_unchained::<R>(prev, off, stats);
    }
    let pid = running.pid;
    if pid == 0 {
        return PrevTask::UNKNOWN;
    }
    let Ok(runtime) = R::read::<u64>(prev, off.task_sum_exec_runtime) else {
        crate::diag::read_failed(SWITCH, crate::diag::READ_ERRORS, &mut stats.read_errors);
        return PrevTask::UNKNOWN;
    };
    let Ok(cgroup) = cgroup_and_slot::<R>(prev, pid, running, off) else {
        crate::diag::read_failed(SWITCH, crate::diag::READ_ERRORS, &mut stats.read_errors);
        return PrevTask::UNKNOWN;
    };
    if runtime > running.start_runtime_ns && cgroup.cgroup_id != 0 {
        add_cpu_ns(cgroup, runtime - running.start_runtime_ns, stats);
    }
    PrevTask { pid, cgroup }
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
) -> PrevTask {
    stats.unchained += 1;
    let (Ok(pid), Ok(policy), Ok(runtime), Ok(start), Ok(css_set)) = (
        R::read::<u32>(prev, off.task_pid),
        R::read::<u32>(prev, off.task_policy),
        R::read::<u64>(prev, off.task_sum_exec_runtime),
        R::read::<u64>(prev, off.task_prev_sum_exec_runtime),
        R::read::<u64>(prev, off.task_cgroups),
    ) else {
        crate::diag::read_failed(SWITCH, crate::diag::READ_ERRORS, &mut stats.read_errors);
        return PrevTask::UNKNOWN;
    };
    if pid == 0 {
        return PrevTask::UNKNOWN;
    }
    let Ok(cgroup) = css_set_cgroup::<R>(css_set, off) else {
        crate::diag::read_failed(SWITCH, crate::diag::READ_ERRORS, &mut stats.read_errors);
        return PrevTask::UNKNOWN;
    };
    if !is_fair_policy(policy) {
        stats.dropped += 1;
    } else if runtime > start && cgroup.cgroup_id != 0 {
        add_cpu_ns(cgroup, runtime - start, stats);
    }
    PrevTask { pid, cgroup }
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
        crate::diag::map_full(names::CPU_TIME_MAP);
    }
}
