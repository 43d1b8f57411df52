//! qosd's developer commands: `cargo xtask setup | run | test | vm | bench | fuzz | chaos |
//! soak | deploy-check | image`.
//!
//! xtask owns everything around the Rust build that a newcomer or CI needs: installing the
//! eBPF tool chain and test dependencies into a cache ([`setup`]), starting qosd with its
//! embedded defaults ([`run`]), running every test tier with a summary ([`test`]; the deploy
//! tier's checks of `deploy/` in [`deploy_check`]), fuzzing the parsers ([`fuzz`]), kill storms
//! ([`chaos`]), churn soaks (`node_bench::soak`), booting guest kernels ([`vm`]), and building
//! qosd's container image ([`image`]).

mod bench;
mod chaos;
mod deploy_check;
mod fuzz;
mod image;
mod node_bench;
mod overhead;
mod procfs;
mod run;
mod setup;
mod test;
mod test_image;
mod vm;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "qosd developer commands (see README.md)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what builds and tests need: rust-src for nightly, bpf-linker (built against the
    /// nightly toolchain's LLVM), Debian packages, guest kernels. Idempotent; cached in
    /// $QOSD_CACHE (default ~/.cache/qosd).
    Setup,
    /// Build qosd (release) and run it on this machine with its embedded defaults. Extra
    /// arguments go to `qosd run`.
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run every test tier CI runs: lint, unit, fuzz (a short run of every target), deploy
    /// (manifests, alert rules, image), host (root), VMs (5.10, 6.1, 6.12, and systemd guests).
    Test(test::TestArgs),
    /// Boot one guest kernel with the given files in its initramfs and run a command in it.
    Vm {
        /// Kernel series to boot: 5.10, 6.1 or 6.12.
        #[arg(long, default_value = "6.1")]
        kernel: String,
        /// Host files to copy into the guest's /bin (their shared libraries come along).
        #[arg(long = "file")]
        files: Vec<PathBuf>,
        /// Seconds before the guest is declared hung.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
        /// Boot with systemd as PID 1 (the command runs as a service once the system bus is
        /// up).
        #[arg(long)]
        systemd: bool,
        /// With --systemd: the hybrid cgroup layout (v1 controllers) instead of cgroup v2.
        #[arg(long, requires = "systemd")]
        hybrid: bool,
        /// Shell command line run by the guest's init after the mounts.
        command: String,
    },
    /// Run the criterion benchmarks (`cargo bench -p qosd`) and print their figures against
    /// the targets (topology merge under 10 ms, allocation under 1 ms) and peers; then, as
    /// root, the eBPF programs' cost per event under load against bpftrace (filter
    /// `ebpf_overhead` for that part only) and qosd's node-scale cost at 10, 110 and 250 pods
    /// against prometheus-node-exporter, standalone and beside kubelet (filter `node` for that
    /// part only, about 15 minutes; `node-kubernetes` for the rounds beside kubelet only).
    Bench {
        /// Only benchmarks whose id contains this string.
        filter: Option<String>,
    },
    /// Fuzz every parser of outside input (quantities, manifests, KubeletConfiguration,
    /// checkpoints, API pods, cgroup files, CPU lists, mountinfo, sysfs NUMA, BTF) with
    /// libFuzzer through cargo-fuzz (installed into the cache; nightly): each target from its
    /// seeds in fuzz/corpus for the given time, executions, new inputs and crashes printed per
    /// target. Fails when a target crashes; the crash input is printed.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Only targets whose name contains this string.
        target: Option<String>,
    },
    /// Kill storms (root): qosd SIGKILLed at random instants, --kills times (it stops early once violations pile up), while
    /// pods are admitted, replaced and deleted and the feedback intervenes; after every
    /// restart the node is checked against cgroupfs, the processes and the CPU manager's
    /// checkpoint. Prints the kills and the invariant violations (any fails the run).
    Chaos {
        /// How many SIGKILLs.
        #[arg(long, default_value_t = 100)]
        kills: u32,
        /// Replay the storm of this seed (printed by every run).
        #[arg(long)]
        seed: Option<u64>,
        /// Run it in this guest kernel (5.10, 6.1 or 6.12) instead of on this machine.
        #[arg(long)]
        kernel: Option<String>,
    },
    /// Churn soak (root): the release qosd for N minutes while pods are created and deleted
    /// (10 to 110 and back, 2 per second, about 100 per wave) and /metrics is scraped every
    /// second; prints qosd's RSS, open fds, threads, eBPF map entries, series and cgroups at
    /// the start, middle and end, and fails if any but RSS grew.
    Soak {
        /// Minutes of churn (10 minutes create and delete about 600 pods).
        #[arg(long, default_value_t = 10)]
        minutes: u64,
    },
    /// Check deploy/ as the deploy tier of `cargo xtask test` does: the manifests against
    /// Kubernetes' schemas (kubernetes-validate), the alert rules and their unit tests
    /// (promtool), and the image built and run.
    DeployCheck {
        /// Leave the image build (a release build) out.
        #[arg(long)]
        no_image: bool,
    },
    /// Build the release qosd and its OCI image archive, target/qosd-image.tar (tag
    /// qosd:VERSION, no Docker engine: umoci), then run `qosd --help` and `qosd --version`
    /// inside it with runc. As root; installs umoci and runc.
    Image {
        /// Only verify the existing archive (unpack it, run qosd in it), without building.
        #[arg(long)]
        check: bool,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Setup => setup::all().map(|_| ()),
        Command::Run { args } => run::run(&args),
        Command::Test(args) => test::run(args),
        Command::Vm {
            kernel,
            files,
            timeout,
            systemd,
            hybrid,
            command,
        } => {
            let init = match (systemd, hybrid) {
                (false, _) => vm::GuestInit::Shell,
                (true, false) => vm::GuestInit::Systemd,
                (true, true) => vm::GuestInit::SystemdHybrid,
            };
            boot_one(&kernel, &files, timeout, init, &command)
        }
        Command::Bench { filter } => bench::run(filter.as_deref()),
        Command::Fuzz { seconds, target } => fuzz::run_alone(seconds, target.as_deref()),
        Command::Chaos {
            kills,
            seed,
            kernel,
        } => chaos::run(kills, seed, kernel.as_deref()),
        Command::Soak { minutes } => bench::soak(minutes),
        Command::DeployCheck { no_image } => deploy_check::run_alone(!no_image),
        Command::Image { check } => image::run(check),
    }
}

fn boot_one(
    series: &str,
    files: &[PathBuf],
    timeout: u64,
    init: vm::GuestInit,
    command: &str,
) -> Result<()> {
    let cache = vm::cache_dir()?;
    let kernels = vm::ensure_kernels(&cache)?;
    let Some(kernel) = kernels.iter().find(|k| k.series == series) else {
        anyhow::bail!("no guest kernel for series {series}; known: 5.10, 6.1, 6.12");
    };
    let payload: Vec<(PathBuf, String)> = files
        .iter()
        .map(|f| {
            let name = f
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (f.clone(), format!("/bin/{name}"))
        })
        .collect();
    let run = vm::run_in_guest(
        kernel,
        &payload,
        command,
        Duration::from_secs(timeout),
        &vm::work_dir(),
        init,
    )?;
    print!("{}", run.output);
    println!(
        "guest exit: {:?} after {:.1}s",
        run.exit,
        run.wall.as_secs_f64()
    );
    Ok(())
}

/// The workspace root (xtask lives one level below it). `cargo run` passes xtask's manifest
/// directory at run time; the compile-time one is only the fallback, because a target
/// directory shared between clones (CI's cache) keeps an xtask built in another clone.
pub fn workspace_root() -> PathBuf {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// Cargo's target directory: `$CARGO_TARGET_DIR` when set (CI keeps it in the cache),
/// `<workspace>/target` otherwise.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map_or_else(
            || workspace_root().join("target"),
            |dir| {
                if dir.is_absolute() {
                    dir
                } else {
                    workspace_root().join(dir)
                }
            },
        )
}

/// True when running as root.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}
