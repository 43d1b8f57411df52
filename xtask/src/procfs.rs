//! Measuring a process from the outside, for the benchmarks: its CPU time and RSS from
//! `/proc`, waiting until it serves HTTP, stopping it with a signal, and one HTTP GET timed.
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// utime + stime of `pid` in seconds.
pub(crate) fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the `(comm)`, which may contain spaces: state is field 3, utime 14.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<f64> {
        let value: u64 = fields
            .get(i)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("/proc/{pid}/stat field {}", i + 3))?;
        #[expect(clippy::cast_precision_loss, reason = "clock ticks")]
        Ok(value as f64)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    #[expect(clippy::cast_precision_loss, reason = "ticks per second, about 100")]
    let hz = if hz > 0 { hz as f64 } else { 100.0 };
    Ok((ticks(11)? + ticks(12)?) / hz)
}

pub(crate) fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("VmRSS of {pid}"))
}

pub(crate) fn free_port() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?)
}

/// Waits until the agent accepts connections on `addr` (it attaches its probes first).
pub(crate) fn wait_until_serving(addr: SocketAddr, agent: &mut Child) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        if let Some(status) = agent.try_wait()? {
            bail!("qosd exited before serving: {status}");
        }
        if Instant::now() > deadline {
            bail!("qosd did not serve on {addr} within 60 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

pub(crate) fn stop(child: &mut Child, signal: i32) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(pid, signal) };
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// `GET path` on `addr`: the body and how long the whole exchange took.
pub(crate) fn get(addr: SocketAddr, path: &str) -> Result<(Vec<u8>, Duration)> {
    use std::io::{Read as _, Write as _};
    let started = Instant::now();
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .with_context(|| format!("reading {path} from {addr}"))?;
    let took = started.elapsed();
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .with_context(|| format!("no HTTP header end in the answer of {addr}{path}"))?;
    let head = String::from_utf8_lossy(&response[..split]);
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("{addr}{path}: {}", head.lines().next().unwrap_or_default());
    }
    let mut body = response[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body)?;
    }
    Ok((body, took))
}

/// The payload of a chunked HTTP/1.1 body.
fn dechunk(mut raw: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("chunk size line")?;
        let size_text = String::from_utf8_lossy(&raw[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("chunk size {size_text:?}"))?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        let chunk = raw.get(..size).context("chunk shorter than its size")?;
        out.extend_from_slice(chunk);
        raw = raw.get(size + 2..).context("chunk without its line end")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_are_joined() {
        let raw = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n";
        assert_eq!(dechunk(raw).expect("chunked"), b"hello, world");
        assert!(dechunk(b"5\r\nhel").is_err());
    }
}
