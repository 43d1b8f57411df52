//! CFS throttle episodes: `throttle_cfs_rq_fexit` / `unthrottle_cfs_rq_fentry` time one episode
//! per `cfs_rq` (a cgroup on one CPU), from the moment `throttle_cfs_rq` left it throttled to
//! `unthrottle_cfs_rq`, into a per-cgroup log2 histogram. Loaded with the sched_switch object
//! where the kernel allows tracing programs.
use aya_ebpf::{
    macros::{fentry, fexit, map},
    maps::{HashMap, PerCpuHashMap},
    programs::{FEntryContext, FExitContext},
};
use qosd_common::{HistBucket, HistKey, MAX_HIST_ENTRIES, MAX_THROTTLED_CFS_RQS, names};

use crate::runq::{BPF_NOEXIST, hist_add, now_ns, sched_offsets, stats};
use crate::{offsets, read_at};

/// `struct cfs_rq *` -> when its throttle episode began.
#[map]
static THROTTLED_CFS_RQ: HashMap<u64, u64> = HashMap::with_max_entries(MAX_THROTTLED_CFS_RQS, 0);

/// (cgroup, log2 bucket) -> throttle episodes in that bucket and their nanoseconds.
#[map]
static THROTTLE_HIST: PerCpuHashMap<HistKey, HistBucket> =
    PerCpuHashMap::with_max_entries(MAX_HIST_ENTRIES, 0);

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
        crate::diag::map_full(names::THROTTLED_MAP);
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
        crate::diag::read_failed(
            "unthrottle_cfs_rq",
            crate::diag::READ_ERRORS,
            &mut stats.read_errors,
        );
        return 0;
    };
    let duration = now - start;
    let dropped = hist_add(&THROTTLE_HIST, names::THROTTLE_HIST_MAP, cgroup, duration);
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
