//! Counter slots, user side: which cgroup owns which element of the sched_switch handler's
//! per-CPU slot arrays (the kernel side is `ebpf/src/slots.rs`).
//!
//! The sched_switch handler adds to a per-CPU array element, found through a small per-CPU
//! cache, instead of looking each cgroup up in a hash on every switch. The elements are handed
//! out here: a cgroup gets a slot once the probe has counted it in its hash (its first events
//! always go there), so the slot holds everything after and the reading is the hash's value
//! plus the slot's. A slot is zeroed before it is published in `CGROUP_SLOT`, and the slot of
//! a removed cgroup is kept back for [`GRACE`] before anyone else gets it, so a CPU's cached
//! lookup of the removed cgroup cannot charge the slot's next owner (no task can be charged to
//! a removed cgroup after its last exit, and cgroup ids are never reused).
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use std::os::fd::AsFd as _;

use aya::Ebpf;
use aya::maps::{HashMap as AyaHashMap, IterableMap, MapData, PerCpuArray, PerCpuValues};
use qosd_common::names;

use super::error_chain;

/// How long a removed cgroup's slot is kept back before it is reused.
pub const GRACE: Duration = Duration::from_secs(30);

/// Errors writing or reading the slot maps.
#[derive(Debug, thiserror::Error)]
#[error("map {map}: {detail}")]
pub struct SlotError {
    map: &'static str,
    detail: String,
}

impl SlotError {
    fn new(map: &'static str, err: &(dyn std::error::Error + 'static)) -> Self {
        Self {
            map,
            detail: error_chain(err),
        }
    }

    fn missing(map: &'static str) -> Self {
        Self {
            map,
            detail: "missing from the kernel object".to_owned(),
        }
    }
}

/// Which cgroup owns which slot.
#[derive(Debug)]
pub struct SlotTable {
    by_cgroup: HashMap<u64, u32>,
    free: Vec<u32>,
    retired: VecDeque<(u32, Instant)>,
}

impl SlotTable {
    /// `capacity` free slots.
    #[must_use]
    pub fn new(capacity: u32) -> Self {
        Self {
            by_cgroup: HashMap::new(),
            free: (0..capacity).rev().collect(),
            retired: VecDeque::new(),
        }
    }

    /// The slot of `cgroup_id`, if it has one.
    #[must_use]
    pub fn slot(&self, cgroup_id: u64) -> Option<u32> {
        self.by_cgroup.get(&cgroup_id).copied()
    }

    /// Every (cgroup id, slot) assigned.
    pub fn assigned(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.by_cgroup.iter().map(|(&c, &s)| (c, s))
    }

    /// Slots assigned.
    #[must_use]
    pub fn len(&self) -> usize {
        self.by_cgroup.len()
    }

    /// Whether no slot is assigned.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.by_cgroup.is_empty()
    }

    /// A free slot for `cgroup_id` (which has none): the lowest never used, or one retired for
    /// longer than [`GRACE`] at `now`. `None` when all are taken or kept back.
    pub fn take(&mut self, cgroup_id: u64, now: Instant) -> Option<u32> {
        if self.by_cgroup.contains_key(&cgroup_id) {
            return None;
        }
        while let Some(&(slot, since)) = self.retired.front() {
            if now.saturating_duration_since(since) < GRACE {
                break;
            }
            self.retired.pop_front();
            self.free.push(slot);
        }
        let slot = self.free.pop()?;
        self.by_cgroup.insert(cgroup_id, slot);
        Some(slot)
    }

    /// Gives back the slot of a removed cgroup; it is kept back until [`GRACE`] after `now`.
    pub fn release(&mut self, cgroup_id: u64, now: Instant) -> Option<u32> {
        let slot = self.by_cgroup.remove(&cgroup_id)?;
        self.retired.push_back((slot, now));
        Some(slot)
    }
}

/// Gives a slot to each of `cgroup_ids` that has none, while slots are free: `zero` empties
/// the slot's elements (of every array it indexes, on every CPU), then the slot is published
/// in `CGROUP_SLOT`. Returns how many were assigned.
pub fn assign(
    ebpf: &mut Ebpf,
    table: &mut SlotTable,
    cgroup_ids: impl IntoIterator<Item = u64>,
    zero: impl Fn(&mut Ebpf, u32) -> Result<(), SlotError>,
) -> Result<usize, SlotError> {
    let now = Instant::now();
    let mut assigned = 0;
    for cgroup_id in cgroup_ids {
        if table.slot(cgroup_id).is_some() {
            continue;
        }
        let Some(slot) = table.take(cgroup_id, now) else {
            break;
        };
        let published = zero(ebpf, slot).and_then(|()| publish(ebpf, cgroup_id, slot));
        if let Err(e) = published {
            // Not published: the slot is free again at once (nothing can have cached it).
            table.by_cgroup.remove(&cgroup_id);
            table.free.push(slot);
            return Err(e);
        }
        assigned += 1;
    }
    Ok(assigned)
}

/// Withdraws the slots of removed cgroups (kept back for [`GRACE`]).
pub fn release(
    ebpf: &mut Ebpf,
    table: &mut SlotTable,
    cgroup_ids: &[u64],
) -> Result<(), SlotError> {
    let now = Instant::now();
    let mut published = published(ebpf)?;
    for &cgroup_id in cgroup_ids {
        if table.release(cgroup_id, now).is_some() {
            let _ = published.remove(&cgroup_id);
        }
    }
    Ok(())
}

/// The per-CPU values of every slot in `table`, read with one `bpf(2)` call for the slots up
/// to the highest one assigned ([`super::batch`]); element by element where the kernel has no
/// batch lookup.
pub fn read_assigned<T: aya::Pod>(
    ebpf: &Ebpf,
    values: &'static str,
    table: &SlotTable,
) -> Result<Vec<(u64, Vec<T>)>, SlotError> {
    let Some(highest) = table.assigned().map(|(_, slot)| slot).max() else {
        return Ok(Vec::new());
    };
    let map = ebpf.map(values).ok_or_else(|| SlotError::missing(values))?;
    let array: PerCpuArray<&MapData, T> =
        PerCpuArray::try_from(map).map_err(|e| SlotError::new(values, &e))?;
    let cpus = aya::util::nr_cpus().map_err(|(_, e)| SlotError::new(values, &e))?;
    match super::batch::percpu_array::<T>(
        IterableMap::<u32, PerCpuValues<T>>::map(&array)
            .fd()
            .as_fd(),
        highest + 1,
        cpus,
    ) {
        Ok(all) => Ok(table
            .assigned()
            .filter_map(|(cgroup, slot)| {
                all.get(usize::try_from(slot).ok()?)
                    .map(|per_cpu| (cgroup, per_cpu.clone()))
            })
            .collect()),
        Err(e) => {
            tracing::debug!(map = values, error = %e, "no batch lookup; reading slot by slot");
            table
                .assigned()
                .map(|(cgroup, slot)| {
                    array
                        .get(&slot, 0)
                        .map(|v| (cgroup, v.iter().copied().collect()))
                        .map_err(|e| SlotError::new(values, &e))
                })
                .collect()
        }
    }
}

/// Sets `slot`'s element of the per-CPU array `values` to `empty` on every CPU.
pub fn zero<T: aya::Pod>(
    ebpf: &mut Ebpf,
    values: &'static str,
    slot: u32,
    empty: T,
) -> Result<(), SlotError> {
    let cpus = aya::util::nr_cpus().map_err(|(_, e)| SlotError::new(values, &e))?;
    let map = ebpf
        .map_mut(values)
        .ok_or_else(|| SlotError::missing(values))?;
    let mut array: PerCpuArray<&mut MapData, T> =
        PerCpuArray::try_from(map).map_err(|e| SlotError::new(values, &e))?;
    let zeros =
        PerCpuValues::try_from(vec![empty; cpus]).map_err(|e| SlotError::new(values, &e))?;
    array
        .set(slot, zeros, 0)
        .map_err(|e| SlotError::new(values, &e))
}

fn publish(ebpf: &mut Ebpf, cgroup_id: u64, slot: u32) -> Result<(), SlotError> {
    published(ebpf)?
        .insert(cgroup_id, slot, 0)
        .map_err(|e| SlotError::new(names::SLOT_MAP, &e))
}

/// The programs' cgroup id -> slot map.
fn published(ebpf: &mut Ebpf) -> Result<AyaHashMap<&mut MapData, u64, u32>, SlotError> {
    let map = ebpf
        .map_mut(names::SLOT_MAP)
        .ok_or_else(|| SlotError::missing(names::SLOT_MAP))?;
    AyaHashMap::try_from(map).map_err(|e| SlotError::new(names::SLOT_MAP, &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_handed_out_once_lowest_first() {
        let mut table = SlotTable::new(2);
        let now = Instant::now();
        assert_eq!(table.take(10, now), Some(0));
        assert_eq!(table.take(10, now), None, "a cgroup keeps its slot");
        assert_eq!(table.take(11, now), Some(1));
        assert_eq!(table.take(12, now), None, "all taken");
        assert_eq!(table.slot(11), Some(1));
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn a_released_slot_is_kept_back_for_the_grace_period() {
        let mut table = SlotTable::new(1);
        let start = Instant::now();
        assert_eq!(table.take(10, start), Some(0));
        assert_eq!(table.release(10, start), Some(0));
        assert_eq!(table.release(10, start), None, "released once");
        assert_eq!(table.slot(10), None);
        assert_eq!(
            table.take(11, start + GRACE - Duration::from_millis(1)),
            None,
            "reused before the grace period ended"
        );
        assert_eq!(table.take(11, start + GRACE), Some(0));
        assert!(!table.is_empty());
    }
}
