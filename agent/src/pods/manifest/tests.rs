use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::*;
use crate::pods::qos::{QosClass, pod_qos};
use crate::pods::source::{Origin, PodEvent, SourcedPod};

const WEB: &str = "apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  containers:
  - name: app
    command: [/bin/sh, -c, 'sleep 100']
    resources: {limits: {cpu: 1, memory: 128Mi}}
";

fn pod_yaml(name: &str, cpu: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers:\n  - name: c\n    resources: {{requests: {{cpu: {cpu}}}}}\n"
    )
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, text).unwrap();
    path
}

fn messages(errors: &[ManifestError]) -> Vec<String> {
    errors.iter().map(ToString::to_string).collect()
}

/// The file a manifest pod came from.
fn manifest_file(pod: &SourcedPod) -> &Path {
    match &pod.origin {
        Origin::Manifest { file, .. } => file,
        other => panic!("not a manifest: {other}"),
    }
}

/// [`scan_dir`] of a directory of hostile files, which must answer within 5 s.
fn scan_within_5s(dir: &Path) -> ScanResult {
    let started = std::time::Instant::now();
    let scan = scan_dir(dir).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    scan
}

fn names(pods: &[SourcedPod]) -> Vec<String> {
    pods.iter().map(|p| p.pod.full_name()).collect()
}

#[test]
fn parses_a_pod_with_defaults() {
    let results = parse_manifest(WEB, ManifestFormat::Yaml);
    assert_eq!(results.len(), 1);
    let parsed = results[0].as_ref().unwrap();
    assert_eq!(parsed.document, 1);
    assert_eq!(parsed.pod.full_name(), "default/web");
    assert_eq!(parsed.pod.metadata.uid.len(), 32);
    assert_eq!(pod_qos(&parsed.pod.spec), QosClass::Guaranteed);
}

#[test]
fn several_documents_and_a_bad_one_in_the_middle() {
    let text = format!(
        "# leading comment\n---\n{}---\n# only a comment\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: [unclosed\n---\n{}...\n",
        pod_yaml("a", "1"),
        pod_yaml("b", "2")
    );
    let results = parse_manifest(&text, ManifestFormat::Yaml);
    assert_eq!(results.len(), 3, "{results:?}");
    assert_eq!(results[0].as_ref().unwrap().pod.metadata.name, "a");
    let err = results[1].as_ref().unwrap_err();
    assert_eq!(err.document(), 2);
    let msg = err.to_string();
    // The syntax error's line number is the file's.
    let line = text.lines().position(|l| l.contains("unclosed")).unwrap() + 1;
    assert_eq!(line, 15);
    assert!(
        msg.starts_with("document 2: ")
            && msg.contains(&format!("flow sequence at line {line} column 18")),
        "{msg}"
    );
    let b = results[2].as_ref().unwrap();
    assert_eq!((b.document, b.pod.metadata.name.as_str()), (3, "b"));
}

#[test]
fn yaml_syntax_error_reports_the_files_line() {
    let text = format!(
        "{}---\nmetadata:\n  name: x\n   bad: indent\n",
        pod_yaml("a", "1")
    );
    let results = parse_manifest(&text, ManifestFormat::Yaml);
    let msg = results[1].as_ref().unwrap_err().to_string();
    let line = text
        .lines()
        .position(|l| l.contains("bad: indent"))
        .unwrap()
        + 1;
    assert!(
        msg.contains(&format!("line {line}")),
        "want line {line}: {msg}"
    );
}

#[test]
fn restart_policies_outside_kubernetes_values_get_its_message() {
    let text = WEB.replace("spec:\n", "spec:\n  restartPolicy: Sometimes\n");
    let msg = parse_manifest(&text, ManifestFormat::Yaml)[0]
        .as_ref()
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with(
            "document 1: spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\""
        ),
        "{msg}"
    );
    let json = r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w"}, "spec": {"initContainers": [{"name": "s", "restartPolicy": "OnFailure"}], "containers": [{"name": "c"}]}}"#;
    let msg = parse_manifest(json, ManifestFormat::Json)[0]
        .as_ref()
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(
            "spec.initContainers[0].restartPolicy: Unsupported value: \"OnFailure\": supported values: \"Always\""
        ),
        "{msg}"
    );
    for policy in ["Always", "OnFailure", "Never"] {
        let text = WEB.replace("spec:\n", &format!("spec:\n  restartPolicy: {policy}\n"));
        assert!(
            parse_manifest(&text, ManifestFormat::Yaml)[0].is_ok(),
            "{policy}"
        );
    }
}

#[test]
fn field_errors_carry_the_path() {
    let text = WEB.replace("cpu: 1", "cpu: 5x");
    let results = parse_manifest(&text, ManifestFormat::Yaml);
    assert_eq!(
        results[0].as_ref().unwrap_err().to_string(),
        "document 1: spec.containers[0].resources.limits.cpu: quantity \"5x\" has an unknown suffix"
    );
    let text = WEB.replace("name: app", "name: app\n    args: notalist");
    let msg = parse_manifest(&text, ManifestFormat::Yaml)[0]
        .as_ref()
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("document 1: spec.containers[0].args: invalid type"),
        "{msg}"
    );
    let text = WEB.replace("- name: app\n", "- image: busybox\n");
    let msg = parse_manifest(&text, ManifestFormat::Yaml)[0]
        .as_ref()
        .unwrap_err()
        .to_string();
    assert_eq!(msg, "document 1: spec.containers[0]: missing field `name`");
}

#[test]
fn wrong_kind_and_api_version() {
    let cases = [
        (
            WEB.replace("kind: Pod", "kind: Deployment"),
            "document 1: kind: \"Deployment\" is not supported (want Pod, List or PodList)",
        ),
        (
            WEB.replace("apiVersion: v1", "apiVersion: apps/v1"),
            "document 1: apiVersion: \"apps/v1\" is not supported (want \"v1\")",
        ),
        (
            WEB.replace("kind: Pod\n", ""),
            "document 1: kind: required (want Pod, List or PodList)",
        ),
        (
            "- a\n- b\n".to_owned(),
            "document 1: expected a Pod or a List of Pods, found a list",
        ),
    ];
    for (text, want) in cases {
        let results = parse_manifest(&text, ManifestFormat::Yaml);
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].as_ref().unwrap_err().to_string(), want);
    }
}

#[test]
fn invalid_pods_name_field_and_value() {
    let text = WEB.replace("name: web", "name: ../../etc");
    let msg = parse_manifest(&text, ManifestFormat::Yaml)[0]
        .as_ref()
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("document 1: metadata.name: \"../../etc\": must not contain '/'"),
        "{msg}"
    );
    let text = WEB.replace("name: web", "name: a/b");
    let msg = parse_manifest(&text, ManifestFormat::Yaml)[0]
        .as_ref()
        .unwrap_err()
        .to_string();
    assert!(msg.contains("metadata.name: \"a/b\""), "{msg}");
    let text = format!("{WEB}  - name: app\n");
    let msg = parse_manifest(&text, ManifestFormat::Yaml)[0]
        .as_ref()
        .unwrap_err()
        .to_string();
    assert_eq!(
        msg,
        "document 1: spec.containers[1].name: \"app\": duplicate name (also spec.containers[0].name)"
    );
}

#[test]
fn json_pod_and_lists() {
    let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j","namespace":"ns"},
            "spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"100m","memory":"1Gi"}}}]}}"#;
    let results = parse_manifest(json, ManifestFormat::Json);
    let pod = &results[0].as_ref().unwrap().pod;
    assert_eq!(pod.full_name(), "ns/j");
    assert_eq!(pod_qos(&pod.spec), QosClass::Burstable);

    let list = r#"{"apiVersion":"v1","kind":"List","items":[
            {"apiVersion":"v1","kind":"Pod","metadata":{"name":"one"},"spec":{"containers":[{"name":"c"}]}},
            {"kind":"Service","metadata":{"name":"svc"}},
            {"metadata":{"name":"three"},"spec":{"containers":[{"name":"c","resources":{"requests":{"memory":"-1"}}}]}},
            {"metadata":{"name":"four"},"spec":{"containers":[{"name":"c"}]}}]}"#;
    let results = parse_manifest(list, ManifestFormat::Json);
    let msgs: Vec<String> = results
        .iter()
        .map(|r| match r {
            Ok(p) => p.pod.metadata.name.clone(),
            Err(e) => e.to_string(),
        })
        .collect();
    assert_eq!(
        msgs,
        [
            "one",
            "document 1: items[1].kind: \"Service\" is not supported (want Pod)",
            "document 1: items[2].spec.containers[0].resources.requests.memory: \"-1\": must be greater than or equal to 0",
            "four"
        ]
    );

    let err = parse_manifest("{\"kind\": \"Pod\",}", ManifestFormat::Json);
    let msg = err[0].as_ref().unwrap_err().to_string();
    assert!(
        msg.starts_with("document 1: ") && msg.contains("line 1"),
        "{msg}"
    );
    assert!(parse_manifest("  \n", ManifestFormat::Json).is_empty());
    assert!(parse_manifest("", ManifestFormat::Yaml).is_empty());
}

#[test]
fn yaml_pod_list() {
    let text = "apiVersion: v1\nkind: PodList\nitems:\n- metadata: {name: x}\n  spec: {containers: [{name: c}]}\n- metadata: {name: y}\n  spec: {containers: [{name: c}]}\n";
    let names: Vec<_> = parse_manifest(text, ManifestFormat::Yaml)
        .into_iter()
        .map(|r| r.unwrap().pod.metadata.name)
        .collect();
    assert_eq!(names, ["x", "y"]);
}

#[test]
fn file_formats() {
    assert_eq!(
        ManifestFormat::of(Path::new("d/a.yaml")),
        Some(ManifestFormat::Yaml)
    );
    assert_eq!(
        ManifestFormat::of(Path::new("a.YML")),
        Some(ManifestFormat::Yaml)
    );
    assert_eq!(
        ManifestFormat::of(Path::new("a.json")),
        Some(ManifestFormat::Json)
    );
    for skip in [
        ".a.yaml",
        "a.yaml~",
        "a.yaml.swp",
        "README",
        "a.txt",
        "yaml",
    ] {
        assert_eq!(ManifestFormat::of(Path::new(skip)), None, "{skip}");
    }
}

#[test]
fn scan_dir_reads_files_in_order_and_reports_problems() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write(
        dir,
        "b.yaml",
        &format!("{}---\n{}", pod_yaml("b1", "1"), pod_yaml("b2", "2x")),
    );
    write(
        dir,
        "a.json",
        r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"containers":[{"name":"c"}]}}"#,
    );
    write(
        dir,
        "c.yml",
        &format!("{}---\n{}", pod_yaml("b1", "3"), pod_yaml("c", "1")),
    );
    write(dir, ".hidden.yaml", &pod_yaml("hidden", "1"));
    write(dir, "notes.txt", "not a manifest");
    write(dir, "broken.yaml", "kind: Pod\nmetadata: {name: x\n");
    fs::create_dir(dir.join("sub.yaml")).unwrap();
    write(dir, "zz.yaml", &WEB.replace("name: web", "name: bad_name"));

    let scan = scan_dir(dir).unwrap();
    assert_eq!(names(&scan.pods), ["default/a", "default/b1", "default/c"]);
    assert_eq!(manifest_file(&scan.pods[1]), dir.join("b.yaml"));
    assert!(matches!(
        scan.pods[2].origin,
        Origin::Manifest { document: 2, .. }
    ));
    let msgs = messages(&scan.errors);
    let d = dir.display();
    assert_eq!(msgs.len(), 5, "{msgs:#?}");
    assert_eq!(
        msgs[0],
        format!(
            "{d}/b.yaml: document 2: spec.containers[0].resources.requests.cpu: quantity \"2x\" has an unknown suffix"
        )
    );
    assert!(
        msgs[1].starts_with(&format!("{d}/broken.yaml: document 1: ")),
        "{}",
        msgs[1]
    );
    assert_eq!(
        msgs[2],
        format!(
            "{d}/c.yml: document 1: pod default/b1 is already defined in {d}/b.yaml document 1; ignoring this one"
        )
    );
    assert_eq!(
        msgs[3],
        format!("{d}/sub.yaml: a directory, not a manifest file (subdirectories are not read)")
    );
    assert!(
        msgs[4].starts_with(&format!(
            "{d}/zz.yaml: document 1: metadata.name: \"bad_name\""
        )),
        "{}",
        msgs[4]
    );
}

#[test]
fn duplicate_uids_are_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let with_uid =
        |name: &str| pod_yaml(name, "1").replace("metadata: {", "metadata: {uid: same-uid, ");
    write(tmp.path(), "a.yaml", &with_uid("first"));
    write(tmp.path(), "b.yaml", &with_uid("second"));
    let scan = scan_dir(tmp.path()).unwrap();
    assert_eq!(names(&scan.pods), ["default/first"]);
    let d = tmp.path().display();
    assert_eq!(
        messages(&scan.errors),
        [format!(
            "{d}/b.yaml: document 1: pod default/second has uid same-uid, already used by the pod of {d}/a.yaml document 1; ignoring this one"
        )]
    );
}

#[test]
fn missing_directory_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope");
    let err = scan_dir(&missing).unwrap_err();
    assert!(
        err.to_string()
            .starts_with(&format!("manifest directory {}: ", missing.display())),
        "{err}"
    );
    assert_eq!(err.path(), missing);
    let err = ManifestWatcher::new(&missing).unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
    let file = write(tmp.path(), "f.yaml", WEB);
    assert!(
        ManifestWatcher::new(file).is_err(),
        "a file is not a directory"
    );
}

#[test]
fn unreadable_file_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("bin.yaml"), [0xff, 0xfe, 0x00, 0x80]).unwrap();
    write(tmp.path(), "ok.yaml", WEB);
    let scan = scan_dir(tmp.path()).unwrap();
    assert_eq!(names(&scan.pods), ["default/web"]);
    assert!(
        matches!(scan.errors[..], [ManifestError::Read { .. }]),
        "{:?}",
        scan.errors
    );
}

/// Backdates a file so that the watcher's racy-write window does not force a re-read.
fn backdate(path: &Path) {
    let old = SystemTime::now() - Duration::from_secs(60);
    File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(old)
        .unwrap();
}

#[test]
fn watcher_sees_add_update_and_delete() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut w = ManifestWatcher::new(dir).unwrap();
    assert!(w.poll().is_empty());

    let a = write(dir, "a.yaml", &pod_yaml("a", "1"));
    write(dir, "b.yaml", &pod_yaml("b", "1"));
    let events = w.poll();
    let added: Vec<_> = events
        .iter()
        .map(|e| match e {
            PodEvent::Added(p) => p.pod.full_name(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(added, ["default/a", "default/b"]);
    assert!(w.poll().is_empty(), "no change, no event");

    // Same length, new content, written right away: still seen.
    write(dir, "a.yaml", &pod_yaml("a", "2"));
    let events = w.poll();
    match &events[..] {
        [PodEvent::Updated(p)] => {
            assert_eq!(p.pod.full_name(), "default/a");
            assert_eq!(p.pod.spec.containers[0].cpu_request_millis(), 2000);
            assert_eq!(p.pod.metadata.uid, w.pods()[0].pod.metadata.uid);
        }
        other => panic!("{other:?}"),
    }

    fs::remove_file(&a).unwrap();
    let uid_a = crate::pods::model::derive_uid("default", "a");
    assert_eq!(
        w.poll(),
        [PodEvent::Removed {
            uid: uid_a,
            namespace: "default".into(),
            name: "a".into()
        }]
    );
    assert_eq!(names(w.pods()), ["default/b"]);
}

#[test]
fn watcher_reports_new_errors_once_and_removes_pods_that_become_invalid() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut w = ManifestWatcher::new(dir).unwrap();
    write(dir, "a.yaml", &pod_yaml("a", "1"));
    assert_eq!(w.poll().len(), 1);
    write(dir, "a.yaml", &pod_yaml("a", "1x"));
    assert!(matches!(&w.poll()[..], [PodEvent::Removed { name, .. }] if name == "a"));
    assert_eq!(w.errors().len(), 1);
    assert_eq!(w.new_errors().len(), 1);
    assert!(w.poll().is_empty());
    assert_eq!(w.errors().len(), 1, "still broken");
    assert!(w.new_errors().is_empty(), "already reported");
    write(dir, "a.yaml", &pod_yaml("a", "1"));
    assert!(matches!(&w.poll()[..], [PodEvent::Added(_)]));
    assert!(w.errors().is_empty());
}

#[test]
fn watcher_skips_unchanged_files_and_forgets_deleted_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let a = write(dir, "a.yaml", &pod_yaml("a", "1"));
    let b = write(dir, "b.yaml", &pod_yaml("b", "1"));
    backdate(&a);
    backdate(&b);
    let mut w = ManifestWatcher::new(dir).unwrap();
    assert_eq!(w.poll().len(), 2);
    assert_eq!(w.files_parsed(), 2);
    for _ in 0..3 {
        assert!(w.poll().is_empty());
    }
    assert_eq!(w.files_parsed(), 2, "unchanged files are not re-read");
    write(dir, "b.yaml", &pod_yaml("b", "300m"));
    assert!(matches!(&w.poll()[..], [PodEvent::Updated(p)] if p.pod.metadata.name == "b"));
    assert_eq!(w.files_parsed(), 3, "only the changed file is re-read");
    fs::remove_file(&b).unwrap();
    assert!(matches!(&w.poll()[..], [PodEvent::Removed { name, .. }] if name == "b"));
    assert_eq!(w.scanner.cached_files(), 1);
}

#[test]
fn watcher_handles_renames_and_a_vanished_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("manifests");
    fs::create_dir(&dir).unwrap();
    let a = write(&dir, "a.yaml", &pod_yaml("a", "1"));
    let mut w = ManifestWatcher::new(&dir).unwrap();
    assert_eq!(w.poll().len(), 1);
    // Renamed file, same pod: no event, the new file is recorded.
    fs::rename(&a, dir.join("renamed.yaml")).unwrap();
    assert!(w.poll().is_empty());
    assert_eq!(manifest_file(&w.pods()[0]), dir.join("renamed.yaml"));
    // A pod that changes uid is removed and added.
    write(
        &dir,
        "renamed.yaml",
        &pod_yaml("a", "1").replace("metadata: {", "metadata: {uid: new-uid, "),
    );
    let events = w.poll();
    assert!(
        matches!(&events[..], [PodEvent::Removed { .. }, PodEvent::Added(p)] if p.pod.metadata.uid == "new-uid"),
        "{events:?}"
    );
    // The directory vanishes: every pod goes, and the error names the directory.
    fs::remove_dir_all(&dir).unwrap();
    assert!(matches!(&w.poll()[..], [PodEvent::Removed { .. }]));
    assert!(w.pods().is_empty());
    assert!(matches!(w.errors(), [ManifestError::Dir { dir: d, .. }] if *d == dir));
}

/// The example manifests shipped in examples/pods load and classify as their names say.
#[test]
fn example_manifests_load_and_classify() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/pods");
    let scan = scan_dir(&dir).unwrap();
    assert!(scan.errors.is_empty(), "{:#?}", messages(&scan.errors));
    let got: Vec<(String, QosClass)> = scan
        .pods
        .iter()
        .map(|p| {
            let file = manifest_file(p)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (file, pod_qos(&p.pod.spec))
        })
        .collect();
    assert_eq!(
        got,
        [
            ("besteffort.yaml".to_owned(), QosClass::BestEffort),
            ("burstable.yaml".to_owned(), QosClass::Burstable),
            ("guaranteed.yaml".to_owned(), QosClass::Guaranteed),
        ]
    );
    for p in &scan.pods {
        let c = &p.pod.spec.containers[0];
        assert_eq!(
            c.command.first().map(String::as_str),
            Some("/bin/sh"),
            "{}",
            p.pod.full_name()
        );
    }
    let guaranteed = &scan.pods[2].pod;
    assert_eq!(guaranteed.effective_requests().cpu_millis, 1000);
    assert_eq!(guaranteed.effective_requests().memory_bytes, 128 << 20);
    let burstable = &scan.pods[1].pod;
    assert_eq!(burstable.effective_requests().cpu_millis, 250);
    assert_eq!(burstable.spec.containers[0].cpu_limit_millis(), Some(500));
}

#[test]
fn an_unchanged_directory_is_not_rescanned_and_a_change_is_seen_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write(dir, "a.yaml", &pod_yaml("a", "1"));
    let mut w = ManifestWatcher::new(dir).unwrap();
    assert_eq!(w.poll().len(), 1);
    let scanned = w.scans();
    for _ in 0..20 {
        assert!(w.poll().is_empty());
    }
    assert_eq!(w.scans(), scanned, "nothing changed: no rescan (inotify)");
    write(dir, "b.yaml", &pod_yaml("b", "1"));
    let events = w.poll();
    assert!(
        matches!(&events[..], [PodEvent::Added(p)] if p.pod.metadata.name == "b"),
        "{events:?}"
    );
    assert_eq!(w.scans(), scanned + 1);
    fs::remove_file(dir.join("a.yaml")).unwrap();
    assert!(matches!(&w.poll()[..], [PodEvent::Removed { name, .. }] if name == "a"));
}

/// A file larger than qosd reads is an error naming it and its size; the other files' pods
/// load. Bytes that are not UTF-8 are an error naming the file.
#[test]
fn oversized_and_non_utf8_files_are_errors_naming_them() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "a.yaml", &pod_yaml("fine", "1"));
    let big = format!("# {}\n{}", "x".repeat(5 << 20), pod_yaml("big", "1"));
    write(tmp.path(), "big.yaml", &big);
    fs::write(
        tmp.path().join("bin.yaml"),
        b"apiVersion: v1\nkind: Pod\n\xff\xfe\n",
    )
    .unwrap();
    let scan = scan_dir(tmp.path()).unwrap();
    assert_eq!(names(&scan.pods), ["default/fine"]);
    let errors = messages(&scan.errors);
    let d = tmp.path().display();
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with(&format!("{d}/big.yaml: "))
                && e.contains("more than the 4194304 bytes")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with(&format!("{d}/bin.yaml: ")) && e.contains("UTF-8")),
        "{errors:?}"
    );
}

/// A YAML alias bomb (each level ten aliases of the one below) is refused as a document
/// error, quickly and without expanding it.
#[test]
fn a_yaml_alias_bomb_is_refused_quickly() {
    let tmp = tempfile::tempdir().unwrap();
    let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for level in 1..10 {
        let prev = level - 1;
        bomb.push_str(&format!(
            "a{level}: &a{level} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"
        ));
    }
    bomb.push_str("apiVersion: v1\nkind: Pod\nmetadata: {name: bomb, labels: *a9}\nspec:\n  containers:\n  - name: c\n");
    write(tmp.path(), "bomb.yaml", &bomb);
    write(tmp.path(), "a.yaml", &pod_yaml("fine", "1"));
    let scan = scan_within_5s(tmp.path());
    assert_eq!(names(&scan.pods), ["default/fine"]);
    let errors = messages(&scan.errors);
    assert!(errors.iter().any(|e| e.contains("bomb.yaml")), "{errors:?}");
}

/// Symlinks in the manifest directory: one to a file loads its pods (ConfigMap volumes are
/// symlinks); one to a directory and a loop of two are errors naming the link; the other
/// files' pods load.
#[test]
fn symlinks_to_files_load_and_to_directories_or_loops_are_errors_naming_them() {
    let tmp = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let target = write(elsewhere.path(), "real.yaml", &pod_yaml("linked", "1"));
    std::os::unix::fs::symlink(&target, tmp.path().join("link.yaml")).unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), tmp.path().join("dir.yaml")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("b.yaml"), tmp.path().join("a.yaml")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("a.yaml"), tmp.path().join("b.yaml")).unwrap();
    write(tmp.path(), "plain.yaml", &pod_yaml("plain", "1"));
    let scan = scan_dir(tmp.path()).unwrap();
    assert_eq!(names(&scan.pods), ["default/linked", "default/plain"]);
    let errors = messages(&scan.errors);
    let d = tmp.path().display();
    for link in ["dir.yaml", "a.yaml", "b.yaml"] {
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with(&format!("{d}/{link}: "))),
            "{link} not named: {errors:?}"
        );
    }
    assert_eq!(errors.len(), 3, "{errors:?}");
}

/// Values nested thousands deep (YAML flow sequences, JSON arrays) are a document error
/// naming the file, quickly, without exhausting the stack; the other files' pods load.
#[test]
fn deeply_nested_values_are_errors_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let depth = 100_000;
    let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    write(
        tmp.path(),
        "deep.yaml",
        &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: deep, labels: {{a: {nested}}}}}\n"),
    );
    write(
        tmp.path(),
        "deep.json",
        &format!("{{\"apiVersion\": \"v1\", \"kind\": \"Pod\", \"spec\": {nested}}}"),
    );
    write(tmp.path(), "fine.yaml", &pod_yaml("fine", "1"));
    let scan = scan_within_5s(tmp.path());
    assert_eq!(names(&scan.pods), ["default/fine"]);
    let errors = messages(&scan.errors);
    let d = tmp.path().display();
    for file in ["deep.yaml", "deep.json"] {
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with(&format!("{d}/{file}: document 1"))),
            "{file}: {errors:?}"
        );
    }
}

/// A file caught half written is read as it is at that moment (a pod of what is there, or an
/// error naming the file), and read again when its writer finishes (inotify's close-write):
/// the pod is then the complete one. Writers that must never be seen half done write a
/// temporary file and rename it, as kubelet's checkpoints and ConfigMap volumes do.
#[test]
fn a_file_caught_half_written_is_read_again_once_complete() {
    use std::io::Write as _;
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("web.yaml");
    let mut w = ManifestWatcher::new(tmp.path()).unwrap();
    let (half, rest) = WEB.split_at(WEB.find("command").unwrap() + 4);
    let mut file = File::create(&path).unwrap();
    file.write_all(half.as_bytes()).unwrap();
    file.flush().unwrap();
    for event in w.poll() {
        if let PodEvent::Added(p) = event {
            assert!(
                p.pod.spec.containers[0].command.is_empty(),
                "only what was written: {p:?}"
            );
        }
    }
    file.write_all(rest.as_bytes()).unwrap();
    drop(file);
    w.poll();
    let web = w
        .pods()
        .iter()
        .find(|p| p.pod.full_name() == "default/web")
        .expect("web loaded once complete");
    assert_eq!(
        web.pod.spec.containers[0].command,
        ["/bin/sh", "-c", "sleep 100"]
    );
}

/// The nesting bound counts flow collections only: brackets in quoted scalars and comments,
/// and block nesting, are not nesting.
#[test]
fn flow_depth_counts_flow_collections_outside_quotes_and_comments() {
    use super::parse::flow_depth;
    assert_eq!(
        flow_depth(WEB),
        2,
        "metadata: {{...}} and resources: {{limits: {{...}}}}"
    );
    assert_eq!(flow_depth("a: '[[[[' # [[[[\nb: \"{{{{\\\"[\"\n"), 0);
    assert_eq!(flow_depth("a: [don't, [x]]\nb: [c]"), 2);
    assert_eq!(flow_depth("a: 'it''s [' \nb: [[1]]"), 2);
    assert_eq!(flow_depth("a:\n  b:\n    c: [1]"), 1);
}

/// A quote the nesting estimate misreads (an apostrophe after a space inside a plain scalar,
/// which YAML reads as text) cannot hide deep nesting from the bound: more opening brackets
/// than any Pod needs are refused before the parser, whatever the estimate says.
#[test]
fn an_apostrophe_in_a_plain_scalar_does_not_hide_deep_nesting() {
    use super::parse::flow_depth;
    let depth = 100_000;
    let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let text = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: deep\n  labels:\n    a: x 'y\nspec: {nested}\n"
    );
    assert!(
        flow_depth(&text) <= 128,
        "the estimate is fooled, which is what the bracket count is for"
    );
    let results = parse_manifest(&text, ManifestFormat::Yaml);
    let [Err(error)] = results.as_slice() else {
        panic!("one error expected: {results:?}");
    };
    let message = error.to_string();
    assert!(
        message.contains("100000 opening brackets ([ and {) in one document, more than 10000"),
        "{message}"
    );
}
