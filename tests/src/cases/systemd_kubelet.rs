//! qosd beside kubelet on a systemd host (the systemd guest, systemd 252 as PID 1): kubelet's
//! slices are real systemd units, started over D-Bus as kubelet's systemd driver starts them
//! (here through qosd's own systemd backend, whose properties are pinned to runc's and
//! kubelet's vectors), and each container is a real transient scope started by `systemd-run`
//! and named as runc names containerd's (`cri-containerd-<id>.scope`). No kubelet or
//! containerd runs: the played API server (`fake-kubernetes`) serves the pods with those ids.
//!
//! qosd runs `--pods kubernetes --cgroup-driver systemd` with the feedback on. It checks: the
//! containers' systemd-named cgroups are found and labelled; the BestEffort tier crowding a
//! Burstable spinner on one CPU is capped and made idle through systemd (`systemctl show`
//! says `CPUWeight=idle` and the quota), not reported as kubelet drift, and a
//! `systemctl daemon-reload` keeps it without qosd writing it again; at SIGTERM kubelet's
//! values are back, in the kernel files and in the unit (`CPUWeight=1`, no quota).
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use fake_kubernetes::{FakeKubernetes, pod_object};
use qosd::cgroup::systemd::bus::SystemdBus;
use qosd::cgroup::systemd::{CALL_TIMEOUT, SystemdBackend};
use qosd::cgroup::{
    CgroupLayout, CgroupName, CgroupReader as _, CgroupWriter as _, CgroupfsBackend, Hierarchies,
    NameStyle,
};
use qosd::cm::pod_resources::{PodCgroupPolicy, container_config, pod_config};
use qosd::cm::qos_tiers::{QosTiers, tier_settings};
use qosd::pods::kubernetes::decode::decode_pod;
use qosd::pods::qos::pod_qos;

use super::kubernetes::{NAMESPACE, NODE, beside_kubelet_args};
use super::systemd::{Layout, TierHeld, systemctl, systemd_here};
use crate::agent::{Agent, sample_value, samples};
use crate::harness::{Context, Outcome, fail};
use crate::pod_tree::{TempPaths, wait_for};

const VICTIM_UID: &str = "0f0e0d0c-0000-4000-8000-0000000000e1";
const NOISY_UID: &str = "0f0e0d0c-0000-4000-8000-0000000000e2";
const VICTIM_ID: &str = "e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1";
const NOISY_ID: &str = "e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2";

/// One pod of the case: its API object's fields, its container's runtime id and command.
struct TestPod {
    uid: &'static str,
    name: &'static str,
    requests: &'static [(&'static str, &'static str)],
    id: &'static str,
    command: Vec<String>,
}

/// The scopes' `systemd-run` processes: killed on drop whatever happened (stopping the root
/// slice stops the scopes too).
struct Scopes(Vec<Child>);

impl Drop for Scopes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub(crate) fn interventions_are_unit_properties_beside_kubelet(ctx: &Context) -> Outcome {
    if let Some(reason) = systemd_here() {
        return Outcome::Skip(reason);
    }
    let root = format!("qosd-systest-sdk{}", std::process::id());
    let scratch = std::env::temp_dir().join(format!("{root}-files"));
    let _files = TempPaths(vec![scratch.clone()]);
    let mut scopes = Scopes(Vec::new());
    let outcome = run(ctx, &root, &scratch, &mut scopes);
    super::systemd::stop_root_slice(&format!("{}.slice", root.replace('-', "_")));
    drop(scopes);
    match outcome {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

fn run(
    ctx: &Context,
    root: &str,
    scratch: &std::path::Path,
    scopes: &mut Scopes,
) -> Result<String, String> {
    std::fs::create_dir_all(scratch).map_err(|e| e.to_string())?;
    // kubelet's part: its slices, started through systemd.
    let layout = CgroupLayout::detect().map_err(|e| e.to_string())?;
    let root_name = CgroupName::new([root]).map_err(|e| e.to_string())?;
    let fs = CgroupfsBackend::new(
        Hierarchies::from_layout(&layout).map_err(|e| e.to_string())?,
        root_name.clone(),
        NameStyle::Systemd,
    );
    let bus = SystemdBus::connect(CALL_TIMEOUT).map_err(|e| e.to_string())?;
    let kubelet = SystemdBackend::new(fs.clone(), Arc::new(bus));
    let tiers = QosTiers::new(&root_name).map_err(|e| e.to_string())?;
    let policy = PodCgroupPolicy::default();
    let exe = ctx.self_exe.display().to_string();
    let noisy_script = format!("for i in 1 2 3 4; do {exe} spin 600 & done; wait");
    let pods = [
        TestPod {
            uid: VICTIM_UID,
            name: "victim",
            requests: &[("cpu", "10m")],
            id: VICTIM_ID,
            command: vec![exe, "spin".into(), "600".into()],
        },
        TestPod {
            uid: NOISY_UID,
            name: "noisy",
            requests: &[],
            id: NOISY_ID,
            command: vec!["/bin/sh".into(), "-c".into(), noisy_script],
        },
    ];
    let objects: Vec<_> = pods
        .iter()
        .map(|p| {
            pod_object(
                NAMESPACE,
                p.name,
                p.uid,
                NODE,
                &[(
                    "c",
                    p.requests,
                    &[],
                    Some(&format!("containerd://{}", p.id)),
                )],
            )
        })
        .collect();
    let specs: Vec<qosd::pods::model::Pod> = objects
        .iter()
        .zip(&pods)
        .map(|(object, pod)| decode_pod(object.clone(), pod.name).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let settings = tier_settings(specs.iter().map(|p| (pod_qos(&p.spec), &p.spec)), false);
    for (tier, config) in [
        (&tiers.kubepods, Default::default()),
        (&tiers.burstable, settings.burstable),
        (&tiers.besteffort, settings.besteffort),
    ] {
        kubelet.create(tier, &config).map_err(|e| e.to_string())?;
    }
    let mut pids = Vec::new();
    for (spec, TestPod { id, command, .. }) in specs.iter().zip(&pods) {
        let pod_cgroup = tiers
            .pod_cgroup(pod_qos(&spec.spec), &spec.metadata.uid)
            .map_err(|e| e.to_string())?;
        kubelet
            .create(&pod_cgroup, &pod_config(&spec.spec, policy))
            .map_err(|e| e.to_string())?;
        // containerd's part, as runc's systemd driver names it.
        let slice = unit_of(&kubelet.name(&pod_cgroup).map_err(|e| e.to_string())?);
        let child = Command::new("systemd-run")
            // As runc starts containerd's scopes: with the accounting of the controllers
            // it sets, so systemd makes the scope in those hierarchies on v1 too.
            .args([
                "--scope",
                "--quiet",
                "--collect",
                "-p",
                "CPUAccounting=yes",
                "-p",
                "MemoryAccounting=yes",
            ])
            .arg(format!("--unit=cri-containerd-{id}"))
            .arg(format!("--slice={slice}"))
            .args(command)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("systemd-run: {e}"))?;
        scopes.0.push(child);
        let scope = pod_cgroup
            .child(&format!("cri-containerd-{id}.scope"))
            .map_err(|e| e.to_string())?;
        let found = wait_for(
            &format!("cri-containerd-{id}.scope with its processes"),
            Duration::from_secs(30),
            || match kubelet.pids(&scope) {
                Ok(p) if !p.is_empty() => Ok(p),
                Ok(_) => Err("no process yet".to_owned()),
                Err(e) => Err(e.to_string()),
            },
        )?;
        // runc then makes the scope's cgroup in every v1 hierarchy systemd left out and joins
        // it, and has systemd hold the container's values.
        let config = container_config(&spec.spec.containers[0], policy);
        if !Layout::here().v2 {
            fs.create(&scope, &config).map_err(|e| e.to_string())?;
            for pid in &found {
                fs.attach(&scope, *pid).map_err(|e| e.to_string())?;
            }
        }
        kubelet.update(&scope, &config).map_err(|e| e.to_string())?;
        pids.extend(found);
    }
    let fake = FakeKubernetes::start().map_err(|e| e.to_string())?;
    for object in objects {
        fake.upsert(object);
    }

    // qosd beside them.
    let kubeconfig = scratch.join("kubeconfig");
    std::fs::write(&kubeconfig, fake.kubeconfig()).map_err(|e| e.to_string())?;
    let mut agent = Agent::start_with(
        &ctx.qosd,
        &beside_kubelet_args(
            &kubeconfig,
            root,
            "systemd",
            scratch,
            &["--feedback-period", "1s"],
        ),
        Duration::from_secs(60),
    )?;
    let with_log = |e: String| format!("{e}\n--- qosd log ---\n{}", agent.log_tail());

    // The noisy shell may still be starting its spinners: pin what is there once all are.
    let noisy_scope = tiers
        .pod_cgroup(pod_qos(&specs[1].spec), NOISY_UID)
        .and_then(|p| p.child(&format!("cri-containerd-{NOISY_ID}.scope")))
        .map_err(|e| e.to_string())?;
    let noisy = wait_for("the five noisy processes", Duration::from_secs(30), || {
        let p = kubelet.pids(&noisy_scope).map_err(|e| e.to_string())?;
        if p.len() >= 5 {
            Ok(p)
        } else {
            Err(format!("{} of 5", p.len()))
        }
    })?;
    let cpu = crate::workload::last_allowed_cpu()?;
    for pid in noisy.into_iter().chain(pids) {
        crate::workload::pin(pid, cpu)?;
    }

    // 1. kubelet's systemd-named cgroups found and labelled.
    wait_for(
        "the victim's CPU time, labelled",
        Duration::from_secs(30),
        || {
            let text = agent.scrape()?;
            samples(&text, "qosd_cgroup_cpu_seconds_total")
                .into_iter()
                .find(|(labels, _)| {
                    [
                        ("pod", "victim"),
                        ("container", "c"),
                        ("qos_class", "burstable"),
                    ]
                    .iter()
                    .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
                })
                .map(|_| ())
                .ok_or_else(|| "not yet".to_owned())
        },
    )
    .map_err(with_log)?;

    // 2. The BestEffort tier capped and idle, held by systemd.
    let layout = Layout::here();
    let tier_path = kubelet.name(&tiers.besteffort).map_err(|e| e.to_string())?;
    let tier_unit = unit_of(&tier_path);
    let tier_dir = PathBuf::from(tier_path.trim_start_matches('/'));
    let held = || TierHeld::read(layout, &tier_dir, &tier_unit);
    let before = wait_for(
        "the tier idle and capped, in its files and its unit",
        Duration::from_secs(90),
        || {
            let held = held()?;
            if held.capped_and_idle(layout) {
                Ok(held)
            } else {
                Err(held.to_string())
            }
        },
    )
    .map_err(with_log)?;
    let reverted = |text: &str| -> f64 {
        samples(text, "qosd_feedback_reverted_total")
            .into_iter()
            .fold(0.0, |sum, (_, v)| sum + v)
    };
    let reverted_before = reverted(&agent.scrape()?);
    systemctl(&["daemon-reload"])?;
    std::thread::sleep(Duration::from_secs(2));
    let after = held()?;
    let text = agent.scrape()?;
    let reverted_after = reverted(&text);
    if after != before || reverted_after != reverted_before {
        return Err(with_log(format!(
            "after systemctl daemon-reload: {after}, before {before}; qosd_feedback_reverted_total {reverted_before} -> {reverted_after}"
        )));
    }
    let tier_drift: Vec<_> = samples(&text, "qosd_kubelet_drift")
        .into_iter()
        .filter(|(labels, v)| *v > 0.0 && labels.iter().any(|(k, v)| k == "level" && v == "tier"))
        .collect();
    if !tier_drift.is_empty() {
        return Err(with_log(format!(
            "the intervention reported as kubelet drift: {tier_drift:?}"
        )));
    }
    let pods_seen = sample_value(&text, "qosd_pods", "qos_class=\"besteffort\"").unwrap_or(0.0);

    // 3. SIGTERM: kubelet's values back, in the files and in the unit (its 2 shares, weight 1
    // on v2; the kernel had reset the weight when the group stopped being idle).
    let (status, _) = agent.stop(libc::SIGTERM, Duration::from_secs(20))?;
    if !status.success() {
        return Err(format!(
            "qosd exited with {status} on SIGTERM\n{}",
            agent.log_tail()
        ));
    }
    let restored = held()?;
    let (weight_file, weight_property) = layout.weight();
    let kubelets_weight = if layout.v2 { "1" } else { "2" };
    let weight_path = layout.dir("cpu", &tier_dir).join(weight_file);
    let weight = std::fs::read_to_string(&weight_path)
        .map(|w| w.trim().to_owned())
        .map_err(|e| format!("{}: {e}", weight_path.display()))?;
    if restored.idle != "0"
        || !layout.unlimited(&restored.quota)
        || restored.weight_property != kubelets_weight
        || restored.quota_per_sec != "infinity"
        || weight != kubelets_weight
    {
        return Err(format!(
            "after SIGTERM: {restored}, {weight_file} {weight}; want kubelet's cpu.idle 0, no quota, {weight_property}={kubelets_weight}, infinity, {weight_file} {kubelets_weight}\n{}",
            agent.log_tail()
        ));
    }
    Ok(format!(
        "{}; {pods_seen} BestEffort pod(s) and the victim labelled from systemd-named cgroups; \
         {tier_unit}: {before}, no tier drift; the same after daemon-reload with \
         qosd_feedback_reverted_total unchanged ({reverted_after}); after SIGTERM kubelet's \
         values: {restored}, {weight_file} {weight}",
        layout.name()
    ))
}

/// The unit of a cgroup path in systemd spelling: its last component.
fn unit_of(path: &str) -> String {
    path.rsplit('/').next().unwrap_or_default().to_owned()
}
