//! Hint merging: from every provider's hints to the one best [`TopologyHint`], giving the same
//! answer as kubelet's `HintMerger.Merge` without enumerating the cross product of the hint
//! lists.
//!
//! This module owns [`filter_provider_hints`] (kubelet's `filterProvidersHints`),
//! [`filter_single_numa_hints`], [`max_of_min_affinity_counts`] and [`HintMerger`].
//!
//! # What kubelet computes
//!
//! kubelet walks every permutation (one hint per resource list). A permutation merges to the
//! AND of its affinities with the machine's nodes `D` (a `nil` affinity counting as `D`); it is
//! preferred when every hint is preferred and every non-`nil` affinity is the same mask.
//! Permutations whose merged mask is empty are skipped; the others are folded with `compare`,
//! and `{D, false}` is returned if none is left. That fold is the maximum of a total order on
//! (preferred, mask), so the answer does not depend on the walk order:
//! - preferred beats non-preferred;
//! - among preferred hints, the "fitter" mask wins: fewer nodes; then, with
//!   `prefer-closest-numa-nodes` (not under `single-numa-node`), the smaller average distance;
//!   then the numerically smaller mask;
//! - among non-preferred hints, with `B` the largest of the lists' narrowest widths
//!   (`bestNonPreferredAffinityCount`), widths rank `B`, `B-1`, ..., `1`, then `B+1`, `B+2`,
//!   ..., and equal widths by the fitter mask.
//!
//! # How this module computes it
//!
//! 1. Preferred candidates, in one pass over the hints: a mask `M` is the affinity of a
//!    preferred permutation exactly when every list has a preferred hint on `M` or a preferred
//!    `nil` hint; it merges to `M & D`. `D` itself is reachable when every list has a preferred
//!    `nil` hint. If any such candidate is non-empty, the fittest one is the answer.
//! 2. Otherwise every permutation with a non-empty result is non-preferred, so only the set of
//!    reachable masks matters. It is built list by list (`R₀ = {D}`,
//!    `Rᵢ = {r & a : r ∈ Rᵢ₋₁, a ∈ affinities of list i} \ {∅}`), deduplicated at each step,
//!    and the best of the last set under the non-preferred order is the answer.
//!
//! Step 1 is linear in the number of hints; step 2 costs `Σ |Rᵢ₋₁| · |listᵢ|`, where `|Rᵢ|` is
//! bounded by the number of distinct intersections (at most `2^|D|`) instead of kubelet's
//! product of list lengths. The property test in this module checks both against a direct
//! port of kubelet's enumeration.
use std::collections::BTreeMap;

use crate::machine::NumaMask;

use super::hint::{ProviderHints, TopologyHint};
use super::numa_info::NumaInfo;

/// One list of hints per resource, in provider order (kubelet's `filterProvidersHints`):
/// a provider with no hints at all, or a resource with `None`, gives `[{any, true}]`; a
/// resource with `Some([])` gives `[{any, false}]`.
pub fn filter_provider_hints(providers: &[ProviderHints]) -> Vec<Vec<TopologyHint>> {
    let mut lists = Vec::new();
    for provider in providers {
        if provider.is_empty() {
            lists.push(vec![TopologyHint::any()]);
            continue;
        }
        for hints in provider.values() {
            match hints {
                None => lists.push(vec![TopologyHint::any()]),
                Some(hints) if hints.is_empty() => lists.push(vec![TopologyHint {
                    affinity: None,
                    preferred: false,
                }]),
                Some(hints) => lists.push(hints.clone()),
            }
        }
    }
    lists
}

/// Keeps, in each list, only preferred hints that are `nil` or on a single node
/// (kubelet's `filterSingleNumaHints`). A list may become empty.
pub fn filter_single_numa_hints(lists: &[Vec<TopologyHint>]) -> Vec<Vec<TopologyHint>> {
    lists
        .iter()
        .map(|list| {
            list.iter()
                .filter(|h| h.preferred && h.affinity.is_none_or(|m| m.count() == 1))
                .copied()
                .collect()
        })
        .collect()
}

/// The largest, over the lists, of the width of the list's narrowest non-`nil` affinity
/// (kubelet's `maxOfMinAffinityCounts`, the `bestNonPreferredAffinityCount`).
pub fn max_of_min_affinity_counts(lists: &[Vec<TopologyHint>]) -> usize {
    lists
        .iter()
        .filter_map(|list| {
            list.iter()
                .filter_map(|h| h.affinity)
                .map(NumaMask::count)
                .min()
        })
        .max()
        .unwrap_or(0)
}

/// Merges hint lists under one policy's comparison rules.
#[derive(Debug, Clone, Copy)]
pub struct HintMerger<'a> {
    numa: &'a NumaInfo,
    /// Break ties between equally wide masks by average distance.
    closest: bool,
}

/// A mask's fitness among masks of the same width: smaller is fitter.
type Fitness = (usize, u64, u64);

impl<'a> HintMerger<'a> {
    /// A merger over `numa`'s nodes; `closest` is `prefer-closest-numa-nodes` (kubelet ignores
    /// it under `single-numa-node`, the caller passes `false` there).
    pub fn new(numa: &'a NumaInfo, closest: bool) -> Self {
        HintMerger { numa, closest }
    }

    /// kubelet's `Closest` / `Narrowest` order as a key: width, then distance (only with
    /// `closest`), then the mask's value.
    fn fitness(&self, mask: NumaMask) -> Fitness {
        let distance = if self.closest {
            self.numa.distance_sum(mask)
        } else {
            0
        };
        (mask.count(), distance, mask.bits())
    }

    /// The best merged hint (see the module documentation).
    pub fn merge(&self, lists: &[Vec<TopologyHint>]) -> TopologyHint {
        let all = self.numa.default_mask();
        if let Some(mask) = self.best_preferred(lists, all) {
            return TopologyHint::new(mask, true);
        }
        let best = self.best_non_preferred(lists, all);
        TopologyHint::new(best.unwrap_or(all), false)
    }

    /// Step 1: the fittest non-empty mask of a preferred permutation.
    fn best_preferred(&self, lists: &[Vec<TopologyHint>], all: NumaMask) -> Option<NumaMask> {
        let mut lists_with_any = 0usize;
        // For each preferred mask: the lists holding it that have no preferred `nil` hint.
        let mut holders: BTreeMap<NumaMask, usize> = BTreeMap::new();
        let mut seen: Vec<NumaMask> = Vec::new();
        for list in lists {
            if list.iter().any(|h| h.preferred && h.affinity.is_none()) {
                lists_with_any += 1;
                continue;
            }
            seen.clear();
            seen.extend(
                list.iter()
                    .filter(|h| h.preferred)
                    .filter_map(|h| h.affinity),
            );
            seen.sort_unstable();
            seen.dedup();
            for &mask in &seen {
                *holders.entry(mask).or_default() += 1;
            }
        }
        let needed = lists.len() - lists_with_any;
        let mut candidates: Vec<NumaMask> = Vec::new();
        if needed == 0 {
            // Every list can take `nil`: the all-`nil` permutation gives D. A preferred mask M
            // can then only come from lists holding it, all of which also hold `nil`; those
            // permutations give M & D.
            candidates.push(all);
            for list in lists {
                candidates.extend(
                    list.iter()
                        .filter(|h| h.preferred)
                        .filter_map(|h| h.affinity),
                );
            }
        } else {
            candidates.extend(
                holders
                    .into_iter()
                    .filter(|&(_, count)| count == needed)
                    .map(|(mask, _)| mask),
            );
        }
        candidates
            .into_iter()
            .map(|mask| mask.and(all))
            .filter(|mask| !mask.is_empty())
            .min_by_key(|&mask| self.fitness(mask))
    }

    /// Step 2: the best reachable non-empty mask under the non-preferred order.
    fn best_non_preferred(&self, lists: &[Vec<TopologyHint>], all: NumaMask) -> Option<NumaMask> {
        let target = max_of_min_affinity_counts(lists);
        let mut reachable: Vec<NumaMask> = vec![all];
        let mut affinities: Vec<NumaMask> = Vec::new();
        let mut next: Vec<NumaMask> = Vec::new();
        for list in lists {
            affinities.clear();
            affinities.extend(list.iter().map(|h| h.affinity.unwrap_or(all).and(all)));
            affinities.sort_unstable();
            affinities.dedup();
            next.clear();
            for &r in &reachable {
                for &a in &affinities {
                    let m = r.and(a);
                    if !m.is_empty() {
                        next.push(m);
                    }
                }
            }
            next.sort_unstable();
            next.dedup();
            std::mem::swap(&mut reachable, &mut next);
            if reachable.is_empty() {
                return None;
            }
        }
        reachable.into_iter().min_by_key(|&mask| {
            let count = mask.count();
            // Widths rank target, target-1, ..., 1, then target+1, target+2, ...
            let rank = if count == target {
                (0, 0)
            } else if count < target {
                (1, target - count)
            } else {
                (2, count)
            };
            (rank, self.fitness(mask))
        })
    }
}

pub mod reference {
    //! A direct port of kubelet's `HintMerger` (enumerate every permutation, fold with
    //! `compare`): the oracle of the property tests and the peer `cargo xtask bench` measures
    //! [`super::HintMerger`] against. Deliberately naive; not used by the agent.
    use super::*;

    fn merge_permutation(all: NumaMask, permutation: &[TopologyHint]) -> TopologyHint {
        let mut preferred = true;
        let mut first: Option<NumaMask> = None;
        let mut merged = all;
        for hint in permutation {
            if let Some(mask) = hint.affinity {
                match first {
                    None => first = Some(mask),
                    Some(f) if f != mask => preferred = false,
                    Some(_) => {}
                }
                merged = merged.and(mask);
            }
            if !hint.preferred {
                preferred = false;
            }
        }
        TopologyHint::new(merged, preferred)
    }

    fn average(numa: &NumaInfo, mask: NumaMask) -> f64 {
        if mask.count() == 0 {
            return 0.0;
        }
        let mut sum = 0.0;
        let mut count = 0.0;
        for a in mask.nodes() {
            for b in mask.nodes() {
                sum += numa.distance(a, b) as f64;
                count += 1.0;
            }
        }
        sum / count
    }

    /// kubelet's `CompareNUMAAffinityMasks`: true when `candidate` replaces `current`.
    fn candidate_fitter(
        numa: &NumaInfo,
        closest: bool,
        current: NumaMask,
        candidate: NumaMask,
    ) -> bool {
        if candidate == current {
            return false;
        }
        let best = if closest && current.count() == candidate.count() {
            let (dc, dn) = (average(numa, current), average(numa, candidate));
            if dc == dn {
                if current.is_less_than(candidate) {
                    current
                } else {
                    candidate
                }
            } else if dc < dn {
                current
            } else {
                candidate
            }
        } else if current.is_narrower_than(candidate) {
            current
        } else {
            candidate
        };
        best == candidate
    }

    fn compare(
        numa: &NumaInfo,
        closest: bool,
        best_count: usize,
        current: Option<TopologyHint>,
        candidate: TopologyHint,
    ) -> Option<TopologyHint> {
        let cand_mask = candidate.affinity.unwrap_or(NumaMask::EMPTY);
        if cand_mask.count() == 0 {
            return current;
        }
        let Some(cur) = current else {
            return Some(candidate);
        };
        let cur_mask = cur.affinity.unwrap_or(NumaMask::EMPTY);
        let fitter = |c: TopologyHint, n: TopologyHint| {
            if candidate_fitter(numa, closest, cur_mask, cand_mask) {
                n
            } else {
                c
            }
        };
        if !cur.preferred && candidate.preferred {
            return Some(candidate);
        }
        if cur.preferred && !candidate.preferred {
            return Some(cur);
        }
        if cur.preferred && candidate.preferred {
            return Some(fitter(cur, candidate));
        }
        let (cc, nc) = (cur_mask.count(), cand_mask.count());
        if cc > best_count {
            return Some(fitter(cur, candidate));
        }
        if cc == best_count {
            if nc != best_count {
                return Some(cur);
            }
            return Some(fitter(cur, candidate));
        }
        if nc > best_count {
            return Some(cur);
        }
        if nc == best_count {
            return Some(candidate);
        }
        if nc > cc {
            return Some(candidate);
        }
        if nc < cc {
            return Some(cur);
        }
        Some(fitter(cur, candidate))
    }

    /// kubelet's `HintMerger.Merge`, by enumeration.
    #[must_use]
    pub fn merge(numa: &NumaInfo, closest: bool, lists: &[Vec<TopologyHint>]) -> TopologyHint {
        let all = numa.default_mask();
        let best_count = max_of_min_affinity_counts(lists);
        let mut best: Option<TopologyHint> = None;
        let mut index = vec![0usize; lists.len()];
        if lists.iter().any(Vec::is_empty) {
            return TopologyHint::new(all, false);
        }
        loop {
            let permutation: Vec<TopologyHint> =
                index.iter().zip(lists).map(|(&i, list)| list[i]).collect();
            let merged = merge_permutation(all, &permutation);
            best = compare(numa, closest, best_count, best, merged);
            // Odometer step.
            let mut pos = lists.len();
            loop {
                if pos == 0 {
                    return best.unwrap_or(TopologyHint::new(all, false));
                }
                pos -= 1;
                index[pos] += 1;
                if index[pos] < lists[pos].len() {
                    break;
                }
                index[pos] = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn mask(nodes: &[usize]) -> NumaMask {
        NumaMask::new(nodes).unwrap()
    }

    fn hint(nodes: &[usize], preferred: bool) -> TopologyHint {
        TopologyHint::new(mask(nodes), preferred)
    }

    fn four_nodes() -> NumaInfo {
        // kubelet's commonNUMAInfoFourNodes.
        NumaInfo::new(
            &[0, 1, 2, 3],
            &[
                vec![10, 11, 12, 12],
                vec![11, 10, 12, 12],
                vec![12, 12, 10, 11],
                vec![12, 12, 11, 10],
            ],
        )
        .unwrap()
    }

    #[test]
    fn max_of_min_affinity_counts_mirrors_kubelet() {
        // kubelet TestMaxOfMinAffinityCounts rows.
        let rows: Vec<(Vec<Vec<TopologyHint>>, usize)> = vec![
            (vec![], 0),
            (vec![vec![hint(&[], true)]], 0),
            (vec![vec![hint(&[0], true)]], 1),
            (vec![vec![hint(&[0, 1], true)]], 2),
            (vec![vec![hint(&[0, 1], true), hint(&[0, 1, 2], true)]], 2),
            (
                vec![
                    vec![hint(&[0, 1], true), hint(&[0, 1, 2], true)],
                    vec![hint(&[0, 1, 2], true)],
                ],
                3,
            ),
            (
                vec![
                    vec![hint(&[0, 1], true), hint(&[0, 1, 2], true)],
                    vec![hint(&[0, 1, 2], true), hint(&[0, 1, 2, 3], true)],
                ],
                3,
            ),
        ];
        for (lists, expected) in rows {
            assert_eq!(max_of_min_affinity_counts(&lists), expected, "{lists:?}");
        }
    }

    #[test]
    fn single_numa_filter_mirrors_kubelet() {
        // kubelet TestPolicySingleNumaNodeFilterHints "filter hints with wide sockemask".
        let lists = vec![
            vec![
                hint(&[0], true),
                hint(&[1], true),
                hint(&[1, 2], false),
                hint(&[0, 1, 2], false),
                TopologyHint {
                    affinity: None,
                    preferred: false,
                },
            ],
            vec![
                hint(&[1, 2], false),
                hint(&[0, 2], false),
                hint(&[3], false),
            ],
        ];
        assert_eq!(
            filter_single_numa_hints(&lists),
            vec![vec![hint(&[0], true), hint(&[1], true)], vec![]]
        );
        // "filter hints with nil socket mask 2/2": preferred nil hints stay.
        let lists = vec![vec![hint(&[1], true), TopologyHint::any()]];
        assert_eq!(filter_single_numa_hints(&lists), lists);
    }

    #[test]
    fn provider_filter_distinguishes_none_and_empty() {
        let mut with_resources = ProviderHints::new();
        with_resources.insert("a".into(), None);
        with_resources.insert("b".into(), Some(vec![]));
        with_resources.insert("c".into(), Some(vec![hint(&[1], true)]));
        let lists = filter_provider_hints(&[ProviderHints::new(), with_resources]);
        assert_eq!(
            lists,
            vec![
                vec![TopologyHint::any()],
                vec![TopologyHint::any()],
                vec![TopologyHint {
                    affinity: None,
                    preferred: false
                }],
                vec![hint(&[1], true)],
            ]
        );
    }

    #[test]
    fn non_preferred_widths_rank_around_the_target() {
        // B = 2 (second list's narrowest). Reachable: {0,1,2} (3), {0,1} (2), {0} (1).
        let numa = four_nodes();
        let merger = HintMerger::new(&numa, false);
        let lists = vec![
            vec![hint(&[0, 1, 2], false), hint(&[0], false)],
            vec![hint(&[0, 1, 2], false), hint(&[0, 1], false)],
        ];
        assert_eq!(merger.merge(&lists), hint(&[0, 1], false));
        // Without a width-2 result, width 1 (below B) beats width 3 (above B).
        let lists = vec![
            vec![hint(&[0, 1, 2], false), hint(&[0], false)],
            vec![hint(&[0, 1, 2], false), hint(&[0, 3], false)],
        ];
        assert_eq!(merger.merge(&lists), hint(&[0], false));
    }

    #[test]
    fn all_subsets_of_eight_nodes_from_four_providers_merge_quickly() {
        // kubernetes#131738: every one of the 255 masks from each of 4 providers
        // (255⁴ ≈ 4.2e9 permutations for kubelet).
        let nodes: Vec<usize> = (0..8).collect();
        let numa = NumaInfo::new(&nodes, &[]).unwrap();
        let mut all = Vec::new();
        NumaMask::for_each_subset(&nodes, |m| all.push(TopologyHint::new(m, m.count() == 2)));
        assert_eq!(all.len(), 255);
        let lists = vec![all; 4];
        let merger = HintMerger::new(&numa, false);
        assert_eq!(merger.merge(&lists), hint(&[0, 1], true));
        // No preferred hint anywhere: the DP over reachable masks runs; B = 1.
        let lists: Vec<Vec<TopologyHint>> = lists
            .into_iter()
            .map(|l| {
                l.into_iter()
                    .map(|h| TopologyHint {
                        preferred: false,
                        ..h
                    })
                    .collect()
            })
            .collect();
        assert_eq!(merger.merge(&lists), hint(&[0], false));
    }

    #[test]
    fn agrees_with_reference_on_kubelet_rows() {
        // kubelet "bestNonPreferredAffinityCount (5)" with and without prefer-closest:
        // narrowest gives {1,2}, closest gives {2,3} (distance 42 < 44).
        let numa = NumaInfo::new(
            &[0, 1, 2, 3, 4, 5, 6, 7],
            &[
                vec![10, 11, 12, 12, 30, 30, 30, 30],
                vec![11, 10, 12, 12, 30, 30, 30, 30],
                vec![12, 12, 10, 11, 30, 30, 30, 30],
                vec![12, 12, 11, 10, 30, 30, 30, 30],
                vec![30, 30, 30, 30, 10, 11, 12, 12],
                vec![30, 30, 30, 30, 11, 10, 12, 12],
                vec![30, 30, 30, 30, 12, 12, 10, 11],
                vec![30, 30, 30, 30, 12, 12, 13, 10],
            ],
        )
        .unwrap();
        let lists = vec![
            vec![hint(&[0, 1, 2, 3], false), hint(&[0, 1], false)],
            vec![hint(&[1, 2], false), hint(&[2, 3], false)],
        ];
        for (closest, expected) in [(false, hint(&[1, 2], false)), (true, hint(&[2, 3], false))] {
            assert_eq!(HintMerger::new(&numa, closest).merge(&lists), expected);
            assert_eq!(reference::merge(&numa, closest, &lists), expected);
        }
    }

    // Small random inputs: up to 5 machine nodes; hint masks over 6 bits so some fall outside
    // the machine; nil and empty masks; up to 4 lists of up to 4 hints.
    fn arb_hint() -> impl Strategy<Value = TopologyHint> {
        (prop::option::weighted(0.85, 0u64..64), any::<bool>()).prop_map(|(bits, preferred)| {
            TopologyHint {
                affinity: bits.map(NumaMask::from_bits),
                preferred,
            }
        })
    }

    fn arb_case() -> impl Strategy<Value = (NumaInfo, Vec<Vec<TopologyHint>>)> {
        (1usize..=5)
            .prop_flat_map(|n| {
                (
                    Just(n),
                    prop::collection::vec(prop::collection::vec(10u64..40, n), n),
                    prop::collection::vec(prop::collection::vec(arb_hint(), 0..=4), 0..=4),
                )
            })
            .prop_map(|(n, rows, lists)| {
                let nodes: Vec<usize> = (0..n).collect();
                (
                    NumaInfo::new(&nodes, &rows).unwrap_or_else(|e| panic!("{e}")),
                    lists,
                )
            })
    }

    proptest! {
        // No regression files: a failure prints its minimal input, which belongs in a table test.
        #![proptest_config(ProptestConfig {
            cases: 3000,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn merge_equals_kubelet_enumeration((numa, lists) in arb_case(), closest in any::<bool>()) {
            let fast = HintMerger::new(&numa, closest).merge(&lists);
            let slow = reference::merge(&numa, closest, &lists);
            prop_assert_eq!(fast, slow);
        }

        #[test]
        fn merge_equals_kubelet_enumeration_after_single_numa_filter(
            (numa, lists) in arb_case()
        ) {
            let lists = filter_single_numa_hints(&lists);
            let fast = HintMerger::new(&numa, false).merge(&lists);
            let slow = reference::merge(&numa, false, &lists);
            prop_assert_eq!(fast, slow);
        }
    }
}
