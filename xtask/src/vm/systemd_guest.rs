//! The systemd guest: the same initramfs with the host's systemd (252 on Debian bookworm) and
//! D-Bus daemon in it, booted with systemd as PID 1 on cgroup v2. `/init` hands over to
//! systemd when `/etc/qosd/systemd` exists; systemd starts the system bus and then
//! `qosd-tests.service`, which runs the command like `/init` does in the other guests, prints
//! the exit marker on the serial console and powers the machine off.
//!
//! Only what that needs is installed: systemd, systemctl, dbus-daemon (with their shared
//! libraries), the bus's configuration and systemd's policy on it, the D-Bus units, and the
//! host's target and slice units (the units above depend on `sysinit.target`,
//! `sockets.target` and the like, which must at least exist). No journald, udev or logind:
//! services write to the console.
use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

use super::initramfs::{install_file_as_is, install_with_libraries, write_guest_file};

/// The marker `/init` looks for.
pub(super) const MARKER: &str = "etc/qosd/systemd";

/// Host programs the systemd guest runs.
const PROGRAMS: [&str; 4] = [
    "/lib/systemd/systemd",
    "/usr/bin/systemctl",
    "/usr/bin/systemd-run",
    "/usr/bin/dbus-daemon",
];

/// Host files copied as they are.
const FILES: [&str; 4] = [
    "/usr/share/dbus-1/system.conf",
    "/usr/share/dbus-1/system.d/org.freedesktop.systemd1.conf",
    "/lib/systemd/system/dbus.service",
    "/lib/systemd/system/dbus.socket",
];

/// The test service: after the bus, on the serial console, the machine off when it ends.
const TEST_SERVICE: &str = "[Unit]
Description=qosd system tests
Requires=dbus.socket
Wants=dbus.service
After=dbus.service

[Service]
Type=oneshot
ExecStart=/bin/sh /etc/qosd/systemd-run.sh
StandardInput=null
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS0
";

/// What systemd starts: the tests (and the bus they pull in).
const DEFAULT_TARGET: &str = "[Unit]
Description=qosd test guest
Wants=qosd-tests.service dbus.socket
";

/// The command's wrapper in the systemd guest: the mounts systemd does not make without its
/// usual units, the same files and loopback as `/init` sets up, the command, the marker.
const RUN_SCRIPT: &str = r#"#!/bin/sh
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
export HOME=/root
# The console is a terminal: no pager for systemctl and friends.
export SYSTEMD_PAGER=cat SYSTEMD_COLORS=0
for fs in bpf:/sys/fs/bpf tracefs:/sys/kernel/tracing debugfs:/sys/kernel/debug; do
    type=${fs%%:*}; target=${fs#*:}
    grep -q " $target " /proc/mounts || mount -t "$type" "$type" "$target" ||
        echo "qosd-init: cannot mount $type on $target"
done
[ -e /etc/hosts ] || echo "127.0.0.1 localhost" > /etc/hosts
[ -e /etc/resolv.conf ] || : > /etc/resolv.conf
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up || echo "qosd-init: cannot bring up lo"
echo "qosd-init: systemd $(systemctl --version | head -n 1 | cut -d' ' -f2) is PID 1"
cd /
/bin/sh -c "$(cat /etc/qosd/command)" < /dev/null
status=$?
echo "QOSD-GUEST-EXIT $status"
sync
poweroff -f
"#;

/// Installs systemd, the bus and the units into the guest tree at `root`.
pub(super) fn install(root: &Path) -> Result<()> {
    for program in PROGRAMS {
        install_with_libraries(root, Path::new(program), program)
            .with_context(|| format!("{program} (apt-get install systemd dbus)"))?;
    }
    for file in FILES {
        install_file_as_is(root, Path::new(file), file)?;
    }
    for entry in fs::read_dir("/lib/systemd/system").context("reading /lib/systemd/system")? {
        let path = entry?.path();
        let is_unit = path
            .extension()
            .is_some_and(|e| e == "target" || e == "slice");
        if is_unit && path.is_file() {
            let guest = format!(
                "/lib/systemd/system/{}",
                path.file_name().unwrap_or_default().to_string_lossy()
            );
            install_file_as_is(root, &path, &guest)?;
        }
    }
    // dbus-daemon drops to this user; systemd and dbus read the machine id, which systemd
    // writes at boot when the file is empty.
    write_guest_file(
        root,
        "/etc/passwd",
        "root:x:0:0:root:/root:/bin/sh\nmessagebus:x:100:101::/nonexistent:/bin/false\n",
        0o644,
    )?;
    write_guest_file(root, "/etc/group", "root:x:0:\nmessagebus:x:101:\n", 0o644)?;
    write_guest_file(root, "/etc/machine-id", "", 0o444)?;
    fs::create_dir_all(root.join("etc/dbus-1/system.d")).context("creating /etc/dbus-1")?;
    fs::create_dir_all(root.join("var/lib/dbus")).context("creating /var/lib/dbus")?;
    // As on every systemd distribution: D-Bus clients look for /var/run/dbus/system_bus_socket.
    std::os::unix::fs::symlink("/run", root.join("var/run")).context("linking /var/run")?;
    write_guest_file(
        root,
        "/etc/systemd/system/qosd-tests.service",
        TEST_SERVICE,
        0o644,
    )?;
    write_guest_file(
        root,
        "/etc/systemd/system/default.target",
        DEFAULT_TARGET,
        0o644,
    )?;
    write_guest_file(root, "/etc/qosd/systemd-run.sh", RUN_SCRIPT, 0o755)?;
    write_guest_file(root, &format!("/{MARKER}"), "", 0o644)
}
