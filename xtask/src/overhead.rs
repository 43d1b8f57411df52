//! `cargo xtask bench`'s eBPF overhead part: what qosd's kernel programs cost per event under
//! a context-switch-heavy load, against bpftrace's classic run-queue-latency script measured in
//! the same run.
//!
//! With `kernel.bpf_stats_enabled=1` the kernel keeps `run_time_ns` and `run_cnt` per program,
//! shown in `/proc/<pid>/fdinfo/<fd>` of every program fd a process holds. For qosd (probes
//! only, no container manager) and then for bpftrace, this module snapshots those counters,
//! drives `stress-ng --switch` for a fixed time, snapshots again and prints, per program, ns per
//! event and events per second; for qosd, scraped every second meanwhile, also its own CPU
//! time and RSS over the window.
//! An empty bpftrace handler on sched_switch is measured too: the floor of this machine.
//! Target: qosd's sched_switch handler (one program: CPU time, run-queue waits and preemption
//! pairs) at most 100 ns per event on average.
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::procfs::{cpu_seconds, free_port, rss_kib, stop, wait_until_serving};

/// How long the load runs per measured process.
const LOAD: Duration = Duration::from_secs(10);
/// Average cost allowed for a sched_switch handler.
const SWITCH_TARGET_NS: f64 = 100.0;
const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// bpftrace's classic run-queue latency measurement (wakeup, wakeup of a new task, switch; a
/// task switched out runnable starts waiting again). qosd needs only sched_switch: it reads
/// the waits the kernel's `sched_info` already keeps.
const BPFTRACE_RUNQLAT: &str = r"
tracepoint:sched:sched_wakeup, tracepoint:sched:sched_wakeup_new { @start[args->pid] = nsecs; }
tracepoint:sched:sched_switch {
  if (args->prev_state == 0) { @start[args->prev_pid] = nsecs; }
  $t = @start[args->next_pid];
  if ($t) { @wait_us = hist((nsecs - $t) / 1000); delete(@start[args->next_pid]); }
}
";

/// The floor: an empty bpftrace program on sched_switch (what attaching anything costs here).
const BPFTRACE_EMPTY: &str = "tracepoint:sched:sched_switch { }";

/// One program's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct ProgStats {
    run_time_ns: u64,
    run_cnt: u64,
}

/// One row of the report.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    owner: &'static str,
    name: String,
    hook: &'static str,
    ns_per_event: f64,
    events_per_second: f64,
}

/// Runs the measurement with the release `qosd` binary and prints the table.
pub(crate) fn run(qosd: &Path) -> Result<()> {
    if !crate::is_root() {
        println!("eBPF overhead: skipped (needs root to load programs and enable bpf_stats)");
        return Ok(());
    }
    let previous = std::fs::read_to_string(BPF_STATS).context(BPF_STATS)?;
    std::fs::write(BPF_STATS, "1").context("enabling kernel.bpf_stats_enabled")?;
    let result = measure_both(qosd);
    // Restore the setting whatever happened.
    let _ = std::fs::write(BPF_STATS, previous.trim());
    let (rows, qosd_cpu, qosd_rss_kib) = result?;
    print_table(&rows, qosd_cpu, qosd_rss_kib);
    Ok(())
}

fn measure_both(qosd: &Path) -> Result<(Vec<Row>, f64, u64)> {
    let addr = free_port()?;
    let mut agent = Command::new(qosd)
        .args(["run", "--metrics-addr", &addr.to_string()])
        // No --manifest-dir: without the default directory qosd runs its probes only, so the
        // figures are the kernel programs'.
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", qosd.display()))?;
    let measured = (|| {
        wait_until_serving(addr, &mut agent)?;
        let pid = agent.id();
        let before = prog_stats(pid)?;
        let cpu_before = cpu_seconds(pid)?;
        // Scraped every second meanwhile, so qosd's user-space cost includes collection.
        let scraping = std::sync::atomic::AtomicBool::new(true);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while scraping.load(std::sync::atomic::Ordering::Relaxed) {
                    scrape(addr);
                    std::thread::sleep(Duration::from_secs(1));
                }
            });
            let load = drive_load();
            scraping.store(false, std::sync::atomic::Ordering::Relaxed);
            load
        })?;
        let after = prog_stats(pid)?;
        let cpu = (cpu_seconds(pid)? - cpu_before) / LOAD.as_secs_f64();
        let rss = rss_kib(pid)?;
        Ok::<_, anyhow::Error>((rows("qosd", &before, &after)?, cpu, rss))
    })();
    stop(&mut agent, libc::SIGTERM);
    let (mut all, cpu, rss) = measured?;

    for (owner, script, programs) in [
        ("bpftrace", BPFTRACE_RUNQLAT, 3),
        ("floor", BPFTRACE_EMPTY, 1),
    ] {
        all.extend(measure_bpftrace(owner, script, programs)?);
    }
    Ok((all, cpu, rss))
}

/// Runs `script` under bpftrace through the load; rows owned by `owner`.
fn measure_bpftrace(owner: &'static str, script: &str, programs: usize) -> Result<Vec<Row>> {
    let mut bpftrace = Command::new("bpftrace")
        .args(["-e", script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting bpftrace (apt-get install bpftrace)")?;
    let measured = (|| {
        let pid = bpftrace.id();
        let before = wait_for_programs(pid, programs)?;
        drive_load()?;
        let after = prog_stats(pid)?;
        rows(owner, &before, &after)
    })();
    stop(&mut bpftrace, libc::SIGINT);
    measured
}

/// `stress-ng --switch` on every CPU for [`LOAD`].
fn drive_load() -> Result<()> {
    let status = Command::new("stress-ng")
        .args([
            "--switch",
            "0",
            "--timeout",
            &format!("{}s", LOAD.as_secs()),
            "--quiet",
        ])
        .stdout(Stdio::null())
        .status()
        .context("starting stress-ng (apt-get install stress-ng)")?;
    if !status.success() {
        bail!("stress-ng failed: {status}");
    }
    Ok(())
}

/// Per-program rows from two snapshots, named through bpftool.
fn rows(
    owner: &'static str,
    before: &BTreeMap<u32, ProgStats>,
    after: &BTreeMap<u32, ProgStats>,
) -> Result<Vec<Row>> {
    let mut out = Vec::new();
    for (id, end) in after {
        let start = before.get(id).copied().unwrap_or_default();
        let events = end.run_cnt.saturating_sub(start.run_cnt);
        let ns = end.run_time_ns.saturating_sub(start.run_time_ns);
        #[expect(
            clippy::cast_precision_loss,
            reason = "event and nanosecond counts of a 10 s window are far below 2^53"
        )]
        let (ns_per_event, events_per_second) = if events == 0 {
            (0.0, 0.0)
        } else {
            (
                ns as f64 / events as f64,
                events as f64 / LOAD.as_secs_f64(),
            )
        };
        let name = prog_name(*id)?;
        out.push(Row {
            owner,
            hook: hook_of(&name),
            name,
            ns_per_event,
            events_per_second,
        });
    }
    Ok(out)
}

/// The scheduler hook a program runs on, from its name: qosd's programs are named after
/// their hook (`qosd_switch_*` is on sched_switch), bpftrace's after the tracepoint.
fn hook_of(name: &str) -> &'static str {
    if name.contains("switch") {
        "sched_switch"
    } else if name.contains("wakeup_ne") {
        "sched_wakeup_new"
    } else if name.contains("wakeup") {
        "sched_wakeup"
    } else {
        "-"
    }
}

fn print_table(rows: &[Row], qosd_cpu: f64, qosd_rss_kib: u64) {
    println!(
        "\n== eBPF overhead under stress-ng --switch ({} s each)",
        LOAD.as_secs()
    );
    println!(
        "{:<9} {:<18} {:<22} {:>10} {:>12}  target",
        "owner", "hook", "program", "ns/event", "events/s"
    );
    for r in rows {
        let target = if r.owner == "qosd" && r.hook == "sched_switch" {
            if r.ns_per_event <= SWITCH_TARGET_NS {
                format!("<= {SWITCH_TARGET_NS} ns ok")
            } else {
                format!("<= {SWITCH_TARGET_NS} ns OVER")
            }
        } else {
            "-".to_owned()
        };
        println!(
            "{:<9} {:<18} {:<22} {:>10.1} {:>12.0}  {target}",
            r.owner, r.hook, r.name, r.ns_per_event, r.events_per_second
        );
    }
    let switch_cost = |owner: &str| -> f64 {
        rows.iter()
            .filter(|r| r.owner == owner && r.hook == "sched_switch")
            .map(|r| r.ns_per_event)
            .sum()
    };
    let (ours, peer, floor) = (
        switch_cost("qosd"),
        switch_cost("bpftrace"),
        switch_cost("floor"),
    );
    if ours > 0.0 && peer > 0.0 {
        println!(
            "per sched_switch, all handlers together: qosd {ours:.1} ns (CPU time, run-queue latency and preemption per cgroup), bpftrace runqlat {peer:.1} ns (one global histogram): {:.2}x; an empty handler costs {floor:.1} ns on this machine",
            ours / peer
        );
    }
    println!(
        "qosd process over the window: {:.2}% of one CPU, RSS {} KiB",
        qosd_cpu * 100.0,
        qosd_rss_kib
    );
}

/// `run_time_ns` / `run_cnt` of every BPF program `pid` holds an fd to, by program id.
fn prog_stats(pid: u32) -> Result<BTreeMap<u32, ProgStats>> {
    let dir = format!("/proc/{pid}/fdinfo");
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).with_context(|| dir.clone())? {
        let Ok(text) = std::fs::read_to_string(entry?.path()) else {
            continue;
        };
        if let Some((id, stats)) = parse_fdinfo(&text) {
            out.insert(id, stats);
        }
    }
    Ok(out)
}

/// A program fd's fdinfo: its id and counters; `None` for any other fd.
fn parse_fdinfo(text: &str) -> Option<(u32, ProgStats)> {
    let field = |key: &str| {
        text.lines().find_map(|l| {
            l.strip_prefix(key)
                .and_then(|v| v.strip_prefix(':'))
                .map(str::trim)
        })
    };
    let id = field("prog_id")?.parse().ok()?;
    Some((
        id,
        ProgStats {
            run_time_ns: field("run_time_ns")?.parse().ok()?,
            run_cnt: field("run_cnt")?.parse().ok()?,
        },
    ))
}

/// Waits until `pid` holds at least `count` programs (bpftrace attaches after parsing).
fn wait_for_programs(pid: u32, count: usize) -> Result<BTreeMap<u32, ProgStats>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stats = prog_stats(pid)?;
        if stats.len() >= count {
            // Let it finish attaching.
            std::thread::sleep(Duration::from_secs(1));
            return prog_stats(pid);
        }
        if Instant::now() > deadline {
            bail!("process {pid} loaded {} of {count} programs", stats.len());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The program's name (bpftool; the kernel keeps 15 characters).
fn prog_name(id: u32) -> Result<String> {
    let out = crate::setup::output("bpftool", &["prog", "show", "id", &id.to_string()])
        .context("bpftool (apt-get install bpftool)")?;
    Ok(parse_prog_name(&out).unwrap_or("?").to_owned())
}

/// The `name` of `bpftool prog show` text (`42: tracing  name qosd_switch_btf  tag ...`).
fn parse_prog_name(text: &str) -> Option<&str> {
    let mut words = text.split_whitespace();
    words.find(|w| *w == "name")?;
    words.next()
}

/// One `GET /metrics`, body discarded.
fn scrape(addr: SocketAddr) {
    use std::io::{Read as _, Write as _};
    if let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = write!(
            stream,
            "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        );
        let _ = stream.read_to_end(&mut Vec::new());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_fdinfo_is_parsed_and_other_fds_are_not() {
        let prog = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nlink_type:\tprog\nprog_type:\t26\nprog_jited:\t1\nprog_tag:\tab12\nmemlock:\t4096\nprog_id:\t42\nrun_time_ns:\t123456\nrun_cnt:\t789\nrecursion_misses:\t0\nverified_insns:\t100\n";
        assert_eq!(
            parse_fdinfo(prog),
            Some((
                42,
                ProgStats {
                    run_time_ns: 123_456,
                    run_cnt: 789
                }
            ))
        );
        assert_eq!(
            parse_fdinfo("pos:\t0\nflags:\t02\nmap_type:\t1\nmap_id:\t3\n"),
            None
        );
    }

    #[test]
    fn programs_are_grouped_by_hook() {
        assert_eq!(hook_of("qosd_switch_btf"), "sched_switch");
        assert_eq!(hook_of("qosd_switch_raw"), "sched_switch");
        assert_eq!(hook_of("runq_wakeup_new_tp_btf"), "sched_wakeup_new");
        assert_eq!(hook_of("sched_wakeup_ne"), "sched_wakeup_new");
        assert_eq!(hook_of("runq_wakeup_tp_btf"), "sched_wakeup");
        assert_eq!(hook_of("numa_page_alloc"), "-");
    }

    #[test]
    fn bpftool_text_gives_the_name() {
        let text = "42: tracing  name qosd_switch_btf  tag 0123456789abcdef  gpl run_time_ns 10 run_cnt 2\n\tloaded_at 2026-12-03T07:00:00+0000  uid 0\n";
        assert_eq!(parse_prog_name(text), Some("qosd_switch_btf"));
        assert_eq!(parse_prog_name("42: tracing  tag 01\n"), None);
    }
}
