//! Checkpoint vectors from kubelet's tests: pkg/kubelet/cm/cpumanager/state/
//! state_checkpoint_test.go (TestCheckpointStateRestore, in its released v2 form and in the
//! 1.36 form with v3/v4 files) and checkpoint tests (TestCPUManagerCheckpointV3_VerifyChecksum_
//! Compatibility). Each row names the kubelet case.
use proptest::prelude::*;

use super::*;
use crate::cm::cpu::testing::cpus;

fn state(default: &str, entries: &[(&str, &str, &str)]) -> CpuState {
    let mut s = CpuState {
        default_cpus: cpus(default),
        ..Default::default()
    };
    for (pod, container, set) in entries {
        s.set(pod, container, cpus(set));
    }
    s
}

fn restored(bytes: &str, policy: &str) -> Result<CpuState, (RecoveryReason, String)> {
    match decode(bytes.as_bytes(), policy) {
        Restored::State(s) => Ok(s),
        Restored::Rebuild { reason, detail } => Err((reason, detail)),
    }
}

fn reason(bytes: &str, policy: &str) -> RecoveryReason {
    restored(bytes, policy).expect_err("must not restore").0
}

#[test]
fn restores_released_v2_checkpoints() {
    // "Restore default cpu set" (kubelet 1.18-1.35 vector).
    assert_eq!(
        restored(
            r#"{"policyName": "none", "defaultCPUSet": "4-6", "entries": {}, "checksum": 354655845}"#,
            "none"
        ),
        Ok(state("4-6", &[]))
    );
    // "Restore valid checkpoint".
    assert_eq!(
        restored(
            r#"{"policyName": "none", "defaultCPUSet": "1-3",
                "entries": {"pod": {"container1": "4-6", "container2": "1-3"}},
                "checksum": 3610638499}"#,
            "none"
        ),
        Ok(state(
            "1-3",
            &[("pod", "container1", "4-6"), ("pod", "container2", "1-3")]
        ))
    );
}

#[test]
fn restores_v2_files_checksummed_under_the_v3_name() {
    // 1.36 "Restore checkpoint from v2 (migration)": checksum of the v3 struct.
    assert_eq!(
        restored(
            r#"{"policyName": "static", "defaultCPUSet": "7-9",
                "entries": {"pod": {"container1": "4-6", "container2": "1-3"}},
                "checksum": 1942532442}"#,
            "static"
        ),
        Ok(state(
            "7-9",
            &[("pod", "container1", "4-6"), ("pod", "container2", "1-3")]
        ))
    );
}

#[test]
fn reports_each_unusable_checkpoint_with_its_reason() {
    let rows: &[(&str, &str, &str, RecoveryReason, &str)] = &[
        (
            "Restore checkpoint with invalid checksum",
            r#"{"policyName": "none", "defaultCPUSet": "4-6", "entries": {}, "checksum": 1337}"#,
            "none",
            RecoveryReason::Checksum,
            "checkpoint is corrupted",
        ),
        (
            "Restore checkpoint with invalid JSON",
            "{",
            "none",
            RecoveryReason::Corrupt,
            "EOF",
        ),
        (
            "Restore checkpoint with invalid policy name",
            r#"{"policyName": "other", "defaultCPUSet": "1-3", "checksum": 0}"#,
            "none",
            RecoveryReason::PolicyChanged,
            r#"configured policy "none" differs from state checkpoint policy "other""#,
        ),
        (
            "Restore checkpoint with unparsable default cpu set (unchecked, checksum 0)",
            r#"{"policyName": "none", "defaultCPUSet": "1.3", "checksum": 0}"#,
            "none",
            RecoveryReason::Corrupt,
            r#"could not parse default CPU set "1.3""#,
        ),
        (
            "Restore checkpoint from v1 (released test: v1 checksum 2912033808)",
            r#"{"policyName": "none", "defaultCPUSet": "4-6", "entries": {}, "checksum": 2912033808}"#,
            "none",
            RecoveryReason::Corrupt,
            "v1 checkpoint",
        ),
        (
            "Restore valid v1 checkpoint (released test: checksum 1535905563)",
            r#"{"policyName": "none", "defaultCPUSet": "1-3",
                "entries": {"container1": "4-6", "container2": "1-3"}, "checksum": 1535905563}"#,
            "none",
            RecoveryReason::Corrupt,
            "v1 checkpoint",
        ),
        (
            "Fail to restore checkpoint from checkpoint with v1 checksum",
            r#"{"policyName": "none", "defaultCPUSet": "1-3", "checksum": 1694838852}"#,
            "none",
            RecoveryReason::Corrupt,
            "v1 checkpoint",
        ),
        (
            "Fail to restore checkpoint from v1 (migration)",
            r#"{"policyName": "static", "defaultCPUSet": "7-9",
                "entries": {"containerID1": "4-6", "containerID2": "1-3"}, "checksum": 2026311253}"#,
            "static",
            RecoveryReason::Corrupt,
            "v1 checkpoint",
        ),
        (
            "a v1 file whose checksum does not match",
            r#"{"policyName": "static", "defaultCPUSet": "7-9",
                "entries": {"containerID1": "4-6"}, "checksum": 5}"#,
            "static",
            RecoveryReason::Checksum,
            "checkpoint is corrupted",
        ),
        (
            "an empty file",
            "",
            "static",
            RecoveryReason::Corrupt,
            "EOF",
        ),
    ];
    for (name, file, policy, want, fragment) in rows {
        let (got, detail) = restored(file, policy).expect_err(name);
        assert_eq!(got, *want, "{name}: {detail}");
        assert!(detail.contains(fragment), "{name}: {detail}");
    }
}

#[test]
fn verifies_v3_checksums_under_both_names_then_rejects_pod_level_entries() {
    // TestCPUManagerCheckpointV3_VerifyChecksum_Compatibility: "accepts legacy v3 checksum"
    // (766259872) and "accepts current v3 checksum" (2284712151). The checksum verifies (the
    // reason is not `checksum`); the pod-level entries make the state unusable for qosd.
    for checksum in [766_259_872u64, 2_284_712_151] {
        let file = format!(
            r#"{{"policyName": "static", "defaultCPUSet": "1-2",
                "entries": {{"pod1": {{"container1": "5-6", "container2": "3-4"}}}},
                "podEntries": {{"pod2": {{"cpuSet": "7-9"}}}},
                "checksum": {checksum}}}"#
        );
        assert_eq!(
            reason(&file, "static"),
            RecoveryReason::Invalid,
            "{checksum}"
        );
    }
    let tampered = r#"{"policyName": "static", "defaultCPUSet": "1-2",
        "entries": {"pod1": {"container1": "5-6", "container2": "3-4"}},
        "podEntries": {"pod2": {"cpuSet": "7-8"}}, "checksum": 766259872}"#;
    assert_eq!(reason(tampered, "static"), RecoveryReason::Checksum);
}

#[test]
fn restores_v4_checkpoints_from_the_data_section() {
    // "Restore default CPU set": the v2 part is deliberately wrong and must be ignored.
    assert_eq!(
        restored(
            r#"{"policyName": "other", "defaultCPUSet": "1-9", "checksum": 1234,
                "data": "{\"policyName\":\"none\",\"defaultCPUSet\":\"4-6\"}",
                "dataChecksum": 657950972}"#,
            "none"
        ),
        Ok(state("4-6", &[]))
    );
    // "Restore valid checkpoint with InPlacePodVerticalScalingExclusiveCPUs disabled".
    assert_eq!(
        restored(
            r#"{"policyName": "other", "defaultCPUSet": "1-9", "checksum": 1234,
                "data": "{\"policyName\":\"static\",\"defaultCPUSet\":\"7-9\",\"entries\":{\"pod\":{\"container1\":\"4-6\",\"container2\":\"1-3\"}}}",
                "dataChecksum": 1420829534}"#,
            "static"
        ),
        Ok(state(
            "7-9",
            &[("pod", "container1", "4-6"), ("pod", "container2", "1-3")]
        ))
    );
    // "Restore checkpoint ignoring unknown fields in data section".
    assert_eq!(
        restored(
            r#"{"policyName": "other", "defaultCPUSet": "1-9", "checksum": 1234,
                "data": "{\"policyName\":\"none\",\"defaultCPUSet\":\"4-6\",\"unknownField\":\"value\"}",
                "dataChecksum": 3492408555}"#,
            "none"
        ),
        Ok(state("4-6", &[]))
    );
}

#[test]
fn reports_unusable_v4_checkpoints_with_kubelets_messages() {
    let rows: &[(&str, &str, &str, RecoveryReason, &str)] = &[
        (
            "Fail to restore checkpoint without data section",
            r#"{"policyName": "static", "defaultCPUSet": "7-9",
                "entries": {"pod": {"container1": "4-6", "container2": "1-3"}},
                "checksum": 1942532442, "dataChecksum": 1234}"#,
            "none",
            RecoveryReason::Corrupt,
            "could not load v4 checkpoint: failed to deserialize cpu manager checkpoint data",
        ),
        (
            "Fail to restore checkpoint with invalid checksum",
            r#"{"policyName": "static", "defaultCPUSet": "7-9", "checksum": 1942532442,
                "data": "{\"policyName\":\"static\",\"defaultCPUSet\":\"7-9\",\"entries\":{\"pod\":{\"container1\":\"4-6\",\"container2\":\"1-3\"}}}",
                "dataChecksum": 1234}"#,
            "static",
            RecoveryReason::Checksum,
            "checkpoint is corrupted",
        ),
        (
            "Fail to restore checkpoint with invalid policy name",
            r#"{"policyName": "static", "defaultCPUSet": "7-9", "checksum": 1942532442,
                "data": "{\"policyName\":\"other\",\"defaultCPUSet\":\"7-9\",\"entries\":{\"pod\":{\"container1\":\"4-6\",\"container2\":\"1-3\"}}}",
                "dataChecksum": 1432271708}"#,
            "none",
            RecoveryReason::PolicyChanged,
            r#"configured policy "none" differs from state checkpoint policy "other""#,
        ),
        (
            "Fail to restore checkpoint with unparsable default CPU set",
            r#"{"policyName": "none", "defaultCPUSet": "7-9", "checksum": 98002435,
                "data": "{\"policyName\":\"none\",\"defaultCPUSet\":\"1.3\"}",
                "dataChecksum": 3033143655}"#,
            "none",
            RecoveryReason::Corrupt,
            r#"could not parse default CPU set "1.3""#,
        ),
        (
            "Fail to restore checkpoint with unparsable assignment entry",
            r#"{"policyName": "static", "defaultCPUSet": "1-3", "checksum": 1659543133,
                "data": "{\"policyName\":\"static\",\"defaultCPUSet\":\"1-3\",\"entries\":{\"pod\":{\"container1\":\"4-6\",\"container2\":\"asd\"}}}",
                "dataChecksum": 3794806925}"#,
            "static",
            RecoveryReason::Corrupt,
            r#"could not parse cpuset "asd" for container "container2" in pod "pod""#,
        ),
        (
            "Restore valid v4 checkpoint with PodLevelResourceManagers enabled (pod entries)",
            r#"{"policyName": "other", "defaultCPUSet": "1-9", "checksum": 1234,
                "data": "{\"policyName\":\"static\",\"defaultCPUSet\":\"1-3\",\"entries\":{\"pod\":{\"container1\":\"4-6\",\"container2\":\"7-9\"}},\"podEntries\":{\"pod\":{\"cpuSet\":\"4-10\"}},\"baselines\":{\"pod\":{\"container1\":{\"baseline\":\"4-5\"},\"container2\":{\"baseline\":\"7-8\"}}}}",
                "dataChecksum": 1032795074}"#,
            "static",
            RecoveryReason::Invalid,
            "podEntries",
        ),
    ];
    for (name, file, policy, want, fragment) in rows {
        let (got, detail) = restored(file, policy).expect_err(name);
        assert_eq!(got, *want, "{name}: {detail}");
        assert!(detail.contains(fragment), "{name}: {detail}");
    }
}

#[test]
fn writes_kubelets_v2_layout_with_kubelets_checksum() {
    // The "Restore valid checkpoint" vector, produced rather than read.
    let s = state(
        "1-3",
        &[("pod", "container1", "4-6"), ("pod", "container2", "1-3")],
    );
    let bytes = encode("none", &s).unwrap();
    assert_eq!(
        String::from_utf8(bytes).unwrap(),
        r#"{"policyName":"none","defaultCpuSet":"1-3","entries":{"pod":{"container1":"4-6","container2":"1-3"}},"checksum":3610638499}"#
    );
    // Empty entries are omitted, as Go's omitempty does; the checksum is the released vector.
    let bytes = encode("none", &state("4-6", &[])).unwrap();
    assert_eq!(
        String::from_utf8(bytes).unwrap(),
        r#"{"policyName":"none","defaultCpuSet":"4-6","checksum":354655845}"#
    );
}

fn arb_state() -> impl Strategy<Value = CpuState> {
    let cpu_set = proptest::collection::btree_set(0u32..512, 0..12)
        .prop_map(|s| s.into_iter().collect::<Cpus>());
    let containers = proptest::collection::btree_map("[a-z][a-z0-9-]{0,10}", cpu_set.clone(), 1..4);
    let pods = proptest::collection::btree_map("[0-9a-f]{8}", containers, 0..5);
    (cpu_set, pods).prop_map(|(default_cpus, assignments)| CpuState {
        default_cpus,
        assignments,
    })
}

proptest! {
    #[test]
    fn checkpoint_round_trips(s in arb_state(), policy in "(none|static)") {
        let bytes = encode(&policy, &s).unwrap();
        prop_assert_eq!(decode(&bytes, &policy), Restored::State(s));
    }

    #[test]
    fn any_changed_byte_in_a_cpu_list_is_detected(s in arb_state(), flip in 0usize..64) {
        let bytes = encode("static", &s).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        // Change one digit of the content (not of the checksum) to another digit.
        let end = text.find("\"checksum\"").unwrap();
        let digits: Vec<usize> = text[..end]
            .char_indices()
            .filter(|(_, c)| c.is_ascii_digit())
            .map(|(i, _)| i)
            .collect();
        prop_assume!(!digits.is_empty());
        let at = digits[flip % digits.len()];
        let old = text.as_bytes()[at];
        let new = if old == b'9' { b'0' } else { old + 1 };
        let mut changed = text.into_bytes();
        changed[at] = new;
        let outcome = decode(&changed, "static");
        prop_assert!(
            matches!(outcome, Restored::Rebuild { .. }),
            "tampered checkpoint restored: {:?}", outcome
        );
    }
}
