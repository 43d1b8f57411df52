//! Guest kernels: Debian cloud kernels in `<cache>/kernels/<series>/vmlinuz`.
//!
//! A missing kernel is fetched with the private apt setup ([`super::apt`]): the newest version
//! of the `linux-image-cloud-amd64` metapackage in the series names the real image package,
//! which is downloaded and unpacked, and its `/boot/vmlinuz-*` kept. The release string is read
//! back from the image's boot header, so a kernel placed there by hand works the same way.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::GuestKernel;
use super::apt::Apt;

/// The metapackage whose versions (one per suite) depend on the current image packages.
const METAPACKAGE: &str = "linux-image-cloud-amd64";

/// A kernel series and the suites that carry it, in boot order.
struct Series {
    name: &'static str,
    suites: &'static str,
}

const SERIES: [Series; 3] = [
    Series {
        name: "5.10",
        suites: "bullseye / bullseye-security",
    },
    Series {
        name: "6.1",
        suites: "bookworm / bookworm-security",
    },
    Series {
        name: "6.12",
        suites: "trixie / trixie-security / bookworm-backports",
    },
];

/// Returns the 5.10, 6.1 and 6.12 guest kernels, fetching the missing ones. Without anything
/// missing this touches neither apt nor the network.
pub(crate) fn ensure_kernels(cache: &Path) -> Result<Vec<GuestKernel>> {
    let kernels = cache.join("kernels");
    let missing: Vec<&Series> = SERIES
        .iter()
        .filter(|s| !vmlinuz_path(&kernels, s.name).is_file())
        .collect();
    if !missing.is_empty() {
        fetch(cache, &kernels, &missing)?;
    }
    SERIES
        .iter()
        .map(|s| cached_kernel(&kernels, s.name))
        .collect()
}

fn vmlinuz_path(kernels: &Path, series: &str) -> PathBuf {
    kernels.join(series).join("vmlinuz")
}

fn cached_kernel(kernels: &Path, series: &str) -> Result<GuestKernel> {
    let vmlinuz = vmlinuz_path(kernels, series);
    let release = image_release(&vmlinuz)?;
    Ok(GuestKernel {
        series: series.to_owned(),
        release,
        vmlinuz,
    })
}

/// Updates the private index once and fetches each missing series.
fn fetch(cache: &Path, kernels: &Path, missing: &[&Series]) -> Result<()> {
    let apt = Apt::prepare(&cache.join("apt"))?;
    eprintln!(
        "xtask vm: updating the Debian kernel index in {}",
        cache.join("apt").display()
    );
    let update_report = apt.update()?;
    let stanzas = apt.show(METAPACKAGE).map_err(|e| {
        let targets = format!("{}/<series>/vmlinuz", kernels.display());
        missing_error(e, &apt, update_report.as_deref(), "any suite", &targets)
    })?;
    let candidates = parse_candidates(&stanzas);
    for series in missing {
        let target = vmlinuz_path(kernels, series.name);
        let result = newest(&candidates, series.name).and_then(|candidate| {
            eprintln!(
                "xtask vm: fetching {} {}",
                candidate.package, candidate.version
            );
            install(&apt, candidate, &target)
        });
        result.map_err(|e| {
            let suites = format!("{} ({} {}.x)", series.suites, METAPACKAGE, series.name);
            missing_error(
                e,
                &apt,
                update_report.as_deref(),
                &suites,
                &target.display(),
            )
        })?;
    }
    Ok(())
}

/// Wraps a fetch failure with what is missing and how to provide the kernel by hand.
fn missing_error(
    error: anyhow::Error,
    apt: &Apt,
    update_report: Option<&str>,
    suites: &str,
    target: &dyn std::fmt::Display,
) -> anyhow::Error {
    let mut message = format!(
        "cannot fetch a guest kernel from {suites}. Provide one by placing a Debian cloud \
         kernel image (the package's /boot/vmlinuz-*) at {target}"
    );
    if let Some(update) = update_report {
        message.push_str(&format!(". {}", update.trim_end_matches('.')));
        if ["NO_PUBKEY", "EXPKEYSIG", "not signed", "signature"]
            .iter()
            .any(|w| update.contains(w))
        {
            message.push_str(&format!(". To verify the archives: {}", apt.keyring_hint()));
        }
    }
    error.context(message)
}

/// One version of the metapackage and the image package it depends on.
#[derive(Debug, PartialEq, Eq)]
struct Candidate {
    version: String,
    package: String,
}

/// Reads `Version:` and the `linux-image-*` dependency from each `apt-cache show` stanza.
fn parse_candidates(stanzas: &str) -> Vec<Candidate> {
    stanzas
        .split("\n\n")
        .filter_map(|stanza| {
            let version = field(stanza, "Version")?;
            let package = field(stanza, "Depends")?
                .split([',', '|'])
                .filter_map(|dep| dep.split_whitespace().next())
                .find(|name| name.starts_with("linux-image-") && *name != METAPACKAGE)?;
            Some(Candidate {
                version: version.to_owned(),
                package: package.to_owned(),
            })
        })
        .collect()
}

fn field<'a>(stanza: &'a str, name: &str) -> Option<&'a str> {
    stanza.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key == name).then(|| value.trim())
    })
}

/// The highest candidate version of `series` (versions "<series>.<patch>-<debian>").
fn newest<'a>(candidates: &'a [Candidate], series: &str) -> Result<&'a Candidate> {
    let prefix = format!("{series}.");
    let mut best: Option<&Candidate> = None;
    for candidate in candidates.iter().filter(|c| c.version.starts_with(&prefix)) {
        best = match best {
            Some(b) if !version_greater(&candidate.version, &b.version)? => Some(b),
            _ => Some(candidate),
        };
    }
    best.with_context(|| format!("the private index has no {METAPACKAGE} version {series}.x"))
}

/// Debian version order, as `dpkg --compare-versions` defines it.
fn version_greater(a: &str, b: &str) -> Result<bool> {
    let status = Command::new("dpkg")
        .args(["--compare-versions", a, "gt", b])
        .status()
        .with_context(|| format!("running dpkg --compare-versions {a} gt {b}"))?;
    match status.code() {
        Some(0) => Ok(true),
        Some(1) => Ok(false),
        _ => bail!("dpkg --compare-versions {a} gt {b} failed ({status})"),
    }
}

/// Downloads the image package, unpacks it and moves its vmlinuz to `target`.
fn install(apt: &Apt, candidate: &Candidate, target: &Path) -> Result<()> {
    let dir = apt.download_dir()?;
    apt.download(&candidate.package, &candidate.version, &dir)?;
    let deb = single_deb(&dir)?;
    let unpacked = dir.join("unpacked");
    let status = Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(&unpacked)
        .status()
        .with_context(|| format!("running dpkg-deb -x {}", deb.display()))?;
    if !status.success() {
        bail!(
            "dpkg-deb -x {} {} failed ({status})",
            deb.display(),
            unpacked.display()
        );
    }
    let image = boot_image(&unpacked.join("boot"))?;
    check_release(&image, &candidate.package)?;
    place(&image, target)?;
    fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))
}

fn single_deb(dir: &Path) -> Result<PathBuf> {
    let debs = files_in(dir, |name| name.ends_with(".deb"))?;
    match debs.as_slice() {
        [deb] => Ok(deb.clone()),
        _ => bail!(
            "expected one .deb in {} after apt-get download, found {debs:?}",
            dir.display()
        ),
    }
}

fn boot_image(boot: &Path) -> Result<PathBuf> {
    let images = files_in(boot, |name| name.starts_with("vmlinuz-"))?;
    match images.as_slice() {
        [image] => Ok(image.clone()),
        _ => bail!(
            "expected one vmlinuz-* in {}, found {images:?}",
            boot.display()
        ),
    }
}

fn files_in(dir: &Path, keep: impl Fn(&str) -> bool) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry
            .with_context(|| format!("listing {}", dir.display()))?
            .path();
        if path.file_name().and_then(|n| n.to_str()).is_some_and(&keep) {
            files.push(path);
        }
    }
    Ok(files)
}

/// The image's own release must match the package name (`linux-image-<release>`).
fn check_release(image: &Path, package: &str) -> Result<()> {
    let release = image_release(image)?;
    if package.strip_prefix("linux-image-") != Some(release.as_str()) {
        bail!(
            "{} reports release {release}, but came from {package}",
            image.display()
        );
    }
    Ok(())
}

/// Copies the image next to `target` and renames it, so an interrupted fetch never leaves a
/// partial file that a later run would take for a cached kernel.
fn place(image: &Path, target: &Path) -> Result<()> {
    let Some(dir) = target.parent() else {
        bail!("kernel path {} has no parent directory", target.display());
    };
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let partial = target.with_extension("partial");
    fs::copy(image, &partial)
        .with_context(|| format!("copying {} to {}", image.display(), partial.display()))?;
    fs::rename(&partial, target)
        .with_context(|| format!("renaming {} to {}", partial.display(), target.display()))
}

/// The release string of an x86 bzImage, read from its boot protocol header: "HdrS" at 0x202,
/// and at 0x20e the offset (from 0x200) of a string starting with the release.
pub(super) fn image_release(image: &Path) -> Result<String> {
    let bytes =
        fs::read(image).with_context(|| format!("reading kernel image {}", image.display()))?;
    release_from_header(&bytes).with_context(|| {
        format!(
            "{} is not an x86 bzImage with a version string",
            image.display()
        )
    })
}

fn release_from_header(bytes: &[u8]) -> Option<String> {
    if bytes.get(0x202..0x206)? != b"HdrS" {
        return None;
    }
    let pointer: [u8; 2] = bytes.get(0x20e..0x210)?.try_into().ok()?;
    let start = usize::from(u16::from_le_bytes(pointer)) + 0x200;
    let rest = bytes.get(start..)?;
    let end = rest
        .iter()
        .position(|b| *b == 0 || b.is_ascii_whitespace())?;
    let release = std::str::from_utf8(rest.get(..end)?).ok()?;
    (!release.is_empty()).then(|| release.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_from_apt_cache_show() {
        let show = "Package: linux-image-cloud-amd64\nVersion: 6.1.192-3\n\
                    Depends: linux-image-6.1.0-57-cloud-amd64 (= 6.1.192-3)\n\n\
                    Package: linux-image-cloud-amd64\nVersion: 5.10.262-1\n\
                    Depends: linux-image-5.10.0-46-cloud-amd64 (= 5.10.262-1)\n";
        let candidates = parse_candidates(show);
        assert_eq!(candidates.len(), 2);
        assert_eq!(candidates[0].package, "linux-image-6.1.0-57-cloud-amd64");
        assert_eq!(candidates[1].version, "5.10.262-1");
    }

    #[test]
    fn release_from_a_boot_header() {
        let mut image = vec![0_u8; 0x400];
        image[0x202..0x206].copy_from_slice(b"HdrS");
        image[0x20e..0x210].copy_from_slice(&0x100_u16.to_le_bytes());
        let version = b"6.1.0-41-cloud-amd64 (debian-kernel@lists.debian.org) #1\0";
        image[0x300..0x300 + version.len()].copy_from_slice(version);
        assert_eq!(
            release_from_header(&image).as_deref(),
            Some("6.1.0-41-cloud-amd64")
        );
        assert_eq!(release_from_header(&image[..0x100]), None);
    }
}
