//! qosd's developer commands. `cargo xtask setup | run | test | vm`.
//!
//! xtask owns everything a newcomer or CI needs around the Rust build: installing the eBPF
//! tool chain and test dependencies into a cache, starting qosd with its embedded defaults,
//! running every test tier (unit, host, VM) and summarising the results.

mod vm;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "qosd developer commands")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
        /// Shell command line run by the guest's init after the mounts.
        command: String,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Vm { kernel, files, timeout, command } => {
            let cache = vm::cache_dir()?;
            let kernels = vm::ensure_kernels(&cache)?;
            let Some(k) = kernels.iter().find(|k| k.series == kernel) else {
                anyhow::bail!("no guest kernel for series {kernel}");
            };
            let payload: Vec<(PathBuf, String)> = files
                .iter()
                .map(|f| {
                    let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                    (f.clone(), format!("/bin/{name}"))
                })
                .collect();
            let run = vm::run_in_guest(k, &payload, &command, Duration::from_secs(timeout), &cache.join("vm-work"))?;
            print!("{}", run.output);
            println!("guest exit: {:?}", run.exit);
            Ok(())
        }
    }
}
