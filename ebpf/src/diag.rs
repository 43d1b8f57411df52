//! Rare-path diagnostics: a kernel read that failed, a map that refused a new entry.
//!
//! The health counters (`read_errors`, `dropped`) count every occurrence; these messages say
//! which program and which map, in qosd's own log, through aya-log's ring buffer
//! (`AYA_LOGS`). They sit only on the branches that count a failure, never on the path a
//! normal event takes, and each kind is logged at most once per CPU every [`INTERVAL_NS`]
//! (the last time is kept per CPU in [`DIAG_LAST_NS`]), so a map that stays full costs one
//! message per CPU every ten seconds, not one per event.
use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::map, maps::PerCpuArray};
use aya_log_ebpf::warn;
use qosd_common::{DIAG_INTERVAL_NS as INTERVAL_NS, DiagKind};

/// Per CPU, per [`DiagKind`]: when this CPU last logged that kind (ns since boot, 0 never).
#[map]
static DIAG_LAST_NS: PerCpuArray<u64> = PerCpuArray::with_max_entries(DiagKind::COUNT, 0);

/// Whether `kind` may be logged on this CPU now; if so, the time is taken.
#[inline(always)]
fn due(kind: DiagKind) -> bool {
    let Some(last) = DIAG_LAST_NS.get_ptr_mut(kind as u32) else {
        return false;
    };
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: this CPU's element of a per-CPU array; programs run with preemption disabled, so
    // nothing else touches it meanwhile.
    unsafe {
        if *last != 0 && now.wrapping_sub(*last) < INTERVAL_NS {
            return false;
        }
        *last = now;
    }
    true
}

/// `program` could not read a kernel field it follows; `total` is this CPU's count so far.
#[inline(always)]
pub(crate) fn read_failed(program: &'static str, total: u64) {
    if due(DiagKind::ReadFailed) {
        warn!(
            &(),
            "{}: a kernel read failed ({} on this CPU so far); the event is counted as a read error",
            program,
            total
        );
    }
}

/// `map` refused a new entry (it is full): the event's count is dropped.
#[inline(always)]
pub(crate) fn map_full(map: &'static str) {
    if due(DiagKind::MapFull) {
        warn!(
            &(),
            "map {} is full: a new entry was refused and the event counted as dropped", map
        );
    }
}
