//! qosd's privileged system tests.
//!
//! `qosd-systests [--qosd PATH] [FILTER]` runs every case (or those whose name contains
//! FILTER) against a real `qosd` binary (default: `qosd` next to this binary), prints a
//! `RESULT` line per case and a closing `N passed, N failed, N skipped`, and exits non-zero
//! if any case failed. `cargo xtask test` runs it on the host and inside each guest kernel.
//! Without root every case is reported as skipped, with that reason.
//!
//! The binary doubles as the test workloads: `qosd-systests spin SECS` burns one CPU for
//! SECS seconds; `qosd-systests sleep SECS` sleeps; `qosd-systests memory MIB SECS` allocates
//! MIB MiB, writes every page once (so it is resident where the memory policy put it), then
//! keeps rewriting one byte per page for SECS seconds; `qosd-systests nap MS SECS` sleeps MS
//! milliseconds and works about as long again, in a loop (a task woken over and over);
//! `qosd-systests pulse WORK_MS PERIOD_MS SECS` uses WORK_MS of CPU time at the start of
//! every PERIOD_MS (spikes above a CFS quota that the average stays below).
//!
//! Two probes of privilege run with chosen capabilities by the capability case:
//! `qosd-systests migrate-pages PID` asks the kernel to move process PID's pages to node 0
//! through qosd's own `numa::migrate::move_pages_to`; `qosd-systests read-file PATH` reads a
//! file. Each prints `ok` or the error, and exits non-zero on an error.
mod agent;
mod cases;
mod cgroup_fixture;
mod containerd;
mod harness;
mod pod_tree;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("spin") => return workload(&args, true),
        Some("sleep") => return workload(&args, false),
        Some("memory") => return memory_workload(&args),
        Some("nap") => return nap_workload(&args),
        Some("pulse") => return pulse_workload(&args),
        Some("migrate-pages") => return migrate_pages_probe(&args),
        Some("read-file") => return read_file_probe(&args),
        _ => {}
    }
    let Ok(self_exe) = std::env::current_exe() else {
        eprintln!("cannot find this executable's path");
        return ExitCode::FAILURE;
    };
    let mut qosd = self_exe.with_file_name("qosd");
    let mut filter = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--qosd" => match rest.next() {
                Some(path) => qosd = PathBuf::from(path),
                None => {
                    eprintln!("--qosd needs a path");
                    return ExitCode::FAILURE;
                }
            },
            other => filter = Some(other.to_owned()),
        }
    }
    let cases = cases::all();
    // SAFETY: geteuid has no preconditions and cannot fail.
    let is_root = unsafe { libc::geteuid() } == 0;
    let skip_all =
        (!is_root).then(|| "needs root: loads eBPF programs and creates cgroups".to_owned());
    let ctx = harness::Context {
        qosd,
        self_exe,
        skip_all,
    };
    if harness::run_all(&cases, &ctx, filter.as_deref()) == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `migrate-pages PID`: qosd's page migration of PID onto node 0.
fn migrate_pages_probe(args: &[String]) -> ExitCode {
    let Some(pid) = args.get(1).and_then(|p| p.parse::<u32>().ok()) else {
        eprintln!("usage: qosd-systests migrate-pages PID");
        return ExitCode::FAILURE;
    };
    match qosd::numa::migrate::move_pages_to(pid, 0, &std::collections::BTreeSet::from([0])) {
        Ok(left) => {
            println!("ok ({left} pages not moved)");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// `read-file PATH`: reads PATH.
fn read_file_probe(args: &[String]) -> ExitCode {
    let Some(path) = args.get(1) else {
        eprintln!("usage: qosd-systests read-file PATH");
        return ExitCode::FAILURE;
    };
    match std::fs::read(path) {
        Ok(_) => {
            println!("ok");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("{path}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The workloads the cases place in cgroups.
fn workload(args: &[String], busy: bool) -> ExitCode {
    let Some(seconds) = args.get(1).and_then(|s| s.parse::<f64>().ok()) else {
        eprintln!("usage: qosd-systests spin|sleep SECONDS");
        return ExitCode::FAILURE;
    };
    let duration = Duration::from_secs_f64(seconds);
    if busy {
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed() < duration {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
            }
        }
    } else {
        std::thread::sleep(duration);
    }
    ExitCode::SUCCESS
}

/// `memory MIB SECS`: MIB MiB made resident, then touched page by page until SECS have passed.
fn memory_workload(args: &[String]) -> ExitCode {
    let (Some(mib), Some(seconds)) = (
        args.get(1).and_then(|s| s.parse::<usize>().ok()),
        args.get(2).and_then(|s| s.parse::<f64>().ok()),
    ) else {
        eprintln!("usage: qosd-systests memory MIB SECONDS");
        return ExitCode::FAILURE;
    };
    const PAGE: usize = 4096;
    let mut buffer = vec![0u8; mib << 20];
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut round = 0u8;
    loop {
        round = round.wrapping_add(1);
        for page in buffer.chunks_mut(PAGE) {
            page[0] = round;
        }
        std::hint::black_box(&buffer);
        if Instant::now() >= deadline {
            break;
        }
    }
    ExitCode::SUCCESS
}

/// `nap MS SECS`: sleep MS ms, then spin about MS ms, until SECS have passed: every wakeup
/// queues the task behind whatever runs on its CPU.
fn nap_workload(args: &[String]) -> ExitCode {
    let (Some(ms), Some(seconds)) = (
        args.get(1).and_then(|s| s.parse::<f64>().ok()),
        args.get(2).and_then(|s| s.parse::<f64>().ok()),
    ) else {
        eprintln!("usage: qosd-systests nap MS SECONDS");
        return ExitCode::FAILURE;
    };
    let nap = Duration::from_secs_f64(ms / 1000.0);
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut x = 0u64;
    while Instant::now() < deadline {
        std::thread::sleep(nap);
        let busy = Instant::now();
        while busy.elapsed() < nap {
            x = std::hint::black_box(x.wrapping_add(1));
        }
    }
    ExitCode::SUCCESS
}

/// `pulse WORK_MS PERIOD_MS SECS`: at the start of every PERIOD_MS, WORK_MS of this thread's
/// CPU time (so time spent throttled does not count as work), then sleep until the next.
fn pulse_workload(args: &[String]) -> ExitCode {
    let (Some(work), Some(period), Some(seconds)) = (
        args.get(1).and_then(|s| s.parse::<f64>().ok()),
        args.get(2).and_then(|s| s.parse::<f64>().ok()),
        args.get(3).and_then(|s| s.parse::<f64>().ok()),
    ) else {
        eprintln!("usage: qosd-systests pulse WORK_MS PERIOD_MS SECONDS");
        return ExitCode::FAILURE;
    };
    let work = Duration::from_secs_f64(work / 1000.0);
    let period = Duration::from_secs_f64(period / 1000.0);
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let mut next = start;
    let mut x = 0u64;
    while Instant::now() < deadline {
        let begun = thread_cpu_time();
        while thread_cpu_time().saturating_sub(begun) < work {
            for _ in 0..1000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        next += period;
        if let Some(rest) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(rest);
        }
    }
    ExitCode::SUCCESS
}

/// CPU time this thread has used.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut ts) };
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}
