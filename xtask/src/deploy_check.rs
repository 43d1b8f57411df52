//! The deploy tier of `cargo xtask test`: `deploy/` checked as far as it can be without a
//! cluster (the development machine has no kube-apiserver and no kubelet), one case each:
//!
//! - `manifest/<file>`: every Kubernetes object of the file validated by kubernetes-validate
//!   (Kubernetes' own JSON schemas; `--strict`, so an unknown field is an error) against the
//!   oldest and the newest Kubernetes the manifests target, [`K8S_VERSIONS`]. Files holding only
//!   kinds those schemas lack (the Prometheus Operator's CRDs) are skipped with that reason.
//!   kubernetes-validate is pip-installed into a virtualenv in the cache; when PyPI cannot be
//!   reached the manifest cases are skipped, never passed. The kustomization's case checks that
//!   its files exist and, where kubectl is installed, that `kubectl kustomize` renders exactly
//!   their objects.
//! - `rules/check`: `spec.groups` of the PrometheusRule written to [`RULES_FILE`] in the work
//!   directory (`target/deploy-check/`) and checked by `promtool check rules`;
//! - `rules/test`: `promtool test rules` on a copy of [`ALERT_TESTS`] next to it (promtool reads
//!   `rule_files` relative to the test file);
//! - `image`: `cargo xtask image` (release build, OCI archive, `qosd --help` and
//!   `qosd --version` run inside the image), unless the tier is told to leave it out;
//! - `daemonset/args`: the DaemonSet's container arguments parsed by that qosd's command line
//!   (a flag or value it does not know fails the case; nothing is started; rules between
//!   flags, such as conflicts, are clap's checks after parsing and not covered).
//!
//! Each case prints `RESULT <case> PASS|FAIL|SKIP (<seconds>s) <detail>`, as the system tests do.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use serde::Deserialize as _;
use serde_yaml_ng::{Mapping, Value};

use crate::{image, setup, vm};

/// Kubernetes versions every core manifest must be valid for: the oldest the DaemonSet
/// targets (the first with kubelet's fine-grained `nodes/pods` authorisation on by default)
/// and the newest kubernetes-validate 1.37 knows.
const K8S_VERSIONS: [&str; 2] = ["1.33.0", "1.37.0"];
/// The validator, pinned to the 1.37 series (its schemas go up to Kubernetes 1.37).
const KUBERNETES_VALIDATE: &str = "kubernetes-validate==1.37.*";
const KUBERNETES_VALIDATE_SERIES: &str = "1.37.";
/// Debian's Python (with python3-venv); not whatever `python3` is first on PATH.
const PYTHON: &str = "/usr/bin/python3";
/// The PrometheusRule, relative to the workspace.
const PROMETHEUS_RULE: &str = "deploy/prometheusrule.yaml";
/// The alerts' promtool unit tests, relative to the workspace.
const ALERT_TESTS: &str = "deploy/tests/qosd-alerts.test.yaml";
/// The extracted rule file: the name the test file's `rule_files` lists.
const RULES_FILE: &str = "qosd-rules.yaml";

/// API groups whose kinds Kubernetes' schemas do not have, and why a file of them is skipped.
const NOT_IN_SCHEMAS: [(&str, &str); 2] = [
    (
        "monitoring.coreos.com/",
        "a Prometheus Operator CRD, not in Kubernetes' schemas",
    ),
    (
        "kustomize.config.k8s.io/",
        "kustomize's own file, not an API object",
    ),
];

/// The tier's counts.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
    /// The `RESULT … FAIL` lines.
    pub failures: Vec<String>,
    /// For the summary: how long the image case took (it is most of the tier's time).
    pub note: String,
}

impl Report {
    /// Prints the case's `RESULT` line and counts it.
    fn record(&mut self, name: &str, started: Instant, outcome: Outcome) {
        let (word, detail) = match outcome {
            Outcome::Pass(d) => ("PASS", d),
            Outcome::Fail(d) => ("FAIL", d),
            Outcome::Skip(d) => ("SKIP", d),
        };
        let line = format!(
            "RESULT {name} {word} ({:.1}s) {detail}",
            started.elapsed().as_secs_f64()
        );
        println!("{line}");
        match word {
            "PASS" => self.passed += 1,
            "SKIP" => self.skipped += 1,
            _ => {
                self.failed += 1;
                self.failures.push(line);
            }
        }
    }
}

/// How one case ended, with its detail.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Pass(String),
    Fail(String),
    Skip(String),
}

impl Outcome {
    fn fail(error: &anyhow::Error) -> Self {
        Self::Fail(format!("{error:#}"))
    }
}

/// Runs every case; `with_image` adds the image build and its run (a release build).
pub(crate) fn run(with_image: bool) -> Report {
    let mut report = Report::default();
    let deploy = crate::workspace_root().join("deploy");
    let work = crate::target_dir().join("deploy-check");
    let started = Instant::now();
    if let Err(e) = reset_dir(&work).and_then(|()| setup::deploy_tools()) {
        report.record("deploy/setup", started, Outcome::fail(&e));
    }
    manifests(&deploy, &work, &mut report);
    rules(&work, &mut report);
    let started = Instant::now();
    let mut binary = None;
    if with_image {
        let outcome = if crate::is_root() {
            match image::build_and_verify() {
                Ok(built) => {
                    binary = Some(built.binary.clone());
                    Outcome::Pass(built.summary())
                }
                Err(e) => Outcome::fail(&e),
            }
        } else {
            Outcome::Skip("building and running the image needs root (umoci unpack, runc)".into())
        };
        report.note = format!(
            "image: release build, archive, run {}s",
            started.elapsed().as_secs()
        );
        report.record("image", started, outcome);
    } else {
        report.record(
            "image",
            started,
            Outcome::Skip("left out (--no-image)".into()),
        );
    }
    let started = Instant::now();
    let outcome = match binary {
        Some(qosd) => check_daemonset_args(&deploy, &qosd).unwrap_or_else(|e| Outcome::fail(&e)),
        None => Outcome::Skip("needs the release qosd the image case builds".into()),
    };
    report.record("daemonset/args", started, outcome);
    report
}

/// `cargo xtask deploy-check`: the tier alone, with its closing count; fails on a failure.
pub(crate) fn run_alone(with_image: bool) -> Result<()> {
    let started = Instant::now();
    let report = run(with_image);
    println!(
        "deploy checks took {}s\n{} passed, {} failed, {} skipped",
        started.elapsed().as_secs(),
        report.passed,
        report.failed,
        report.skipped
    );
    if report.failed > 0 {
        bail!("{} deploy check(s) failed", report.failed);
    }
    Ok(())
}

fn reset_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

// ---------------------------------------------------------------------------------------------
// Manifests

/// kubernetes-validate, or why it cannot be had.
enum Validator {
    Ready(PathBuf),
    /// pip could not reach PyPI: the manifest cases are skipped, with this reason.
    Unavailable(String),
    /// Anything else went wrong installing it: the manifest cases fail, with this reason.
    Broken(String),
}

fn manifests(deploy: &Path, work: &Path, report: &mut Report) {
    let started = Instant::now();
    let files = match manifest_files(deploy) {
        Ok(files) => files,
        Err(e) => return report.record("manifests", started, Outcome::fail(&e)),
    };
    let validator = kubernetes_validate()
        .unwrap_or_else(|e| Validator::Broken(format!("installing kubernetes-validate: {e:#}")));
    for file in files {
        let started = Instant::now();
        let name = format!(
            "manifest/{}",
            file.file_name().unwrap_or_default().to_string_lossy()
        );
        let outcome = check_manifest(&file, work, &validator).unwrap_or_else(|e| Outcome::fail(&e));
        report.record(&name, started, outcome);
    }
}

/// The YAML files directly in `deploy/` (not its tests), sorted.
fn manifest_files(deploy: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in
        std::fs::read_dir(deploy).with_context(|| format!("reading {}", deploy.display()))?
    {
        let path = entry?.path();
        if path.is_file() && path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            files.push(path);
        }
    }
    files.sort();
    if files.is_empty() {
        bail!("no YAML manifest in {}", deploy.display());
    }
    Ok(files)
}

/// Installs kubernetes-validate into a virtualenv in the cache, unless the right version is
/// there already. A pip failure (PyPI unreachable) is `Unavailable`; anything else an error.
fn kubernetes_validate() -> Result<Validator> {
    let dir = vm::cache_dir()?.join("kubernetes-validate");
    let venv = dir.join("venv");
    let bin = venv.join("bin/kubernetes-validate");
    if installed_version(&bin).is_some_and(|v| v.starts_with(KUBERNETES_VALIDATE_SERIES)) {
        return Ok(Validator::Ready(bin));
    }
    println!(
        "deploy: installing {KUBERNETES_VALIDATE} into {}",
        venv.display()
    );
    if venv.exists() {
        std::fs::remove_dir_all(&venv)
            .with_context(|| format!("removing the old {}", venv.display()))?;
    }
    setup::run(Command::new(PYTHON).args(["-m", "venv"]).arg(&venv))
        .context("creating the virtualenv (Debian's python3-venv)")?;
    let out = Command::new(venv.join("bin/pip"))
        .args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--timeout",
            "20",
            "--retries",
            "2",
            KUBERNETES_VALIDATE,
        ])
        .output()
        .context("starting pip")?;
    if !out.status.success() {
        return Ok(Validator::Unavailable(format!(
            "pip could not install {KUBERNETES_VALIDATE} (PyPI unreachable?): {}",
            pip_failure(&String::from_utf8_lossy(&out.stderr))
        )));
    }
    match installed_version(&bin) {
        Some(v) if v.starts_with(KUBERNETES_VALIDATE_SERIES) => Ok(Validator::Ready(bin)),
        other => bail!(
            "pip installed kubernetes-validate, which reports version {other:?}, not {KUBERNETES_VALIDATE_SERIES}x"
        ),
    }
}

/// The gist of pip's complaint: its first connection retry warning (the cause, when the index
/// cannot be reached) and its last line (the verdict).
fn pip_failure(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let last = lines.last().copied().unwrap_or("no message");
    match lines.iter().find(|l| l.starts_with("WARNING: Retrying")) {
        Some(retry) if *retry != last => {
            // The cause is at the end of a long repr: "Failed to establish ...: [Errno 111] ...".
            let cause = retry
                .find("Failed to establish")
                .map_or(*retry, |at| &retry[at..]);
            let cause: String = cause.chars().take(200).collect();
            format!("{cause} ... {last}")
        }
        _ => last.to_owned(),
    }
}

fn installed_version(bin: &Path) -> Option<String> {
    let out = Command::new(bin).arg("--version").output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// One YAML document of a manifest file.
#[derive(Debug)]
struct Document {
    api_version: String,
    kind: String,
    name: String,
    value: Value,
}

impl Document {
    fn label(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }

    /// Why Kubernetes' schemas cannot check this document, if they cannot.
    fn not_in_schemas(&self) -> Option<&'static str> {
        NOT_IN_SCHEMAS
            .iter()
            .find(|(group, _)| self.api_version.starts_with(group))
            .map(|(_, why)| *why)
    }

    fn is_kustomization(&self) -> bool {
        self.kind == "Kustomization" && self.api_version.starts_with("kustomize.config.k8s.io/")
    }
}

/// The non-empty documents of a YAML stream, each with its apiVersion, kind and name.
fn parse_documents(text: &str) -> Result<Vec<Document>> {
    let mut documents = Vec::new();
    for (index, de) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(de).with_context(|| format!("YAML document {index}"))?;
        if value.is_null() {
            continue;
        }
        let field = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_owned);
        let (Some(api_version), Some(kind)) = (field("apiVersion"), field("kind")) else {
            bail!("YAML document {index} has no apiVersion or kind");
        };
        let name = value
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("(unnamed)")
            .to_owned();
        documents.push(Document {
            api_version,
            kind,
            name,
            value,
        });
    }
    Ok(documents)
}

fn check_manifest(file: &Path, work: &Path, validator: &Validator) -> Result<Outcome> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let documents = parse_documents(&text).with_context(|| format!("{}", file.display()))?;
    if documents.is_empty() {
        return Ok(Outcome::Fail("no Kubernetes object in the file".into()));
    }
    if let [kustomization] = documents.as_slice()
        && kustomization.is_kustomization()
    {
        return check_kustomization(file, kustomization);
    }
    let (skipped, checked): (Vec<&Document>, Vec<&Document>) =
        documents.iter().partition(|d| d.not_in_schemas().is_some());
    let not_checked = skipped
        .iter()
        .map(|d| {
            let rules = if d.kind == "PrometheusRule" {
                "; its rules are checked by rules/check and rules/test"
            } else {
                ""
            };
            format!(
                "{} ({}): {}{rules}",
                d.label(),
                d.api_version,
                d.not_in_schemas().unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    if checked.is_empty() {
        return Ok(Outcome::Skip(format!("not validated: {not_checked}")));
    }
    let bin = match validator {
        Validator::Ready(bin) => bin,
        Validator::Unavailable(why) => return Ok(Outcome::Skip(why.clone())),
        Validator::Broken(why) => return Ok(Outcome::Fail(why.clone())),
    };
    // A file mixing both kinds has its checkable objects validated from a copy of their own.
    let target = if skipped.is_empty() {
        file.to_path_buf()
    } else {
        let copy = work.join(file.file_name().unwrap_or_default());
        let mut stream = String::new();
        for document in &checked {
            stream.push_str("---\n");
            stream.push_str(&serde_yaml_ng::to_string(&document.value)?);
        }
        std::fs::write(&copy, stream).with_context(|| format!("writing {}", copy.display()))?;
        copy
    };
    for version in K8S_VERSIONS {
        let out = Command::new(bin)
            .args(["--strict", "--kubernetes-version", version])
            .arg(&target)
            .output()
            .with_context(|| format!("starting {}", bin.display()))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        print!("{text}");
        if let Err(why) = judge_validation(&text, out.status.success(), checked.len()) {
            return Ok(Outcome::Fail(format!("Kubernetes {version}: {why}")));
        }
    }
    let objects = checked
        .iter()
        .map(|d| d.label())
        .collect::<Vec<_>>()
        .join(", ");
    let mut detail = format!(
        "{objects} valid against Kubernetes {} (strict schemas)",
        K8S_VERSIONS.join(" and ")
    );
    if !skipped.is_empty() {
        detail.push_str(&format!("; not validated: {not_checked}"));
    }
    Ok(Outcome::Pass(detail))
}

/// A kustomization: every file it lists exists, and `kubectl kustomize` (where kubectl is
/// installed: not a Debian package, so not always) renders exactly their objects.
fn check_kustomization(file: &Path, kustomization: &Document) -> Result<Outcome> {
    let dir = file.parent().unwrap_or(Path::new("."));
    let resources: Vec<&str> = kustomization
        .value
        .get("resources")
        .and_then(Value::as_sequence)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if resources.is_empty() {
        return Ok(Outcome::Fail("lists no resources".into()));
    }
    let mut expected = Vec::new();
    for resource in &resources {
        let path = dir.join(resource);
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Ok(Outcome::Fail(format!(
                "lists {resource}, which cannot be read"
            )));
        };
        let documents = parse_documents(&text).with_context(|| format!("{}", path.display()))?;
        expected.extend(documents.iter().map(Document::label));
    }
    expected.sort();
    let unlisted: Vec<String> = manifest_files(dir)?
        .iter()
        .filter(|f| f.as_path() != file)
        .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()))
        .filter(|name| !resources.contains(&name.as_str()))
        .collect();
    let unlisted = if unlisted.is_empty() {
        String::new()
    } else {
        format!("; not listed: {}", unlisted.join(", "))
    };
    let out = match Command::new("kubectl").arg("kustomize").arg(dir).output() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Outcome::Skip(format!(
                "kubectl (with its kustomize) is not installed; the {} listed files exist{unlisted}",
                resources.len()
            )));
        }
        Err(e) => return Err(e).context("starting kubectl kustomize"),
        Ok(out) => out,
    };
    if !out.status.success() {
        return Ok(Outcome::Fail(format!(
            "kubectl kustomize: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let rendered = parse_documents(&String::from_utf8_lossy(&out.stdout))
        .context("reading kubectl kustomize's output")?;
    let mut rendered: Vec<String> = rendered.iter().map(Document::label).collect();
    rendered.sort();
    if rendered != expected {
        return Ok(Outcome::Fail(format!(
            "kubectl kustomize renders {rendered:?}, the listed files hold {expected:?}"
        )));
    }
    Ok(Outcome::Pass(format!(
        "`kubectl kustomize` renders the {} objects of its {} files{unlisted}",
        rendered.len(),
        resources.len()
    )))
}

/// Reads kubernetes-validate's report on a file of `objects` objects: it exits 0 on a kind it
/// has no schema for (a warning), so every object must be reported as passed by name.
fn judge_validation(output: &str, success: bool, objects: usize) -> Result<(), String> {
    let problems: Vec<&str> = output
        .lines()
        .filter(|l| l.starts_with("ERROR") || l.contains("Couldn't find schema"))
        .collect();
    if !problems.is_empty() {
        return Err(problems.join(" | "));
    }
    if !success {
        return Err(format!("kubernetes-validate failed: {}", output.trim()));
    }
    let passed = output
        .lines()
        .filter(|l| l.contains(" passed for resource "))
        .count();
    if passed != objects {
        return Err(format!(
            "{passed} of {objects} objects reported valid: {}",
            output.trim()
        ));
    }
    Ok(())
}

/// An argument the command line refuses, put after the DaemonSet's: qosd exits at parsing,
/// naming the first argument it refuses, which is this one when all of the DaemonSet's parse.
const SENTINEL: [&str; 2] = ["--feedback-hold", "not-a-duration"];

/// The DaemonSet's container arguments, given to `qosd` (the image's entrypoint) followed by
/// [`SENTINEL`]: the refusal must be the sentinel's.
fn check_daemonset_args(deploy: &Path, qosd: &Path) -> Result<Outcome> {
    let path = deploy.join("daemonset.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let documents = parse_documents(&text)?;
    let daemonset = documents
        .iter()
        .find(|d| d.kind == "DaemonSet")
        .context("no DaemonSet in daemonset.yaml")?;
    let args: Vec<&str> = daemonset
        .value
        .get("spec")
        .and_then(|s| s.get("template"))
        .and_then(|t| t.get("spec"))
        .and_then(|s| s.get("containers"))
        .and_then(|c| c.get(0))
        .and_then(|c| c.get("args"))
        .and_then(Value::as_sequence)
        .context("the DaemonSet's first container has no args")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let out = Command::new(qosd)
        .args(&args)
        .args(SENTINEL)
        .env_clear()
        .output()
        .with_context(|| format!("starting {}", qosd.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    Ok(judge_args(out.status.success(), &stderr, args.len()))
}

fn judge_args(success: bool, stderr: &str, count: usize) -> Outcome {
    if success {
        return Outcome::Fail(format!(
            "qosd accepted `{}`: its arguments were not parsed",
            SENTINEL.join(" ")
        ));
    }
    let refusal = stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or(stderr.trim());
    if refusal.contains(SENTINEL[1]) && refusal.contains(SENTINEL[0]) {
        Outcome::Pass(format!(
            "the release qosd parses the DaemonSet's {count} arguments (flags and values)"
        ))
    } else {
        Outcome::Fail(format!("qosd refuses the DaemonSet's arguments: {refusal}"))
    }
}

// ---------------------------------------------------------------------------------------------
// Alert rules

fn rules(work: &Path, report: &mut Report) {
    let root = crate::workspace_root();
    let started = Instant::now();
    let (rules, tests) = match prepare_rules(&root, work) {
        Ok(paths) => paths,
        Err(e) => {
            report.record("rules/check", started, Outcome::fail(&e));
            report.record(
                "rules/test",
                started,
                Outcome::Fail("not run: the rules could not be extracted".into()),
            );
            return;
        }
    };
    let outcome = match promtool(&["check", "rules"], &rules) {
        Ok((true, out)) => Outcome::Pass(format!(
            "{} from {PROMETHEUS_RULE} spec.groups ({})",
            out.lines()
                .find_map(|l| l.trim().strip_prefix("SUCCESS: "))
                .unwrap_or("checked"),
            rules.display()
        )),
        Ok((false, out)) => Outcome::Fail(first_lines(&out, 6)),
        Err(e) => Outcome::fail(&e),
    };
    report.record("rules/check", started, outcome);

    let started = Instant::now();
    let outcome = match promtool(&["test", "rules"], &tests) {
        Ok((true, _)) => match test_summary(&tests) {
            Ok(summary) => Outcome::Pass(format!("{ALERT_TESTS}: {summary}")),
            Err(e) => Outcome::fail(&e),
        },
        Ok((false, out)) => Outcome::Fail(first_lines(&out, 6)),
        Err(e) => Outcome::fail(&e),
    };
    report.record("rules/test", started, outcome);
}

/// Writes the extracted rules and a copy of the unit tests into `work`; returns both paths.
fn prepare_rules(root: &Path, work: &Path) -> Result<(PathBuf, PathBuf)> {
    let rule_path = root.join(PROMETHEUS_RULE);
    let text = std::fs::read_to_string(&rule_path)
        .with_context(|| format!("reading {}", rule_path.display()))?;
    let groups = extract_rule_groups(&text).with_context(|| format!("{}", rule_path.display()))?;
    let rules = work.join(RULES_FILE);
    std::fs::write(&rules, groups).with_context(|| format!("writing {}", rules.display()))?;
    let source = root.join(ALERT_TESTS);
    let tests = work.join(source.file_name().unwrap_or_default());
    let test_text = std::fs::read_to_string(&source)
        .with_context(|| format!("reading {}", source.display()))?;
    let rule_files = rule_files(&test_text)?;
    if rule_files != [RULES_FILE] {
        bail!("{ALERT_TESTS} must list exactly `rule_files: [{RULES_FILE}]`, not {rule_files:?}");
    }
    std::fs::write(&tests, test_text).with_context(|| format!("writing {}", tests.display()))?;
    Ok((rules, tests))
}

/// A promtool rule file (`groups:` and nothing else) from the PrometheusRule in `text`.
fn extract_rule_groups(text: &str) -> Result<String> {
    let documents = parse_documents(text)?;
    let [document] = documents.as_slice() else {
        bail!(
            "expected one PrometheusRule document, found {}",
            documents.len()
        );
    };
    if document.kind != "PrometheusRule" {
        bail!("expected kind PrometheusRule, found {}", document.kind);
    }
    let groups = document
        .value
        .get("spec")
        .and_then(|spec| spec.get("groups"))
        .context("the PrometheusRule has no spec.groups")?;
    if groups.as_sequence().is_none_or(Vec::is_empty) {
        bail!("spec.groups of the PrometheusRule is not a non-empty list");
    }
    let mut file = Mapping::new();
    file.insert(Value::from("groups"), groups.clone());
    Ok(serde_yaml_ng::to_string(&file)?)
}

/// The `rule_files` of a promtool test file.
fn rule_files(test_text: &str) -> Result<Vec<String>> {
    let value: Value = serde_yaml_ng::from_str(test_text).context("parsing the alert tests")?;
    Ok(value
        .get("rule_files")
        .and_then(Value::as_sequence)
        .map(|files| {
            files
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default())
}

/// "N test groups, M evaluations" of a promtool test file.
fn test_summary(tests: &Path) -> Result<String> {
    let text =
        std::fs::read_to_string(tests).with_context(|| format!("reading {}", tests.display()))?;
    let value: Value = serde_yaml_ng::from_str(&text).context("parsing the alert tests")?;
    let groups = value
        .get("tests")
        .and_then(Value::as_sequence)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let evaluations: usize = groups
        .iter()
        .filter_map(|g| g.get("alert_rule_test").and_then(Value::as_sequence))
        .map(Vec::len)
        .sum();
    Ok(format!(
        "{} test groups, {evaluations} alert evaluations passed",
        groups.len()
    ))
}

/// Runs promtool on one file, echoing its output; (success, stdout + stderr).
fn promtool(args: &[&str], file: &Path) -> Result<(bool, String)> {
    let out = Command::new("promtool")
        .args(args)
        .arg(file)
        // rule_files are relative to the test file; run where both are.
        .current_dir(file.parent().unwrap_or(Path::new(".")))
        .output()
        .context("starting promtool (Debian's prometheus package)")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    print!("{text}");
    Ok((out.status.success(), text))
}

fn first_lines(text: &str, n: usize) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(n)
        .collect::<Vec<_>>()
        .join(" | ")
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    const RULE: &str = r#"
# a comment
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: example
  namespace: ns
spec:
  groups:
    - name: g
      rules:
        - alert: A
          expr: >-
            sum by (instance) (rate(x_total[5m])) > 0
            or
            vector(1)
          for: 10m
          labels:
            severity: warning
          annotations:
            summary: "{{ $labels.instance }} is A"
"#;

    #[test]
    fn spec_groups_are_extracted_alone() {
        let extracted = extract_rule_groups(RULE).unwrap();
        let value: Value = serde_yaml_ng::from_str(&extracted).unwrap();
        let keys: Vec<&str> = value
            .as_mapping()
            .unwrap()
            .keys()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(keys, ["groups"]);
        let rule = &value["groups"][0]["rules"][0];
        assert_eq!(rule["alert"].as_str(), Some("A"));
        assert_eq!(
            rule["expr"].as_str(),
            // `>-` folds the lines with spaces, as Prometheus would read them too.
            Some("sum by (instance) (rate(x_total[5m])) > 0 or vector(1)")
        );
        assert_eq!(
            rule["annotations"]["summary"].as_str(),
            Some("{{ $labels.instance }} is A")
        );
        assert_eq!(rule["for"].as_str(), Some("10m"));
    }

    #[test]
    fn extraction_refuses_what_is_not_one_prometheus_rule() {
        let service_monitor = RULE.replace("kind: PrometheusRule", "kind: ServiceMonitor");
        assert!(extract_rule_groups(&service_monitor).is_err());
        let two = format!("{RULE}\n---\n{RULE}");
        assert!(extract_rule_groups(&two).is_err());
        let no_groups = "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: x}\nspec: {}\n";
        assert!(extract_rule_groups(no_groups).is_err());
        let empty_groups = "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: x}\nspec: {groups: []}\n";
        assert!(extract_rule_groups(empty_groups).is_err());
    }

    #[test]
    fn documents_are_classified_by_what_the_schemas_know() {
        let text = "---\n# only a comment\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: s\n---\napiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata:\n  name: m\n---\napiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n";
        let documents = parse_documents(text).unwrap();
        let labels: Vec<String> = documents.iter().map(Document::label).collect();
        assert_eq!(
            labels,
            ["Service/s", "ServiceMonitor/m", "Kustomization/(unnamed)"]
        );
        assert!(documents[0].not_in_schemas().is_none());
        assert!(documents[1].not_in_schemas().is_some());
        assert!(documents[2].not_in_schemas().is_some());
        assert!(parse_documents("metadata:\n  name: x\n").is_err());
    }

    #[test]
    fn validation_output_must_name_every_object_as_passed() {
        let two = "INFO rbac.yaml passed for resource clusterrole/qosd against version 1.33\nINFO rbac.yaml passed for resource clusterrolebinding/qosd against version 1.33\n";
        assert_eq!(judge_validation(two, true, 2), Ok(()));
        assert!(judge_validation(two, true, 3).is_err());
        // kubernetes-validate exits 0 on a kind it has no schema for (a typo in `kind`).
        let unknown = "WARN x.yaml Couldn't find schema for kind Servce with api version v1 for kubernetes version 1.33\n";
        assert!(judge_validation(unknown, true, 1).is_err());
        let error = "ERROR d.yaml did not validate for resource daemonset/qosd against version 1.33: spec.template.spec: Additional properties are not allowed ('hostPIDx' was unexpected)\n";
        let why = judge_validation(error, false, 1).unwrap_err();
        assert!(why.contains("hostPIDx"), "{why}");
    }

    #[test]
    fn pip_failures_name_the_cause_and_the_verdict() {
        let stderr = "WARNING: Retrying (Retry(total=1, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError(\"Failed to establish a new connection: [Errno 111] Connection refused\")': /simple/kubernetes-validate/\nERROR: Could not find a version that satisfies the requirement kubernetes-validate==1.37.*\nERROR: No matching distribution found for kubernetes-validate==1.37.*\n";
        let why = pip_failure(stderr);
        assert!(why.contains("Connection refused"), "{why}");
        assert!(why.ends_with("No matching distribution found for kubernetes-validate==1.37.*"));
        assert_eq!(pip_failure("ERROR: boom\n"), "ERROR: boom");
        assert_eq!(pip_failure(""), "no message");
    }

    #[test]
    fn daemonset_arguments_pass_only_when_the_sentinel_is_refused() {
        let sentinel = "error: invalid value 'not-a-duration' for '--feedback-hold <FEEDBACK_HOLD>': unknown unit\n";
        assert!(matches!(judge_args(false, sentinel, 15), Outcome::Pass(_)));
        let unknown = "error: unexpected argument '--pods' found\n";
        assert!(matches!(judge_args(false, unknown, 15), Outcome::Fail(_)));
        let value = "error: invalid value 'maybe' for '--feedback <FEEDBACK>'\n";
        assert!(matches!(judge_args(false, value, 15), Outcome::Fail(_)));
        assert!(matches!(judge_args(true, "", 15), Outcome::Fail(_)));
    }

    /// The repository's own rules and tests.
    fn repository_rules() -> Value {
        let root = crate::workspace_root();
        let text = std::fs::read_to_string(root.join(PROMETHEUS_RULE)).unwrap();
        serde_yaml_ng::from_str(&extract_rule_groups(&text).unwrap()).unwrap()
    }

    fn alerts(rules: &Value) -> Vec<(String, String)> {
        rules["groups"]
            .as_sequence()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_sequence().unwrap())
            .map(|r| {
                (
                    r["alert"].as_str().unwrap().to_owned(),
                    r["expr"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn every_alert_is_tested_both_ways() {
        let rules = repository_rules();
        let root = crate::workspace_root();
        let tests: Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(root.join(ALERT_TESTS)).unwrap())
                .unwrap();
        // alert -> (an evaluation expects it to fire, an evaluation expects silence)
        let mut seen: BTreeMap<String, (bool, bool)> = BTreeMap::new();
        for group in tests["tests"].as_sequence().unwrap() {
            for case in group["alert_rule_test"].as_sequence().unwrap() {
                let name = case["alertname"].as_str().unwrap().to_owned();
                let fires = case
                    .get("exp_alerts")
                    .and_then(Value::as_sequence)
                    .is_some_and(|a| !a.is_empty());
                let entry = seen.entry(name).or_default();
                if fires {
                    entry.0 = true;
                } else {
                    entry.1 = true;
                }
            }
        }
        let names: Vec<String> = alerts(&rules).into_iter().map(|(name, _)| name).collect();
        assert_eq!(names.len(), 9, "{names:?}");
        for name in &names {
            assert_eq!(
                seen.get(name),
                Some(&(true, true)),
                "{name}: needs an evaluation where it fires and one where it must not"
            );
        }
        let unknown: Vec<&String> = seen.keys().filter(|n| !names.contains(n)).collect();
        assert!(unknown.is_empty(), "tests of no alert: {unknown:?}");
        assert_eq!(
            rule_files(&serde_yaml_ng::to_string(&tests).unwrap()).unwrap(),
            [RULES_FILE]
        );
    }

    #[test]
    fn alerts_use_only_metrics_qosd_exports() {
        let mut used = BTreeSet::new();
        for (_, expr) in alerts(&repository_rules()) {
            for token in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if token.starts_with("qosd_") {
                    used.insert(token.to_owned());
                }
            }
        }
        let expected: BTreeSet<String> = [
            "qosd_probe_info",
            "qosd_probe_dropped_events_total",
            "qosd_checkpoint_recoveries_total",
            "qosd_kubelet_drift",
            "qosd_feedback_reverted_total",
            "qosd_pod_source_up",
            "qosd_unattributed_cgroups",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        assert_eq!(used, expected);
        // Each is registered by name somewhere in the agent's sources.
        let mut sources = String::new();
        let mut dirs = vec![crate::workspace_root().join("agent/src")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    sources.push_str(&std::fs::read_to_string(path).unwrap());
                }
            }
        }
        for metric in &used {
            assert!(
                sources.contains(&format!("\"{metric}\"")),
                "{metric} is not registered in agent/src"
            );
        }
    }
}
