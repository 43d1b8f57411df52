//! The system test cases, one module per capability.
pub mod cpu_time;
pub mod lifecycle;

use crate::harness::Case;

/// Every case, in the order they run.
pub fn all() -> Vec<Case> {
    vec![
        Case {
            name: "check_reports_layout_kernel_btf_and_probe_modes",
            run: lifecycle::check_report,
        },
        Case {
            name: "metrics_expose_build_and_probe_info",
            run: lifecycle::metrics_info,
        },
        Case {
            name: "cpu_seconds_match_kernel_accounting",
            run: cpu_time::matches_kernel_accounting,
        },
        Case {
            name: "sigterm_detaches_programs_and_exits_zero_within_1s",
            run: lifecycle::sigterm_detaches,
        },
        Case {
            name: "sigint_detaches_programs_and_exits_zero_within_1s",
            run: lifecycle::sigint_detaches,
        },
    ]
}
