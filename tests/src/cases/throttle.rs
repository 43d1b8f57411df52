//! CFS throttling: a workload held to 20 % of one CPU for 10 s. qosd's `cpu.stat` counters
//! must equal the kernel's file within 5 %, and where the throttle-episode programs run
//! (fentry), the sum of episodes must be within 10 % of the kernel's throttled time.
use std::path::PathBuf;
use std::time::Duration;

use qosd::cgroup::CgroupLayout;

use crate::agent::{Agent, sample_value};
use crate::cgroup_fixture::TestCgroups;
use crate::harness::{Context, Outcome, fail};

const COUNTER_TOLERANCE: f64 = 0.05;
const EPISODE_TOLERANCE: f64 = 0.10;
const SPIN_SECONDS: &str = "10";
const EPISODE_PROBE: &str = "cpu_throttle_episodes";

/// What one throttled run measured.
struct Measured {
    /// qosd's nr_periods, nr_throttled, throttled seconds.
    qosd: [f64; 3],
    /// The kernel's, from cpu.stat.
    kernel: [f64; 3],
    /// Sum of throttle episodes, when the probe runs.
    episodes: Option<f64>,
    /// The episode probe's mode line, for messages.
    episode_mode: String,
}

/// `qosd_cpu_periods_total`, `qosd_cpu_throttled_periods_total` and
/// `qosd_cpu_throttled_seconds_total` against the cgroup's cpu.stat.
pub(crate) fn counters_match_cpu_stat(ctx: &Context) -> Outcome {
    let m = match measure(ctx) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let names = ["nr_periods", "nr_throttled", "throttled seconds"];
    let mut lines = Vec::new();
    let mut bad = false;
    for ((name, qosd), kernel) in names.iter().zip(m.qosd).zip(m.kernel) {
        let rel = if kernel == 0.0 {
            f64::INFINITY
        } else {
            (qosd - kernel).abs() / kernel
        };
        bad |= rel > COUNTER_TOLERANCE;
        lines.push(format!("{name}: qosd {qosd:.4} vs cpu.stat {kernel:.4}"));
    }
    let summary = lines.join("; ");
    if bad {
        fail(format!(
            "{summary}: more than 5% apart (or the kernel throttled nothing)"
        ))
    } else {
        Outcome::Pass(summary)
    }
}

/// The eBPF episode sum against cpu.stat's throttled time; skipped, with the kernel's reason,
/// where the episode probe is unavailable.
pub(crate) fn episodes_match_cpu_stat(ctx: &Context) -> Outcome {
    let m = match measure(ctx) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let Some(episodes) = m.episodes else {
        // qosd_probe_info carries the mode only; `qosd check` gives the kernel's reason.
        let reason = std::process::Command::new(&ctx.qosd)
            .arg("check")
            .output()
            .ok()
            .and_then(|out| {
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .find(|l| l.trim_start().starts_with(EPISODE_PROBE))
                    .map(|l| l.trim().to_owned())
            })
            .unwrap_or(m.episode_mode);
        return Outcome::Skip(format!(
            "episode sub-check not run, the probe is unavailable here: {reason}; the cpu.stat counters are checked by cpu_throttling_counters_match_cpu_stat"
        ));
    };
    let kernel = m.kernel[2];
    if kernel < 1.0 {
        return fail(format!(
            "the kernel throttled only {kernel:.3}s; the test cannot judge"
        ));
    }
    let rel = (episodes - kernel).abs() / kernel;
    let summary = format!(
        "episodes {episodes:.4}s vs cpu.stat throttled {kernel:.4}s ({:.1}% apart)",
        rel * 100.0
    );
    if rel > EPISODE_TOLERANCE {
        fail(format!("{summary}: more than 10% apart"))
    } else {
        Outcome::Pass(summary)
    }
}

fn measure(ctx: &Context) -> Result<Measured, String> {
    let agent = Agent::start(&ctx.qosd, Duration::from_secs(60))?;
    let layout = CgroupLayout::detect().map_err(|e| e.to_string())?;
    let cpu_root = layout
        .cpu_hierarchy()
        .ok_or("no cpu hierarchy mounted")?
        .to_owned();
    let v1 = layout.uses_v1_cpu_controller();
    let mut cgroups = TestCgroups::create("qosd-systest-throttle")?;
    let parent = cpu_root.join(&cgroups.name);
    if !v1 {
        enable_cpu_controller(&cpu_root)?;
        enable_cpu_controller(&parent)?;
    }
    cgroups.mkdir("limited")?;
    let dir = parent.join("limited");
    if v1 {
        write(&dir.join("cpu.cfs_period_us"), "100000")?;
        write(&dir.join("cpu.cfs_quota_us"), "20000")?;
    } else {
        write(&dir.join("cpu.max"), "20000 100000")?;
    }
    let exe = ctx.self_exe.clone();
    cgroups.spawn_in("limited", &exe, &["spin", SPIN_SECONDS])?;
    cgroups.wait_all()?;
    // Let the last episode end (the next period refill unthrottles) before comparing.
    std::thread::sleep(Duration::from_millis(300));

    let text = agent.scrape()?;
    let stat = std::fs::read_to_string(dir.join("cpu.stat"))
        .map_err(|e| format!("{}: {e}", dir.join("cpu.stat").display()))?;
    let field = |key: &str| {
        stat.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let throttled = if v1 {
        field("throttled_time").map(|ns| ns / 1e9)
    } else {
        field("throttled_usec").map(|us| us / 1e6)
    }
    .ok_or_else(|| format!("cpu.stat without throttled time:\n{stat}"))?;
    let kernel = [
        field("nr_periods").ok_or("cpu.stat without nr_periods")?,
        field("nr_throttled").ok_or("cpu.stat without nr_throttled")?,
        throttled,
    ];
    let labels = format!("cgroup=\"{}\"", cgroups.label("limited"));
    let value = |name: &str| sample_value(&text, name, &labels).unwrap_or(0.0);
    let qosd = [
        value("qosd_cpu_periods_total"),
        value("qosd_cpu_throttled_periods_total"),
        value("qosd_cpu_throttled_seconds_total"),
    ];
    let episode_mode = text
        .lines()
        .find(|l| {
            l.starts_with("qosd_probe_info{") && l.contains(&format!("probe=\"{EPISODE_PROBE}\""))
        })
        .unwrap_or("no qosd_probe_info line")
        .to_owned();
    let episodes = episode_mode
        .contains("mode=\"fentry\"")
        .then(|| value("qosd_cpu_throttle_episode_seconds_sum"));
    Ok(Measured {
        qosd,
        kernel,
        episodes,
        episode_mode,
    })
}

/// Adds the cpu controller to a v2 cgroup's children, unless it is already there.
fn enable_cpu_controller(dir: &std::path::Path) -> Result<(), String> {
    let file: PathBuf = dir.join("cgroup.subtree_control");
    let current = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    if current.split_whitespace().any(|c| c == "cpu") {
        return Ok(());
    }
    write(&file, "+cpu")
}

fn write(path: &std::path::Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("writing {value} to {}: {e}", path.display()))
}
