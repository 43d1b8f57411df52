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
    /// Run the agent: attach the probes, serve metrics, and manage pods (standalone from a
    /// manifest directory, or beside kubelet on a Kubernetes node) until SIGTERM or SIGINT.
    Run(Box<RunArgs>),
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

/// Where pods come from.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PodsFrom {
    /// A manifest directory (standalone: qosd runs the pods and owns their cgroups).
    Manifests,
    /// The API server's watch of this node's pods (beside kubelet, which owns the cgroups).
    Kubernetes,
    /// kubelet's own /pods endpoint (beside kubelet, for nodes where the agent may not watch
    /// the API server).
    Kubelet,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Where to serve /metrics, /healthz and /inspect.
    #[arg(long, default_value = "127.0.0.1:9464", env = "QOSD_METRICS_ADDR")]
    metrics_addr: SocketAddr,
    /// Where pods come from: `manifests` (standalone; the default when a manifest directory is
    /// given or /etc/qosd/manifests exists), `kubernetes` (the API server's watch of the pods
    /// bound to --node-name) or `kubelet` (kubelet's /pods at --kubelet-url). With
    /// `kubernetes` and `kubelet`, kubelet owns the pod cgroups: qosd finds them, labels every
    /// metric with their pods, reports where they differ from what kubelet should have
    /// written, and writes only its feedback's settings. Without any, qosd runs the probes
    /// only.
    #[arg(long, value_enum, env = "QOSD_PODS")]
    pods: Option<PodsFrom>,
    /// Pod manifests (YAML or JSON, several per file) to run, watched for changes.
    #[arg(long, env = "QOSD_MANIFEST_DIR")]
    manifest_dir: Option<PathBuf>,
    /// This node's name, whose pods the API server is asked for (--pods kubernetes).
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// A kubeconfig file (--pods kubernetes). Default: the in-cluster service account, else
    /// $KUBECONFIG or ~/.kube/config.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// kubelet's API (--pods kubelet): https://NODE:10250 (authenticated with
    /// --kubelet-token-file) or http://NODE:10255 (the read-only port, where a node has it).
    #[arg(long, env = "QOSD_KUBELET_URL")]
    kubelet_url: Option<String>,
    /// Bearer token sent to kubelet over https; re-read as it rotates. Default: the service
    /// account's token, when it exists.
    #[arg(long)]
    kubelet_token_file: Option<PathBuf>,
    /// CA bundle of kubelet's serving certificate. Default: the service account's CA, when it
    /// exists.
    #[arg(long)]
    kubelet_ca: Option<PathBuf>,
    /// Accept any certificate from kubelet (self-signed serving certificates). The token is
    /// still sent: only where the path to kubelet is trusted.
    #[arg(long)]
    kubelet_insecure_skip_tls_verify: bool,
    /// How often kubelet's /pods is fetched (--pods kubelet).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    kubelet_poll_period: Duration,
    /// A kubelet.config.k8s.io/v1beta1 KubeletConfiguration file (reserved resources,
    /// eviction thresholds, enforceNodeAllocatable, cgroupRoot, cgroupDriver, the CPU and
    /// memory manager policies, ...). Beside kubelet: the node's own
    /// (/var/lib/kubelet/config.yaml), read only.
    #[arg(long, env = "QOSD_KUBELET_CONFIG")]
    kubelet_config: Option<PathBuf>,
    /// kubelet's root directory, where its cpu_manager_state and memory_manager_state are
    /// read from beside kubelet (never written).
    #[arg(long, default_value = "/var/lib/kubelet")]
    kubelet_root: PathBuf,
    /// kubelet's cgroup driver beside kubelet (overrides cgroupDriver; default: from
    /// --kubelet-config, else detected from what is on disk).
    #[arg(long, value_enum)]
    cgroup_driver: Option<DriverName>,
    /// The cgroup under which kubepods lives (overrides cgroupRoot).
    #[arg(long)]
    cgroup_root: Option<String>,
    /// How often cgroupfs is compared with the desired state: standalone corrects it; beside
    /// kubelet it reports kubelet's values missing (drift) and writes undone interventions
    /// again (e.g. 10s, 1m).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    reconcile_period: Duration,
    /// Attach mode of the scheduler probes: auto (tp_btf, else raw_tracepoint), tp_btf or
    /// raw_tracepoint, for the sched_switch handler (cpu_time and runqlat). raw_tracepoint
    /// also puts the task-migration probe on a raw tracepoint (to test or work around a
    /// kernel's tp_btf).
    #[arg(long, value_enum, default_value_t = CpuTimeMode::Auto)]
    cpu_time_mode: CpuTimeMode,
    /// Where container stdout/stderr go, one file per container (standalone).
    #[arg(long, default_value = "/var/log/qosd/containers")]
    container_log_dir: PathBuf,
    /// Where qosd keeps its state: standalone, the CPU and memory managers' checkpoints
    /// (cpu_manager_state, memory_manager_state, in kubelet's format; a kubelet root directory
    /// lets qosd take over kubelet's assignments); beside kubelet, kubelet's values under the
    /// feedback's interventions (feedback_interventions.json), put back by the next qosd if
    /// this one is killed.
    #[arg(long, default_value = "/var/lib/qosd", env = "QOSD_STATE_DIR")]
    state_dir: PathBuf,
    /// What the measurements may change: `on` lets the feedback policies write (the
    /// BestEffort tier capped, and made idle, while it crowds out the other classes; a CFS
    /// burst for throttled Burstable containers; memory moved to the NUMA node of a
    /// container's CPUs), `dry-run` makes and logs the same decisions without writing, `off`
    /// disables them. Decisions are logged, listed by `qosd inspect` and counted in
    /// qosd_feedback_decisions_total. Default: `on` standalone, `dry-run` beside kubelet.
    #[arg(long, value_enum, env = "QOSD_FEEDBACK")]
    feedback: Option<FeedbackMode>,
    /// How often the feedback takes its measurements (the window it judges, e.g. 500ms,
    /// 5s). A policy acts once its condition has held for 1 s and two windows at least, so
    /// 500ms decides 1 to 1.5 s after a condition begins.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    feedback_period: Duration,
    /// How long an intervention stays at least before it may be lifted (doubled while the
    /// trouble comes back soon after each lift).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    feedback_hold: Duration,
}

#[derive(Clone, Copy, ValueEnum)]
enum DriverName {
    Cgroupfs,
    Systemd,
}

/// Command lines that cannot run, named by the flag at fault.
#[derive(Debug, thiserror::Error)]
enum ArgsError {
    #[error(
        "--pods kubernetes needs --node-name (or $NODE_NAME): the API server is asked for the pods bound to it"
    )]
    NoNodeName,
    #[error("--pods kubelet needs --kubelet-url (https://NODE:10250 or http://NODE:10255)")]
    NoKubeletUrl,
    #[error("--manifest-dir goes with --pods manifests, not --pods {0}")]
    ManifestDirBesideKubelet(&'static str),
}

/// The agent's options from the command line.
fn run_options(args: &RunArgs) -> Result<qosd::daemon::RunOptions, ArgsError> {
    use qosd::daemon::AgentMode;
    use qosd::kubernetes::{KubernetesOptions, PodSourceChoice};
    use qosd::pods::kubernetes::client::{
        ApiServerOptions, KubeletOptions, SERVICE_ACCOUNT_CA, SERVICE_ACCOUNT_TOKEN,
    };
    let manifest_dir = args.manifest_dir.clone().or_else(|| {
        let default = PathBuf::from(DEFAULT_MANIFEST_DIR);
        (args.pods.is_none() && default.is_dir()).then_some(default)
    });
    let pods = args
        .pods
        .or_else(|| manifest_dir.is_some().then_some(PodsFrom::Manifests));
    let feedback = |default: FeedbackMode| {
        qosd::feedback::FeedbackConfig::with_defaults(
            args.feedback.unwrap_or(default).into(),
            args.feedback_period,
            args.feedback_hold,
        )
    };
    let existing = |path: &str| {
        let path = PathBuf::from(path);
        path.exists().then_some(path)
    };
    let beside_kubelet = |source| KubernetesOptions {
        source,
        kubelet_config: args.kubelet_config.clone(),
        kubelet_root: args.kubelet_root.clone(),
        cgroup_driver: args.cgroup_driver.map(|d| match d {
            DriverName::Cgroupfs => qosd::config::kubelet::CgroupDriver::Cgroupfs,
            DriverName::Systemd => qosd::config::kubelet::CgroupDriver::Systemd,
        }),
        cgroup_root: args.cgroup_root.clone(),
        reconcile_period: args.reconcile_period,
        state_dir: args.state_dir.clone(),
        feedback: feedback(FeedbackMode::DryRun),
    };
    let mode = match pods {
        None => AgentMode::ProbesOnly,
        Some(PodsFrom::Manifests) => AgentMode::Standalone(qosd::standalone::StandaloneOptions {
            manifest_dir: manifest_dir.unwrap_or_else(|| PathBuf::from(DEFAULT_MANIFEST_DIR)),
            kubelet_config: args.kubelet_config.clone(),
            cgroup_root: args.cgroup_root.clone(),
            reconcile_period: args.reconcile_period,
            log_dir: Some(args.container_log_dir.clone()),
            state_dir: args.state_dir.clone(),
            feedback: feedback(FeedbackMode::On),
        }),
        Some(PodsFrom::Kubernetes) => {
            if args.manifest_dir.is_some() {
                return Err(ArgsError::ManifestDirBesideKubelet("kubernetes"));
            }
            let node = args.node_name.clone().ok_or(ArgsError::NoNodeName)?;
            AgentMode::Kubernetes(beside_kubelet(PodSourceChoice::ApiServer {
                node,
                options: ApiServerOptions {
                    kubeconfig: args.kubeconfig.clone(),
                },
            }))
        }
        Some(PodsFrom::Kubelet) => {
            if args.manifest_dir.is_some() {
                return Err(ArgsError::ManifestDirBesideKubelet("kubelet"));
            }
            let url = args.kubelet_url.clone().ok_or(ArgsError::NoKubeletUrl)?;
            AgentMode::Kubernetes(beside_kubelet(PodSourceChoice::Kubelet(KubeletOptions {
                url,
                token_file: args
                    .kubelet_token_file
                    .clone()
                    .or_else(|| existing(SERVICE_ACCOUNT_TOKEN)),
                ca_file: args
                    .kubelet_ca
                    .clone()
                    .or_else(|| existing(SERVICE_ACCOUNT_CA)),
                insecure_skip_tls_verify: args.kubelet_insecure_skip_tls_verify,
                period: args.kubelet_poll_period,
            })))
        }
    };
    Ok(qosd::daemon::RunOptions {
        metrics_addr: args.metrics_addr,
        mode,
        cpu_time_mode: args.cpu_time_mode.into(),
    })
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
        Command::Run(args) => {
            let options = match run_options(&args) {
                Ok(options) => options,
                Err(e) => {
                    eprintln!("qosd run: {e}");
                    return ExitCode::from(2);
                }
            };
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
            match runtime.block_on(qosd::daemon::run(options)) {
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
