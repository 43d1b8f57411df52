//! The system test cases, one module per capability.
pub(crate) mod capabilities;
pub(crate) mod cgroups;
pub(crate) mod chaos;
pub(crate) mod cpu_time;
pub(crate) mod feedback;
pub(crate) mod inspect;
pub(crate) mod kubernetes;
pub(crate) mod lifecycle;
pub(crate) mod numa;
pub(crate) mod numa_unpinned;
pub(crate) mod pods;
pub(crate) mod prometheus;
pub(crate) mod runqlat;
pub(crate) mod surprises;
pub(crate) mod systemd;
pub(crate) mod systemd_kubelet;
pub(crate) mod throttle;
pub(crate) mod topology;

use crate::harness::Case;

/// A case's own time limit, where the harness's default is too short for it.
pub(crate) fn time_limit(case: &str) -> Option<std::time::Duration> {
    (case == "kill_storm_leaves_node_consistent").then(chaos::time_limit)
}

/// Every case, in the order they run.
pub(crate) fn all() -> Vec<Case> {
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
            name: "cpu_seconds_match_kernel_accounting_raw_tracepoint",
            run: cpu_time::matches_kernel_accounting_raw_tracepoint,
        },
        Case {
            name: "cgroup_manager_creates_exact_files",
            run: cgroups::create_writes_exact_files,
        },
        Case {
            name: "cgroup_manager_update_writes_only_drift",
            run: cgroups::update_writes_only_drift,
        },
        Case {
            name: "cgroup_manager_pids_and_destroy_leave_nothing",
            run: cgroups::pids_and_destroy_leave_nothing,
        },
        Case {
            name: "cgroup_manager_join_handle_places_before_exec_and_kill_empties",
            run: cgroups::join_handle_and_kill,
        },
        Case {
            name: "cgroup_manager_stats_read_kernel_files",
            run: cgroups::stats_read_kernel_files,
        },
        Case {
            name: "manifests_become_pod_cgroups_with_kubelet_values",
            run: pods::manifests_become_cgroups,
        },
        Case {
            name: "node_allocatable_enforced_and_admission_rejects",
            run: pods::node_allocatable_enforced,
        },
        Case {
            name: "guaranteed_pod_pinned_to_one_numa_node_survives_restart_with_corrupt_checkpoints",
            run: topology::guaranteed_pod_pinned_to_one_numa_node,
        },
        Case {
            name: "numa_memory_of_unpinned_pods_is_judged_by_where_they_ran",
            run: numa_unpinned::unpinned_memory_is_judged_by_where_it_ran,
        },
        Case {
            name: "feedback_gives_a_throttled_burstable_container_a_cpu_burst",
            run: feedback::throttled_burstable_gets_a_burst,
        },
        Case {
            name: "feedback_caps_besteffort_when_it_crowds_out_burstable",
            run: feedback::besteffort_crowding_burstable_is_suppressed,
        },
        Case {
            name: "feedback_moves_misplaced_memory_to_the_node_of_the_cpus",
            run: feedback::misplaced_memory_follows_the_cpus,
        },
        Case {
            name: "systemd_driver_units_hold_kubelet_values_through_reload_drift_and_stops",
            run: systemd::units_hold_kubelet_values_through_reload_drift_and_stops,
        },
        Case {
            name: "systemd_driver_feedback_interventions_survive_daemon_reload",
            run: systemd::feedback_interventions_survive_daemon_reload,
        },
        Case {
            name: "systemd_beside_kubelet_interventions_are_unit_properties_and_restored",
            run: systemd_kubelet::interventions_are_unit_properties_beside_kubelet,
        },
        Case {
            name: "systemd_driver_dashboard_queries_answer",
            run: prometheus::dashboard_queries_answer_on_the_systemd_driver,
        },
        Case {
            name: "sigterm_detaches_programs_and_exits_zero_within_5s",
            run: lifecycle::sigterm_detaches,
        },
        Case {
            name: "sigint_detaches_programs_and_exits_zero_within_5s",
            run: lifecycle::sigint_detaches,
        },
        Case {
            name: "sighup_is_ignored_and_sigquit_detaches_programs_within_5s",
            run: lifecycle::sighup_is_ignored_and_sigquit_detaches,
        },
        Case {
            name: "inspect_only_reads",
            run: inspect::inspect_only_reads,
        },
        Case {
            name: "runqueue_latency_matches_schedstat",
            run: runqlat::waits_match_schedstat,
        },
        Case {
            name: "runqueue_latency_matches_schedstat_raw_tracepoint",
            run: runqlat::waits_match_schedstat_raw_tracepoint,
        },
        Case {
            name: "preemption_pairs_attributed_to_victim_and_preemptor",
            run: runqlat::preemption_pairs,
        },
        Case {
            name: "sched_switch_counters_of_removed_cgroups_are_dropped",
            run: runqlat::removed_cgroups_forgotten,
        },
        Case {
            name: "cpu_throttling_counters_match_cpu_stat",
            run: throttle::counters_match_cpu_stat,
        },
        Case {
            name: "cpu_throttle_episodes_match_cpu_stat",
            run: throttle::episodes_match_cpu_stat,
        },
        Case {
            name: "numa_probe_modes_as_expected",
            run: numa::probe_modes,
        },
        Case {
            name: "numa_memory_bytes_local_remote_match_numa_stat",
            run: numa::memory_bytes,
        },
        Case {
            name: "numa_hint_faults_local_remote_match_vmstat",
            run: numa::hint_faults,
        },
        Case {
            name: "numa_page_allocations_local_remote_cover_resident_pages",
            run: numa::page_allocations,
        },
        Case {
            name: "numa_counters_of_removed_cgroups_are_dropped",
            run: numa::removed_cgroups_forgotten,
        },
        Case {
            name: "numa_task_migrations_match_nr_migrations",
            run: numa::migrations,
        },
        Case {
            name: "numa_task_migrations_match_nr_migrations_raw_tracepoint",
            run: numa::migrations_raw_tracepoint,
        },
        Case {
            name: "dashboard_queries_answer_from_a_real_prometheus",
            run: prometheus::dashboard_queries_answer,
        },
        Case {
            name: "beside_kubelet_with_containerd",
            run: kubernetes::beside_kubelet,
        },
        Case {
            name: "kernel_surprises_degrade_one_part",
            run: surprises::kernel_surprises_degrade,
        },
        Case {
            name: "listed_capabilities_suffice_for_every_probe",
            run: capabilities::listed_capabilities_suffice,
        },
        Case {
            name: "kill_storm_leaves_node_consistent",
            run: chaos::kill_storm,
        },
    ]
}
