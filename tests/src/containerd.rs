//! A real containerd for the Kubernetes cases: started on its own socket, root and state
//! directories (never a system instance), with its CRI plugin on the cgroupfs driver
//! (`SystemdCgroup = false`), the `native` snapshotter and no CNI (pod sandboxes use the host
//! network, as kubelet does for hostNetwork pods). The test image (busybox-static, built by
//! `cargo xtask` with umoci and given in `QOSD_TEST_IMAGE`) is imported with containerd's own
//! `ctr`. Pods are run through the CRI API the way kubelet runs them: a sandbox with the pod
//! cgroup as its cgroup parent, then containers with the resources kubelet asks for.
//!
//! On drop every sandbox is stopped and removed, containerd is stopped, and any shim it left is
//! killed, so no container outlives the case.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, CreateContainerRequest, ImageSpec, LinuxContainerConfig,
    LinuxContainerResources, LinuxPodSandboxConfig, LinuxSandboxSecurityContext,
    ListPodSandboxRequest, NamespaceMode, NamespaceOption, PodSandboxConfig, PodSandboxMetadata,
    RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest, StopPodSandboxRequest,
    VersionRequest,
};
use tonic::transport::{Channel, Endpoint, Uri};

/// The image every test container runs: the archive's one image, tagged `1`, imported under
/// this name.
pub(crate) const IMAGE: &str = "qosd.test/busybox:1";
/// [`IMAGE`] without its tag (`ctr import --base-name`).
const IMAGE_NAME: &str = "qosd.test/busybox";

/// The environment variable naming the test image archive (an OCI layout tar).
pub(crate) const IMAGE_ENV: &str = "QOSD_TEST_IMAGE";

/// A running private containerd.
pub(crate) struct Containerd {
    dir: PathBuf,
    child: Option<Child>,
    runtime: tokio::runtime::Runtime,
    client: RuntimeServiceClient<Channel>,
    sandboxes: Vec<String>,
}

/// A pod as kubelet would ask containerd for it.
pub(crate) struct PodSpec<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    /// The pod cgroup (cgroupfs spelling), which kubelet made.
    pub cgroup_parent: &'a str,
}

/// One container: name, `sh -c` script, and the resources kubelet derives from its spec.
pub(crate) struct ContainerSpec<'a> {
    pub name: &'a str,
    pub script: &'a str,
    pub cpu_shares: i64,
    pub cpu_quota: i64,
    pub cpu_period: i64,
    pub memory_limit: i64,
}

/// Why containerd cannot be used here (reported as a skip).
pub(crate) fn unavailable() -> Option<String> {
    for (binary, package) in [
        ("containerd", "containerd"),
        ("ctr", "containerd"),
        ("runc", "runc"),
        ("containerd-shim-runc-v2", "containerd"),
    ] {
        if which(binary).is_none() {
            return Some(format!("{binary} not found (Debian package {package})"));
        }
    }
    match std::env::var_os(IMAGE_ENV) {
        Some(path) if Path::new(&path).is_file() => None,
        Some(path) => Some(format!(
            "{IMAGE_ENV}={} is not a file",
            Path::new(&path).display()
        )),
        None => Some(format!(
            "{IMAGE_ENV} is not set (cargo xtask test builds the busybox test image and sets it)"
        )),
    }
}

fn which(binary: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(binary))
            .find(|p| p.is_file())
    })
}

impl Containerd {
    /// Starts containerd in a fresh directory and imports the test image.
    pub(crate) fn start() -> Result<Self, String> {
        let dir =
            std::env::temp_dir().join(format!("qosd-systest-containerd-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["root", "state", "opt", "cni", "logs"] {
            std::fs::create_dir_all(dir.join(sub))
                .map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let socket = dir.join("containerd.sock");
        let config = dir.join("config.toml");
        std::fs::write(&config, config_toml(&dir))
            .map_err(|e| format!("{}: {e}", config.display()))?;
        let log = std::fs::File::create(dir.join("containerd.log")).map_err(|e| e.to_string())?;
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting containerd: {e}"))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = loop {
            if socket.exists() {
                let path = socket.clone();
                let connected = runtime.block_on(async move {
                    let channel = Endpoint::try_from("http://[::]:50051")
                        .map_err(|e| e.to_string())?
                        .connect_with_connector(tower::service_fn(move |_: Uri| {
                            let path = path.clone();
                            async move {
                                Ok::<_, std::io::Error>(TokioIo::new(
                                    tokio::net::UnixStream::connect(path).await?,
                                ))
                            }
                        }))
                        .await
                        .map_err(|e| e.to_string())?;
                    let mut client = RuntimeServiceClient::new(channel);
                    client
                        .version(VersionRequest::default())
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok::<_, String>(client)
                });
                if let Ok(client) = connected {
                    break client;
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "containerd's CRI did not answer within 30 s; its log: {}",
                    dir.join("containerd.log").display()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let mut containerd = Self {
            dir,
            child: Some(child),
            runtime,
            client,
            sandboxes: Vec::new(),
        };
        containerd.import_image()?;
        Ok(containerd)
    }

    fn import_image(&mut self) -> Result<(), String> {
        let archive = std::env::var_os(IMAGE_ENV).ok_or("no test image")?;
        let out = Command::new("ctr")
            .arg("--address")
            .arg(self.dir.join("containerd.sock"))
            .args([
                "-n",
                "k8s.io",
                "images",
                "import",
                "--base-name",
                IMAGE_NAME,
            ])
            .arg(&archive)
            .output()
            .map_err(|e| format!("ctr: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "ctr images import: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    }

    /// Runs a pod sandbox and its containers as kubelet would; returns the container ids in
    /// order.
    pub(crate) fn run_pod(
        &mut self,
        pod: &PodSpec<'_>,
        containers: &[ContainerSpec<'_>],
    ) -> Result<Vec<String>, String> {
        let sandbox_config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: pod.name.to_owned(),
                uid: pod.uid.to_owned(),
                namespace: pod.namespace.to_owned(),
                attempt: 0,
            }),
            // Host network: the node's name (kubelet leaves it empty for hostNetwork pods).
            hostname: String::new(),
            log_directory: self.dir.join("logs").join(pod.uid).display().to_string(),
            labels: [
                ("io.kubernetes.pod.name", pod.name),
                ("io.kubernetes.pod.namespace", pod.namespace),
                ("io.kubernetes.pod.uid", pod.uid),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: pod.cgroup_parent.to_owned(),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: NamespaceMode::Node as i32,
                        pid: NamespaceMode::Pod as i32,
                        ipc: NamespaceMode::Pod as i32,
                        ..NamespaceOption::default()
                    }),
                    ..LinuxSandboxSecurityContext::default()
                }),
                ..LinuxPodSandboxConfig::default()
            }),
            ..PodSandboxConfig::default()
        };
        let client = &mut self.client;
        let sandbox = self
            .runtime
            .block_on(client.run_pod_sandbox(RunPodSandboxRequest {
                config: Some(sandbox_config.clone()),
                runtime_handler: String::new(),
            }))
            .map_err(|e| format!("RunPodSandbox {}: {e}", pod.name))?
            .into_inner()
            .pod_sandbox_id;
        self.sandboxes.push(sandbox.clone());
        let mut ids = Vec::new();
        for container in containers {
            let config = ContainerConfig {
                metadata: Some(ContainerMetadata {
                    name: container.name.to_owned(),
                    attempt: 0,
                }),
                image: Some(ImageSpec {
                    image: IMAGE.to_owned(),
                    ..ImageSpec::default()
                }),
                command: vec!["/bin/sh".into(), "-c".into(), container.script.to_owned()],
                log_path: format!("{}.log", container.name),
                linux: Some(LinuxContainerConfig {
                    resources: Some(LinuxContainerResources {
                        cpu_period: container.cpu_period,
                        cpu_quota: container.cpu_quota,
                        cpu_shares: container.cpu_shares,
                        memory_limit_in_bytes: container.memory_limit,
                        ..LinuxContainerResources::default()
                    }),
                    ..LinuxContainerConfig::default()
                }),
                ..ContainerConfig::default()
            };
            let client = &mut self.client;
            let id = self
                .runtime
                .block_on(client.create_container(CreateContainerRequest {
                    pod_sandbox_id: sandbox.clone(),
                    config: Some(config),
                    sandbox_config: Some(sandbox_config.clone()),
                }))
                .map_err(|e| format!("CreateContainer {}/{}: {e}", pod.name, container.name))?
                .into_inner()
                .container_id;
            let client = &mut self.client;
            self.runtime
                .block_on(client.start_container(StartContainerRequest {
                    container_id: id.clone(),
                }))
                .map_err(|e| format!("StartContainer {}/{}: {e}", pod.name, container.name))?;
            ids.push(id);
        }
        Ok(ids)
    }

    /// The last lines of containerd's log, for failure messages.
    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    fn stop_all(&mut self) {
        let client = &mut self.client;
        let listed = self
            .runtime
            .block_on(client.list_pod_sandbox(ListPodSandboxRequest::default()))
            .map(|r| {
                r.into_inner()
                    .items
                    .into_iter()
                    .map(|s| s.id)
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        for id in self.sandboxes.drain(..).chain(listed) {
            let client = &mut self.client;
            let _ = self
                .runtime
                .block_on(client.stop_pod_sandbox(StopPodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                }));
            let client = &mut self.client;
            let _ = self.runtime.block_on(
                client.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id }),
            );
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.stop_all();
        if let Some(mut child) = self.child.take() {
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: kill(2) on our own child, not yet reaped.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        kill_shims(&self.dir);
        // The native snapshotter's copies and containerd's state.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Kills the shims (and through them their containers) started for this containerd: they
/// name its address on their command line.
fn kill_shims(dir: &Path) {
    let address = dir.join("containerd.sock").display().to_string();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in procs.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.contains("containerd-shim") && cmdline.contains(&address) {
            // SAFETY: kill(2) on a shim this test's containerd started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Whether `/` is an initramfs (the guests'): pivot_root(2) refuses to move a ramfs root away,
/// so runc must be told to switch roots without it (containerd's `NoPivotRoot`, which makes
/// runc move the rootfs over `/` and chroot into it). Real nodes boot from a disk.
fn root_is_initramfs() -> bool {
    // The last mount on `/` in /proc/self/mounts is the one processes see.
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let root_type = mounts
        .lines()
        .rev()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_source, target, fs_type) = (fields.next()?, fields.next()?, fields.next()?);
            (target == "/").then_some(fs_type)
        })
        .next();
    matches!(root_type, Some("rootfs" | "ramfs" | "tmpfs"))
}

fn config_toml(dir: &Path) -> String {
    let d = dir.display();
    let no_pivot_root = root_is_initramfs();
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[debug]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{IMAGE}"
  # Never below containerd's own OOM score: lowering it needs CAP_SYS_RESOURCE, which the
  # development machine withholds (runc then fails with "failed to update
  # /proc/self/oom_score_adj"); as kind and rootless setups do.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        NoPivotRoot = {no_pivot_root}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/cni-bin"
    conf_dir = "{d}/cni"
"#
    )
}
