//! Counter slots: the dense index user space gives each cgroup the programs have seen
//! ([`CGROUP_SLOT`]), so the sched_switch handlers add to a per-CPU array element instead of
//! looking a cgroup up in a hash on every switch. Each CPU keeps the lookups it made in a small
//! direct-mapped cache ([`SLOT_CACHE`]), so a switch to a cgroup seen recently on that CPU
//! costs two array accesses. A cgroup without a slot (new, or beyond [`MAX_SLOTS`]) is counted
//! in the handlers' hashes instead; user space adds both.
//!
//! Slots are only reused after their cgroup is gone and a grace period has passed, so a cached
//! entry of a removed cgroup can point at a reused slot only for a cgroup that no task can be
//! charged to any more (cgroup ids are never reused).
use aya_ebpf::{
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use qosd_common::{MAX_SLOTS, NO_SLOT, SLOT_CACHE_SIZE, SlotCacheEntry};

/// cgroup id -> slot, written by user space.
#[map]
static CGROUP_SLOT: HashMap<u64, u32> = HashMap::with_max_entries(MAX_SLOTS, 0);

/// Each CPU's recent cgroup -> slot lookups, indexed by the cgroup id's low bits.
#[map]
static SLOT_CACHE: PerCpuArray<SlotCacheEntry> = PerCpuArray::with_max_entries(SLOT_CACHE_SIZE, 0);

/// The slot of `cgroup_id` (not 0), or [`NO_SLOT`] when user space has not assigned one.
/// Misses are not cached, so a slot assigned later is found at the next switch.
#[inline(always)]
pub(crate) fn slot_of(cgroup_id: u64) -> u32 {
    let index = (cgroup_id as u32) & (SLOT_CACHE_SIZE - 1);
    let Some(entry) = SLOT_CACHE.get_ptr_mut(index) else {
        return NO_SLOT;
    };
    // SAFETY: a successful per-CPU array lookup; programs run with preemption disabled, so
    // only this invocation touches this CPU's entry meanwhile.
    let entry = unsafe { &mut *entry };
    if entry.cgroup_id == cgroup_id {
        return entry.slot;
    }
    // SAFETY: the value is a plain u32 copied out at once.
    let Some(slot) = (unsafe { CGROUP_SLOT.get(cgroup_id) }).copied() else {
        return NO_SLOT;
    };
    entry.cgroup_id = cgroup_id;
    entry.slot = slot;
    slot
}
