//! `cargo xtask setup`: everything the build and the tests need, installed idempotently into a
//! cache that survives across runs (`$QOSD_CACHE`, default `~/.cache/qosd`):
//! rust-src for the nightly toolchain, bpf-linker built against that toolchain's own LLVM, the
//! Debian packages the tests and the image build use, and the guest kernels. A second run
//! takes seconds.
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::vm;

/// Debian packages the build needs (`cargo xtask run` installs these too).
const BUILD_PACKAGES: &[(&str, &str)] = &[
    ("libhwloc-dev", "hwlocality links against hwloc"),
    ("pkg-config", "hwlocality finds hwloc with it"),
    ("libudev-dev", "hwloc.pc lists -ludev for the link"),
    (
        "protobuf-compiler",
        "protoc builds the CRI client (k8s-cri) the Kubernetes system case talks to containerd with",
    ),
];

/// Debian packages the test tiers need on top of the build's.
const TEST_PACKAGES: &[(&str, &str)] = &[
    ("qemu-system-x86", "boots the guest kernels"),
    (
        "busybox-static",
        "the guests' userland, and the test image containerd runs",
    ),
    (
        "containerd",
        "the Kubernetes case runs its pods with a real containerd (CRI) and imports the test image with ctr (host and guests)",
    ),
    ("cpio", "packs the guests' initramfs"),
    ("binutils", "strips binaries for the initramfs"),
    ("curl", "the README's metrics example"),
    (
        "numactl",
        "places the cross-NUMA test workloads (host and guests)",
    ),
    (
        "strace",
        "inspect_only_reads traces qosd's system calls while /inspect is asked (host and guests)",
    ),
    (
        "prometheus",
        "the host systest runs every dashboard query through a real Prometheus (/usr/bin/prometheus, started by the test on a free port)",
    ),
];

/// Debian packages the deploy tier needs to check `deploy/` (promtool comes with prometheus).
const DEPLOY_PACKAGES: &[(&str, &str)] = &[
    (
        "prometheus",
        "promtool checks the alert rules and runs their unit tests",
    ),
    (
        "python3-venv",
        "the private virtualenv kubernetes-validate (Kubernetes' schemas) is installed into",
    ),
];

/// Debian packages `cargo xtask image` needs: an OCI image built and run without a Docker engine.
const IMAGE_PACKAGES: &[(&str, &str)] = &[
    (
        "umoci",
        "builds qosd's OCI image (layout, layer, configuration) without a Docker engine",
    ),
    (
        "runc",
        "runs `qosd --help` and `qosd --version` inside the built image to verify it",
    ),
];

/// Debian packages `cargo xtask bench` needs for the eBPF overhead figures.
const BENCH_PACKAGES: &[(&str, &str)] = &[
    ("bpftool", "names the kernel programs in the overhead table"),
    (
        "bpftrace",
        "the peer the overhead of qosd's programs is measured against",
    ),
    (
        "stress-ng",
        "the context-switch-heavy load of the overhead benchmark",
    ),
    (
        "prometheus-node-exporter",
        "the node benchmark's peer for idle CPU and scrape cost",
    ),
    (
        "strace",
        "counts qosd's syscalls by kind in the node benchmark",
    ),
];

/// What later steps need from setup.
pub(crate) struct Toolchain {
    /// Directory holding `bpf-linker`, to put first on PATH for builds.
    pub bpf_linker_dir: PathBuf,
    /// Cache root.
    pub cache: PathBuf,
}

impl Toolchain {
    /// PATH with bpf-linker first.
    pub(crate) fn path_env(&self) -> std::ffi::OsString {
        let mut paths = vec![self.bpf_linker_dir.clone()];
        if let Some(existing) = std::env::var_os("PATH") {
            paths.extend(std::env::split_paths(&existing));
        }
        std::env::join_paths(paths).unwrap_or_default()
    }
}

/// Installs what the build needs (rust-src, bpf-linker).
pub(crate) fn build_tools() -> Result<Toolchain> {
    let cache = vm::cache_dir()?;
    ensure_packages(BUILD_PACKAGES)?;
    ensure_rust_src()?;
    let bpf_linker_dir = ensure_bpf_linker(&cache)?;
    Ok(Toolchain {
        bpf_linker_dir,
        cache,
    })
}

/// Installs what `cargo xtask bench` needs: build tools and the overhead benchmark's peers.
pub(crate) fn bench_tools() -> Result<Toolchain> {
    let toolchain = build_tools()?;
    ensure_packages(BENCH_PACKAGES)?;
    Ok(toolchain)
}

/// Installs what the deploy tier's manifest and rule checks need (Debian packages only; the
/// deploy check installs kubernetes-validate from PyPI itself, where a failure is a skip).
pub(crate) fn deploy_tools() -> Result<()> {
    ensure_packages(DEPLOY_PACKAGES)
}

/// Installs what `cargo xtask image` needs: build tools, umoci and runc.
pub(crate) fn image_tools() -> Result<Toolchain> {
    let toolchain = build_tools()?;
    ensure_packages(IMAGE_PACKAGES)?;
    Ok(toolchain)
}

/// Installs everything: build tools, Debian packages, guest kernels.
pub(crate) fn all() -> Result<Toolchain> {
    let toolchain = build_tools()?;
    ensure_packages(TEST_PACKAGES)?;
    ensure_packages(DEPLOY_PACKAGES)?;
    ensure_packages(IMAGE_PACKAGES)?;
    let kernels = vm::ensure_kernels(&toolchain.cache)?;
    for k in &kernels {
        println!(
            "setup: guest kernel {} ({}) at {}",
            k.series,
            k.release,
            k.vmlinuz.display()
        );
    }
    Ok(toolchain)
}

fn ensure_rust_src() -> Result<()> {
    let installed = output("rustup", &["component", "list", "--installed", "--toolchain", "nightly"])
        .context("the nightly toolchain is needed to build the eBPF object; install it with `rustup toolchain install nightly`")?;
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        return Ok(());
    }
    println!("setup: adding rust-src to the nightly toolchain");
    run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
        .context("installing rust-src for nightly (needed for -Z build-std=core)")
}

/// bpf-linker has no prebuilt binary here and no matching LLVM package, so it is built against
/// the nightly toolchain's own libLLVM. A stamp records which libLLVM it was built against.
fn ensure_bpf_linker(cache: &Path) -> Result<PathBuf> {
    let sysroot = output("rustc", &["+nightly", "--print", "sysroot"])?;
    let lib_dir = Path::new(sysroot.trim()).join("lib");
    let libllvm = std::fs::read_dir(&lib_dir)
        .with_context(|| format!("reading {}", lib_dir.display()))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("libLLVM.so.") && n.contains("-rust-"))
        .with_context(|| format!("no libLLVM.so.*-rust-* in {}", lib_dir.display()))?;
    let major = libllvm
        .trim_start_matches("libLLVM.so.")
        .split('.')
        .next()
        .unwrap_or_default()
        .to_owned();
    let root = cache.join("bpf-linker");
    let bin_dir = root.join("bin");
    let stamp = root.join("built-against");
    let binary = bin_dir.join("bpf-linker");
    if binary.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == libllvm) {
        return Ok(bin_dir);
    }
    println!("setup: building bpf-linker against {libllvm} (about 3 minutes, once)");
    let prefix = cache.join("llvm");
    let prefix_lib = prefix.join("lib");
    std::fs::create_dir_all(&prefix_lib)
        .with_context(|| format!("creating {}", prefix_lib.display()))?;
    for link in ["libLLVM.so".to_owned(), libllvm.clone()] {
        let path = prefix_lib.join(&link);
        let _ = std::fs::remove_file(&path);
        std::os::unix::fs::symlink(lib_dir.join(&libllvm), &path)
            .with_context(|| format!("linking {}", path.display()))?;
    }
    run(Command::new("cargo")
        .args([
            "+nightly",
            "install",
            "bpf-linker",
            "--locked",
            "--force",
            "--no-default-features",
            "--features",
        ])
        .arg(format!("llvm-{major}"))
        .arg("--root")
        .arg(&root)
        .env("LLVM_PREFIX", &prefix))
    .context("building bpf-linker; it needs crates.io and the nightly toolchain")?;
    std::fs::write(&stamp, &libllvm).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(bin_dir)
}

fn ensure_packages(packages: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| {
            output("dpkg-query", &["-W", "-f=${Status}", name])
                .map_or(true, |s| !s.contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !crate::is_root() {
        bail!(
            "missing Debian packages {missing:?}; install them with `sudo apt-get install {}`",
            missing.join(" ")
        );
    }
    println!("setup: installing {missing:?}");
    run(Command::new("apt-get").arg("update").arg("-q")).context("apt-get update")?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
    .with_context(|| format!("installing {missing:?}"))
}

/// Runs a command, failing on a non-zero exit.
pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Runs a command and returns its stdout.
pub(crate) fn output(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("starting {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
