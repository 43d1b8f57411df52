//! The static policy's options (`cpuManagerPolicyOptions`): parsing, maturity gating and the
//! compatibility checks of kubelet's `policy_options.go`, with kubelet's error messages.
//!
//! Maturity follows kubelet 1.34: `full-pcpus-only` is stable; `distribute-cpus-across-numa`,
//! `strict-cpu-reservation` and `prefer-align-cpus-by-uncorecache` are beta (on unless the
//! `CPUManagerPolicyBetaOptions` gate is switched off); `align-by-socket` and
//! `distribute-cpus-across-cores` are alpha (need `CPUManagerPolicyAlphaOptions`).
use std::collections::BTreeMap;

use super::cpu_topology::CpuTopology;

pub const FULL_PCPUS_ONLY: &str = "full-pcpus-only";
pub const DISTRIBUTE_CPUS_ACROSS_NUMA: &str = "distribute-cpus-across-numa";
pub const ALIGN_BY_SOCKET: &str = "align-by-socket";
pub const DISTRIBUTE_CPUS_ACROSS_CORES: &str = "distribute-cpus-across-cores";
pub const STRICT_CPU_RESERVATION: &str = "strict-cpu-reservation";
pub const PREFER_ALIGN_CPUS_BY_UNCORECACHE: &str = "prefer-align-cpus-by-uncorecache";

/// Feature gate that allows alpha options.
pub const GATE_ALPHA_OPTIONS: &str = "CPUManagerPolicyAlphaOptions";
/// Feature gate that allows beta options (on by default).
pub const GATE_BETA_OPTIONS: &str = "CPUManagerPolicyBetaOptions";

const ALPHA: &[&str] = &[ALIGN_BY_SOCKET, DISTRIBUTE_CPUS_ACROSS_CORES];
const BETA: &[&str] = &[
    STRICT_CPU_RESERVATION,
    DISTRIBUTE_CPUS_ACROSS_NUMA,
    PREFER_ALIGN_CPUS_BY_UNCORECACHE,
];
const STABLE: &[&str] = &[FULL_PCPUS_ONLY];

/// Errors in the policy options, worded as kubelet's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    #[error("unknown CPU Manager Policy option: {0:?}")]
    Unknown(String),
    #[error("CPU Manager Policy Alpha-level Options not enabled, but option {0:?} provided")]
    AlphaNotEnabled(String),
    #[error("CPU Manager Policy Beta-level Options not enabled, but option {0:?} provided")]
    BetaNotEnabled(String),
    #[error("bad value for option {name:?}: strconv.ParseBool: parsing {value:?}: invalid syntax")]
    BadValue { name: String, value: String },
    #[error("static policy options {0} and {1} can not be used at the same time")]
    Conflict(&'static str, &'static str),
    #[error(
        "Topolgy manager single-numa-node policy is incompatible with CPUManager align-by-socket policy option"
    )]
    AlignBySocketWithSingleNumaNode,
    #[error(
        "Align by socket is not compatible with hardware where number of sockets are more than number of NUMA"
    )]
    AlignBySocketHardware,
}

/// Which option maturity levels the feature gates allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionGates {
    /// `CPUManagerPolicyAlphaOptions` (default off).
    pub alpha: bool,
    /// `CPUManagerPolicyBetaOptions` (default on).
    pub beta: bool,
}

impl Default for OptionGates {
    fn default() -> Self {
        Self {
            alpha: false,
            beta: true,
        }
    }
}

impl OptionGates {
    /// The gates from a `featureGates` map, with kubelet's defaults.
    #[must_use]
    pub fn from_feature_gates(gates: &BTreeMap<String, bool>) -> Self {
        Self {
            alpha: gates.get(GATE_ALPHA_OPTIONS).copied().unwrap_or(false),
            beta: gates.get(GATE_BETA_OPTIONS).copied().unwrap_or(true),
        }
    }
}

/// The parsed options (kubelet's `StaticPolicyOptions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StaticPolicyOptions {
    /// Only whole physical cores; requests that are not a multiple of the SMT level fail with
    /// `SMTAlignmentError`.
    pub full_physical_cpus_only: bool,
    /// Spread evenly over NUMA nodes when more than one is needed.
    pub distribute_cpus_across_numa: bool,
    /// Alignment at socket rather than NUMA-node boundary.
    pub align_by_socket: bool,
    /// Spread threads over cores (do not take whole cores first).
    pub distribute_cpus_across_cores: bool,
    /// Reserved CPUs are not in the shared pool either.
    pub strict_cpu_reservation: bool,
    /// Best-effort packing into uncore (L3) caches.
    pub prefer_align_by_uncore_cache: bool,
}

/// Go's `strconv.ParseBool`.
fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// kubelet's `CheckPolicyOptionAvailable`.
pub fn check_available(name: &str, gates: OptionGates) -> Result<(), OptionsError> {
    if ALPHA.contains(&name) {
        if !gates.alpha {
            return Err(OptionsError::AlphaNotEnabled(name.to_owned()));
        }
    } else if BETA.contains(&name) {
        if !gates.beta {
            return Err(OptionsError::BetaNotEnabled(name.to_owned()));
        }
    } else if !STABLE.contains(&name) {
        return Err(OptionsError::Unknown(name.to_owned()));
    }
    Ok(())
}

impl StaticPolicyOptions {
    /// kubelet's `NewStaticPolicyOptions` (options checked in name order, so the first error
    /// reported is deterministic).
    pub fn parse(
        options: &BTreeMap<String, String>,
        gates: OptionGates,
    ) -> Result<Self, OptionsError> {
        let mut opts = Self::default();
        for (name, value) in options {
            check_available(name, gates)?;
            let flag = parse_bool(value).ok_or_else(|| OptionsError::BadValue {
                name: name.clone(),
                value: value.clone(),
            })?;
            match name.as_str() {
                FULL_PCPUS_ONLY => opts.full_physical_cpus_only = flag,
                DISTRIBUTE_CPUS_ACROSS_NUMA => opts.distribute_cpus_across_numa = flag,
                ALIGN_BY_SOCKET => opts.align_by_socket = flag,
                DISTRIBUTE_CPUS_ACROSS_CORES => opts.distribute_cpus_across_cores = flag,
                STRICT_CPU_RESERVATION => opts.strict_cpu_reservation = flag,
                PREFER_ALIGN_CPUS_BY_UNCORECACHE => opts.prefer_align_by_uncore_cache = flag,
                _ => return Err(OptionsError::Unknown(name.clone())),
            }
        }
        let conflicts = [
            (
                opts.full_physical_cpus_only && opts.distribute_cpus_across_cores,
                FULL_PCPUS_ONLY,
                DISTRIBUTE_CPUS_ACROSS_CORES,
            ),
            (
                opts.distribute_cpus_across_numa && opts.distribute_cpus_across_cores,
                DISTRIBUTE_CPUS_ACROSS_NUMA,
                DISTRIBUTE_CPUS_ACROSS_CORES,
            ),
            (
                opts.prefer_align_by_uncore_cache && opts.distribute_cpus_across_cores,
                PREFER_ALIGN_CPUS_BY_UNCORECACHE,
                DISTRIBUTE_CPUS_ACROSS_CORES,
            ),
            (
                opts.prefer_align_by_uncore_cache && opts.distribute_cpus_across_numa,
                PREFER_ALIGN_CPUS_BY_UNCORECACHE,
                DISTRIBUTE_CPUS_ACROSS_NUMA,
            ),
        ];
        for (conflict, a, b) in conflicts {
            if conflict {
                return Err(OptionsError::Conflict(a, b));
            }
        }
        Ok(opts)
    }

    /// kubelet's `ValidateStaticPolicyOptions`: checks against the machine and the topology
    /// manager policy (`none`, `best-effort`, `restricted`, `single-numa-node`).
    pub fn validate(
        &self,
        topology: &CpuTopology,
        topology_manager_policy: &str,
    ) -> Result<(), OptionsError> {
        if self.align_by_socket {
            if topology_manager_policy == "single-numa-node" {
                return Err(OptionsError::AlignBySocketWithSingleNumaNode);
            }
            if topology.num_sockets > topology.num_numa_nodes {
                return Err(OptionsError::AlignBySocketHardware);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    const ALL_GATES: OptionGates = OptionGates {
        alpha: true,
        beta: true,
    };

    /// Rows mirror kubelet's policy_options_test.go `TestPolicyOptionsAvailable` and
    /// `TestPolicyOptionsCompatibility` cases.
    #[test]
    #[allow(
        clippy::type_complexity,
        reason = "table-driven test cases: one tuple per kubelet case"
    )]
    fn parse_table() {
        let cases: &[(&str, &[(&str, &str)], OptionGates, Result<(), &str>)] = &[
            (
                "FullPCPUsOnly stable option, no gate needed",
                &[(FULL_PCPUS_ONLY, "true")],
                OptionGates {
                    alpha: false,
                    beta: false,
                },
                Ok(()),
            ),
            (
                "DistributeCPUsAcrossNUMA beta option, beta gate off",
                &[(DISTRIBUTE_CPUS_ACROSS_NUMA, "true")],
                OptionGates {
                    alpha: false,
                    beta: false,
                },
                Err(
                    "CPU Manager Policy Beta-level Options not enabled, but option \"distribute-cpus-across-numa\" provided",
                ),
            ),
            (
                "AlignBySocket alpha option, alpha gate off",
                &[(ALIGN_BY_SOCKET, "true")],
                OptionGates::default(),
                Err(
                    "CPU Manager Policy Alpha-level Options not enabled, but option \"align-by-socket\" provided",
                ),
            ),
            (
                "badcpumanagerpolicyoption: unknown option",
                &[("badcpumanagerpolicyoption", "true")],
                ALL_GATES,
                Err("unknown CPU Manager Policy option: \"badcpumanagerpolicyoption\""),
            ),
            (
                "bad bool value",
                &[(FULL_PCPUS_ONLY, "yes")],
                ALL_GATES,
                Err(
                    "bad value for option \"full-pcpus-only\": strconv.ParseBool: parsing \"yes\": invalid syntax",
                ),
            ),
            (
                "FullPhysicalCPUsOnly set to true only",
                &[(FULL_PCPUS_ONLY, "true")],
                ALL_GATES,
                Ok(()),
            ),
            (
                "DistributeCPUsAcrossCores set to true only",
                &[(DISTRIBUTE_CPUS_ACROSS_CORES, "true")],
                ALL_GATES,
                Ok(()),
            ),
            (
                "FullPhysicalCPUsOnly and DistributeCPUsAcrossCores options can not coexist",
                &[
                    (FULL_PCPUS_ONLY, "true"),
                    (DISTRIBUTE_CPUS_ACROSS_CORES, "true"),
                ],
                ALL_GATES,
                Err(
                    "static policy options full-pcpus-only and distribute-cpus-across-cores can not be used at the same time",
                ),
            ),
            (
                "DistributeCPUsAcrossNUMA and DistributeCPUsAcrossCores options can not coexist",
                &[
                    (DISTRIBUTE_CPUS_ACROSS_NUMA, "true"),
                    (DISTRIBUTE_CPUS_ACROSS_CORES, "true"),
                ],
                ALL_GATES,
                Err(
                    "static policy options distribute-cpus-across-numa and distribute-cpus-across-cores can not be used at the same time",
                ),
            ),
            (
                "PreferAlignByUncoreCache and DistributeCPUsAcrossNUMA options can not coexist",
                &[
                    (PREFER_ALIGN_CPUS_BY_UNCORECACHE, "true"),
                    (DISTRIBUTE_CPUS_ACROSS_NUMA, "true"),
                ],
                ALL_GATES,
                Err(
                    "static policy options prefer-align-cpus-by-uncorecache and distribute-cpus-across-numa can not be used at the same time",
                ),
            ),
            (
                "an option set to false does not conflict",
                &[
                    (FULL_PCPUS_ONLY, "true"),
                    (DISTRIBUTE_CPUS_ACROSS_CORES, "false"),
                ],
                ALL_GATES,
                Ok(()),
            ),
        ];
        for (name, pairs, gates, expected) in cases {
            let got = StaticPolicyOptions::parse(&opts(pairs), *gates)
                .map(|_| ())
                .map_err(|e| e.to_string());
            assert_eq!(got, expected.map_err(str::to_owned), "{name}");
        }
    }

    #[test]
    fn parse_sets_each_flag() {
        let parsed = StaticPolicyOptions::parse(
            &opts(&[
                (FULL_PCPUS_ONLY, "1"),
                (STRICT_CPU_RESERVATION, "True"),
                (PREFER_ALIGN_CPUS_BY_UNCORECACHE, "t"),
                (ALIGN_BY_SOCKET, "TRUE"),
            ]),
            ALL_GATES,
        )
        .unwrap();
        assert!(parsed.full_physical_cpus_only);
        assert!(parsed.strict_cpu_reservation);
        assert!(parsed.prefer_align_by_uncore_cache);
        assert!(parsed.align_by_socket);
        assert!(!parsed.distribute_cpus_across_numa);
    }

    /// Mirrors kubelet's policy_options_test.go `TestValidateStaticPolicyOptions`.
    #[test]
    fn validate_align_by_socket() {
        let two_sockets_one_numa = CpuTopology::new((0..4).map(|cpu| {
            (
                cpu,
                super::super::cpu_topology::CpuInfo {
                    core: cpu,
                    socket: cpu / 2,
                    numa: 0,
                    uncore: 0,
                },
            )
        }))
        .unwrap();
        let two_sockets_two_numa = CpuTopology::synthetic(2, 1, 2, 1, 1).unwrap();
        let align = StaticPolicyOptions {
            align_by_socket: true,
            ..Default::default()
        };
        assert_eq!(
            align.validate(&two_sockets_two_numa, "single-numa-node"),
            Err(OptionsError::AlignBySocketWithSingleNumaNode)
        );
        assert_eq!(
            align.validate(&two_sockets_one_numa, "restricted"),
            Err(OptionsError::AlignBySocketHardware)
        );
        assert_eq!(align.validate(&two_sockets_two_numa, "restricted"), Ok(()));
        assert_eq!(
            StaticPolicyOptions::default().validate(&two_sockets_one_numa, "single-numa-node"),
            Ok(())
        );
    }
}
