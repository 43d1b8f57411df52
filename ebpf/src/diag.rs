//! Rare-path diagnostics: a kernel read that failed, a map that refused a new entry.
//!
//! The health counters (`read_errors`, `dropped`) count every occurrence; these messages say
//! which program and which map, in qosd's own log, through aya-log's ring buffer
//! (`AYA_LOGS`). They sit only on the branches that count a failure, never on the path a
//! normal event takes, and each kind is logged at most once per CPU every [`INTERVAL_NS`]
//! (the last time is kept per CPU in [`DIAG_LAST_NS`]), so a map that stays full costs one
//! message per CPU every ten seconds, not one per event.
use aya_ebpf::{macros::map, maps::PerCpuArray};
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
    let now = crate::runq::now_ns();
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

/// The name, in [`read_failed`]'s message, of a counter of read errors only.
pub(crate) const READ_ERRORS: &str = "read errors";
/// The name, in [`read_failed`]'s message, of a counter of every event left out (read errors
/// and others, such as a full map).
pub(crate) const DROPPED: &str = "events left out";

/// `program` could not read a kernel field it follows and leaves the event out: `counter`,
/// this CPU's count named `counter_name` ([`READ_ERRORS`] or [`DROPPED`]), goes up by one.
#[inline(always)]
pub(crate) fn read_failed(program: &'static str, counter_name: &'static str, counter: &mut u64) {
    *counter += 1;
    if due(DiagKind::ReadFailed) {
        warn!(
            &(),
            "{}: a kernel read failed and the event was left out ({} {} on this CPU so far)",
            program,
            *counter,
            counter_name
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
