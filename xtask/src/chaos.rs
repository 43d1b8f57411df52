//! `cargo xtask chaos`: the system tests' kill storm (`kill_storm_leaves_node_consistent`, 10
//! kills in the test tiers) run long: qosd SIGKILLed at random instants `--kills`
//! times while pods are admitted, replaced and deleted and the feedback intervenes, the node
//! checked against cgroupfs, the processes and the checkpoint after every restart. On this
//! machine (as root), or in a guest kernel with `--kernel`. The case's result line carries the
//! figures: kills (during start-up, with an intervention in force), pods admitted, replaced and
//! deleted, settle times, and the number of invariant violations; a violation fails the run.
use std::process::Command;
use std::time::Duration;

use anyhow::{Result, bail};

use crate::{setup, test, vm};

/// The case the storm is.
const CASE: &str = "kill_storm_leaves_node_consistent";

pub(crate) fn run(kills: u32, seed: Option<u64>, kernel: Option<&str>) -> Result<()> {
    if kills == 0 {
        bail!("--kills must be at least 1");
    }
    let toolchain = setup::build_tools()?;
    let bins = test::build_test_binaries(&toolchain)?;
    let mut env = format!("QOSD_CHAOS_KILLS={kills}");
    if let Some(seed) = seed {
        env.push_str(&format!(" QOSD_CHAOS_SEED={seed}"));
    }
    let (ok, output) = match kernel {
        None => {
            // SAFETY: geteuid has no preconditions and cannot fail.
            if unsafe { libc::geteuid() } != 0 {
                bail!("the kill storm makes cgroups and loads eBPF programs: run it as root");
            }
            let mut cmd = Command::new(&bins.systests);
            cmd.arg("--qosd").arg(&bins.qosd).arg(CASE);
            cmd.env("QOSD_CHAOS_KILLS", kills.to_string());
            if let Some(seed) = seed {
                cmd.env("QOSD_CHAOS_SEED", seed.to_string());
            }
            test::tee(&mut cmd)?
        }
        Some(series) => {
            let kernels = vm::ensure_kernels(&toolchain.cache)?;
            let Some(kernel) = kernels.iter().find(|k| k.series == series) else {
                bail!("no guest kernel for series {series}; known: 5.10, 6.1, 6.12");
            };
            let work = vm::work_dir();
            let payload = test::stripped_payload(&bins, &work)?;
            // Longer than the case's own limit (120 s and 90 s per kill, `cases::chaos::
            // time_limit`), so a storm that hangs is reported by the case, which says where.
            let timeout = Duration::from_secs(300 + 90 * u64::from(kills));
            let run = vm::run_in_guest(
                kernel,
                &payload,
                &format!("{env} /bin/qosd-systests --qosd /bin/qosd {CASE}"),
                timeout,
                &work,
                vm::GuestInit::Shell,
            )?;
            print!("{}", run.output);
            (matches!(run.exit, vm::GuestExit::Exited(0)), run.output)
        }
    };
    let result = output
        .lines()
        .find(|l| l.starts_with(&format!("RESULT {CASE}")))
        .unwrap_or("no result line");
    println!("\n== chaos: {kills} SIGKILLs asked for\n{result}");
    if !ok || !result.contains(" PASS ") {
        bail!("the kill storm failed (see its result above)");
    }
    Ok(())
}
