//! `cargo xtask run`: build qosd in release mode and run it in the foreground on the example
//! pods (`examples/pods/`: one Guaranteed, one Burstable, one BestEffort) under the cgroup root
//! `/qosd`, with `examples/kubelet-config.yaml` (static CPU manager, Static memory manager,
//! single-numa-node) and its checkpoints in `target/qosd-state`; Ctrl-C (SIGINT) stops the
//! containers and removes their cgroups.
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::setup;

/// Builds and runs `qosd run ARGS`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let toolchain = setup::build_tools()?;
    setup::run(
        Command::new("cargo")
            .args(["build", "--release", "-p", "qosd"])
            .env("PATH", toolchain.path_env())
            .current_dir(crate::workspace_root()),
    )?;
    if !crate::is_root() {
        bail!("qosd loads eBPF programs and manages cgroups: run `cargo xtask run` as root");
    }
    let binary = crate::target_dir().join("release/qosd");
    println!(
        "starting {} run {} (metrics on http://127.0.0.1:9464/metrics by default; Ctrl-C stops)",
        binary.display(),
        args.join(" ")
    );
    let root = crate::workspace_root();
    let status = Command::new(&binary)
        .arg("run")
        .arg("--manifest-dir")
        .arg(root.join("examples/pods"))
        .args(["--cgroup-root", "/qosd"])
        .arg("--kubelet-config")
        .arg(root.join("examples/kubelet-config.yaml"))
        .arg("--state-dir")
        .arg(crate::target_dir().join("qosd-state"))
        .arg("--container-log-dir")
        .arg(crate::target_dir().join("qosd-container-logs"))
        .args(args)
        .status()
        .with_context(|| format!("starting {}", binary.display()))?;
    if !status.success() {
        bail!("qosd exited with {status}");
    }
    Ok(())
}
