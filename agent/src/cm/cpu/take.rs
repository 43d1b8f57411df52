//! Topology-aware CPU selection: kubelet's `cpu_assignment.go` (`takeByTopologyNUMAPacked`,
//! `takeByTopologyNUMADistributed` and the `cpuAccumulator` they share), on [`Cpus`] bitsets.
//!
//! Packed ([`take_packed`]) fills the largest free topology units first: whole NUMA nodes and
//! sockets (whichever is higher in the hierarchy first), then, with
//! `prefer-align-cpus-by-uncorecache`, whole or partial uncore caches, then whole cores
//! (skipped with the spread ordering of `distribute-cpus-across-cores`), then single CPUs.
//! Every level walks its candidates in kubelet's order: by ascending number of free CPUs,
//! nested within the higher levels, ties broken by id. Distributed ([`take_distributed`],
//! `distribute-cpus-across-numa`) spreads a request evenly over the fewest NUMA nodes that can
//! hold it, in groups of `group_size` CPUs, choosing the combination that leaves the free CPUs
//! most balanced, and packs within each node.
//!
//! The results are kubelet's for the same inputs (the table tests replay kubelet's cases). Two
//! loops that can spin forever in kubelet when a NUMA node runs out of whole CPU groups stop
//! instead and the combination is skipped (or the allocation reported as an accounting error).
use std::collections::BTreeMap;
use std::ops::ControlFlow;

use super::cpu_topology::CpuTopology;
use super::cpuset::Cpus;

/// Errors taking CPUs, worded as kubelet's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TakeError {
    #[error(
        "not enough cpus available to satisfy request: requested={requested}, available={available}"
    )]
    NotEnough { requested: usize, available: usize },
    #[error("failed to allocate cpus")]
    Failed,
    #[error("accounting error, not enough CPUs allocated, remaining: {0}")]
    AccountingShort(i64),
    #[error("accounting error, too many CPUs allocated, remaining: {0}")]
    AccountingOver(i64),
}

/// How single CPUs are ordered (kubelet's `CPUSortingStrategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortingStrategy {
    /// Core by core: both threads of a core before the next core (the default).
    Packed,
    /// Socket by socket in CPU id order, which spreads over cores
    /// (`distribute-cpus-across-cores`); whole cores are not taken first.
    Spread,
}

struct Accumulator<'a> {
    topo: &'a CpuTopology,
    /// The free CPUs not yet taken (kubelet's `details`).
    avail: Cpus,
    needed: i64,
    result: Cpus,
    /// NUMA nodes are at or above sockets in the hierarchy (`NumSockets >= NumNUMANodes`).
    numa_first: bool,
    strategy: SortingStrategy,
}

impl<'a> Accumulator<'a> {
    fn new(
        topo: &'a CpuTopology,
        available: &Cpus,
        num_cpus: usize,
        strategy: SortingStrategy,
    ) -> Self {
        Self {
            topo,
            avail: available.intersection(topo.all_cpus()),
            needed: i64::try_from(num_cpus).unwrap_or(i64::MAX),
            result: Cpus::new(),
            numa_first: topo.num_sockets >= topo.num_numa_nodes,
            strategy,
        }
    }

    fn free_in(&self, set: &Cpus) -> usize {
        self.avail.intersection_len(set)
    }

    fn take(&mut self, cpus: &Cpus) {
        self.result.union_with(cpus);
        self.avail.subtract(&self.result);
        self.needed -= i64::try_from(cpus.len()).unwrap_or(i64::MAX);
    }

    fn needs_at_least(&self, n: usize) -> bool {
        self.needed >= i64::try_from(n).unwrap_or(i64::MAX)
    }

    fn is_satisfied(&self) -> bool {
        self.needed < 1
    }

    fn is_failed(&self) -> bool {
        self.needed > i64::try_from(self.avail.len()).unwrap_or(i64::MAX)
    }

    /// kubelet's `sort`: ascending number of free CPUs, then id.
    fn sort_by_free<'s>(&self, ids: &mut [u32], cpus_of: impl Fn(u32) -> &'s Cpus) {
        ids.sort_by_cached_key(|&id| (self.free_in(cpus_of(id)), id));
    }

    fn avail_numas(&self) -> Vec<u32> {
        self.topo.numa_nodes_of(&self.avail)
    }

    fn avail_sockets(&self) -> Vec<u32> {
        self.topo.sockets_of(&self.avail)
    }

    /// Sockets holding free CPUs of NUMA node `numa` (`details.SocketsInNUMANodes`).
    fn sockets_in_numa(&self, numa: u32) -> Vec<u32> {
        let free = self.avail.intersection(self.topo.numa_cpus(numa));
        self.topo
            .sockets_of_numa(numa)
            .iter()
            .copied()
            .filter(|&s| free.intersects(self.topo.socket_cpus(s)))
            .collect()
    }

    /// NUMA nodes holding free CPUs of socket `socket` (`details.NUMANodesInSockets`).
    fn numas_in_socket(&self, socket: u32) -> Vec<u32> {
        let free = self.avail.intersection(self.topo.socket_cpus(socket));
        self.topo
            .numas_of_socket(socket)
            .iter()
            .copied()
            .filter(|&n| free.intersects(self.topo.numa_cpus(n)))
            .collect()
    }

    fn cores_with_free(&self, cores: &[u32]) -> Vec<u32> {
        cores
            .iter()
            .copied()
            .filter(|&c| self.avail.intersects(self.topo.core_cpus(c)))
            .collect()
    }

    fn uncores_in_numa(&self, numa: u32) -> Vec<u32> {
        let free = self.avail.intersection(self.topo.numa_cpus(numa));
        self.topo
            .uncores_of_numa(numa)
            .iter()
            .copied()
            .filter(|&u| free.intersects(self.topo.uncore_cpus(u)))
            .collect()
    }

    /// kubelet's `sortAvailableNUMANodes`.
    fn sort_numa_nodes(&self) -> Vec<u32> {
        if self.numa_first {
            let mut numas = self.avail_numas();
            self.sort_by_free(&mut numas, |n| self.topo.numa_cpus(n));
            numas
        } else {
            let mut out = Vec::new();
            for socket in self.sort_sockets() {
                let mut numas = self.numas_in_socket(socket);
                self.sort_by_free(&mut numas, |n| self.topo.numa_cpus(n));
                out.extend(numas);
            }
            out
        }
    }

    /// kubelet's `sortAvailableSockets`.
    fn sort_sockets(&self) -> Vec<u32> {
        if self.numa_first {
            let mut out = Vec::new();
            for numa in self.sort_numa_nodes() {
                let mut sockets = self.sockets_in_numa(numa);
                self.sort_by_free(&mut sockets, |s| self.topo.socket_cpus(s));
                out.extend(sockets);
            }
            out
        } else {
            let mut sockets = self.avail_sockets();
            self.sort_by_free(&mut sockets, |s| self.topo.socket_cpus(s));
            sockets
        }
    }

    /// kubelet's `sortAvailableCores`.
    fn sort_cores(&self) -> Vec<u32> {
        let mut out = Vec::new();
        if self.numa_first {
            for socket in self.sort_sockets() {
                let mut cores = self.cores_with_free(self.topo.cores_of_socket(socket));
                self.sort_by_free(&mut cores, |c| self.topo.core_cpus(c));
                out.extend(cores);
            }
        } else {
            for numa in self.sort_numa_nodes() {
                let mut cores = self.cores_with_free(self.topo.cores_of_numa(numa));
                self.sort_by_free(&mut cores, |c| self.topo.core_cpus(c));
                out.extend(cores);
            }
        }
        out
    }

    /// kubelet's `sortAvailableUncoreCaches`: per sorted NUMA node, its uncore caches by free
    /// CPUs.
    fn sort_uncores(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for numa in self.sort_numa_nodes() {
            let mut uncores = self.uncores_in_numa(numa);
            self.sort_by_free(&mut uncores, |u| self.topo.uncore_cpus(u));
            out.extend(uncores);
        }
        out
    }

    /// Free CPUs in the order single CPUs are taken.
    fn sorted_cpus(&self) -> Vec<u32> {
        let mut out = Vec::new();
        match self.strategy {
            SortingStrategy::Packed => {
                for core in self.sort_cores() {
                    out.extend(self.avail.intersection(self.topo.core_cpus(core)).iter());
                }
            }
            SortingStrategy::Spread => {
                for socket in self.sort_sockets() {
                    out.extend(
                        self.avail
                            .intersection(self.topo.socket_cpus(socket))
                            .iter(),
                    );
                }
            }
        }
        out
    }

    fn free_numa_nodes(&self) -> Vec<u32> {
        self.sort_numa_nodes()
            .into_iter()
            .filter(|&n| {
                let all = self.topo.numa_cpus(n);
                self.free_in(all) == all.len()
            })
            .collect()
    }

    fn free_sockets(&self) -> Vec<u32> {
        let per_socket = self.topo.cpus_per_socket();
        self.sort_sockets()
            .into_iter()
            .filter(|&s| self.free_in(self.topo.socket_cpus(s)) == per_socket)
            .collect()
    }

    fn free_uncores(&self) -> Vec<u32> {
        self.sort_uncores()
            .into_iter()
            .filter(|&u| {
                let all = self.topo.uncore_cpus(u);
                self.free_in(all) == all.len()
            })
            .collect()
    }

    fn free_cores(&self) -> Vec<u32> {
        let per_core = self.topo.cpus_per_core();
        self.sort_cores()
            .into_iter()
            .filter(|&c| self.free_in(self.topo.core_cpus(c)) == per_core)
            .collect()
    }

    fn take_full_numa_nodes(&mut self) {
        for numa in self.free_numa_nodes() {
            let cpus = self.topo.numa_cpus(numa);
            if self.needs_at_least(cpus.len()) {
                self.take(cpus);
            }
        }
    }

    fn take_full_sockets(&mut self) {
        for socket in self.free_sockets() {
            let cpus = self.topo.socket_cpus(socket);
            if self.needs_at_least(cpus.len()) {
                self.take(cpus);
            }
        }
    }

    fn take_full_first_level(&mut self) {
        if self.numa_first {
            self.take_full_numa_nodes();
        } else {
            self.take_full_sockets();
        }
    }

    fn take_full_second_level(&mut self) {
        if self.numa_first {
            self.take_full_sockets();
        } else {
            self.take_full_numa_nodes();
        }
    }

    fn take_full_uncores(&mut self) {
        for uncore in self.free_uncores() {
            let cpus = self.topo.uncore_cpus(uncore);
            if self.needs_at_least(cpus.len()) {
                self.take(cpus);
            }
        }
    }

    /// kubelet's `takePartialUncore`: take the request from this one uncore cache if its first
    /// `needed / cpus per core` cores with free CPUs (by id) hold exactly what is needed.
    fn take_partial_uncore(&mut self, uncore: u32) {
        let Ok(needed) = usize::try_from(self.needed) else {
            return;
        };
        let cores_needed = needed / self.topo.cpus_per_core().max(1);
        let cores = self.cores_with_free(self.topo.cores_of_uncore(uncore));
        let mut free = Cpus::new();
        for &core in cores.iter().take(cores_needed) {
            free.union_with(&self.avail.intersection(self.topo.core_cpus(core)));
        }
        if free.len() == needed {
            self.take(&free);
        }
    }

    /// kubelet's `takeUncoreCache`.
    fn take_uncore_caches(&mut self) {
        let per_uncore = self.topo.cpus_per_uncore();
        for uncore in self.sort_uncores() {
            if self.needs_at_least(per_uncore) {
                self.take_full_uncores();
            }
            if self.is_satisfied() {
                return;
            }
            self.take_partial_uncore(uncore);
            if self.is_satisfied() {
                return;
            }
        }
    }

    fn take_full_cores(&mut self) {
        for core in self.free_cores() {
            let cpus = self.topo.core_cpus(core);
            if self.needs_at_least(cpus.len()) {
                self.take(cpus);
            }
        }
    }

    fn take_remaining_cpus(&mut self) {
        for cpu in self.sorted_cpus() {
            // The order can list a CPU twice when a socket spans NUMA nodes that are ordered
            // first; kubelet would count it twice.
            if self.result.contains(cpu) {
                continue;
            }
            self.take(&std::iter::once(cpu).collect());
            if self.is_satisfied() {
                return;
            }
        }
    }

    /// kubelet's `rangeNUMANodesNeededToSatisfy`.
    fn numa_range_needed(&self, group_size: usize) -> (usize, usize) {
        let num_numa = self.topo.numa_ids().count().max(1);
        let avail_numa = self.avail_numas().len();
        let num_cpus = self.topo.num_cpus;
        let groups = (num_cpus.saturating_sub(1)) / group_size + 1;
        let groups_per_numa = (groups - 1) / num_numa + 1;
        let needed = usize::try_from(self.needed).unwrap_or(0);
        let groups_needed = (needed.saturating_sub(1)) / group_size + 1;
        let min = (groups_needed - 1) / groups_per_numa + 1;
        let max = groups_needed.min(avail_numa);
        (min, max)
    }
}

/// Calls `f` on every `k`-subset of `items`, in lexicographic order of positions, until it
/// breaks (kubelet's `iterateCombinations`).
fn for_each_combination(
    items: &[u32],
    k: usize,
    mut f: impl FnMut(&[u32]) -> ControlFlow<()>,
) -> ControlFlow<()> {
    let n = items.len();
    if k == 0 || k > n {
        return ControlFlow::Continue(());
    }
    let mut idx: Vec<usize> = (0..k).collect();
    let mut combo = vec![0u32; k];
    loop {
        for (slot, &i) in combo.iter_mut().zip(&idx) {
            *slot = items[i];
        }
        f(&combo)?;
        let Some(pos) = (0..k).rev().find(|&i| idx[i] < n - k + i) else {
            return ControlFlow::Continue(());
        };
        idx[pos] += 1;
        for j in pos + 1..k {
            idx[j] = idx[j - 1] + 1;
        }
    }
}

/// kubelet's `takeByTopologyNUMAPacked`: `num_cpus` CPUs out of `available`, packed.
pub fn take_packed(
    topo: &CpuTopology,
    available: &Cpus,
    num_cpus: usize,
    strategy: SortingStrategy,
    prefer_align_by_uncore_cache: bool,
) -> Result<Cpus, TakeError> {
    let mut acc = Accumulator::new(topo, available, num_cpus, strategy);
    if acc.is_satisfied() {
        return Ok(acc.result);
    }
    if acc.is_failed() {
        return Err(TakeError::NotEnough {
            requested: num_cpus,
            available: available.len(),
        });
    }
    acc.take_full_first_level();
    if acc.is_satisfied() {
        return Ok(acc.result);
    }
    acc.take_full_second_level();
    if acc.is_satisfied() {
        return Ok(acc.result);
    }
    if prefer_align_by_uncore_cache {
        acc.take_uncore_caches();
        if acc.is_satisfied() {
            return Ok(acc.result);
        }
    }
    if strategy != SortingStrategy::Spread {
        acc.take_full_cores();
        if acc.is_satisfied() {
            return Ok(acc.result);
        }
    }
    acc.take_remaining_cpus();
    if acc.is_satisfied() {
        return Ok(acc.result);
    }
    Err(TakeError::Failed)
}

/// kubelet's `mean` / `standardDeviation`, rounded to three decimals as kubelet rounds them.
fn standard_deviation(xs: &[i64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let len = xs.len() as f64;
    let mean = (xs.iter().map(|&x| x as f64).sum::<f64>() / len * 1000.0).round() / 1000.0;
    let sum: f64 = xs
        .iter()
        .map(|&x| (x as f64 - mean) * (x as f64 - mean))
        .sum();
    ((sum / len).sqrt() * 1000.0).round() / 1000.0
}

/// Takes `remainder` CPUs from `subset` in rounds of `group` per node, skipping nodes with
/// fewer than `group` left; `None` if a round makes no progress (kubelet would loop forever).
fn hand_out_remainder(
    after: &mut BTreeMap<u32, i64>,
    subset: &[u32],
    mut remainder: i64,
    group: i64,
) -> Option<()> {
    while remainder > 0 {
        let before = remainder;
        for numa in subset {
            if remainder == 0 {
                break;
            }
            let left = after.entry(*numa).or_insert(0);
            if *left < group {
                continue;
            }
            *left -= group;
            remainder -= group;
        }
        if remainder == before {
            return None;
        }
    }
    Some(())
}

/// kubelet's `takeByTopologyNUMADistributed` (KEP-2902): spread `num_cpus` evenly over the
/// fewest NUMA nodes that can hold them, in groups of `group_size` CPUs.
pub fn take_distributed(
    topo: &CpuTopology,
    available: &Cpus,
    num_cpus: usize,
    group_size: usize,
    strategy: SortingStrategy,
) -> Result<Cpus, TakeError> {
    let group_size = group_size.max(1);
    if !num_cpus.is_multiple_of(group_size) {
        return take_packed(topo, available, num_cpus, strategy, false);
    }
    let mut acc = Accumulator::new(topo, available, num_cpus, strategy);
    if acc.is_satisfied() {
        return Ok(acc.result);
    }
    if acc.is_failed() {
        return Err(TakeError::NotEnough {
            requested: num_cpus,
            available: available.len(),
        });
    }
    let numas = acc.sort_numa_nodes();
    let free_of = |acc: &Accumulator<'_>, numa: u32| -> i64 {
        i64::try_from(acc.free_in(topo.numa_cpus(numa))).unwrap_or(i64::MAX)
    };
    let (min_numas, max_numas) = acc.numa_range_needed(group_size);
    let num = i64::try_from(num_cpus).unwrap_or(i64::MAX);
    let group = i64::try_from(group_size).unwrap_or(i64::MAX);
    for k in min_numas..=max_numas {
        let mut best_balance = f64::MAX;
        let mut best_remainder: Option<Vec<u32>> = None;
        let mut best_combo: Option<Vec<u32>> = None;
        let _ = for_each_combination(&numas, k, |combo| {
            if best_balance == 0.0 {
                return ControlFlow::Break(());
            }
            let cpus: i64 = combo.iter().map(|&n| free_of(&acc, n)).sum();
            if cpus < num {
                return ControlFlow::Continue(());
            }
            let groups: i64 = combo.iter().map(|&n| free_of(&acc, n) / group).sum();
            if groups * group < num {
                return ControlFlow::Continue(());
            }
            let len = i64::try_from(combo.len()).unwrap_or(i64::MAX);
            let distribution = (num / len / group) * group;
            if combo.iter().any(|&n| free_of(&acc, n) < distribution) {
                return ControlFlow::Continue(());
            }
            let mut after: BTreeMap<u32, i64> =
                numas.iter().map(|&n| (n, free_of(&acc, n))).collect();
            for n in combo {
                *after.entry(*n).or_insert(0) -= distribution;
            }
            let remainder = num - distribution * len;
            let remainder_combo: Vec<u32> = combo
                .iter()
                .copied()
                .filter(|n| after.get(n).copied().unwrap_or(0) >= group)
                .collect();
            let mut best_local_balance = f64::MAX;
            let mut best_local_remainder: Option<Vec<u32>> = None;
            if remainder == 0 {
                best_local_balance =
                    standard_deviation(&after.values().copied().collect::<Vec<_>>());
            }
            let mut sub_k = remainder_combo.len();
            while remainder > 0 && sub_k >= 1 {
                let _ = for_each_combination(&remainder_combo, sub_k, |subset| {
                    let mut after = after.clone();
                    let total: i64 = subset
                        .iter()
                        .map(|n| after.get(n).copied().unwrap_or(0))
                        .sum();
                    if total < remainder {
                        return ControlFlow::Continue(());
                    }
                    if hand_out_remainder(&mut after, subset, remainder, group).is_none() {
                        return ControlFlow::Continue(());
                    }
                    let balance = standard_deviation(&after.values().copied().collect::<Vec<_>>());
                    if balance < best_local_balance {
                        best_local_balance = balance;
                        best_local_remainder = Some(subset.to_vec());
                    }
                    ControlFlow::Continue(())
                });
                sub_k -= 1;
            }
            if best_local_balance < best_balance {
                best_balance = best_local_balance;
                best_remainder = best_local_remainder;
                best_combo = Some(combo.to_vec());
            }
            ControlFlow::Continue(())
        });
        let Some(best_combo) = best_combo else {
            continue;
        };
        let len = i64::try_from(best_combo.len()).unwrap_or(i64::MAX);
        let distribution = (num / len / group) * group;
        for &numa in &best_combo {
            let free = acc.avail.intersection(topo.numa_cpus(numa));
            let cpus = take_packed(
                topo,
                &free,
                usize::try_from(distribution).unwrap_or(0),
                strategy,
                false,
            )
            .unwrap_or_default();
            acc.take(&cpus);
        }
        let mut remainder = num - distribution * len;
        let best_remainder = best_remainder.unwrap_or_default();
        while remainder > 0 {
            let before = remainder;
            for &numa in &best_remainder {
                if remainder == 0 {
                    break;
                }
                if acc.free_in(topo.numa_cpus(numa)) < group_size {
                    continue;
                }
                let free = acc.avail.intersection(topo.numa_cpus(numa));
                let cpus =
                    take_packed(topo, &free, group_size, strategy, false).unwrap_or_default();
                acc.take(&cpus);
                remainder -= group;
            }
            if remainder == before {
                break;
            }
        }
        if acc.needed > 0 {
            return Err(TakeError::AccountingShort(acc.needed));
        }
        if acc.needed < 0 {
            return Err(TakeError::AccountingOver(acc.needed));
        }
        return Ok(acc.result);
    }
    take_packed(topo, available, num_cpus, strategy, false)
}

#[cfg(test)]
mod tests;
