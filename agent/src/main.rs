//! The `qosd` command line.
use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::process::ExitCode;

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

#[derive(Subcommand)]
enum Command {
    /// Run the agent: attach the probes and serve metrics until SIGTERM or SIGINT.
    Run {
        /// Where to serve /metrics and /healthz.
        #[arg(long, default_value = "127.0.0.1:9464", env = "QOSD_METRICS_ADDR")]
        metrics_addr: SocketAddr,
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
        Command::Check => {
            print!("{}", qosd::check::report());
            ExitCode::SUCCESS
        }
        Command::Run { metrics_addr } => {
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
            match runtime.block_on(qosd::daemon::run(qosd::daemon::RunOptions { metrics_addr })) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "qosd stopped");
                    ExitCode::FAILURE
                }
            }
        }
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
