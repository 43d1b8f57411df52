//! The `qosd` command line.
use qosd::config::kubelet::DurationError;
use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use tracing_subscriber::EnvFilter;

/// qosd: a Linux node agent that manages pod cgroups the way kubelet does and measures them
/// with eBPF (CPU time, throttling, run-queue latency, NUMA locality), exported to Prometheus.
///
/// qosd needs root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN) to load its kernel programs.
/// Log verbosity follows RUST_LOG (default: info).
#[derive(Parser)]
#[command(version, about, long_about)]
struct Cli {
    /// Log format: human-readable text or one JSON object per line.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true, env = "QOSD_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum InspectFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum FeedbackMode {
    On,
    DryRun,
    Off,
}

impl From<FeedbackMode> for qosd::feedback::Mode {
    fn from(mode: FeedbackMode) -> Self {
        match mode {
            FeedbackMode::On => Self::On,
            FeedbackMode::DryRun => Self::DryRun,
            FeedbackMode::Off => Self::Off,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum CpuTimeMode {
    Auto,
    TpBtf,
    RawTracepoint,
}

impl From<CpuTimeMode> for qosd::probes::sched_switch::ModePreference {
    fn from(mode: CpuTimeMode) -> Self {
        match mode {
            CpuTimeMode::Auto => Self::Auto,
            CpuTimeMode::TpBtf => Self::TpBtf,
            CpuTimeMode::RawTracepoint => Self::RawTracepoint,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent: attach the probes and serve metrics until SIGTERM or SIGINT.
    Run {
        /// Where to serve /metrics, /healthz and /inspect.
        #[arg(long, default_value = "127.0.0.1:9464", env = "QOSD_METRICS_ADDR")]
        metrics_addr: SocketAddr,
        /// Pod manifests (YAML or JSON, several per file) to run, watched for changes. When the
        /// default directory does not exist qosd runs without a container manager.
        #[arg(long, env = "QOSD_MANIFEST_DIR")]
        manifest_dir: Option<PathBuf>,
        /// A kubelet.config.k8s.io/v1beta1 KubeletConfiguration file (reserved resources,
        /// eviction thresholds, enforceNodeAllocatable, cgroupRoot, cgroupDriver, ...).
        #[arg(long, env = "QOSD_KUBELET_CONFIG")]
        kubelet_config: Option<PathBuf>,
        /// The cgroup under which kubepods lives (overrides cgroupRoot).
        #[arg(long)]
        cgroup_root: Option<String>,
        /// How often cgroupfs is compared with the desired state and corrected (e.g. 10s, 1m).
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        reconcile_period: Duration,
        /// Attach mode of the scheduler probes: auto (tp_btf, else raw_tracepoint), tp_btf or
        /// raw_tracepoint, for the sched_switch handler (cpu_time and runqlat). raw_tracepoint
        /// also puts the task-migration probe on a raw tracepoint (to test or work around a
        /// kernel's tp_btf).
        #[arg(long, value_enum, default_value_t = CpuTimeMode::Auto)]
        cpu_time_mode: CpuTimeMode,
        /// Where container stdout/stderr go, one file per container.
        #[arg(long, default_value = "/var/log/qosd/containers")]
        container_log_dir: PathBuf,
        /// Where the CPU and memory managers keep their checkpoints (cpu_manager_state,
        /// memory_manager_state, in kubelet's format). A kubelet root directory
        /// (/var/lib/kubelet) lets qosd take over kubelet's assignments.
        #[arg(long, default_value = "/var/lib/qosd", env = "QOSD_STATE_DIR")]
        state_dir: PathBuf,
        /// What the measurements may change (standalone mode): `on` lets the feedback policies
        /// write (the BestEffort tier capped, and made idle, while it crowds out the other
        /// classes; a CFS burst for throttled Burstable containers; memory moved to the NUMA
        /// node of a container's CPUs), `dry-run` makes and logs the same decisions without
        /// writing, `off` disables them. Decisions are logged, listed by `qosd inspect` and counted in
        /// qosd_feedback_decisions_total.
        #[arg(long, value_enum, default_value_t = FeedbackMode::On, env = "QOSD_FEEDBACK")]
        feedback: FeedbackMode,
        /// How often the feedback takes its measurements (the window it judges, e.g. 500ms,
        /// 5s). A policy acts once its condition has held for 1 s and two windows at least, so
        /// 500ms decides 1 to 1.5 s after a condition begins.
        #[arg(long, default_value = "500ms", value_parser = parse_duration)]
        feedback_period: Duration,
        /// How long an intervention stays at least before it may be lifted (doubled while the
        /// trouble comes back soon after each lift).
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        feedback_hold: Duration,
    },
    /// Print what the running agent manages, as tables (pods, containers and their cgroups,
    /// limits in effect, process counts; beside kubelet also kubelet's values missing from
    /// cgroupfs and cgroups no pod owns; the feedback's decisions), fetched from its /inspect
    /// endpoint.
    Inspect {
        /// The running agent's metrics address.
        #[arg(long, default_value = "127.0.0.1:9464", env = "QOSD_METRICS_ADDR")]
        addr: SocketAddr,
        /// `text`: tables, read the way `kubectl get` output is; `json`: the same state as one
        /// JSON document, for scripts.
        #[arg(short = 'o', long = "output", value_enum, default_value_t = InspectFormat::Text)]
        output: InspectFormat,
    },
    /// Report the cgroup layout, kernel version, BTF, attach types and the mode each probe
    /// will use. Loads and attaches each probe once to find out, so run it as root.
    Check,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `check` prints a report on stdout; keep its log to warnings unless RUST_LOG says otherwise.
    let default_level = if matches!(cli.command, Command::Check) {
        "warn"
    } else {
        "info"
    };
    init_logging(cli.log_format, default_level);
    match cli.command {
        Command::Inspect { addr, output } => match qosd::inspect::fetch(addr) {
            Ok(report) => {
                match output {
                    InspectFormat::Text => print!("{}", report.to_text()),
                    InspectFormat::Json => println!(
                        "{}",
                        serde_json::to_string_pretty(&report.data).unwrap_or_default()
                    ),
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("qosd inspect: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Check => {
            print!("{}", qosd::check::report());
            ExitCode::SUCCESS
        }
        Command::Run {
            metrics_addr,
            manifest_dir,
            kubelet_config,
            cgroup_root,
            reconcile_period,
            cpu_time_mode,
            container_log_dir,
            state_dir,
            feedback,
            feedback_period,
            feedback_hold,
        } => {
            let manifest_dir = manifest_dir.or_else(|| {
                let default = PathBuf::from(DEFAULT_MANIFEST_DIR);
                default.is_dir().then_some(default)
            });
            let standalone = manifest_dir.map(|manifest_dir| qosd::standalone::StandaloneOptions {
                manifest_dir,
                kubelet_config,
                cgroup_root,
                reconcile_period,
                log_dir: Some(container_log_dir),
                state_dir,
                feedback: qosd::feedback::FeedbackConfig::with_defaults(
                    feedback.into(),
                    feedback_period,
                    feedback_hold,
                ),
            });
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    tracing::error!(error = %e, "starting the async runtime");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(qosd::daemon::run(qosd::daemon::RunOptions {
                metrics_addr,
                standalone,
                cpu_time_mode: cpu_time_mode.into(),
            })) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "qosd stopped");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// The embedded default pod source.
const DEFAULT_MANIFEST_DIR: &str = "/etc/qosd/manifests";

/// Parses Go-style durations (`500ms`, `10s`, `1m30s`) as kubelet does.
fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    match qosd::config::kubelet::parse_go_duration(text)? {
        d if d.is_zero() => Err(DurationError::NotPositive(text.to_owned())),
        d => Ok(d),
    }
}

fn init_logging(format: LogFormat, default_level: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
