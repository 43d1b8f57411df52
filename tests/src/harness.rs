//! A small test runner that can say "skipped, because…": each case returns an [`Outcome`];
//! the runner prints one `RESULT` line per case and a closing `N passed, N failed, N skipped`.
//! libtest has no runtime skip, and a skip must never be counted as a pass.
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

/// A case still running after this long is declared hung: the kernel is asked to dump its
/// blocked tasks and CPU backtraces to the console, the case fails, and the run ends, so a
/// hang becomes a diagnosable failure instead of a silent guest timeout.
const CASE_LIMIT: Duration = Duration::from_secs(180);

/// Cases named in this variable (comma-separated) are reported as skipped: `cargo xtask test`
/// runs them in another of its tiers, to keep the whole command within CI's time budget.
pub(crate) const ELSEWHERE_ENV: &str = "QOSD_SYSTESTS_ELSEWHERE";

/// How long `case` may run: [`CASE_LIMIT`], or more for a case that says it needs more.
fn limit_of(case: &str) -> Duration {
    crate::cases::time_limit(case).unwrap_or(CASE_LIMIT)
}

/// What a case concluded.
#[derive(Debug)]
pub(crate) enum Outcome {
    Pass(String),
    Fail(String),
    Skip(String),
}

/// Shorthand for a failing outcome from any displayable error.
pub(crate) fn fail(detail: impl std::fmt::Display) -> Outcome {
    Outcome::Fail(detail.to_string())
}

/// A named case.
pub(crate) struct Case {
    pub name: &'static str,
    pub run: fn(&Context) -> Outcome,
}

/// What every case may use.
pub(crate) struct Context {
    /// The qosd binary under test.
    pub qosd: std::path::PathBuf,
    /// This binary, re-executed as a workload (`spin`, `sleep`).
    pub self_exe: std::path::PathBuf,
    /// When set, every case is reported as skipped for this reason instead of run.
    pub skip_all: Option<String>,
}

/// Runs the cases whose name contains `filter`, prints results; returns the failure count.
pub(crate) fn run_all(cases: &[Case], ctx: &Context, filter: Option<&str>) -> usize {
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    let watchdog = start_watchdog();
    for case in cases
        .iter()
        .filter(|c| filter.is_none_or(|f| c.name.contains(f)))
    {
        let started = Instant::now();
        println!("RUN    {}", case.name);
        // The watchdog ends the process itself if it fires; a send error means it is gone.
        let _ = watchdog.send(Some(case.name));
        let elsewhere = std::env::var(ELSEWHERE_ENV)
            .is_ok_and(|names| names.split(',').any(|n| n.trim() == case.name));
        let outcome = if let Some(reason) = &ctx.skip_all {
            Outcome::Skip(reason.clone())
        } else if elsewhere {
            Outcome::Skip(format!(
                "run in another tier of this test command ({ELSEWHERE_ENV}), within CI's time budget"
            ))
        } else {
            catch_unwind(AssertUnwindSafe(|| (case.run)(ctx))).unwrap_or_else(|panic| {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                Outcome::Fail(format!("panicked: {msg}"))
            })
        };
        let _ = watchdog.send(None);
        let secs = started.elapsed().as_secs_f64();
        let (word, detail) = match &outcome {
            Outcome::Pass(d) => {
                passed += 1;
                ("PASS", d)
            }
            Outcome::Fail(d) => {
                failed += 1;
                ("FAIL", d)
            }
            Outcome::Skip(d) => {
                skipped += 1;
                ("SKIP", d)
            }
        };
        println!("RESULT {} {word} ({secs:.1}s) {detail}", case.name);
    }
    println!("{passed} passed, {failed} failed, {skipped} skipped");
    failed
}

/// A thread that fails the run when one case exceeds its limit ([`limit_of`]). It is told the name of
/// the case that starts (`Some`) and that it ended (`None`).
fn start_watchdog() -> mpsc::Sender<Option<&'static str>> {
    let (tx, rx) = mpsc::channel::<Option<&'static str>>();
    std::thread::spawn(move || {
        let mut current = None;
        loop {
            let next = match current {
                Some(name) => rx.recv_timeout(limit_of(name)),
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match next {
                Ok(case) => current = case,
                Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => {
                    let name = current.unwrap_or_default();
                    // sysrq w: blocked (D state) tasks; l: backtraces of all CPUs. Best effort;
                    // the console log level is raised first so the dumps reach the console.
                    let _ = std::fs::write("/proc/sys/kernel/printk", "8");
                    for key in ["w", "l"] {
                        let _ = std::fs::write("/proc/sysrq-trigger", key);
                    }
                    let limit = limit_of(name);
                    println!(
                        "RESULT {name} FAIL ({:.1}s) hung: no outcome within {}s; kernel task dump requested (sysrq w, l)",
                        limit.as_secs_f64(),
                        limit.as_secs()
                    );
                    std::process::exit(2);
                }
            }
        }
    });
    tx
}
