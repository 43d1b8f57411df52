//! qosd beside kubelet, with a real containerd running the pods. No kube-apiserver or kubelet
//! can run on the development machine, so the case plays both: it makes the QoS tiers and pod
//! cgroups with kubelet's values (through qosd's standalone cgroup backend, whose values are
//! pinned to kubelet's own test vectors), has containerd run each pod's sandbox and containers
//! through CRI with kubelet's cgroup parent and resources, and serves the pods, with the
//! container ids containerd gave them in their status, from a played API server speaking the
//! real wire format (the `fake-kubernetes` crate). qosd runs `--pods kubernetes` against it.
//!
//! It checks, against the kernel and the runtime: the containers' cgroups (made by runc, not
//! qosd) carry their namespace, pod, container and QoS class in CPU time, run-queue latency,
//! throttling and NUMA memory; a hand-edited kubelet value is reported as drift and left as it
//! is; a CFS burst given to a throttled spiky container, written back to kubelet's value, is
//! written again and counted; the API server going away and coming back loses nothing;
//! `qosd inspect` shows the pods as tables and as JSON; on SIGTERM the burst is back at
//! kubelet's value.
use std::time::Duration;

use fake_kubernetes::{FakeKubernetes, pod_object};
use qosd::cgroup::resources::{Limit, ResourceConfig};
use qosd::cgroup::{CgroupName, CgroupWriter as _, CgroupfsBackend, Hierarchies, NameStyle};
use qosd::cm::pod_resources::{PodCgroupPolicy, container_config, pod_config};
use qosd::cm::qos_tiers::{QosTiers, tier_settings};
use qosd::pods::kubernetes::decode::decode_pod;
use qosd::pods::qos::pod_qos;

use crate::agent::{Agent, http_get, sample_value, samples};
use crate::containerd::{self, ContainerSpec, Containerd, PodSpec};
use crate::harness::{Context, Outcome, fail};
use crate::pod_tree::{self, TempPaths, wait_for};

/// Where the case writes `qosd inspect`'s text report when set.
const INSPECT_OUT_ENV: &str = "QOSD_SYSTEST_INSPECT_OUT";
pub(super) const NODE: &str = "systest-node";
pub(super) const NAMESPACE: &str = "systest";
const SPINNER_UID: &str = "0f0e0d0c-0000-4000-8000-00000000c001";
const SPIKY_UID: &str = "0f0e0d0c-0000-4000-8000-00000000c002";
const IDLE_UID: &str = "0f0e0d0c-0000-4000-8000-00000000c003";

/// One pod of the case: the API object and how containerd runs its one container.
struct TestPod {
    name: &'static str,
    uid: &'static str,
    container: &'static str,
    requests: &'static [(&'static str, &'static str)],
    limits: &'static [(&'static str, &'static str)],
    script: &'static str,
}

const PODS: [TestPod; 3] = [
    TestPod {
        name: "spinner",
        uid: SPINNER_UID,
        container: "spin",
        requests: &[("cpu", "100m")],
        limits: &[("cpu", "500m")],
        // 4 MiB held in a shell variable (2^22 bytes by doubling), so its memory.numa_stat is
        // never empty: a bare shell loop's few pages can stay in the per-CPU LRU batches, out
        // of memory.numa_stat (5.10 showed it), and there is nothing to label then.
        script: "x=a; i=0; while [ $i -lt 22 ]; do x=$x$x; i=$((i+1)); done; while :; do :; done",
    },
    TestPod {
        name: "spiky",
        uid: SPIKY_UID,
        container: "spikes",
        requests: &[("cpu", "50m")],
        limits: &[("cpu", "200m")],
        // About 35 ms of CPU (SPIN_ITERATIONS, calibrated on this machine), then 300 ms
        // asleep: above the 20 ms quota in its periods, about half the limit on average.
        script: "while :; do i=0; while [ $i -lt SPIN_ITERATIONS ]; do i=$((i+1)); done; sleep 0.3; done",
    },
    TestPod {
        name: "idle",
        uid: IDLE_UID,
        container: "sleeper",
        requests: &[],
        limits: &[],
        script: "sleep 86400",
    },
];

/// How many iterations of busybox's shell loop take about 35 ms here (emulated guests are
/// many times slower than the host), measured with the same shell the container runs.
fn spin_iterations() -> Result<u64, String> {
    const PROBE: u64 = 20_000;
    let started = std::time::Instant::now();
    let status = std::process::Command::new("/bin/busybox")
        .args([
            "sh",
            "-c",
            &format!("i=0; while [ $i -lt {PROBE} ]; do i=$((i+1)); done"),
        ])
        .status()
        .map_err(|e| format!("/bin/busybox (busybox-static): {e}"))?;
    if !status.success() {
        return Err(format!("busybox's calibration loop failed: {status}"));
    }
    let per_iteration = started.elapsed().as_secs_f64() / PROBE as f64;
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a positive iteration count, clamped"
    )]
    let iterations = (0.035 / per_iteration.max(1e-9)) as u64;
    Ok(iterations.clamp(200, 1_000_000))
}

/// The case.
pub(crate) fn beside_kubelet(ctx: &Context) -> Outcome {
    if let Some(why) = containerd::unavailable() {
        return Outcome::Skip(why);
    }
    match run(ctx) {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

fn run(ctx: &Context) -> Result<String, String> {
    let h = pod_tree::Hierarchies::new("qosd-systest-k8s")?;
    let scratch = std::env::temp_dir().join(format!("{}-files", h.root_name));
    let _files = TempPaths(vec![scratch.clone()]);
    std::fs::create_dir_all(&scratch).map_err(|e| e.to_string())?;

    // kubelet's part: tiers and pod cgroups with kubelet's values.
    let root = CgroupName::new([h.root_name.as_str()]).map_err(|e| e.to_string())?;
    let kubelet = CgroupfsBackend::new(
        Hierarchies::from_layout(&h.layout).map_err(|e| e.to_string())?,
        root.clone(),
        NameStyle::Cgroupfs,
    );
    let tiers = QosTiers::new(&root).map_err(|e| e.to_string())?;
    let policy = PodCgroupPolicy::default();
    let specs: Vec<qosd::pods::model::Pod> = PODS
        .iter()
        .map(|p| {
            decode_pod(
                pod_object(
                    NAMESPACE,
                    p.name,
                    p.uid,
                    NODE,
                    &[(p.container, p.requests, p.limits, None)],
                ),
                p.name,
            )
            .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let settings = tier_settings(specs.iter().map(|p| (pod_qos(&p.spec), &p.spec)), false);
    for (tier, config) in [
        (&tiers.kubepods, ResourceConfig::default()),
        (&tiers.burstable, settings.burstable),
        (&tiers.besteffort, settings.besteffort),
    ] {
        kubelet.create(tier, &config).map_err(|e| e.to_string())?;
    }
    let mut pod_cgroups = Vec::new();
    for spec in &specs {
        let cgroup = tiers
            .pod_cgroup(pod_qos(&spec.spec), &spec.metadata.uid)
            .map_err(|e| e.to_string())?;
        kubelet
            .create(&cgroup, &pod_config(&spec.spec, policy))
            .map_err(|e| e.to_string())?;
        pod_cgroups.push(cgroup);
    }

    // containerd's part: sandboxes and containers through CRI.
    let iterations = spin_iterations()?.to_string();
    let mut runtime = Containerd::start()?;
    let fake = FakeKubernetes::start().map_err(|e| e.to_string())?;
    let mut container_ids = Vec::new();
    for ((test, spec), cgroup) in PODS.iter().zip(&specs).zip(&pod_cgroups) {
        let resources = container_config(&spec.spec.containers[0], policy);
        let value = |limit: Option<Limit>| match limit {
            Some(Limit::Value(v)) => i64::try_from(v).unwrap_or(0),
            _ => 0,
        };
        let ids = runtime
            .run_pod(
                &PodSpec {
                    namespace: NAMESPACE,
                    name: test.name,
                    uid: test.uid,
                    cgroup_parent: &cgroup.to_cgroupfs(),
                },
                &[ContainerSpec {
                    name: test.container,
                    script: &test.script.replace("SPIN_ITERATIONS", &iterations),
                    cpu_shares: i64::try_from(resources.cpu_shares.unwrap_or(2)).unwrap_or(2),
                    cpu_quota: value(resources.cpu_quota),
                    cpu_period: i64::try_from(resources.cpu_period.unwrap_or(0)).unwrap_or(0),
                    memory_limit: value(resources.memory_limit),
                }],
            )
            .map_err(|e| format!("{e}\n--- containerd log ---\n{}", runtime.log_tail()))?;
        let id = ids.into_iter().next().ok_or("no container id")?;
        fake.upsert(pod_object(
            NAMESPACE,
            test.name,
            test.uid,
            NODE,
            &[(
                test.container,
                test.requests,
                test.limits,
                Some(&format!("containerd://{id}")),
            )],
        ));
        container_ids.push(id);
    }

    // qosd beside them.
    let kubeconfig = scratch.join("kubeconfig");
    std::fs::write(&kubeconfig, fake.kubeconfig()).map_err(|e| e.to_string())?;
    let mut agent = Agent::start_with(
        &ctx.qosd,
        &beside_kubelet_args(&kubeconfig, &h.root_name, "cgroupfs", &scratch, &[]),
        Duration::from_secs(60),
    )?;
    let with_log = |e: String| format!("{e}\n{}", agent.log_tail());

    // 1. kubelet's pods in every family, labelled.
    let labels = |pod: &TestPod| {
        let qos = if pod.limits.is_empty() {
            "besteffort"
        } else {
            "burstable"
        };
        [
            ("container", pod.container),
            ("namespace", NAMESPACE),
            ("pod", pod.name),
            ("qos_class", qos),
        ]
    };
    let spinner = &PODS[0];
    let cpu = wait_for(
        "the spinner's CPU time, labelled",
        Duration::from_secs(20),
        || {
            let text = agent.scrape()?;
            sum_series(&text, "qosd_cgroup_cpu_seconds_total", &labels(spinner))
                .filter(|s| *s > 0.5)
                .ok_or_else(|| "not yet".to_owned())
        },
    )
    .map_err(with_log)?;
    let under_root = |name: &CgroupName| {
        name.to_cgroupfs()
            .trim_start_matches(&format!("/{}/", h.root_name))
            .to_owned()
    };
    // Resident memory reaches memory.numa_stat as the kernel moves pages onto the cgroup's LRU
    // lists (per-CPU batches first): a small process's series may take a few scrapes, and a
    // process as small as the sandbox's `sleep` may have nothing there at all (5.10 showed
    // it). NUMA memory is asked of the spinner; of the sandbox where the kernel shows some.
    let families = [
        ("qosd_runqueue_latency_seconds_count", spinner),
        ("qosd_cpu_throttled_periods_total", spinner),
        ("qosd_numa_memory_bytes", spinner),
    ];
    let sandbox = [("pod", "spinner"), ("container", "POD")];
    let sandbox_dir = std::fs::read_dir(h.path("memory", &under_root(&pod_cgroups[0])))
        .map_err(|e| e.to_string())?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .find(|e| e.file_name().to_string_lossy() != container_ids[0])
        .map(|e| e.path())
        .ok_or("no sandbox cgroup beside the spinner's container")?;
    let spinner_dir = sandbox_dir.with_file_name(&container_ids[0]);
    let text = wait_for("every family labelled", Duration::from_secs(30), || {
        let text = agent.scrape()?;
        for (family, pod) in families {
            if sum_series(&text, family, &labels(pod)).is_none() {
                let kernel = numa_stat_total(&spinner_dir)
                    .map_or_else(|e| e, |total| format!("{total} in its memory.numa_stat"));
                return Err(format!(
                    "no {family} series for {} with its pod labels ({kernel})",
                    pod.name
                ));
            }
        }
        let kernel = numa_stat_total(&sandbox_dir)?;
        if kernel > 0 && sum_series(&text, "qosd_numa_memory_bytes", &sandbox).is_none() {
            return Err(format!(
                "no qosd_numa_memory_bytes of the spinner's sandbox (container=\"POD\"), \
                     while {}/memory.numa_stat shows {kernel}",
                sandbox_dir.display()
            ));
        }
        Ok(text)
    })
    .map_err(with_log)?;
    let throttled =
        sum_series(&text, "qosd_cpu_throttled_periods_total", &labels(spinner)).unwrap_or(0.0);
    // The sandbox (its pause process: busybox sleep here) is the pod's, labelled as kubelet's
    // cAdvisor labels it.
    let sandbox_memory = match sum_series(&text, "qosd_numa_memory_bytes", &sandbox) {
        Some(bytes) => format!("sandbox {bytes} bytes resident as container=POD"),
        None => "sandbox with nothing in memory.numa_stat (kernel), no series".to_owned(),
    };

    // 2. A hand edit of a kubelet value: drift, not corrected.
    let spinner_pod_cpu = h.path("cpu", &under_root(&pod_cgroups[0]));
    let shares_file = if h.v2() { "cpu.weight" } else { "cpu.shares" };
    std::fs::write(spinner_pod_cpu.join(shares_file), "1000").map_err(|e| e.to_string())?;
    wait_for(
        "a drift of the hand-edited file",
        Duration::from_secs(20),
        || {
            let text = agent.scrape()?;
            sum_series(
                &text,
                "qosd_kubelet_drift",
                &[
                    ("file", shares_file),
                    ("level", "pod"),
                    ("namespace", NAMESPACE),
                    ("pod", "spinner"),
                ],
            )
            .filter(|v| *v == 1.0)
            .ok_or_else(|| "not yet".to_owned())
        },
    )
    .map_err(with_log)?;
    let edited = std::fs::read_to_string(spinner_pod_cpu.join(shares_file)).unwrap_or_default();
    if edited.trim() != "1000" {
        return Err(with_log(format!(
            "qosd corrected kubelet's file: {shares_file} = {edited}"
        )));
    }

    // 3. A burst for the spiky container, written back by "kubelet", written again.
    let spiky_container = h.path(
        "cpu",
        &format!("{}/{}", under_root(&pod_cgroups[1]), container_ids[1]),
    );
    let burst_file = if h.v2() {
        "cpu.max.burst"
    } else {
        "cpu.cfs_burst_us"
    };
    let burst_path = spiky_container.join(burst_file);
    let burst_detail = if burst_path.exists() {
        let read_burst = || {
            std::fs::read_to_string(&burst_path)
                .map(|s| s.trim().to_owned())
                .map_err(|e| e.to_string())
        };
        wait_for(
            "a CFS burst for the spiky container",
            Duration::from_secs(30),
            || read_burst().and_then(|b| if b == "20000" { Ok(()) } else { Err(b) }),
        )
        .map_err(with_log)?;
        std::fs::write(&burst_path, "0").map_err(|e| e.to_string())?;
        wait_for("the burst written again", Duration::from_secs(15), || {
            let text = agent.scrape()?;
            let reverted = sample_value(
                &text,
                "qosd_feedback_reverted_total",
                "policy=\"cpu_burst\"",
            )
            .unwrap_or(0.0);
            let burst = read_burst()?;
            (reverted >= 1.0 && burst == "20000")
                .then_some(())
                .ok_or(format!("reverted {reverted}, burst {burst}"))
        })
        .map_err(with_log)?;
        "burst 20000 us written again after a revert".to_owned()
    } else {
        format!("no {burst_file} on this kernel: burst not checked")
    };

    // 4. The API server away and back: nothing lost.
    fake.set_available(false);
    wait_for("the pod source down", Duration::from_secs(15), || {
        let text = agent.scrape()?;
        sample_value(&text, "qosd_pod_source_up", "source=\"api_server\"")
            .filter(|v| *v == 0.0)
            .map(|_| ())
            .ok_or_else(|| "still up".to_owned())
    })
    .map_err(with_log)?;
    let text = agent.scrape()?;
    if sum_series(&text, "qosd_cgroup_cpu_seconds_total", &labels(spinner)).is_none() {
        return Err(with_log(
            "the spinner lost its labels while the API server was away".into(),
        ));
    }
    fake.set_available(true);
    wait_for("the pod source up again", Duration::from_secs(30), || {
        let text = agent.scrape()?;
        sample_value(&text, "qosd_pod_source_up", "source=\"api_server\"")
            .filter(|v| *v == 1.0)
            .map(|_| ())
            .ok_or_else(|| "still down".to_owned())
    })
    .map_err(with_log)?;
    let pods = sample_value(&agent.scrape()?, "qosd_pods", "qos_class=\"burstable\"");
    if pods != Some(2.0) {
        return Err(with_log(format!(
            "qosd_pods{{qos_class=\"burstable\"}} is {pods:?}, want 2"
        )));
    }

    // 5. inspect: tables and JSON.
    let report: serde_json::Value =
        serde_json::from_str(&http_get(agent.addr, "/inspect")?).map_err(|e| e.to_string())?;
    let listed = report["data"]["pods"].as_array().map_or(0, Vec::len);
    let text_report = std::process::Command::new(&ctx.qosd)
        .args(["inspect", "--addr", &agent.addr.to_string()])
        .output()
        .map_err(|e| e.to_string())?;
    let text_report = String::from_utf8_lossy(&text_report.stdout).into_owned();
    // For the docs: the report as an operator sees it.
    if let Some(path) = std::env::var_os(INSPECT_OUT_ENV) {
        std::fs::write(&path, &text_report).map_err(|e| format!("{INSPECT_OUT_ENV}: {e}"))?;
    }
    if listed != 3 || !text_report.contains("PODS") || !text_report.contains("spiky") {
        return Err(with_log(format!(
            "inspect: {listed} pods in JSON; text:\n{text_report}"
        )));
    }

    // 6. SIGTERM: kubelet's value back under the burst.
    let tail = agent.log_tail();
    agent
        .stop(libc::SIGTERM, Duration::from_secs(20))
        .map_err(|e| format!("{e}\n{tail}"))?;
    if burst_path.exists() {
        let after = std::fs::read_to_string(&burst_path).unwrap_or_default();
        if after.trim() != "0" {
            return Err(format!(
                "{burst_file} is {after} after qosd stopped, want kubelet's 0"
            ));
        }
    }
    drop(runtime);
    Ok(format!(
        "spinner {cpu:.2} CPU-s and {throttled} throttled periods labelled, {sandbox_memory}; drift on {shares_file} reported, not corrected; {burst_detail}; API server away and back: labels kept; inspect {listed} pods; kubelet's values back at stop"
    ))
}

/// `qosd run` beside kubelet on the played API server (`kubeconfig`): kubelet's cgroups under
/// `/root` with `driver`'s naming, its root directory and qosd's state under `scratch`, a 1 s
/// reconcile, the feedback on with a long hold; then `extra`.
pub(super) fn beside_kubelet_args(
    kubeconfig: &std::path::Path,
    root: &str,
    driver: &str,
    scratch: &std::path::Path,
    extra: &[&str],
) -> Vec<String> {
    let path = |p: &std::path::Path| p.display().to_string();
    let mut args = vec![
        "--pods".to_owned(),
        "kubernetes".to_owned(),
        "--node-name".to_owned(),
        NODE.to_owned(),
        "--kubeconfig".to_owned(),
        path(kubeconfig),
        "--cgroup-root".to_owned(),
        format!("/{root}"),
        "--cgroup-driver".to_owned(),
        driver.to_owned(),
        "--kubelet-root".to_owned(),
        path(&scratch.join("kubelet")),
        "--state-dir".to_owned(),
        path(&scratch.join("state")),
        "--reconcile-period".to_owned(),
        "1s".to_owned(),
        "--feedback".to_owned(),
        "on".to_owned(),
        "--feedback-hold".to_owned(),
        "600s".to_owned(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    args
}

/// The sum of `name`'s series whose labels include every `(key, value)` of `with`; `None`
/// when there is no such series.
fn sum_series(text: &str, name: &str, with: &[(&str, &str)]) -> Option<f64> {
    let matching: Vec<f64> = samples(text, name)
        .into_iter()
        .filter(|(labels, _)| {
            with.iter()
                .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, value)| value)
        .collect();
    (!matching.is_empty()).then(|| matching.iter().sum())
}

/// The sum of a cgroup's `memory.numa_stat` (v2: the anon and file lines' node counts; v1:
/// `total=`), only to tell whether the kernel shows any resident memory there.
fn numa_stat_total(dir: &std::path::Path) -> Result<u64, String> {
    let path = dir.join("memory.numa_stat");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut total = 0u64;
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        match fields.next() {
            Some("anon" | "file") => {
                for field in fields {
                    if let Some((_, v)) = field.split_once('=') {
                        total += v.parse::<u64>().unwrap_or(0);
                    }
                }
            }
            Some(first) if first.starts_with("total=") => {
                total += first
                    .trim_start_matches("total=")
                    .parse::<u64>()
                    .unwrap_or(0);
            }
            _ => {}
        }
    }
    Ok(total)
}
