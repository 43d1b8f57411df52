//! Topology manager policies (`none`, `best-effort`, `restricted`, `single-numa-node`) and
//! policy options (`prefer-closest-numa-nodes`, `max-allowable-numa-nodes`), as kubelet's
//! `policy_*.go` and `policy_options.go`.
//!
//! This module owns option parsing and each policy's merge-and-admit rule; the merge itself is
//! [`super::merge`].
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use super::TopologyManagerError;
use super::hint::{ProviderHints, TopologyHint};
use super::merge::{HintMerger, filter_provider_hints, filter_single_numa_hints};
use super::numa_info::NumaInfo;

/// The `prefer-closest-numa-nodes` option name.
pub const PREFER_CLOSEST_NUMA_NODES: &str = "prefer-closest-numa-nodes";
/// The `max-allowable-numa-nodes` option name.
pub const MAX_ALLOWABLE_NUMA_NODES: &str = "max-allowable-numa-nodes";
/// kubelet's default (and minimum) `max-allowable-numa-nodes`.
pub const DEFAULT_MAX_ALLOWABLE_NUMA_NODES: usize = 8;

/// A topology manager policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyName {
    /// No alignment: every pod admitted, providers allocate without a hint.
    None,
    /// Align when possible; always admit.
    BestEffort,
    /// Admit only when the merged hint is preferred.
    Restricted,
    /// Admit only when everything fits on one NUMA node.
    SingleNumaNode,
}

impl PolicyName {
    /// kubelet's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::None => "none",
            PolicyName::BestEffort => "best-effort",
            PolicyName::Restricted => "restricted",
            PolicyName::SingleNumaNode => "single-numa-node",
        }
    }
}

impl fmt::Display for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PolicyName {
    type Err = TopologyManagerError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(PolicyName::None),
            "best-effort" => Ok(PolicyName::BestEffort),
            "restricted" => Ok(PolicyName::Restricted),
            "single-numa-node" => Ok(PolicyName::SingleNumaNode),
            other => Err(TopologyManagerError::UnknownPolicy(other.to_string())),
        }
    }
}

/// Policy options (`topologyManagerPolicyOptions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyOptions {
    /// `prefer-closest-numa-nodes`: among equally wide masks, prefer the smallest average
    /// distance (ignored by `single-numa-node`).
    pub prefer_closest_numa: bool,
    /// `max-allowable-numa-nodes`: more NUMA nodes than this is an error at start-up (unless
    /// the policy is `none`).
    pub max_allowable_numa_nodes: usize,
}

impl Default for PolicyOptions {
    fn default() -> Self {
        PolicyOptions {
            prefer_closest_numa: false,
            max_allowable_numa_nodes: DEFAULT_MAX_ALLOWABLE_NUMA_NODES,
        }
    }
}

impl PolicyOptions {
    /// Parses the option map as kubelet's `NewPolicyOptions` does (both options are available
    /// without feature gates, as in current kubelet where they are GA).
    pub fn parse(options: &BTreeMap<String, String>) -> Result<Self, TopologyManagerError> {
        let mut opts = PolicyOptions::default();
        for (name, value) in options {
            match name.as_str() {
                PREFER_CLOSEST_NUMA_NODES => {
                    opts.prefer_closest_numa =
                        parse_go_bool(value).ok_or_else(|| TopologyManagerError::BadOption {
                            name: name.clone(),
                            value: value.clone(),
                        })?;
                }
                MAX_ALLOWABLE_NUMA_NODES => {
                    let n: i64 = value
                        .parse()
                        .map_err(|_| TopologyManagerError::NotAnInteger {
                            name: name.clone(),
                            value: value.clone(),
                        })?;
                    if n < DEFAULT_MAX_ALLOWABLE_NUMA_NODES as i64 {
                        return Err(TopologyManagerError::MaxAllowableTooSmall);
                    }
                    if n > DEFAULT_MAX_ALLOWABLE_NUMA_NODES as i64 {
                        tracing::info!(
                            max_allowable_numa_nodes = n,
                            default = DEFAULT_MAX_ALLOWABLE_NUMA_NODES,
                            "the value of max-allowable-numa-nodes is more than the default \
                             recommended value"
                        );
                    }
                    opts.max_allowable_numa_nodes = usize::try_from(n).unwrap_or(usize::MAX);
                }
                _ => return Err(TopologyManagerError::UnknownOption(name.clone())),
            }
        }
        Ok(opts)
    }
}

/// Go's `strconv.ParseBool`.
fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// A policy bound to the machine's NUMA nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    name: PolicyName,
    numa: NumaInfo,
    options: PolicyOptions,
}

impl Policy {
    /// A policy over `numa`.
    pub fn new(name: PolicyName, numa: NumaInfo, options: PolicyOptions) -> Self {
        Policy {
            name,
            numa,
            options,
        }
    }

    /// The policy.
    pub fn name(&self) -> PolicyName {
        self.name
    }

    /// Its options.
    pub fn options(&self) -> PolicyOptions {
        self.options
    }

    /// The NUMA nodes it merges over.
    pub fn numa_info(&self) -> &NumaInfo {
        &self.numa
    }

    /// Merges the providers' hints and decides admission (kubelet's `Policy.Merge`).
    pub fn merge(&self, providers: &[ProviderHints]) -> (TopologyHint, bool) {
        match self.name {
            PolicyName::None => (TopologyHint::default(), true),
            PolicyName::BestEffort => {
                let lists = filter_provider_hints(providers);
                let merger = HintMerger::new(&self.numa, self.options.prefer_closest_numa);
                (merger.merge(&lists), true)
            }
            PolicyName::Restricted => {
                let lists = filter_provider_hints(providers);
                let merger = HintMerger::new(&self.numa, self.options.prefer_closest_numa);
                let best = merger.merge(&lists);
                (best, best.preferred)
            }
            PolicyName::SingleNumaNode => {
                let lists = filter_single_numa_hints(&filter_provider_hints(providers));
                let mut best = HintMerger::new(&self.numa, false).merge(&lists);
                if best.affinity == Some(self.numa.default_mask()) {
                    best.affinity = None;
                }
                (best, best.preferred)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Table tests, each named after the kubelet `policy_*_test.go` row it mirrors. Rows run
    //! through both the merge in this crate and the cross-product reference.
    use super::*;
    use crate::cm::topology_manager::merge::reference;
    use crate::machine::NumaMask;

    fn m(nodes: &[usize]) -> NumaMask {
        NumaMask::new(nodes).unwrap()
    }

    fn h(nodes: &[usize], preferred: bool) -> TopologyHint {
        TopologyHint::new(m(nodes), preferred)
    }

    fn nil(preferred: bool) -> TopologyHint {
        TopologyHint {
            affinity: None,
            preferred,
        }
    }

    /// A provider with one resource per (name, hints) pair.
    fn p(resources: &[(&str, Option<Vec<TopologyHint>>)]) -> ProviderHints {
        resources
            .iter()
            .map(|(name, hints)| ((*name).to_string(), hints.clone()))
            .collect()
    }

    fn r1(hints: Vec<TopologyHint>) -> ProviderHints {
        p(&[("resource1", Some(hints))])
    }

    fn r2(hints: Vec<TopologyHint>) -> ProviderHints {
        p(&[("resource2", Some(hints))])
    }

    fn numa_two() -> NumaInfo {
        NumaInfo::new(&[0, 1], &[vec![10, 11], vec![11, 10]]).unwrap()
    }

    fn numa_four() -> NumaInfo {
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

    fn numa_eight() -> NumaInfo {
        NumaInfo::new(
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
        .unwrap()
    }

    struct Row {
        name: &'static str,
        providers: Vec<ProviderHints>,
        expected: TopologyHint,
    }

    fn row(name: &'static str, providers: Vec<ProviderHints>, expected: TopologyHint) -> Row {
        Row {
            name,
            providers,
            expected,
        }
    }

    /// kubelet `commonPolicyMergeTestCases` (same answer under every aligning policy).
    fn common_rows() -> Vec<Row> {
        vec![
            row(
                "Two providers, 1 hint each, same mask, both preferred 1/2",
                vec![r1(vec![h(&[0], true)]), r2(vec![h(&[0], true)])],
                h(&[0], true),
            ),
            row(
                "Two providers, 1 hint each, same mask, both preferred 2/2",
                vec![r1(vec![h(&[1], true)]), r2(vec![h(&[1], true)])],
                h(&[1], true),
            ),
            row(
                "Two providers, 1 no hints, 1 single hint preferred 1/2",
                vec![
                    ProviderHints::new(),
                    p(&[("resource", Some(vec![h(&[0], true)]))]),
                ],
                h(&[0], true),
            ),
            row(
                "Two providers, 1 no hints, 1 single hint preferred 2/2",
                vec![
                    ProviderHints::new(),
                    p(&[("resource", Some(vec![h(&[1], true)]))]),
                ],
                h(&[1], true),
            ),
            row(
                "Two providers, 1 with 2 hints, 1 with single hint matching 1/2",
                vec![
                    r1(vec![h(&[0], true), h(&[1], true)]),
                    r2(vec![h(&[0], true)]),
                ],
                h(&[0], true),
            ),
            row(
                "Two providers, 1 with 2 hints, 1 with single hint matching 2/2",
                vec![
                    r1(vec![h(&[0], true), h(&[1], true)]),
                    r2(vec![h(&[1], true)]),
                ],
                h(&[1], true),
            ),
            row(
                "Two providers, both with 2 hints, matching narrower preferred hint from both",
                vec![
                    r1(vec![h(&[0], true), h(&[1], true)]),
                    r2(vec![h(&[0], true), h(&[0, 1], false)]),
                ],
                h(&[0], true),
            ),
            row(
                "Ensure less narrow preferred hints are chosen over narrower non-preferred hints",
                vec![
                    r1(vec![h(&[1], true), h(&[0, 1], false)]),
                    r2(vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]),
                ],
                h(&[1], true),
            ),
            row(
                "Multiple resources, same provider",
                vec![p(&[
                    ("resource1", Some(vec![h(&[1], true), h(&[0, 1], false)])),
                    (
                        "resource2",
                        Some(vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]),
                    ),
                ])],
                h(&[1], true),
            ),
        ]
    }

    /// kubelet `bestEffortPolicy.mergeTestCases` (also the restricted policy's rows).
    fn best_effort_rows(all: &[usize]) -> Vec<Row> {
        vec![
            row(
                "Two providers, 2 hints each, same mask (some with different bits), same preferred",
                vec![
                    r1(vec![h(&[0, 1], true), h(&[0, 2], true)]),
                    r2(vec![h(&[0, 1], true), h(&[0, 2], true)]),
                ],
                h(&[0, 1], true),
            ),
            row("TopologyHint not set", vec![], h(all, true)),
            row(
                "HintProvider returns empty non-nil map[string][]TopologyHint",
                vec![ProviderHints::new()],
                h(all, true),
            ),
            row(
                "HintProvider returns -nil map[string][]TopologyHint from provider",
                vec![p(&[("resource", None)])],
                h(all, true),
            ),
            row(
                "HintProvider returns empty non-nil map[string][]TopologyHint from provider",
                vec![p(&[("resource", Some(vec![]))])],
                h(all, false),
            ),
            row(
                "Single TopologyHint with Preferred as true and NUMANodeAffinity as nil",
                vec![p(&[("resource", Some(vec![nil(true)]))])],
                h(all, true),
            ),
            row(
                "Single TopologyHint with Preferred as false and NUMANodeAffinity as nil",
                vec![p(&[("resource", Some(vec![nil(false)]))])],
                h(all, false),
            ),
            row(
                "Two providers, 1 hint each, no common mask",
                vec![r1(vec![h(&[0], true)]), r2(vec![h(&[1], true)])],
                h(all, false),
            ),
            row(
                "Two providers, 1 hint each, same mask, 1 preferred, 1 not 1/2",
                vec![r1(vec![h(&[0], true)]), r2(vec![h(&[0], false)])],
                h(&[0], false),
            ),
            row(
                "Two providers, 1 hint each, same mask, 1 preferred, 1 not 2/2",
                vec![r1(vec![h(&[1], true)]), r2(vec![h(&[1], false)])],
                h(&[1], false),
            ),
            row(
                "Two providers, 1 hint each, 1 wider mask, both preferred 1/2",
                vec![r1(vec![h(&[0], true)]), r2(vec![h(&[0, 1], true)])],
                h(&[0], false),
            ),
            row(
                "Two providers, 1 with 2 hints, 1 with single non-preferred hint matching",
                vec![
                    r1(vec![h(&[0], true), h(&[1], true)]),
                    r2(vec![h(&[0, 1], false)]),
                ],
                h(&[0], false),
            ),
            row(
                "Two providers, 1 hint each, 1 wider mask, both preferred 2/2",
                vec![r1(vec![h(&[1], true)]), r2(vec![h(&[0, 1], true)])],
                h(&[1], false),
            ),
            row(
                "bestNonPreferredAffinityCount (1)",
                vec![
                    r1(vec![h(&[0, 1, 2, 3], false), h(&[0, 1], false)]),
                    r2(vec![h(&[0, 1], false)]),
                ],
                h(&[0, 1], false),
            ),
            row(
                "bestNonPreferredAffinityCount (2)",
                vec![
                    r1(vec![h(&[0, 1, 2, 3], false), h(&[0, 1], false)]),
                    r2(vec![h(&[0, 3], false)]),
                ],
                h(&[0, 3], false),
            ),
            row(
                "bestNonPreferredAffinityCount (3)",
                vec![
                    r1(vec![h(&[0, 1, 2, 3], false), h(&[0, 1], false)]),
                    r2(vec![h(&[1, 2], false)]),
                ],
                h(&[1, 2], false),
            ),
            row(
                "bestNonPreferredAffinityCount (4)",
                vec![
                    r1(vec![h(&[0, 1, 2, 3], false), h(&[0, 1], false)]),
                    r2(vec![h(&[2, 3], false)]),
                ],
                h(&[2, 3], false),
            ),
        ]
    }

    /// kubelet `bestEffortPolicy.mergeTestCasesNoPolicies` (without prefer-closest).
    fn no_policies_rows() -> Vec<Row> {
        vec![
            row(
                "bestNonPreferredAffinityCount (5)",
                vec![
                    r1(vec![h(&[0, 1, 2, 3], false), h(&[0, 1], false)]),
                    r2(vec![h(&[1, 2], false), h(&[2, 3], false)]),
                ],
                h(&[1, 2], false),
            ),
            row(
                "bestNonPreferredAffinityCount (6)",
                vec![
                    r1(vec![h(&[0, 1, 2, 3], false), h(&[0, 1], false)]),
                    r2(vec![
                        h(&[1, 2, 3], false),
                        h(&[1, 2], false),
                        h(&[1, 3], false),
                        h(&[2, 3], false),
                    ]),
                ],
                h(&[1, 2], false),
            ),
        ]
    }

    /// kubelet `bestEffortPolicy.mergeTestCasesClosestNUMA` (eight nodes, prefer-closest).
    fn closest_rows() -> Vec<Row> {
        vec![
            row(
                "Two providers, 2 hints each, same mask (some with different bits), same preferred",
                vec![
                    r1(vec![h(&[0, 4], true), h(&[0, 2], true)]),
                    r2(vec![h(&[0, 4], true), h(&[0, 2], true)]),
                ],
                h(&[0, 2], true),
            ),
            row(
                "Two providers, 2 hints each, different mask",
                vec![
                    r1(vec![h(&[4], true), h(&[0, 2], true)]),
                    r2(vec![h(&[4], true), h(&[0, 2], true)]),
                ],
                h(&[4], true),
            ),
            row(
                "bestNonPreferredAffinityCount (5)",
                vec![
                    r1(vec![h(&[0, 1, 2, 3], false), h(&[0, 1], false)]),
                    r2(vec![h(&[1, 2], false), h(&[2, 3], false)]),
                ],
                h(&[2, 3], false),
            ),
            row(
                "bestNonPreferredAffinityCount (6)",
                vec![
                    r1(vec![h(&[0, 1, 2, 3], false), h(&[0, 1], false)]),
                    r2(vec![
                        h(&[1, 2, 3], false),
                        h(&[1, 2], false),
                        h(&[1, 3], false),
                        h(&[2, 3], false),
                    ]),
                ],
                h(&[2, 3], false),
            ),
        ]
    }

    /// kubelet `singleNumaNodePolicy.mergeTestCases`.
    fn single_numa_rows() -> Vec<Row> {
        vec![
            row("TopologyHint not set", vec![], nil(true)),
            row(
                "HintProvider returns empty non-nil map[string][]TopologyHint",
                vec![ProviderHints::new()],
                nil(true),
            ),
            row(
                "HintProvider returns -nil map[string][]TopologyHint from provider",
                vec![p(&[("resource", None)])],
                nil(true),
            ),
            row(
                "HintProvider returns empty non-nil map[string][]TopologyHint from provider",
                vec![p(&[("resource", Some(vec![]))])],
                nil(false),
            ),
            row(
                "Single TopologyHint with Preferred as true and NUMANodeAffinity as nil",
                vec![p(&[("resource", Some(vec![nil(true)]))])],
                nil(true),
            ),
            row(
                "Single TopologyHint with Preferred as false and NUMANodeAffinity as nil",
                vec![p(&[("resource", Some(vec![nil(false)]))])],
                nil(false),
            ),
            row(
                "Two providers, 1 hint each, no common mask",
                vec![r1(vec![h(&[0], true)]), r2(vec![h(&[1], true)])],
                nil(false),
            ),
            row(
                "Two providers, 1 hint each, same mask, 1 preferred, 1 not 1/2",
                vec![r1(vec![h(&[0], true)]), r2(vec![h(&[0], false)])],
                nil(false),
            ),
            row(
                "Two providers, 1 hint each, same mask, 1 preferred, 1 not 2/2",
                vec![r1(vec![h(&[1], true)]), r2(vec![h(&[1], false)])],
                nil(false),
            ),
            row(
                "Two providers, 1 with 2 hints, 1 with single non-preferred hint matching",
                vec![
                    r1(vec![h(&[0], true), h(&[1], true)]),
                    r2(vec![h(&[0, 1], false)]),
                ],
                nil(false),
            ),
            row(
                "Single NUMA hint generation",
                vec![p(&[
                    ("resource1", Some(vec![h(&[0, 1], true)])),
                    (
                        "resource2",
                        Some(vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]),
                    ),
                ])],
                nil(false),
            ),
            row(
                "One no-preference provider",
                vec![
                    r1(vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]),
                    p(&[]),
                ],
                h(&[0], true),
            ),
        ]
    }

    /// Runs rows through the policy, and (for aligning policies) the merge step through the
    /// cross-product reference too.
    fn check(policy: &Policy, rows: &[Row], suite: &str) -> usize {
        for row in rows {
            let (hint, admit) = policy.merge(&row.providers);
            assert_eq!(hint, row.expected, "{suite}: {}", row.name);
            let expected_admit = match policy.name() {
                PolicyName::None | PolicyName::BestEffort => true,
                PolicyName::Restricted | PolicyName::SingleNumaNode => row.expected.preferred,
            };
            assert_eq!(admit, expected_admit, "{suite}: {} (admit)", row.name);
            if policy.name() != PolicyName::SingleNumaNode {
                let lists = filter_provider_hints(&row.providers);
                let closest = policy.options().prefer_closest_numa;
                assert_eq!(
                    reference::merge(policy.numa_info(), closest, &lists),
                    row.expected,
                    "{suite}: {} (reference)",
                    row.name
                );
            }
        }
        rows.len()
    }

    #[test]
    fn best_effort_merge() {
        // kubelet TestPolicyBestEffortMerge (four nodes).
        let numa = numa_four();
        let all = numa.nodes().to_vec();
        let policy = Policy::new(PolicyName::BestEffort, numa, PolicyOptions::default());
        let mut rows = common_rows();
        rows.extend(best_effort_rows(&all));
        rows.extend(no_policies_rows());
        assert_eq!(check(&policy, &rows, "TestPolicyBestEffortMerge"), 28);
    }

    #[test]
    fn best_effort_merge_closest_numa() {
        // kubelet TestPolicyBestEffortMergeClosestNUMA (eight nodes).
        let numa = numa_eight();
        let all = numa.nodes().to_vec();
        let options = PolicyOptions {
            prefer_closest_numa: true,
            ..PolicyOptions::default()
        };
        let policy = Policy::new(PolicyName::BestEffort, numa, options);
        let mut rows = common_rows();
        rows.extend(best_effort_rows(&all));
        rows.extend(closest_rows());
        assert_eq!(
            check(&policy, &rows, "TestPolicyBestEffortMergeClosestNUMA"),
            30
        );
    }

    #[test]
    fn restricted_merge() {
        // kubelet TestPolicyRestrictedMerge: the same hints, admitted only when preferred.
        let numa = numa_four();
        let all = numa.nodes().to_vec();
        let policy = Policy::new(PolicyName::Restricted, numa, PolicyOptions::default());
        let mut rows = common_rows();
        rows.extend(best_effort_rows(&all));
        rows.extend(no_policies_rows());
        check(&policy, &rows, "TestPolicyRestrictedMerge");
        // TestPolicyRestrictedMergeClosestNUMA.
        let numa = numa_eight();
        let all = numa.nodes().to_vec();
        let options = PolicyOptions {
            prefer_closest_numa: true,
            ..PolicyOptions::default()
        };
        let policy = Policy::new(PolicyName::Restricted, numa, options);
        let mut rows = common_rows();
        rows.extend(best_effort_rows(&all));
        rows.extend(closest_rows());
        check(&policy, &rows, "TestPolicyRestrictedMergeClosestNUMA");
    }

    #[test]
    fn single_numa_node_merge() {
        // kubelet TestPolicySingleNumaNodeMerge (four nodes; prefer-closest has no effect).
        for closest in [false, true] {
            let options = PolicyOptions {
                prefer_closest_numa: closest,
                ..PolicyOptions::default()
            };
            let policy = Policy::new(PolicyName::SingleNumaNode, numa_four(), options);
            let mut rows = common_rows();
            rows.extend(single_numa_rows());
            assert_eq!(check(&policy, &rows, "TestPolicySingleNumaNodeMerge"), 21);
        }
        // A single-node machine: the one node is the default affinity, reported as nil.
        let one = NumaInfo::new(&[0], &[vec![10]]).unwrap();
        let policy = Policy::new(PolicyName::SingleNumaNode, one, PolicyOptions::default());
        assert_eq!(policy.merge(&[r1(vec![h(&[0], true)])]), (nil(true), true));
    }

    #[test]
    fn none_policy_admits_without_a_hint() {
        // kubelet TestPolicyNoneMerge / TestPolicyNoneCanAdmitPodResult.
        let policy = Policy::new(PolicyName::None, numa_two(), PolicyOptions::default());
        let (hint, admit) = policy.merge(&[r1(vec![h(&[0, 1], false)])]);
        assert_eq!(hint, TopologyHint::default());
        assert!(admit);
    }

    #[test]
    fn can_admit_pod_result() {
        // kubelet TestPolicy{BestEffort,Restricted,SingleNumaNode}CanAdmitPodResult.
        let unsatisfiable = [p(&[("resource", Some(vec![]))])];
        for (name, admit) in [
            (PolicyName::BestEffort, true),
            (PolicyName::Restricted, false),
            (PolicyName::SingleNumaNode, false),
        ] {
            let policy = Policy::new(name, numa_two(), PolicyOptions::default());
            assert_eq!(policy.merge(&unsatisfiable).1, admit, "{name}");
        }
    }

    #[test]
    fn policy_names_round_trip() {
        // kubelet TestNewManager "Policy is set to ..." / "unknown".
        for name in ["none", "best-effort", "restricted", "single-numa-node"] {
            assert_eq!(name.parse::<PolicyName>().unwrap().as_str(), name);
        }
        let err = "unknown".parse::<PolicyName>().unwrap_err();
        assert_eq!(err.to_string(), "unknown policy: \"unknown\"");
    }

    #[test]
    fn options_parse_like_kubelet() {
        // kubelet TestNewTopologyManagerOptions rows.
        let opts = |pairs: &[(&str, &str)]| {
            PolicyOptions::parse(
                &pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                    .collect(),
            )
        };
        assert_eq!(
            opts(&[
                (PREFER_CLOSEST_NUMA_NODES, "true"),
                (MAX_ALLOWABLE_NUMA_NODES, "8")
            ]),
            Ok(PolicyOptions {
                prefer_closest_numa: true,
                max_allowable_numa_nodes: 8
            })
        );
        assert_eq!(
            opts(&[(MAX_ALLOWABLE_NUMA_NODES, "12")]),
            Ok(PolicyOptions {
                prefer_closest_numa: false,
                max_allowable_numa_nodes: 12
            })
        );
        assert_eq!(opts(&[]), Ok(PolicyOptions::default()));
        assert_eq!(
            opts(&[(PREFER_CLOSEST_NUMA_NODES, "T")]).map(|o| o.prefer_closest_numa),
            Ok(true)
        );
        assert_eq!(
            opts(&[(PREFER_CLOSEST_NUMA_NODES, "not a boolean")])
                .unwrap_err()
                .to_string(),
            "bad value for option \"prefer-closest-numa-nodes\": \"not a boolean\""
        );
        assert_eq!(
            opts(&[(MAX_ALLOWABLE_NUMA_NODES, "a")])
                .unwrap_err()
                .to_string(),
            "unable to convert policy option to integer \"max-allowable-numa-nodes\": \"a\""
        );
        assert_eq!(
            opts(&[(MAX_ALLOWABLE_NUMA_NODES, "7")])
                .unwrap_err()
                .to_string(),
            "the minimum value of \"max-allowable-numa-nodes\" should not be less than 8"
        );
        assert_eq!(
            opts(&[("unknown-option", "true")]).unwrap_err().to_string(),
            "unknown Topology Manager Policy option: \"unknown-option\""
        );
    }
}
