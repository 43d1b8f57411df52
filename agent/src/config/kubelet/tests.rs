use std::path::Path;
use std::time::Duration;

use super::*;
use crate::config::eviction::{self, DEFAULT_EVICTION_HARD, Signal, ThresholdValue};

const HEADER: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

fn parse(body: &str) -> Result<LoadedKubeletConfig, ConfigError> {
    parse_kubelet_config(
        &format!("{HEADER}{body}"),
        Path::new("/etc/kubernetes/kubelet.yaml"),
    )
}

fn config(body: &str) -> KubeletConfiguration {
    parse(body).unwrap_or_else(|e| panic!("{body}: {e}")).config
}

fn validation_errors(body: &str) -> Vec<String> {
    match parse(body) {
        Err(ConfigError::Validation { errors, .. }) => errors,
        other => panic!("{body}: expected validation errors, got {other:?}"),
    }
}

fn invalid(body: &str) -> (String, String, String) {
    match parse(body) {
        Err(e @ ConfigError::Invalid { .. }) => {
            let text = e.to_string();
            let ConfigError::Invalid { field, reason, .. } = e else {
                unreachable!()
            };
            (field, reason, text)
        }
        other => panic!("{body}: expected an invalid field, got {other:?}"),
    }
}

fn q(text: &str) -> Option<Quantity> {
    Some(Quantity::parse(text).unwrap())
}

/// The node-allocatable example from the brief (and kubelet's reserve-compute-resources page).
#[test]
fn example_file_loads_unchanged() {
    let text = "\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
systemReserved: {cpu: \"500m\", memory: \"1Gi\"}
kubeReserved: {cpu: \"500m\", memory: \"1Gi\"}
enforceNodeAllocatable: [pods, kube-reserved, system-reserved]
systemReservedCgroup: /system.slice
kubeReservedCgroup: /kubelet.slice
";
    let loaded = parse_kubelet_config(text, Path::new("/etc/kubelet.yaml")).unwrap();
    assert!(loaded.unsupported_fields.is_empty());
    let c = loaded.config;
    assert_eq!(
        c.system_reserved,
        ReservedResources {
            cpu: q("500m"),
            memory: q("1Gi"),
            ..Default::default()
        }
    );
    assert_eq!(c.kube_reserved, c.system_reserved);
    assert_eq!(
        c.enforce_node_allocatable,
        BTreeSet::from([
            EnforcementKey::Pods,
            EnforcementKey::KubeReserved,
            EnforcementKey::SystemReserved
        ])
    );
    assert_eq!(c.system_reserved_cgroup.as_deref(), Some("/system.slice"));
    assert_eq!(c.kube_reserved_cgroup.as_deref(), Some("/kubelet.slice"));
    assert_eq!(c.system_reserved.milli_cpu(), 500);
    assert_eq!(c.kube_reserved.memory_bytes(), 1 << 30);
    // Everything else is kubelet's default.
    assert_eq!(c.cgroup_driver, CgroupDriver::Cgroupfs);
    assert_eq!(c.cgroup_root, "/");
    assert_eq!(c.eviction_hard.len(), DEFAULT_EVICTION_HARD.len());
}

/// `pkg/kubelet/apis/config/v1beta1/defaults_test.go` `TestSetDefaultsKubeletConfiguration`
/// ("empty config"), for the fields qosd reads.
#[test]
fn empty_configuration_gets_kubelet_defaults() {
    let c = config("");
    assert_eq!(c, KubeletConfiguration::default());
    assert_eq!(c.system_reserved, ReservedResources::default());
    assert_eq!(
        c.enforce_node_allocatable,
        BTreeSet::from([EnforcementKey::Pods])
    );
    assert_eq!(c.system_reserved_cgroup, None);
    assert_eq!(c.cgroup_driver, CgroupDriver::Cgroupfs);
    assert_eq!(c.cgroup_root, "/");
    assert!(c.cgroups_per_qos);
    assert!(c.feature_gates.is_empty());
    assert!(!c.memory_qos());
    assert!((c.memory_throttling_factor - 0.9).abs() < f64::EPSILON);
    assert_eq!(c.pod_pids_limit, -1);
    assert!(c.cpu_cfs_quota);
    assert_eq!(c.cpu_cfs_quota_period, Duration::from_millis(100));
    assert!(c.reserved_system_cpus.is_empty());
    assert_eq!(c.cpu_manager_policy, "none");
    assert_eq!(c.memory_manager_policy, "None");
    assert_eq!(c.topology_manager_policy, "none");
    assert_eq!(c.topology_manager_scope, "container");
    assert_eq!(c.max_pods, 110);
    let memory = eviction::threshold_for(&c.eviction_hard, Signal::MemoryAvailable).unwrap();
    assert_eq!(
        memory.value,
        ThresholdValue::Quantity(Quantity::from_units(100 << 20))
    );
    let nodefs = eviction::threshold_for(&c.eviction_hard, Signal::NodeFsAvailable).unwrap();
    assert_eq!(nodefs.value, ThresholdValue::Percentage(0.1));
    assert!(eviction::threshold_for(&c.eviction_hard, Signal::PidAvailable).is_none());
}

#[test]
fn every_supported_field_is_read() {
    let c = config(
        "\
systemReserved: {cpu: 1, memory: 2Gi, ephemeral-storage: 10Gi, pid: \"1000\"}
kubeReserved: {cpu: 250m}
evictionHard: {memory.available: 5%, pid.available: 500}
mergeDefaultEvictionSettings: false
enforceNodeAllocatable: [pods, system-reserved-compressible]
systemReservedCgroup: /system.slice
kubeReservedCgroup: \"\"
cgroupDriver: systemd
cgroupRoot: /qosd
cgroupsPerQOS: true
featureGates: {MemoryQoS: true, CustomCPUCFSQuotaPeriod: true}
memoryThrottlingFactor: 0.8
podPidsLimit: 4096
cpuCFSQuota: false
cpuCFSQuotaPeriod: 50ms
cpuManagerPolicy: static
memoryManagerPolicy: Static
topologyManagerPolicy: single-numa-node
topologyManagerScope: pod
maxPods: 250
",
    );
    assert_eq!(
        c.system_reserved,
        ReservedResources {
            cpu: q("1"),
            memory: q("2Gi"),
            ephemeral_storage: q("10Gi"),
            pid: q("1000")
        }
    );
    assert_eq!(c.kube_reserved.milli_cpu(), 250);
    assert_eq!(
        c.eviction_hard.len(),
        2,
        "no defaults without mergeDefaultEvictionSettings"
    );
    assert_eq!(
        eviction::threshold_for(&c.eviction_hard, Signal::PidAvailable)
            .unwrap()
            .value,
        ThresholdValue::Quantity(Quantity::from_units(500))
    );
    assert!(c.enforces(EnforcementKey::SystemReservedCompressible));
    assert!(!c.enforces(EnforcementKey::SystemReserved));
    assert_eq!(
        c.kube_reserved_cgroup, None,
        "an empty cgroup name is unset"
    );
    assert_eq!(c.cgroup_driver, CgroupDriver::Systemd);
    assert_eq!(c.cgroup_root, "/qosd");
    assert!(c.memory_qos());
    assert!((c.memory_throttling_factor - 0.8).abs() < f64::EPSILON);
    assert_eq!(c.pod_pids_limit, 4096);
    assert!(!c.cpu_cfs_quota);
    assert_eq!(c.cpu_cfs_quota_period, Duration::from_millis(50));
    assert_eq!(c.cpu_manager_policy, "static");
    assert_eq!(c.memory_manager_policy, "Static");
    assert_eq!(c.topology_manager_policy, "single-numa-node");
    assert_eq!(c.topology_manager_scope, "pod");
    assert_eq!(c.max_pods, 250);
}

#[test]
fn resource_manager_options_and_reserved_memory_are_parsed() {
    let c = config(
        "cpuManagerPolicyOptions: {full-pcpus-only: \"true\", distribute-cpus-across-numa: \"true\"}\n\
             topologyManagerPolicyOptions: {max-allowable-numa-nodes: 16}\n\
             reservedMemory:\n\
             - numaNode: 0\n  limits: {memory: 1Gi, hugepages-2Mi: 4Mi}\n\
             - numaNode: 1\n  limits: {memory: 512Mi}\n",
    );
    assert_eq!(
        c.cpu_manager_policy_options,
        BTreeMap::from([
            ("distribute-cpus-across-numa".to_owned(), "true".to_owned()),
            ("full-pcpus-only".to_owned(), "true".to_owned()),
        ])
    );
    assert_eq!(
        c.topology_manager_policy_options
            .get("max-allowable-numa-nodes"),
        Some(&"16".to_owned())
    );
    assert_eq!(c.reserved_memory.len(), 2);
    assert_eq!(c.reserved_memory[0].numa_node, 0);
    assert_eq!(c.reserved_memory[0].limits["memory"].value(), 1 << 30);
    assert_eq!(
        c.reserved_memory[0].limits["hugepages-2Mi"].value(),
        4 << 20
    );
    assert_eq!(c.reserved_memory[1].limits["memory"].value(), 512 << 20);
}

#[test]
fn reserved_memory_is_validated_like_kubelet() {
    let errors = validation_errors(
        "reservedMemory:\n\
             - numaNode: 0\n  limits: {memory: 1Gi, cpu: 1}\n\
             - numaNode: 0\n  limits: {memory: 0}\n\
             - numaNode: -1\n  limits: {memory: 1Gi}\n",
    );
    assert!(
        errors.iter().any(|e| e.contains("reservedMemory[0]")
            && e.contains("the limit type \"cpu\" for NUMA node 0 is not supported")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("reservedMemory[1]")
            && e.contains("may not be zero for NUMA node 0 and resource \"memory\"")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("reservedMemory[1]")
            && e.contains("duplicate value for NUMA node 0 and resource \"memory\"")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("reservedMemory[2].numaNode")),
        "{errors:?}"
    );
    let (field, reason, _) = invalid("cpuManagerPolicyOptions: {full-pcpus-only: true}\n");
    assert_eq!(field, "cpuManagerPolicyOptions.full-pcpus-only");
    assert!(reason.contains("expected a string"), "{reason}");
    let (field, reason, _) = invalid("reservedMemory:\n- numaNode: 0\n  limit: {memory: 1Gi}\n");
    assert!(field.starts_with("reservedMemory[0]"), "{field}");
    assert!(reason.contains("unknown field `limit`"), "{reason}");
}

#[test]
fn reserved_system_cpus_are_parsed_and_exclusive_with_reserved_cgroups() {
    let c = config("reservedSystemCPUs: 0-1,4\n");
    assert_eq!(c.reserved_system_cpus.to_vec(), vec![0, 1, 4]);
    let errors =
        validation_errors("reservedSystemCPUs: 0-1\nsystemReservedCgroup: /system.slice\n");
    assert!(
        errors[0].contains("can't use reservedSystemCPUs"),
        "{errors:?}"
    );
    let errors = validation_errors("reservedSystemCPUs: 3-1\n");
    assert!(
        errors[0].contains("unable to parse reservedSystemCPUs") && errors[0].contains("3-1"),
        "{errors:?}"
    );
}

#[test]
fn json_is_read_like_yaml() {
    let json = r#"{
  "apiVersion": "kubelet.config.k8s.io/v1beta1",
  "kind": "KubeletConfiguration",
  "systemReserved": {"cpu": "500m", "memory": "1Gi"},
  "enforceNodeAllocatable": ["pods", "system-reserved"],
  "systemReservedCgroup": "/system.slice",
  "staticPodPath": "/etc/kubernetes/manifests"
}"#;
    let loaded = parse_kubelet_config(json, Path::new("kubelet.json")).unwrap();
    let yaml = parse(
        "systemReserved: {cpu: 500m, memory: 1Gi}\nenforceNodeAllocatable: [pods, system-reserved]\n\
             systemReservedCgroup: /system.slice\nstaticPodPath: /etc/kubernetes/manifests\n",
    )
    .unwrap();
    assert_eq!(loaded.config, yaml.config);
    assert_eq!(loaded.unsupported_fields, ["staticPodPath"]);
    let err = parse_kubelet_config("{\"apiVersion\": ", Path::new("kubelet.json")).unwrap_err();
    assert!(matches!(err, ConfigError::Syntax { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("kubelet config file kubelet.json: not valid YAML or JSON"),
        "{err}"
    );
}

#[test]
fn unknown_fields_are_errors_naming_them() {
    let err = parse("systemReserved: {cpu: 1}\nsystemReservd: {cpu: 1}\nfooBar: 1\n").unwrap_err();
    let ConfigError::UnknownFields { fields, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(fields, &["fooBar", "systemReservd"]);
    assert_eq!(
        err.to_string(),
        "kubelet config file /etc/kubernetes/kubelet.yaml: strict decoding error: unknown field \"fooBar\", \
             unknown field \"systemReservd\""
    );
    // Field names are case-sensitive, as in kubelet's strict decoding.
    let err = parse("SystemReserved: {cpu: 1}\n").unwrap_err();
    assert!(
        err.to_string().contains("unknown field \"SystemReserved\""),
        "{err}"
    );
}

#[test]
fn real_but_unsupported_fields_are_reported_by_name() {
    let loaded = parse(
        "address: 0.0.0.0\nstaticPodPath: /etc/kubernetes/manifests\nauthentication:\n  anonymous: {enabled: false}\n\
             maxPods: 50\n",
    )
    .unwrap();
    assert_eq!(
        loaded.unsupported_fields,
        ["address", "authentication", "staticPodPath"]
    );
    assert_eq!(loaded.config.max_pods, 50);
}

#[test]
fn supported_and_unsupported_field_lists_match_the_decoder() {
    for name in SUPPORTED_FIELDS {
        assert!(
            !UNSUPPORTED_FIELDS.contains(name),
            "{name} is in both lists"
        );
        let value = serde_json::json!({ *name: null });
        let decoded: Result<RawKubeletConfiguration, _> = serde_json::from_value(value);
        assert!(decoded.is_ok(), "{name}: {:?}", decoded.err());
    }
    let unique: BTreeSet<_> = UNSUPPORTED_FIELDS.iter().collect();
    assert_eq!(
        unique.len(),
        UNSUPPORTED_FIELDS.len(),
        "duplicate in UNSUPPORTED_FIELDS"
    );
}

#[test]
fn api_version_and_kind_are_checked() {
    let cases = [
        (
            "kind: KubeletConfiguration\n",
            "apiVersion is missing, expected \"kubelet.config.k8s.io/v1beta1\"",
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n",
            "apiVersion is \"kubelet.config.k8s.io/v1alpha1\", expected \"kubelet.config.k8s.io/v1beta1\"",
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1beta1\n",
            "kind is missing, expected \"KubeletConfiguration\"",
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n",
            "kind is \"KubeProxyConfiguration\", expected \"KubeletConfiguration\"",
        ),
    ];
    for (text, want) in cases {
        let err = parse_kubelet_config(text, Path::new("k.yaml")).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("kubelet config file k.yaml: {want}"),
            "{text}"
        );
    }
}

#[test]
fn malformed_values_name_file_field_and_reason() {
    let (field, reason, text) = invalid("systemReserved: {cpu: abc}\n");
    assert_eq!(field, "systemReserved.cpu");
    assert!(reason.contains("\"abc\""), "{reason}");
    assert!(
        text.starts_with("kubelet config file /etc/kubernetes/kubelet.yaml: systemReserved.cpu: "),
        "{text}"
    );

    let (field, reason, _) = invalid("kubeReserved: {memory: -1Gi}\n");
    assert_eq!(
        (field.as_str(), reason.as_str()),
        (
            "kubeReserved.memory",
            "resource quantity cannot be negative: -1Gi"
        )
    );

    let (field, reason, _) = invalid("systemReserved: {hugepages-2Mi: 1Gi}\n");
    assert_eq!(field, "systemReserved");
    assert!(
        reason.starts_with("cannot reserve \"hugepages-2Mi\" resource"),
        "{reason}"
    );

    let (field, reason, _) = invalid("cgroupsPerQOS: \"yes\"\n");
    assert_eq!(field, "cgroupsPerQOS");
    assert!(reason.contains("expected a boolean"), "{reason}");

    let (field, reason, _) = invalid("cpuCFSQuotaPeriod: 100 ms\n");
    assert_eq!(field, "cpuCFSQuotaPeriod");
    assert!(reason.contains("100 ms"), "{reason}");

    let (field, reason, _) = invalid("evictionHard: {memory.available: -1}\n");
    assert_eq!(field, "evictionHard.memory.available");
    assert_eq!(
        reason,
        "eviction threshold memory.available must be positive: -1"
    );

    let (field, reason, _) = invalid("evictionHard: {memory.free: 1Gi}\n");
    assert_eq!(
        (field.as_str(), reason.as_str()),
        (
            "evictionHard.memory.free",
            "unsupported eviction signal memory.free"
        )
    );

    let (field, reason, _) = invalid("cgroupDriver: systemdd\n");
    assert_eq!(field, "cgroupDriver");
    assert!(reason.contains("\"systemdd\""), "{reason}");

    let (field, _, _) = invalid("enforceNodeAllocatable: pods\n");
    assert_eq!(field, "enforceNodeAllocatable");

    let (field, _, _) = invalid("maxPods: 5000000000\n");
    assert_eq!(field, "maxPods");

    let (field, _, _) = invalid("featureGates: {MemoryQoS: 1}\n");
    assert_eq!(field, "featureGates.MemoryQoS");
}

/// Rows mirror `validation_test.go` `TestValidateKubeletConfiguration` cases on
/// enforceNodeAllocatable and the other fields qosd validates.
#[test]
fn validation_like_kubelet() {
    let cases: &[(&str, &[&str])] = &[
        (
            "enforceNodeAllocatable: [system-reserved]\n",
            &[
                "systemReservedCgroup (--system-reserved-cgroup) must be specified when \"system-reserved\" or \
                   \"system-reserved-compressible\" included in enforceNodeAllocatable (--enforce-node-allocatable)",
            ],
        ),
        (
            "enforceNodeAllocatable: [kube-reserved-compressible]\n",
            &[
                "kubeReservedCgroup (--kube-reserved-cgroup) must be specified when \"kube-reserved\" or \
                   \"kube-reserved-compressible\" included in enforceNodeAllocatable (--enforce-node-allocatable)",
            ],
        ),
        (
            "enforceNodeAllocatable: [pods, none]\n",
            &[
                "enforceNodeAllocatable (--enforce-node-allocatable) may not contain additional enforcements when \
                   \"none\" is specified",
            ],
        ),
        (
            "enforceNodeAllocatable: [pods, pods]\n",
            &[
                "duplicated enforcements \"pods\" in enforceNodeAllocatable (--enforce-node-allocatable)",
            ],
        ),
        (
            "enforceNodeAllocatable: [illegal-key]\n",
            &[
                "option \"illegal-key\" specified for enforceNodeAllocatable (--enforce-node-allocatable). Valid \
                   options are \"pods\", \"system-reserved\", \"system-reserved-compressible\", \"kube-reserved\", \
                   \"kube-reserved-compressible\" or \"none\"",
            ],
        ),
        (
            "enforceNodeAllocatable: [system-reserved, system-reserved-compressible]\nsystemReservedCgroup: /s\n",
            &[
                "both \"system-reserved\" and \"system-reserved-compressible\" cannot be specified together in \
                   enforceNodeAllocatable (--enforce-node-allocatable)",
            ],
        ),
        // The default [pods] needs the QoS hierarchy.
        (
            "cgroupsPerQOS: false\n",
            &[
                "cgroupsPerQOS (--cgroups-per-qos) must be set to true when \"pods\" contained in \
                   enforceNodeAllocatable (--enforce-node-allocatable)",
            ],
        ),
        (
            "cpuCFSQuotaPeriod: 50ms\n",
            &[
                "cpuCFSQuotaPeriod (--cpu-cfs-quota-period) 50ms requires feature gate CustomCPUCFSQuotaPeriod",
            ],
        ),
        (
            "cpuCFSQuotaPeriod: 2s\nfeatureGates: {CustomCPUCFSQuotaPeriod: true}\n",
            &[
                "cpuCFSQuotaPeriod (--cpu-cfs-quota-period) 2s must be between 1ms and 1sec, inclusive",
            ],
        ),
        (
            "maxPods: -1\n",
            &["maxPods (--max-pods) -1 must not be a negative number"],
        ),
        (
            "memoryThrottlingFactor: 1.1\n",
            &["memoryThrottlingFactor 1.1 must be greater than 0 and less than or equal to 1.0"],
        ),
        (
            "memoryThrottlingFactor: 0\n",
            &["memoryThrottlingFactor 0 must be greater than 0 and less than or equal to 1.0"],
        ),
        (
            "topologyManagerPolicy: invalid-policy\n",
            &[
                "topologyManagerPolicy (--topology-manager-policy) \"invalid-policy\" must be one of: [\"none\", \
                   \"best-effort\", \"restricted\", \"single-numa-node\"]",
            ],
        ),
        (
            "topologyManagerScope: invalid-scope\n",
            &[
                "topologyManagerScope (--topology-manager-scope) \"invalid-scope\" must be one of: \"container\", or \"pod\"",
            ],
        ),
    ];
    for (body, want) in cases {
        assert_eq!(validation_errors(body), *want, "{body}");
    }
    // All findings are reported together, like kubelet's aggregate.
    let errors = validation_errors("maxPods: -1\nmemoryThrottlingFactor: 2\n");
    assert_eq!(errors.len(), 2, "{errors:?}");
    let err = parse("maxPods: -1\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "kubelet config file /etc/kubernetes/kubelet.yaml: invalid configuration: maxPods (--max-pods) -1 must \
             not be a negative number"
    );
    // Valid combinations.
    let c = config("cgroupsPerQOS: false\nenforceNodeAllocatable: []\n");
    assert!(c.enforce_node_allocatable.is_empty());
    assert_eq!(
        c.cgroup_root, "",
        "kubelet only defaults cgroupRoot with cgroupsPerQOS"
    );
    assert!(
        config("enforceNodeAllocatable: [none]\n")
            .enforce_node_allocatable
            .is_empty()
    );
    let c = config("cpuCFSQuotaPeriod: 1s\nfeatureGates: {CustomCPUCFSQuotaPeriod: true}\n");
    assert_eq!(c.cpu_cfs_quota_period, Duration::from_secs(1));
}

#[test]
fn eviction_hard_defaults_and_merge() {
    let signals = |c: &KubeletConfiguration| -> Vec<&str> {
        c.eviction_hard.iter().map(|t| t.signal.as_str()).collect()
    };
    // Unset (or null): kubelet's defaults.
    assert_eq!(
        config("evictionHard:\n").eviction_hard,
        KubeletConfiguration::default().eviction_hard
    );
    // Set: only the given signals.
    let c = config("evictionHard: {memory.available: 1Gi}\n");
    assert_eq!(signals(&c), ["memory.available"]);
    assert_eq!(
        c.eviction_hard[0].value,
        ThresholdValue::Quantity(Quantity::from_units(1 << 30))
    );
    // Explicitly empty: none at all.
    assert!(config("evictionHard: {}\n").eviction_hard.is_empty());
    // Merged: defaults plus overrides; 0% switches a default off.
    let c = config(
        "evictionHard: {memory.available: 1Gi, nodefs.available: 0%}\nmergeDefaultEvictionSettings: true\n",
    );
    assert_eq!(
        signals(&c),
        [
            "imagefs.available",
            "imagefs.inodesFree",
            "memory.available",
            "nodefs.inodesFree"
        ]
    );
    assert_eq!(
        eviction::threshold_for(&c.eviction_hard, Signal::MemoryAvailable)
            .unwrap()
            .value,
        ThresholdValue::Quantity(Quantity::from_units(1 << 30))
    );
}

#[test]
fn pod_pids_limit_and_max_pods_defaults() {
    assert_eq!(config("podPidsLimit: -5\n").pod_pids_limit, -1);
    assert_eq!(config("podPidsLimit: 0\n").pod_pids_limit, 0);
    assert_eq!(config("maxPods: 0\n").max_pods, 110);
}

#[test]
fn documents_that_are_not_configurations() {
    let path = Path::new("k.yaml");
    assert!(matches!(
        parse_kubelet_config("", path),
        Err(ConfigError::Empty { .. })
    ));
    let err = parse_kubelet_config("# only a comment\n", path).unwrap_err();
    assert_eq!(
        err.to_string(),
        "kubelet config file k.yaml: expected a mapping of fields, found nothing (null)"
    );
    let err = parse_kubelet_config("- a\n- b\n", path).unwrap_err();
    assert_eq!(
        err.to_string(),
        "kubelet config file k.yaml: expected a mapping of fields, found a list"
    );
    let err = parse_kubelet_config("apiVersion: [\n", path).unwrap_err();
    assert!(matches!(err, ConfigError::Syntax { .. }), "{err}");
    // Duplicate keys are rejected, like go-yaml's "mapping key already defined".
    let err = parse("maxPods: 1\nmaxPods: 2\n").unwrap_err();
    assert!(matches!(err, ConfigError::Syntax { .. }), "{err}");
    assert!(err.to_string().contains("maxPods"), "{err}");
}

#[test]
fn loads_from_a_file_and_names_a_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, format!("{HEADER}kubeReserved: {{memory: 512Mi}}\n")).unwrap();
    let loaded = load_kubelet_config(&path).unwrap();
    assert_eq!(loaded.path, path);
    assert_eq!(loaded.config.kube_reserved.memory_bytes(), 512 << 20);
    let missing = dir.path().join("nope.yaml");
    let err = load_kubelet_config(&missing).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }));
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "{err}"
    );
}

#[test]
fn go_durations() {
    let ok = [
        ("0", Duration::ZERO),
        ("100ms", Duration::from_millis(100)),
        ("1.5s", Duration::from_millis(1500)),
        (".5s", Duration::from_millis(500)),
        ("1m30s", Duration::from_secs(90)),
        ("2h", Duration::from_secs(7200)),
        ("250us", Duration::from_micros(250)),
        ("250µs", Duration::from_micros(250)),
        ("10ns", Duration::from_nanos(10)),
        ("+1s", Duration::from_secs(1)),
    ];
    for (text, want) in ok {
        assert_eq!(parse_go_duration(text), Ok(want), "{text}");
    }
    for bad in ["", "1", "s", "1x", "-1s", "1.2.3s", "100 ms", "9999999999h"] {
        assert!(parse_go_duration(bad).is_err(), "{bad}");
    }
}
