//! The Grafana dashboards (`dashboards/*.json`) against a real Prometheus scraping a real qosd.
//!
//! This module owns the case and what only it needs: the pods it admits, a Prometheus child
//! process (`/usr/bin/prometheus`, installed by `cargo xtask setup`) with its temporary
//! configuration and storage, killed and removed on every path by [`Prometheus`]'s `Drop`, a
//! client for Prometheus's HTTP API, and the substitution of the dashboards' template
//! variables. Every panel target of every dashboard (`qosd-node.json`, `qosd-cluster.json`, ...)
//! is run through `/api/v1/query`: each must parse, and each must return data unless it needs a
//! probe qosd itself reports as `unavailable` in `qosd_probe_info`, or a metric qosd exports only
//! in Kubernetes mode ([`KUBERNETES_METRICS`]; qosd runs standalone here). Those are listed in
//! the result, per dashboard, with the probe or the metric, and never counted as having data.
//! End to end, Prometheus's `sum(qosd_pods)` must equal the pods admitted and a busy pod's CPU
//! seconds must grow between two instant queries.
//!
//! The unit test `agent/tests/dashboards.rs` checks the same dashboards' metric names against
//! the sources without root or Prometheus.
use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use qosd::probes::{cpu_time, numa, runqlat, throttle};

use crate::agent::{Agent, free_port, sum_where};
use crate::harness::{Context, Outcome, fail};
use crate::pod_tree::{Hierarchies, TempPaths, wait_for};
use crate::workload::{NumaBalancing, node_cpus};

/// The Prometheus binary of the Debian package `prometheus` (`cargo xtask setup`).
const PROMETHEUS: &str = "/usr/bin/prometheus";
/// Where the dashboards are, in the checkout this binary was built from.
const DASHBOARD_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../dashboards");
/// Where `cargo xtask test` puts them in the test guests (which hold no checkout).
const GUEST_DASHBOARD_DIR: &str = "/usr/share/qosd/dashboards";
const NAMESPACE: &str = "systest-prom";
/// The pod whose CPU seconds must grow between two queries.
const BUSY_POD: &str = "guaranteed-busy";
/// Scrapes Prometheus must have made before the queries run (rate windows need two samples).
const MIN_SCRAPES: f64 = 6.0;

/// Grafana's built-in variables, as Grafana sets them for the test's 2 s scrape interval
/// (`$__rate_interval`: four scrape intervals).
const BUILTINS: &[(&str, &str)] = &[
    ("__rate_interval", "8s"),
    ("__interval", "4s"),
    ("__interval_ms", "4000"),
    ("__range", "1m"),
    ("__range_s", "60"),
    ("__range_ms", "60000"),
];

/// The metrics each probe exports (a histogram by its base name): a query that needs one of
/// them cannot have data where qosd reports that probe `unavailable`.
const PROBE_METRICS: &[(&str, &[&str])] = &[
    (
        cpu_time::PROBE_NAME,
        &[
            "qosd_cgroup_cpu_seconds_total",
            "qosd_cpu_unchained_switches_total",
        ],
    ),
    (
        runqlat::PROBE_NAME,
        &[
            "qosd_runqueue_latency_seconds",
            "qosd_preemptions_total",
            "qosd_preemption_wait_seconds_total",
            "qosd_cgroup_preemptions_total",
            "qosd_cgroup_preemption_wait_seconds_total",
            "qosd_runqueue_unmeasured_waits_total",
        ],
    ),
    (throttle::PROBE_NAME, &["qosd_cpu_throttle_episode_seconds"]),
    (numa::HINT_FAULT_PROBE, &["qosd_numa_hint_faults_total"]),
    (
        numa::PAGE_ALLOC_PROBE,
        &["qosd_numa_page_allocations_total"],
    ),
    (numa::MIGRATION_PROBE, &["qosd_numa_task_migrations_total"]),
];

/// The metrics qosd exports only in Kubernetes mode (beside kubelet, with an API server or
/// kubelet as pod source; `agent/src/cm/beside_kubelet/metrics.rs`). This case runs qosd
/// standalone, so a query that needs one of them cannot have data here: it must still parse,
/// and it is reported as needing Kubernetes mode, never as a pass. Every other query keeps the
/// rule (data, or a probe qosd reports `unavailable`).
const KUBERNETES_METRICS: &[&str] = &[
    "qosd_kubelet_drift",
    "qosd_unattributed_cgroups",
    "qosd_pod_source_up",
    "qosd_pod_source_errors_total",
    "qosd_feedback_reverted_total",
];

/// A pod the case admits: its name, the end of its uid, its resources (which make its QoS
/// class) and what its one container `c` runs.
struct PodSpec {
    name: &'static str,
    uid_suffix: &'static str,
    resources: &'static str,
    command: Workload,
}

/// What a container runs.
enum Workload {
    /// `qosd-systests ARGS...`.
    SelfExe(&'static [&'static str]),
    /// `/bin/sh -c LINE`.
    Shell(&'static str),
}

/// Two pods of each QoS class, about one CPU of load in all: capped spinners (throttled), a
/// napper (woken over and over), a forker (exec balancing migrates it), a memory toucher (hinting faults).
const PODS: &[PodSpec] = &[
    PodSpec {
        name: BUSY_POD,
        uid_suffix: "c1",
        resources: "{limits: {cpu: \"1\", memory: 128Mi}}",
        command: Workload::SelfExe(&["nap", "2", "600"]),
    },
    PodSpec {
        name: "guaranteed-capped",
        uid_suffix: "c2",
        resources: "{limits: {cpu: 200m, memory: 128Mi}}",
        command: Workload::SelfExe(&["spin", "600"]),
    },
    PodSpec {
        name: "burstable-capped",
        uid_suffix: "c3",
        resources: "{requests: {cpu: 100m, memory: 32Mi}, limits: {cpu: 300m}}",
        command: Workload::SelfExe(&["spin", "600"]),
    },
    PodSpec {
        name: "burstable-waker",
        uid_suffix: "c4",
        resources: "{requests: {cpu: 50m, memory: 16Mi}}",
        command: Workload::Shell("while :; do sleep 0.05; done"),
    },
    PodSpec {
        name: "besteffort-forker",
        uid_suffix: "c5",
        resources: "{}",
        command: Workload::Shell("while :; do /bin/true; sleep 0.02; done"),
    },
    PodSpec {
        name: "besteffort-memory",
        uid_suffix: "c6",
        resources: "{}",
        // 32 MiB rewritten page by page: NUMA hinting faults where balancing runs.
        command: Workload::SelfExe(&["memory", "32", "600"]),
    },
];

/// Asks for 64 CPUs: rejected with `OutOfcpu`, so the rejection panels have a series.
const TOO_BIG: &str = "apiVersion: v1\nkind: Pod\n\
    metadata: {name: too-big, namespace: systest-prom, uid: 0f0e0d0c-0000-4000-8000-0000000000cf}\n\
    spec:\n  containers:\n  - name: c\n    command: [\"/bin/sh\", \"-c\", \"sleep 600\"]\n    \
    resources: {requests: {cpu: \"64\"}}\n";

/// Every dashboard query answers from a real Prometheus scraping a real qosd.
pub(crate) fn dashboard_queries_answer(ctx: &Context) -> Outcome {
    if !Path::new(PROMETHEUS).is_file() {
        return fail(format!(
            "{PROMETHEUS} is missing: `cargo xtask setup` installs the Debian package prometheus (and `cargo xtask test` copies it into the guests)"
        ));
    }
    match run(ctx, None) {
        Ok(outcome) => outcome,
        Err(e) => fail(e),
    }
}

/// The same with qosd's systemd cgroup driver (`cgroupDriver: systemd`), in the systemd guests.
pub(crate) fn dashboard_queries_answer_on_the_systemd_driver(ctx: &Context) -> Outcome {
    if let Some(reason) = super::systemd::systemd_here() {
        return Outcome::Skip(reason);
    }
    if !Path::new(PROMETHEUS).is_file() {
        return fail(format!("{PROMETHEUS} is missing"));
    }
    match run(ctx, Some("systemd")) {
        Ok(outcome) => outcome,
        Err(e) => fail(e),
    }
}

fn pod_manifest(spec: &PodSpec, self_exe: &Path) -> String {
    let command = match &spec.command {
        Workload::SelfExe(args) => {
            let mut parts = vec![format!("\"{}\"", self_exe.display())];
            parts.extend(args.iter().map(|a| format!("\"{a}\"")));
            format!("[{}]", parts.join(", "))
        }
        Workload::Shell(line) => format!("[\"/bin/sh\", \"-c\", \"{line}\"]"),
    };
    format!(
        "apiVersion: v1\nkind: Pod\n\
         metadata: {{name: {name}, namespace: {NAMESPACE}, uid: 0f0e0d0c-0000-4000-8000-0000000000{uid}}}\n\
         spec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n    \
         command: {command}\n    resources: {resources}\n",
        name = spec.name,
        uid = spec.uid_suffix,
        resources = spec.resources,
    )
}

/// qosd standalone with the test pods, `driver` the KubeletConfiguration's `cgroupDriver`
/// (none: no configuration, cgroupfs), scraped by Prometheus; every dashboard query asked.
fn run(ctx: &Context, driver: Option<&str>) -> Result<Outcome, String> {
    let dashboards = load_dashboards()?;
    // With two NUMA nodes (the guests) the hinting-fault panels must show data too: NUMA
    // balancing takes hinting faults only while it is on.
    let _balancing = if node_cpus()?.len() >= 2 {
        Some(NumaBalancing::set(true)?)
    } else {
        None
    };
    let h = Hierarchies::new("qosd-systest-prom")?;
    // On the systemd driver, whatever happens, no unit of the case stays (qosd stops them at
    // SIGTERM; this is for a run that failed before).
    let _slice = StopSlice(driver.map(|_| format!("{}.slice", h.root_name.replace('-', "_"))));
    let scratch = std::env::temp_dir().join(format!("{}-files", h.root_name));
    let manifests = scratch.join("manifests");
    let _cleanup = TempPaths(vec![scratch.clone()]);
    std::fs::create_dir_all(&manifests).map_err(|e| format!("{}: {e}", manifests.display()))?;
    for spec in PODS {
        let path = manifests.join(format!("{}.yaml", spec.name));
        std::fs::write(&path, pod_manifest(spec, &ctx.self_exe))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    std::fs::write(manifests.join("too-big.yaml"), TOO_BIG).map_err(|e| e.to_string())?;
    let mut args: Vec<String> = [
        "--manifest-dir",
        &manifests.display().to_string(),
        "--cgroup-root",
        &format!("/{}", h.root_name),
        "--state-dir",
        &scratch.join("state").display().to_string(),
        "--container-log-dir",
        &scratch.join("logs").display().to_string(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    if let Some(driver) = driver {
        let config = scratch.join("kubelet.yaml");
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: {driver}\n"
            ),
        )
        .map_err(|e| format!("{}: {e}", config.display()))?;
        args.extend(["--kubelet-config".to_owned(), config.display().to_string()]);
    }
    let mut agent = Agent::start_with(&ctx.qosd, &args, Duration::from_secs(60))?;
    let with_log = |e: String, agent: &Agent| format!("{e}\n{}", agent.log_tail());

    #[expect(
        clippy::cast_precision_loss,
        reason = "a handful of pods, far below 2^53"
    )]
    let admitted = PODS.len() as f64;
    wait_for(
        "qosd admits every pod and rejects too-big",
        Duration::from_secs(30),
        || {
            let text = agent.scrape()?;
            let pods = sum_where(&text, "qosd_pods", &[]);
            let rejected = sum_where(&text, "qosd_pod_admission_rejections_total", &[]);
            if pods == admitted && rejected >= 1.0 {
                Ok(())
            } else {
                Err(format!(
                    "qosd_pods sums to {pods} (want {admitted}), rejections {rejected}"
                ))
            }
        },
    )
    .map_err(|e| with_log(e, &agent))?;

    let prometheus = Prometheus::start(agent.addr)?;
    let outcome = check_dashboards(&prometheus, &dashboards, admitted)
        .map_err(|e| format!("{e}\n{}", prometheus.log_tail()))
        .map_err(|e| with_log(e, &agent));
    drop(prometheus);
    let (status, _) = agent.stop(libc::SIGTERM, Duration::from_secs(30))?;
    let outcome = outcome?;
    if !status.success() {
        return Err(format!("qosd exited {status} after SIGTERM"));
    }
    Ok(outcome)
}

/// How many times a query with no series (a panel's or an end-to-end one) is asked again,
/// 2.5 s apart: under emulation scrapes can overrun their timeout, several in a row, and a
/// `rate()` needs two good ones in its window.
const STALE_RETRIES: usize = 3;
/// The time all retries of one case may take together: a target down for long makes every
/// query retry, and the case must still end within the harness's budget.
const RETRY_BUDGET: Duration = Duration::from_secs(45);

/// The value of the one series of a query's answer.
fn single_value(expr: &str, result: &[Value]) -> Result<f64, String> {
    let [series] = result else {
        return Err(format!("{expr}: {} series, want 1", result.len()));
    };
    series["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{expr}: no value in {series}"))
}

/// Stops a systemd slice when dropped.
struct StopSlice(Option<String>);

impl Drop for StopSlice {
    fn drop(&mut self) {
        if let Some(unit) = &self.0 {
            super::systemd::stop_root_slice(unit);
        }
    }
}

/// One dashboard: its file name and parsed JSON.
struct Dashboard {
    file: String,
    json: Value,
}

fn load_dashboards() -> Result<Vec<Dashboard>, String> {
    let dir = [DASHBOARD_DIR, GUEST_DASHBOARD_DIR]
        .into_iter()
        .map(Path::new)
        .find(|d| d.is_dir())
        .ok_or(format!(
            "no dashboards in {DASHBOARD_DIR} (the checkout) or {GUEST_DASHBOARD_DIR} (the guests)"
        ))?;
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_none_or(|ext| ext != "json") {
            continue;
        }
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let json = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let file = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        out.push(Dashboard { file, json });
    }
    out.sort_by(|a, b| a.file.cmp(&b.file));
    if out.is_empty() {
        return Err(format!("no *.json dashboards in {}", dir.display()));
    }
    Ok(out)
}

/// One panel target to run: where it is and its expression with the variables substituted.
struct Query {
    place: String,
    expr: String,
}

/// Every panel target of a dashboard (rows' nested panels included), with `$variables`
/// replaced by the value Grafana uses for "All" (the variable's `allValue`) and the
/// [`BUILTINS`]; and each `label_values(EXPR, label)` variable as `count by (label) (EXPR)`.
fn queries(dashboard: &Dashboard) -> Result<Vec<Query>, String> {
    let variables: Vec<&Value> = dashboard.json["templating"]["list"]
        .as_array()
        .map(|l| l.iter().collect())
        .unwrap_or_default();
    let mut values: BTreeMap<String, String> = BUILTINS
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    for variable in &variables {
        if variable["type"] == "query" {
            let name = variable["name"].as_str().unwrap_or_default().to_owned();
            let all = variable["allValue"].as_str().unwrap_or(".*").to_owned();
            values.insert(name, all);
        }
    }
    let mut out = Vec::new();
    let mut stack: Vec<&Value> = dashboard.json["panels"]
        .as_array()
        .map(|l| l.iter().collect())
        .unwrap_or_default();
    while let Some(panel) = stack.pop() {
        if let Some(nested) = panel["panels"].as_array() {
            stack.extend(nested);
        }
        let title = panel["title"].as_str().unwrap_or_default();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let Some(expr) = target["expr"].as_str() else {
                continue;
            };
            let place = format!(
                "{} panel {title:?} {}",
                dashboard.file,
                target["refId"].as_str().unwrap_or_default()
            );
            let expr = substitute(expr, &values).map_err(|e| format!("{place}: {e}"))?;
            out.push(Query { place, expr });
        }
    }
    out.sort_by(|a, b| a.place.cmp(&b.place));
    for variable in &variables {
        let query = variable["query"]
            .as_str()
            .or_else(|| variable["query"]["query"].as_str())
            .unwrap_or_default();
        let Some((expr, label)) = query
            .trim()
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .and_then(|q| q.rsplit_once(','))
        else {
            continue;
        };
        let place = format!(
            "{} variable ${}",
            dashboard.file,
            variable["name"].as_str().unwrap_or_default()
        );
        let expr = substitute(expr.trim(), &values).map_err(|e| format!("{place}: {e}"))?;
        out.push(Query {
            place,
            expr: format!("count by ({}) ({expr})", label.trim()),
        });
    }
    Ok(out)
}

/// `expr` with every `$name` and `${name}` / `${name:format}` replaced from `values`.
fn substitute(expr: &str, values: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::with_capacity(expr.len());
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, consumed) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced
                .find('}')
                .ok_or_else(|| format!("unclosed ${{ in {expr:?}"))?;
            let inner = &braced[..end];
            (inner.split(':').next().unwrap_or_default(), end + 2)
        } else {
            let len = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..len], len)
        };
        let value = values
            .get(name)
            .ok_or_else(|| format!("unknown variable ${name} in {expr:?}"))?;
        out.push_str(value);
        rest = &after[consumed..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The probes a query needs, by the metric names in it (histogram series by base name).
fn probes_needed(expr: &str) -> Vec<&'static str> {
    let words: Vec<&str> = expr
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .collect();
    let base = |word: &str| {
        ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| word.strip_suffix(s))
            .unwrap_or(word)
            .to_owned()
    };
    PROBE_METRICS
        .iter()
        .filter(|(_, metrics)| {
            words
                .iter()
                .any(|w| metrics.contains(w) || metrics.contains(&base(w).as_str()))
        })
        .map(|(probe, _)| *probe)
        .collect()
}

/// The [`KUBERNETES_METRICS`] a query uses.
fn kubernetes_metrics_needed(expr: &str) -> Vec<&'static str> {
    let words: Vec<&str> = expr
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .collect();
    KUBERNETES_METRICS
        .iter()
        .filter(|m| words.contains(m))
        .copied()
        .collect()
}

fn check_dashboards(
    prometheus: &Prometheus,
    dashboards: &[Dashboard],
    admitted: f64,
) -> Result<Outcome, String> {
    prometheus.wait_for_target()?;
    let unavailable: Vec<String> = prometheus
        .query("qosd_probe_info{mode=\"unavailable\"}")?
        .iter()
        .filter_map(|s| s["metric"]["probe"].as_str().map(str::to_owned))
        .collect();
    // The Kubernetes-mode metrics this qosd (standalone) does not export at all: a query that
    // needs one cannot have data here. One it does export is checked like any other.
    let mut not_exported = Vec::new();
    for metric in KUBERNETES_METRICS {
        if prometheus.query(&format!("count({metric})"))?.is_empty() {
            not_exported.push(*metric);
        }
    }

    let mut problems = Vec::new();
    let mut retried = Vec::new();
    let mut tallies = Vec::new();
    for dashboard in dashboards {
        let mut tally = Tally::default();
        for query in queries(dashboard)? {
            tally.total += 1;
            let result = match prometheus.query(&query.expr) {
                Ok(result) => result,
                Err(e) => {
                    problems.push(format!("{}: {e}", query.place));
                    continue;
                }
            };
            let missing: Vec<&str> = probes_needed(&query.expr)
                .into_iter()
                .filter(|p| unavailable.iter().any(|u| u == p))
                .collect();
            let kubernetes: Vec<&str> = kubernetes_metrics_needed(&query.expr)
                .into_iter()
                .filter(|m| not_exported.contains(m))
                .collect();
            if !missing.is_empty() {
                tally.excluded.push(format!(
                    "{} (needs probe {}, unavailable per qosd_probe_info; {} series)",
                    query.place,
                    missing.join(", "),
                    result.len()
                ));
            } else if !kubernetes.is_empty() && result.is_empty() {
                // Parsed, and cannot have data: qosd runs standalone here (a manifest
                // directory, no API server, no kubelet). Not a pass.
                tally.needs_kubernetes.push(format!(
                    "{} (needs Kubernetes mode: {})",
                    query.place,
                    kubernetes.join(", ")
                ));
            } else if result.is_empty() {
                // Asked again after the next scrape (see `asked_after_staleness`); the failed
                // scrape is reported either way.
                match prometheus.asked_after_staleness(&query.expr, result) {
                    Ok((again, states)) if !again.is_empty() => {
                        tally.with_data += 1;
                        retried.extend(
                            states
                                .iter()
                                .map(|state| format!("{} (target then: {state})", query.place)),
                        );
                    }
                    Ok((_, states)) => problems.push(format!(
                        "{}: no data for {}, asked {} times 2.5 s apart (target before each retry: {}; retry budget left {:?})",
                        query.place,
                        query.expr,
                        states.len() + 1,
                        states.join("; "),
                        prometheus.retry_budget.get()
                    )),
                    Err(e) => problems.push(format!("{}: {e}", query.place)),
                }
            } else {
                tally.with_data += 1;
            }
        }
        tallies.push((dashboard.file.as_str(), tally));
    }

    // End to end: the pod count, and a busy pod's CPU seconds moving between two queries.
    let pods = prometheus.scalar_after_staleness("sum(qosd_pods)", &mut retried)?;
    if pods != admitted {
        problems.push(format!(
            "Prometheus's sum(qosd_pods) = {pods}, the test admitted {admitted}"
        ));
    }
    let busy = format!(
        "sum(qosd_cgroup_cpu_seconds_total{{namespace=\"{NAMESPACE}\", pod=\"{BUSY_POD}\", container=\"c\"}})"
    );
    let before = prometheus.scalar_after_staleness(&busy, &mut retried)?;
    std::thread::sleep(Duration::from_secs(5));
    let after = prometheus.scalar_after_staleness(&busy, &mut retried)?;
    if after <= before {
        problems.push(format!(
            "{BUSY_POD}'s qosd_cgroup_cpu_seconds_total did not grow in Prometheus: {before} then {after} 5 s later"
        ));
    }

    let total: usize = tallies.iter().map(|(_, t)| t.total).sum();
    if !problems.is_empty() {
        return Err(format!(
            "{} of {total} queries failed:\n{}",
            problems.len(),
            problems.join("\n")
        ));
    }
    let with_data: usize = tallies.iter().map(|(_, t)| t.with_data).sum();
    let per_dashboard: Vec<String> = tallies
        .iter()
        .map(|(file, tally)| format!("{file}: {}", tally.report()))
        .collect();
    let retried_text = if retried.is_empty() {
        String::new()
    } else {
        format!(
            "; {} answered only after the next scrape: {}",
            retried.len(),
            retried.join("; ")
        )
    };
    let summary = format!(
        "{total} queries from {} dashboard(s) parsed; {with_data} returned data{retried_text}; {}; sum(qosd_pods) = {pods} as admitted; {BUSY_POD} CPU {before:.3} s -> {after:.3} s",
        dashboards.len(),
        per_dashboard.join("; "),
    );
    if with_data == 0 {
        return Ok(Outcome::Skip(format!(
            "no query could be checked for data: {summary}"
        )));
    }
    Ok(Outcome::Pass(summary))
}

/// What became of one dashboard's queries (every one parsed, or the case failed).
#[derive(Default)]
struct Tally {
    total: usize,
    with_data: usize,
    /// Queries that need a probe qosd reports `unavailable`, with the probe.
    excluded: Vec<String>,
    /// Queries that need a [`KUBERNETES_METRICS`] metric qosd does not export standalone.
    needs_kubernetes: Vec<String>,
}

impl Tally {
    fn report(&self) -> String {
        let list = |items: &[String]| {
            if items.is_empty() {
                String::new()
            } else {
                format!(": {}", items.join("; "))
            }
        };
        format!(
            "{} queries, {} with data, {} excluded on this host{}, {} not checked for data, needing Kubernetes mode{}",
            self.total,
            self.with_data,
            self.excluded.len(),
            list(&self.excluded),
            self.needs_kubernetes.len(),
            list(&self.needs_kubernetes),
        )
    }
}

/// A Prometheus child process scraping one target every second, with its configuration and
/// storage in a temporary directory. Killed, and the directory removed, on drop.
struct Prometheus {
    child: Option<Child>,
    addr: SocketAddr,
    target: SocketAddr,
    dir: PathBuf,
    /// What is left of [`RETRY_BUDGET`].
    retry_budget: std::cell::Cell<Duration>,
}

impl Prometheus {
    /// Starts Prometheus on a free 127.0.0.1 port, scraping `target`, and waits until it is
    /// ready.
    fn start(target: SocketAddr) -> Result<Self, String> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "qosd-systest-prometheus-{}-{nanos}",
            std::process::id()
        ));
        let addr = free_port()?;
        // The guard exists before anything is created, so every later error cleans up.
        let mut prometheus = Self {
            child: None,
            addr,
            target,
            dir,
            retry_budget: std::cell::Cell::new(RETRY_BUDGET),
        };
        std::fs::create_dir_all(prometheus.dir.join("data"))
            .map_err(|e| format!("{}: {e}", prometheus.dir.display()))?;
        let config = prometheus.dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 2s\n  scrape_timeout: 2s\n  evaluation_interval: 2s\n\
                 scrape_configs:\n- job_name: qosd\n  static_configs:\n  - targets: ['{target}']\n"
            ),
        )
        .map_err(|e| format!("{}: {e}", config.display()))?;
        let log_path = prometheus.log_path();
        let log =
            std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                prometheus.dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {PROMETHEUS}: {e}"))?;
        prometheus.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if matches!(prometheus.get("/-/ready"), Ok((200, _))) {
                return Ok(prometheus);
            }
            if let Some(child) = prometheus.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!(
                    "prometheus exited before it was ready: {status}\n{}",
                    prometheus.log_tail()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "prometheus not ready on {addr} within 30 s\n{}",
                    prometheus.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("prometheus.log")
    }

    /// The last lines Prometheus logged, for failure messages.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(10)..].join("\n");
        format!("--- prometheus log ---\n{tail}")
    }

    /// The qosd target's health, last error and last scrape's duration, for a report.
    fn target_state(&self) -> Result<String, String> {
        let scrape_url = format!("http://{}/metrics", self.target);
        let (status, body) = self.get("/api/v1/targets")?;
        let json: Value =
            serde_json::from_str(&body).map_err(|e| format!("/api/v1/targets ({status}): {e}"))?;
        let target = json["data"]["activeTargets"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["scrapeUrl"] == scrape_url.as_str())
            .ok_or_else(|| format!("no active target {scrape_url}: {body}"))?;
        Ok(format!(
            "health {}, last error {}, last scrape {} s",
            target["health"], target["lastError"], target["lastScrapeDuration"]
        ))
    }

    /// Waits until the qosd target is up and has been scraped [`MIN_SCRAPES`] times.
    fn wait_for_target(&self) -> Result<(), String> {
        let scrape_url = format!("http://{}/metrics", self.target);
        wait_for(
            "prometheus reports the qosd target up",
            Duration::from_secs(30),
            || {
                let (status, body) = self.get("/api/v1/targets")?;
                let json: Value = serde_json::from_str(&body)
                    .map_err(|e| format!("/api/v1/targets ({status}): {e}"))?;
                let target = json["data"]["activeTargets"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|t| t["scrapeUrl"] == scrape_url.as_str())
                    .ok_or_else(|| format!("no active target {scrape_url}: {body}"))?;
                if target["health"] == "up" {
                    Ok(())
                } else {
                    Err(format!(
                        "target health {}, last error {}",
                        target["health"], target["lastError"]
                    ))
                }
            },
        )?;
        wait_for(
            "prometheus has scraped qosd a few times",
            Duration::from_secs(30),
            || {
                let scrapes = self.scalar("count_over_time(qosd_build_info[1m])")?;
                if scrapes >= MIN_SCRAPES {
                    Ok(())
                } else {
                    Err(format!("{scrapes} scrapes, want {MIN_SCRAPES}"))
                }
            },
        )
    }

    /// Runs an instant query; returns the result's series (a scalar or string result counts
    /// as one). Fails unless the answer is HTTP 200 with status `success`.
    fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let (status, body) = self.get(&format!("/api/v1/query?query={}", url_encode(expr)))?;
        let json: Value = serde_json::from_str(&body)
            .map_err(|e| format!("HTTP {status}, unparsable answer {body:?}: {e}"))?;
        if status != 200 || json["status"] != "success" {
            return Err(format!(
                "HTTP {status}, {} {}: {}",
                json["errorType"], json["error"], expr
            ));
        }
        let data = &json["data"];
        match data["resultType"].as_str() {
            Some("vector" | "matrix") => Ok(data["result"].as_array().cloned().unwrap_or_default()),
            Some("scalar" | "string") => Ok(vec![data["result"].clone()]),
            other => Err(format!("unexpected result type {other:?}: {body}")),
        }
    }

    /// The value of a query that returns exactly one series.
    fn scalar(&self, expr: &str) -> Result<f64, String> {
        single_value(expr, &self.query(expr)?)
    }

    /// `answer` (the first answer to `expr`), asked again after the next scrape, up to
    /// [`STALE_RETRIES`] times and within what is left of [`RETRY_BUDGET`], while it has no
    /// series: a failed scrape (over the 2 s timeout in an
    /// emulated guest) marks every series stale until the next one. Returns the last answer
    /// and the target's state before each retry, for the caller to report.
    fn asked_after_staleness(
        &self,
        expr: &str,
        mut answer: Vec<Value>,
    ) -> Result<(Vec<Value>, Vec<String>), String> {
        let mut states = Vec::new();
        const PAUSE: Duration = Duration::from_millis(2500);
        while answer.is_empty() && states.len() < STALE_RETRIES && self.retry_budget.get() >= PAUSE
        {
            self.retry_budget.set(self.retry_budget.get() - PAUSE);
            states.push(self.target_state()?);
            std::thread::sleep(PAUSE);
            answer = self.query(expr)?;
        }
        Ok((answer, states))
    }

    /// [`Self::scalar`] through [`Self::asked_after_staleness`] with [`STALE_RETRIES`]: each
    /// retry's target state is added to `retried`; an answer still empty is an error with
    /// every state seen.
    fn scalar_after_staleness(&self, expr: &str, retried: &mut Vec<String>) -> Result<f64, String> {
        let (answer, states) = self.asked_after_staleness(expr, self.query(expr)?)?;
        if answer.is_empty() {
            return Err(format!(
                "{expr}: 0 series, asked {} times 2.5 s apart (target before each retry: {}; retry budget left {:?})",
                states.len() + 1,
                states.join("; "),
                self.retry_budget.get()
            ));
        }
        retried.extend(
            states
                .iter()
                .map(|state| format!("{expr} (target then: {state})")),
        );
        single_value(expr, &answer)
    }

    /// A GET over HTTP/1.0 (so the answer is never chunked): the status code and the body.
    fn get(&self, path: &str) -> Result<(u16, String), String> {
        let mut stream = TcpStream::connect_timeout(&self.addr, Duration::from_secs(2))
            .map_err(|e| format!("connecting to prometheus on {}: {e}", self.addr))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .map_err(|e| e.to_string())?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr)
            .map_err(|e| e.to_string())?;
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .map_err(|e| format!("reading prometheus's answer to {path}: {e}"))?;
        let (head, body) = response
            .split_once("\r\n\r\n")
            .ok_or_else(|| format!("malformed HTTP answer to {path}"))?;
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| format!("no status in {:?}", head.lines().next()))?;
        Ok((status, body.to_owned()))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn url_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitute_replaces_plain_braced_and_formatted_variables() {
        let values: BTreeMap<String, String> = [("pod", ".+"), ("__rate_interval", "5s")]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(
            substitute(
                "rate(x{pod=~\"$pod\", p=~\"${pod:regex}\"}[$__rate_interval])",
                &values
            ),
            Ok("rate(x{pod=~\".+\", p=~\".+\"}[5s])".to_owned())
        );
        assert!(substitute("x{a=\"$missing\"}", &values).is_err());
    }

    #[test]
    fn probes_needed_finds_histogram_series_by_base_name() {
        assert_eq!(
            probes_needed("sum by (le) (rate(qosd_cpu_throttle_episode_seconds_bucket[5s]))"),
            [throttle::PROBE_NAME]
        );
        assert_eq!(
            probes_needed("sum(qosd_numa_hint_faults_total) / sum(qosd_cgroup_cpu_seconds_total)"),
            [cpu_time::PROBE_NAME, numa::HINT_FAULT_PROBE]
        );
        assert!(probes_needed("sum(qosd_pods)").is_empty());
    }

    #[test]
    fn kubernetes_metrics_needed_matches_whole_names_only() {
        assert_eq!(
            kubernetes_metrics_needed(
                "sum by (instance, level, file) (qosd_kubelet_drift{instance=~\".+\"})"
            ),
            ["qosd_kubelet_drift"]
        );
        assert_eq!(
            kubernetes_metrics_needed(
                "sum(rate(qosd_pod_source_errors_total[5s])) + sum(qosd_pod_source_up)"
            ),
            ["qosd_pod_source_up", "qosd_pod_source_errors_total"]
        );
        assert!(kubernetes_metrics_needed("sum by (qos_class) (qosd_pods)").is_empty());
        assert!(
            kubernetes_metrics_needed("sum(increase(qosd_feedback_decisions_total[1m]))")
                .is_empty()
        );
    }

    #[test]
    fn url_encode_keeps_unreserved_characters_only() {
        assert_eq!(url_encode("a_b-c.d~"), "a_b-c.d~");
        assert_eq!(url_encode("x{a=\"b\"} / 2"), "x%7Ba%3D%22b%22%7D%20%2F%202");
    }
}
