//! The image the Kubernetes system case has containerd run: Debian's static busybox with the
//! applets the test containers use, as an OCI layout archive built with umoci (no Docker
//! engine, no registry). Built once into the cache and reused; the systests find it in
//! `QOSD_TEST_IMAGE` (on the host, and copied into each guest that runs containerd).
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::image::{reset_dir, umoci};
use crate::setup;

/// The variable the systests read the archive's path from.
pub(crate) const ENV: &str = "QOSD_TEST_IMAGE";

/// busybox applets the containers call.
const APPLETS: &[&str] = &["sh", "sleep", "cat", "ls", "true", "echo"];

/// Bumped when the image's content changes, so an older cached archive is rebuilt.
const REVISION: u32 = 1;

/// The archive, built unless the cache has this revision already.
pub(crate) fn ensure(cache: &Path) -> Result<PathBuf> {
    let dir = cache.join("test-image");
    let archive = dir.join(format!("busybox-r{REVISION}.tar"));
    if archive.is_file() {
        return Ok(archive);
    }
    let busybox = Path::new("/bin/busybox");
    if !busybox.is_file() {
        bail!(
            "{} missing (Debian package busybox-static)",
            busybox.display()
        );
    }
    println!("setup: building the test image {}", archive.display());
    let work = dir.join("build");
    reset_dir(&work)?;
    let layout = work.join("layout");
    let bundle = work.join("bundle");
    // Tagged `1`: `ctr images import --base-name qosd.test/busybox` names it
    // `qosd.test/busybox:1`.
    let image = format!("{}:1", layout.display());
    umoci(&["init", "--layout"], &[&layout])?;
    umoci(&["new", "--image", &image], &[])?;
    umoci(&["unpack", "--image", &image], &[&bundle])?;
    let bin = bundle.join("rootfs/bin");
    std::fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    std::fs::copy(busybox, bin.join("busybox"))
        .with_context(|| format!("copying {}", busybox.display()))?;
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", bin.join(applet))
            .with_context(|| format!("linking {applet}"))?;
    }
    umoci(&["repack", "--image", &image], &[&bundle])?;
    umoci(
        &[
            "config",
            "--image",
            &image,
            "--config.cmd=/bin/sleep",
            "--config.cmd=86400",
        ],
        &[],
    )?;
    umoci(&["gc", "--layout"], &[&layout])?;
    let staged = dir.join("staging.tar");
    setup::run(
        Command::new("tar")
            .arg("-cf")
            .arg(&staged)
            .arg("-C")
            .arg(&layout)
            .args(["oci-layout", "index.json", "blobs"]),
    )
    .context("packing the test image")?;
    std::fs::rename(&staged, &archive)
        .with_context(|| format!("moving {} into place", archive.display()))?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(archive)
}
