//! Run-queue latency and preemption pairs.
//!
//! The run-queue half of the sched_switch handler ([`Switch`]): the kernel already times
//! every wait in `task->sched_info`: it adds each wait on a run queue to `run_delay` when the
//! wait ends (the task arrives on a CPU, or is moved off a run queue while waiting). So this
//! handler reads no clock and needs no wakeup hook: when a task leaves a CPU, the growth of
//! its `run_delay` since its previous departure (kept in [`TASK_WAITS`], an array indexed by
//! pid, not a hash) is the wait that preceded the slice just ended. The wait goes into a log2
//! histogram of the task's cgroup: the cgroup's counter slot ([`crate::slots`]), or a per-CPU
//! hash for a cgroup without one. A task switched out while still runnable was preempted: its
//! entry names the (victim cgroup, preemptor cgroup) pair, and at its next departure the
//! preemption and the wait it caused are counted against the pair, in the victim's slot (or
//! the pair hash).
//!
//! The throttle-episode programs ([`crate::throttle`]) share this half's offsets, health
//! counters and histogram helper.
use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::map,
    maps::{Array, PerCpuArray, PerCpuHashMap},
};
use qosd_common::{
    HistBucket, HistKey, MAX_HIST_ENTRIES, MAX_PREEMPT_PAIRS, MAX_SLOTS, MAX_TASK_WAITS,
    PreemptKey, PreemptValue, RunqSlot, RunqStats, SchedOffsets, TaskWait, log2_bucket, names,
    task_wait_index,
};

use crate::cpu_time::PrevTask;
use crate::{KernelRead, TaskCgroup};

/// Offsets beyond [`KernelOffsets`], written by user space before load.
#[unsafe(no_mangle)]
static QOSD_SCHED_OFFSETS: SchedOffsets = SchedOffsets {
    task_state: 0,
    cfs_rq_tg: 0,
    tg_css: 0,
    cfs_rq_throttled: 0,
    task_run_delay: 0,
    task_pcount: 0,
    configured: 0,
    pad: 0,
};

/// pid's low bits -> the task's `sched_info` when it last left a CPU.
#[map]
static TASK_WAITS: Array<TaskWait> = Array::with_max_entries(MAX_TASK_WAITS, 0);

/// slot -> the cgroup's waits and preemptions, one set per CPU.
#[map]
static RUNQ_BY_SLOT: PerCpuArray<RunqSlot> = PerCpuArray::with_max_entries(MAX_SLOTS, 0);

/// (cgroup, log2 bucket) -> waits in that bucket and the nanoseconds they waited, for
/// cgroups without a slot.
#[map]
static RUNQ_HIST: PerCpuHashMap<HistKey, HistBucket> =
    PerCpuHashMap::with_max_entries(MAX_HIST_ENTRIES, 0);

/// (victim cgroup, preemptor cgroup) -> preemptions and the waits they caused, for victims
/// without a slot or preemptors beyond the slot's cells.
#[map]
static RUNQ_PREEMPT: PerCpuHashMap<PreemptKey, PreemptValue> =
    PerCpuHashMap::with_max_entries(MAX_PREEMPT_PAIRS, 0);

/// Health counters, one set per CPU.
#[map]
static RUNQ_STATS: PerCpuArray<RunqStats> = PerCpuArray::with_max_entries(1, 0);

const BPF_ANY: u64 = 0;
pub(crate) const BPF_NOEXIST: u64 = 1;
/// `TASK_RUNNING`: a task in this state when it leaves a CPU was preempted.
const TASK_RUNNING: u32 = 0;
/// `TASK_DEAD`: the state of a task's last switch out.
const TASK_DEAD: u32 = 0x80;

#[inline(always)]
pub(crate) fn sched_offsets() -> &'static SchedOffsets {
    // SAFETY: plain-data static living for the program's run; see `crate::offsets` for why
    // its address is loaded through a volatile read.
    unsafe { &*core::ptr::read_volatile(&&raw const QOSD_SCHED_OFFSETS) }
}

#[inline(always)]
pub(crate) fn stats() -> Option<&'static mut RunqStats> {
    let ptr = RUNQ_STATS.get_ptr_mut(0)?;
    // SAFETY: a successful per-CPU array lookup; programs run with preemption disabled, so
    // only this program invocation touches this CPU's slot meanwhile.
    Some(unsafe { &mut *ptr })
}

#[inline(always)]
pub(crate) fn now_ns() -> u64 {
    // SAFETY: bpf_ktime_get_ns has no preconditions; it reads CLOCK_MONOTONIC.
    unsafe { bpf_ktime_get_ns() }
}

/// The run-queue half of one sched_switch: its health counters (none when user space did
/// not configure the probe, which then counts nothing) and what it learnt of the task leaving.
pub(crate) struct Switch {
    stats: Option<&'static mut RunqStats>,
    leaving: Leaving,
}

impl Switch {
    /// Reads what the wait and preemption of `prev` need beyond what the cpu-time half read
    /// (`prev_task`): whether it is still runnable or exiting.
    #[inline(always)]
    pub(crate) fn begin<R: KernelRead>(
        preempt: bool,
        prev: *const u8,
        prev_task: PrevTask,
    ) -> Self {
        let soff = sched_offsets();
        let stats = if soff.configured == 0 { None } else { stats() };
        let Some(stats) = stats else {
            return Self {
                stats: None,
                leaving: Leaving::NONE,
            };
        };
        stats.switches += 1;
        let leaving = leaving::<R>(preempt, prev, prev_task, soff, stats);
        Self {
            stats: Some(stats),
            leaving,
        }
    }

    /// The task switched in could not be read.
    #[inline(always)]
    pub(crate) fn read_error(&mut self) {
        if let Some(stats) = self.stats.as_deref_mut() {
            crate::diag::read_failed(
                crate::SWITCH,
                crate::diag::READ_ERRORS,
                &mut stats.read_errors,
            );
        }
    }

    /// Records `prev`'s departure; `preemptor` is the cgroup of the task switched in (0 when
    /// unknown).
    #[inline(always)]
    pub(crate) fn finish<R: KernelRead>(self, prev: *const u8, preemptor: u64) {
        if let Some(stats) = self.stats
            && self.leaving.pid != 0
        {
            departed::<R>(prev, &self.leaving, preemptor, sched_offsets(), stats);
        }
    }
}

/// What the switch needs to know of the task leaving the CPU (not an `Option`, for the
/// reason given at [`TaskCgroup`]).
#[derive(Clone, Copy)]
struct Leaving {
    /// 0 for the idle task, or when it could not be read.
    pid: u32,
    /// Still runnable: preempted.
    preempted: bool,
    /// Exiting: its entry is cleared.
    dead: bool,
    /// Its cgroup as read now (no walk unless its css_set changed since it arrived).
    cgroup: TaskCgroup,
}

impl Leaving {
    const NONE: Self = Self {
        pid: 0,
        preempted: false,
        dead: false,
        cgroup: TaskCgroup::UNKNOWN,
    };
}

/// The task leaving the CPU: `prev_task` as the cpu-time half read it, and its state.
#[inline(always)]
fn leaving<R: KernelRead>(
    preempt: bool,
    prev: *const u8,
    prev_task: PrevTask,
    soff: &SchedOffsets,
    stats: &mut RunqStats,
) -> Leaving {
    if prev_task.pid == 0 {
        return Leaving::NONE;
    }
    // A preempted task is runnable, so its state only matters for a switch that is not a
    // preemption.
    let state = if preempt {
        TASK_RUNNING
    } else if let Ok(state) = R::read::<u32>(prev, soff.task_state) {
        state
    } else {
        crate::diag::read_failed(
            crate::SWITCH,
            crate::diag::READ_ERRORS,
            &mut stats.read_errors,
        );
        return Leaving::NONE;
    };
    Leaving {
        pid: prev_task.pid,
        preempted: state == TASK_RUNNING,
        dead: state & TASK_DEAD != 0,
        cgroup: prev_task.cgroup,
    }
}

/// `prev` leaves the CPU. Its `sched_info` now includes the wait its arrival ended: the
/// growth of `run_delay` since its entry was written (at its previous departure) goes into its
/// cgroup's histogram; if it was then preempted, the preemption and that wait count against
/// the (victim, preemptor) pair its entry names. If it is preempted now, by a task in cgroup
/// `preemptor`, the entry it leaves names that pair.
#[inline(always)]
fn departed<R: KernelRead>(
    prev: *const u8,
    leaving: &Leaving,
    preemptor: u64,
    soff: &SchedOffsets,
    stats: &mut RunqStats,
) {
    let (Ok(run_delay), Ok(pcount)) = (
        R::read::<u64>(prev, soff.task_run_delay),
        R::read::<u64>(prev, soff.task_pcount),
    ) else {
        crate::diag::read_failed(
            crate::SWITCH,
            crate::diag::READ_ERRORS,
            &mut stats.read_errors,
        );
        return;
    };
    let Some(entry) = TASK_WAITS.get_ptr_mut(task_wait_index(leaving.pid)) else {
        return;
    };
    let (wait, pair) = match previous_departure(entry, leaving.pid) {
        Some(left) if left.pcount <= pcount && run_delay >= left.run_delay_ns => (
            run_delay - left.run_delay_ns,
            (left.victim_cgroup, left.preemptor_cgroup),
        ),
        // Its first arrival: all it waited since it was forked.
        _ if pcount == 1 => (run_delay, (0, 0)),
        _ => {
            stats.unmeasured_waits += 1;
            (0, (0, 0))
        }
    };
    let cgroup = leaving.cgroup;
    let preempted = leaving.preempted && cgroup.cgroup_id != 0 && preemptor != 0;
    let mut left = TaskWait {
        pid: if leaving.dead { 0 } else { leaving.pid },
        pcount,
        run_delay_ns: run_delay,
        ..TaskWait::default()
    };
    if preempted {
        (left.victim_cgroup, left.preemptor_cgroup) = (cgroup.cgroup_id, preemptor);
    }
    store_task_wait(entry, &left);
    let (victim, preemptor) = pair;
    if victim != 0 && preemptor != 0 {
        let victim_slot = if victim == cgroup.cgroup_id {
            cgroup.slot
        } else {
            crate::slots::slot_of(victim)
        };
        add_pair(victim, victim_slot, preemptor, 1, wait, stats);
    }
    if wait == 0 || cgroup.cgroup_id == 0 {
        return;
    }
    if hist_add_slot(cgroup.slot, wait) {
        stats.waits += 1;
    } else if hist_add(&RUNQ_HIST, names::RUNQ_HIST_MAP, cgroup.cgroup_id, wait) {
        stats.dropped += 1;
    } else {
        stats.waits += 1;
    }
}

/// Writes `left` into `entry`. The entry may be written at the same moment by another CPU for
/// a task whose pid shares it: `pid` goes to 0 first and is set last (in this order on x86's
/// ordered stores), so a reader that sees the same pid before and after its reads saw one
/// writer.
#[inline(always)]
fn store_task_wait(entry: *mut TaskWait, left: &TaskWait) {
    // SAFETY: `entry` points into the array's value, valid for the program's run; volatile
    // keeps the compiler from reordering or merging the stores.
    unsafe {
        core::ptr::write_volatile(&raw mut (*entry).pid, 0);
        core::ptr::write_volatile(&raw mut (*entry).pcount, left.pcount);
        core::ptr::write_volatile(&raw mut (*entry).run_delay_ns, left.run_delay_ns);
        core::ptr::write_volatile(&raw mut (*entry).victim_cgroup, left.victim_cgroup);
        core::ptr::write_volatile(&raw mut (*entry).preemptor_cgroup, left.preemptor_cgroup);
        core::ptr::write_volatile(&raw mut (*entry).pid, left.pid);
    }
}

/// What task `pid` left in `entry` at its previous departure, if it is still there.
#[inline(always)]
fn previous_departure(entry: *const TaskWait, pid: u32) -> Option<TaskWait> {
    // SAFETY: `entry` points into the array's value; see `store_task_wait` for the order in
    // which a writer stores the fields.
    let (before, left, after) = unsafe {
        let before = core::ptr::read_volatile(&raw const (*entry).pid);
        let left = TaskWait {
            pid: before,
            pcount: core::ptr::read_volatile(&raw const (*entry).pcount),
            run_delay_ns: core::ptr::read_volatile(&raw const (*entry).run_delay_ns),
            victim_cgroup: core::ptr::read_volatile(&raw const (*entry).victim_cgroup),
            preemptor_cgroup: core::ptr::read_volatile(&raw const (*entry).preemptor_cgroup),
            ..TaskWait::default()
        };
        (
            before,
            left,
            core::ptr::read_volatile(&raw const (*entry).pid),
        )
    };
    (before == pid && after == pid).then_some(left)
}

/// Adds to the (victim, preemptor) pair: in a cell of the victim's slot when it has one with
/// a cell free or already the preemptor's, else in the pair hash.
#[inline(always)]
fn add_pair(
    victim: u64,
    victim_slot: u32,
    preemptor: u64,
    count: u64,
    wait_ns: u64,
    stats: &mut RunqStats,
) {
    if let Some(slot) = RUNQ_BY_SLOT.get_ptr_mut(victim_slot) {
        // SAFETY: this CPU's element of the slot array, written only by this CPU with
        // preemption disabled.
        let cells = unsafe { &mut (*slot).preemptors };
        for cell in cells.iter_mut() {
            if cell.preemptor_cgroup == 0 {
                cell.preemptor_cgroup = preemptor;
            }
            if cell.preemptor_cgroup == preemptor {
                cell.count += count;
                cell.wait_ns += wait_ns;
                return;
            }
        }
    }
    let key = PreemptKey {
        victim_cgroup: victim,
        preemptor_cgroup: preemptor,
    };
    if let Some(value) = RUNQ_PREEMPT.get_ptr_mut(key) {
        // SAFETY: this CPU's slot of an existing element, written only by this CPU with
        // preemption disabled.
        unsafe {
            (*value).count += count;
            (*value).wait_ns += wait_ns;
        }
    } else if RUNQ_PREEMPT
        .insert(key, PreemptValue { count, wait_ns }, BPF_ANY)
        .is_err()
    {
        stats.dropped += 1;
        crate::diag::map_full(names::PREEMPT_MAP);
    }
}

/// Records `value_ns` in the histogram of `slot`; false when the slot does not exist.
#[inline(always)]
fn hist_add_slot(slot: u32, value_ns: u64) -> bool {
    let Some(counters) = RUNQ_BY_SLOT.get_ptr_mut(slot) else {
        return false;
    };
    // SAFETY: this CPU's element of the slot array, written only by this CPU with
    // preemption disabled.
    let counters = unsafe { &mut *counters };
    counters.sum_ns += value_ns;
    let bucket = log2_bucket(value_ns) as usize;
    // SAFETY: reads back a local. The compiler can prove the bucket in range and would drop
    // the bounds check below, which the verifier needs to see; an opaque reload keeps it.
    let bucket = unsafe { core::ptr::read_volatile(&raw const bucket) };
    if let Some(count) = counters.buckets.get_mut(bucket) {
        *count += 1;
    }
    true
}

/// Records `value_ns` in `cgroup_id`'s histogram (one lookup: the bucket's count and sum);
/// true when the map (called `name`) refused a new entry.
#[inline(always)]
pub(crate) fn hist_add(
    map: &PerCpuHashMap<HistKey, HistBucket>,
    name: &'static str,
    cgroup_id: u64,
    value_ns: u64,
) -> bool {
    let key = HistKey {
        cgroup_id,
        bucket: log2_bucket(value_ns),
        pad: 0,
    };
    if let Some(slot) = map.get_ptr_mut(key) {
        // SAFETY: this CPU's slot of an existing element, written only by this CPU with
        // preemption disabled.
        unsafe {
            (*slot).count += 1;
            (*slot).sum_ns += value_ns;
        }
        false
    } else {
        let first = HistBucket {
            count: 1,
            sum_ns: value_ns,
        };
        let full = map.insert(key, first, BPF_ANY).is_err();
        if full {
            crate::diag::map_full(name);
        }
        full
    }
}
