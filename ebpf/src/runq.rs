//! Run-queue latency, preemption pairs and CFS throttle episodes.
//!
//! `runq_*` (sched_wakeup, sched_wakeup_new, sched_switch; `tp_btf` and `raw_tp` flavours):
//! a task's wait starts when it is woken (unless it is running at that moment: a wakeup that
//! finds it still on its CPU) or when it is switched out while still runnable (preempted, or
//! yielding); it ends when the task is switched in. So only queued tasks have an entry, and a
//! task that blocks has none to remove. The wait goes into a log2
//! histogram of the task's cgroup; a preemption is also counted against the (victim cgroup,
//! preemptor cgroup) pair, with the wait it caused. Per-task state lives in a bounded hash
//! keyed by pid, holding only tasks waiting for a CPU: the entry goes when the task is switched
//! in or blocks (a task can only exit by running, so every entry has an end); a wait that finds
//! the map full is counted as dropped, never silently evicted. User space removes entries older
//! than any real wait, which only a missed event could leave.
//!
//! `throttle_cfs_rq_fexit` / `unthrottle_cfs_rq_fentry`: one throttle episode per `cfs_rq`
//! (a cgroup on one CPU), from the moment `throttle_cfs_rq` left it throttled to
//! `unthrottle_cfs_rq`, recorded in a per-cgroup log2 histogram.
use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{btf_tracepoint, fentry, fexit, map, raw_tracepoint},
    maps::{HashMap, PerCpuArray, PerCpuHashMap},
    programs::{BtfTracePointContext, FEntryContext, FExitContext, RawTracePointContext},
};
use qosd_common::{
    HIST_MAX_BUCKET, HistBucket, HistKey, KernelOffsets, MAX_HIST_ENTRIES, MAX_PREEMPT_PAIRS,
    MAX_THROTTLED_CFS_RQS, MAX_WAITING_TASKS, PreemptKey, PreemptValue, RunqStats, SchedOffsets,
    WaitStart,
};

use crate::{Direct, KernelRead, Probed, offsets, read_at, task_cgroup_id};

/// Offsets beyond [`KernelOffsets`], written by user space before load.
#[unsafe(no_mangle)]
static QOSD_SCHED_OFFSETS: SchedOffsets = SchedOffsets {
    task_state: 0,
    cfs_rq_tg: 0,
    tg_css: 0,
    cfs_rq_throttled: 0,
    task_on_cpu: 0,
    configured: 0,
};

/// pid -> when its wait began; only tasks waiting for a CPU (bounded; a full map drops and
/// counts the new wait).
#[map]
static RUNQ_WAIT_START: HashMap<u32, WaitStart> = HashMap::with_max_entries(MAX_WAITING_TASKS, 0);

/// (cgroup, log2 bucket) -> waits in that bucket and the nanoseconds they waited.
#[map]
static RUNQ_HIST: PerCpuHashMap<HistKey, HistBucket> =
    PerCpuHashMap::with_max_entries(MAX_HIST_ENTRIES, 0);

/// (victim cgroup, preemptor cgroup) -> preemptions and the waits they caused.
#[map]
static RUNQ_PREEMPT: PerCpuHashMap<PreemptKey, PreemptValue> =
    PerCpuHashMap::with_max_entries(MAX_PREEMPT_PAIRS, 0);

/// Health counters, one set per CPU.
#[map]
static RUNQ_STATS: PerCpuArray<RunqStats> = PerCpuArray::with_max_entries(1, 0);

/// `struct cfs_rq *` -> when its throttle episode began.
#[map]
static THROTTLED_CFS_RQ: HashMap<u64, u64> = HashMap::with_max_entries(MAX_THROTTLED_CFS_RQS, 0);

/// (cgroup, log2 bucket) -> throttle episodes in that bucket and their nanoseconds.
#[map]
static THROTTLE_HIST: PerCpuHashMap<HistKey, HistBucket> =
    PerCpuHashMap::with_max_entries(MAX_HIST_ENTRIES, 0);

const BPF_ANY: u64 = 0;
const BPF_NOEXIST: u64 = 1;
/// `-EEXIST`: an insert with [`BPF_NOEXIST`] found the key.
const EEXIST: i64 = -17;

#[btf_tracepoint(function = "sched_switch")]
#[expect(
    clippy::needless_pass_by_value,
    reason = "aya's program macros hand over the context by value"
)]
pub fn runq_switch_tp_btf(ctx: BtfTracePointContext) -> i32 {
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
pub fn runq_switch_raw_tp(ctx: RawTracePointContext) -> i32 {
    let preempt: u64 = ctx.arg(0);
    on_switch::<Probed>(preempt & 0xff != 0, ctx.arg(1), ctx.arg(2));
    0
}

#[btf_tracepoint(function = "sched_wakeup")]
#[expect(
    clippy::needless_pass_by_value,
    reason = "aya's program macros hand over the context by value"
)]
pub fn runq_wakeup_tp_btf(ctx: BtfTracePointContext) -> i32 {
    on_wakeup::<Direct>(ctx.arg(0));
    0
}

#[btf_tracepoint(function = "sched_wakeup_new")]
#[expect(
    clippy::needless_pass_by_value,
    reason = "aya's program macros hand over the context by value"
)]
pub fn runq_wakeup_new_tp_btf(ctx: BtfTracePointContext) -> i32 {
    on_wakeup::<Direct>(ctx.arg(0));
    0
}

#[raw_tracepoint(tracepoint = "sched_wakeup")]
#[expect(
    clippy::needless_pass_by_value,
    reason = "aya's program macros hand over the context by value"
)]
pub fn runq_wakeup_raw_tp(ctx: RawTracePointContext) -> i32 {
    on_wakeup::<Probed>(ctx.arg(0));
    0
}

#[raw_tracepoint(tracepoint = "sched_wakeup_new")]
#[expect(
    clippy::needless_pass_by_value,
    reason = "aya's program macros hand over the context by value"
)]
pub fn runq_wakeup_new_raw_tp(ctx: RawTracePointContext) -> i32 {
    on_wakeup::<Probed>(ctx.arg(0));
    0
}

#[inline(always)]
fn sched_offsets() -> SchedOffsets {
    // SAFETY: plain-data static; the volatile read stops the compiler from folding the zero
    // initialiser that user space overwrites at load time.
    unsafe { core::ptr::read_volatile(&QOSD_SCHED_OFFSETS) }
}

#[inline(always)]
fn stats() -> Option<&'static mut RunqStats> {
    let ptr = RUNQ_STATS.get_ptr_mut(0)?;
    // SAFETY: a successful per-CPU array lookup; programs run with preemption disabled, so
    // only this program invocation touches this CPU's slot meanwhile.
    Some(unsafe { &mut *ptr })
}

#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: bpf_ktime_get_ns has no preconditions; it reads CLOCK_MONOTONIC.
    unsafe { bpf_ktime_get_ns() }
}

/// A woken task starts waiting, unless it is running (a wakeup that found it still on its
/// CPU: it never left) or already waiting (woken while still queued after a preemption: that
/// wait began earlier and keeps its attribution).
#[inline(always)]
fn on_wakeup<R: KernelRead>(task: *const u8) {
    let Some(stats) = stats() else {
        return;
    };
    stats.wakeups += 1;
    let off = offsets();
    let soff = sched_offsets();
    if off.cgroup_mode == 0 || soff.configured == 0 {
        return;
    }
    let (Ok(pid), Ok(on_cpu)) = (
        R::read::<u32>(task, off.task_pid),
        R::read::<i32>(task, soff.task_on_cpu),
    ) else {
        stats.read_errors += 1;
        return;
    };
    if pid == 0 || on_cpu != 0 {
        return;
    }
    let start = WaitStart {
        since_ns: now_ns(),
        victim_cgroup: 0,
        preemptor_cgroup: 0,
    };
    // -EEXIST (already waiting) is expected; anything else (the map is full) loses this wait.
    if let Err(e) = RUNQ_WAIT_START.insert(pid, start, BPF_NOEXIST)
        && i64::from(e) != EEXIST
    {
        stats.dropped += 1;
    }
}

#[inline(always)]
fn on_switch<R: KernelRead>(preempt: bool, prev: *const u8, next: *const u8) {
    let Some(stats) = stats() else {
        return;
    };
    stats.switches += 1;
    let off = offsets();
    let soff = sched_offsets();
    if off.cgroup_mode == 0 || soff.configured == 0 {
        return;
    }
    let now = now_ns();
    switched_out::<R>(preempt, prev, next, now, &off, &soff, stats);
    switched_in::<R>(next, now, &off, stats);
}

/// `prev` leaves the CPU: still runnable means preempted (its wait starts now, charged to
/// the pair); otherwise it blocks, and has no entry (it was running, so no wakeup made one).
#[inline(always)]
fn switched_out<R: KernelRead>(
    preempt: bool,
    prev: *const u8,
    next: *const u8,
    now: u64,
    off: &KernelOffsets,
    soff: &SchedOffsets,
    stats: &mut RunqStats,
) {
    let (Ok(pid), Ok(state)) = (
        R::read::<u32>(prev, off.task_pid),
        R::read::<u32>(prev, soff.task_state),
    ) else {
        stats.read_errors += 1;
        return;
    };
    if pid == 0 {
        return;
    }
    if !preempt && state != 0 {
        return;
    }
    let (Ok(victim), Ok(preemptor)) = (
        task_cgroup_id::<R>(prev, off),
        task_cgroup_id::<R>(next, off),
    ) else {
        stats.read_errors += 1;
        return;
    };
    let start = WaitStart {
        since_ns: now,
        victim_cgroup: victim,
        preemptor_cgroup: preemptor,
    };
    if RUNQ_WAIT_START.insert(pid, start, BPF_ANY).is_err() {
        stats.dropped += 1;
    }
    if victim == 0 || preemptor == 0 {
        return;
    }
    let key = PreemptKey {
        victim_cgroup: victim,
        preemptor_cgroup: preemptor,
    };
    add_pair(&key, 1, 0, stats);
}

/// `next` takes the CPU: its wait, if one was recorded, ends now.
#[inline(always)]
fn switched_in<R: KernelRead>(
    next: *const u8,
    now: u64,
    off: &KernelOffsets,
    stats: &mut RunqStats,
) {
    let Ok(pid) = R::read::<u32>(next, off.task_pid) else {
        stats.read_errors += 1;
        return;
    };
    if pid == 0 {
        return;
    }
    let Some(start) = RUNQ_WAIT_START.get_ptr(pid) else {
        return;
    };
    // SAFETY: the pointer comes from a successful lookup; the value is copied out at once.
    let start = unsafe { *start };
    let _ = RUNQ_WAIT_START.remove(pid);
    if now <= start.since_ns {
        return;
    }
    let wait = now - start.since_ns;
    // A preempted task's cgroup was read when it was switched out; a woken one's is read now.
    let cgroup = match start.victim_cgroup {
        0 => match task_cgroup_id::<R>(next, off) {
            Ok(0) => return,
            Ok(id) => id,
            Err(()) => {
                stats.read_errors += 1;
                return;
            }
        },
        id => id,
    };
    if hist_add(&RUNQ_HIST, cgroup, wait) {
        stats.dropped += 1;
    }
    if start.victim_cgroup != 0 && start.preemptor_cgroup != 0 {
        let key = PreemptKey {
            victim_cgroup: start.victim_cgroup,
            preemptor_cgroup: start.preemptor_cgroup,
        };
        add_pair(&key, 0, wait, stats);
    }
}

#[inline(always)]
fn add_pair(key: &PreemptKey, count: u64, wait_ns: u64, stats: &mut RunqStats) {
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
    }
}

/// Records `value_ns` in `cgroup_id`'s histogram (one lookup: the bucket's count and sum);
/// true when the map refused a new entry.
#[inline(always)]
fn hist_add(map: &PerCpuHashMap<HistKey, HistBucket>, cgroup_id: u64, value_ns: u64) -> bool {
    let key = HistKey {
        cgroup_id,
        bucket: bucket(value_ns),
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
        map.insert(key, first, BPF_ANY).is_err()
    }
}

/// log2 bucket of `v` nanoseconds: `b` such that `2^(b-1) <= v < 2^b`, capped.
#[inline(always)]
fn bucket(v: u64) -> u32 {
    let b = 64 - v.leading_zeros();
    if b > HIST_MAX_BUCKET {
        HIST_MAX_BUCKET
    } else {
        b
    }
}

#[fexit(function = "throttle_cfs_rq")]
#[expect(
    clippy::needless_pass_by_value,
    reason = "aya's program macros hand over the context by value"
)]
pub fn throttle_cfs_rq_fexit(ctx: FExitContext) -> i32 {
    // throttle_cfs_rq(struct cfs_rq *cfs_rq): it may decline to throttle (runtime could still
    // be assigned), so the cfs_rq's own `throttled` flag decides.
    let cfs_rq: *const u8 = ctx.arg(0);
    let soff = sched_offsets();
    if soff.configured == 0 {
        return 0;
    }
    let Ok(throttled) = read_at::<i32>(cfs_rq, soff.cfs_rq_throttled) else {
        return 0;
    };
    if throttled == 0 {
        return 0;
    }
    let key = cfs_rq as u64;
    if THROTTLED_CFS_RQ.get_ptr(key).is_some() {
        return 0;
    }
    if THROTTLED_CFS_RQ.insert(key, now_ns(), BPF_NOEXIST).is_err()
        && let Some(stats) = stats()
    {
        stats.throttle_dropped += 1;
    }
    0
}

#[fentry(function = "unthrottle_cfs_rq")]
#[expect(
    clippy::needless_pass_by_value,
    reason = "aya's program macros hand over the context by value"
)]
pub fn unthrottle_cfs_rq_fentry(ctx: FEntryContext) -> i32 {
    let cfs_rq: *const u8 = ctx.arg(0);
    let key = cfs_rq as u64;
    let Some(start) = THROTTLED_CFS_RQ.get_ptr(key) else {
        return 0;
    };
    // SAFETY: the pointer comes from a successful lookup; the value is copied out at once.
    let start = unsafe { *start };
    let _ = THROTTLED_CFS_RQ.remove(key);
    let now = now_ns();
    let Some(stats) = stats() else {
        return 0;
    };
    if now <= start {
        return 0;
    }
    let Ok(cgroup) = cfs_rq_cgroup_id(cfs_rq) else {
        stats.read_errors += 1;
        return 0;
    };
    let duration = now - start;
    let dropped = hist_add(&THROTTLE_HIST, cgroup, duration);
    if dropped {
        stats.throttle_dropped += 1;
    } else {
        stats.throttle_episodes += 1;
    }
    0
}

/// `cfs_rq->tg->css.cgroup->kn->id`.
#[inline(always)]
fn cfs_rq_cgroup_id(cfs_rq: *const u8) -> Result<u64, ()> {
    let off = offsets();
    let soff = sched_offsets();
    let tg: *const u8 = read_at(cfs_rq, soff.cfs_rq_tg)?;
    if tg.is_null() {
        return Err(());
    }
    let cgroup: *const u8 = read_at(tg.wrapping_add(soff.tg_css as usize), off.css_cgroup)?;
    let kn: *const u8 = read_at(cgroup, off.cgroup_kn)?;
    read_at(kn, off.kernfs_node_id)
}
