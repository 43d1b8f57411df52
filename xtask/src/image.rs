//! `cargo xtask image`: qosd's OCI image, built and checked without a Docker engine.
//!
//! The release `qosd` (built as `cargo xtask bench` builds it) goes into a one-layer image
//! holding what it needs to run and nothing else: the binary at [`BINARY`], every shared library
//! `ldd` lists at its host path, and the dynamic loader (no shell, no package manager). umoci
//! builds it: a layout, an empty image, unpacked to a bundle, the files copied into its root
//! file system, repacked, and the configuration set (entrypoint `qosd`, command `run`, `PATH`,
//! the metrics port, OCI labels), every timestamp [`EPOCH`] so that the same binary gives the
//! same digest. The layout is packed as [`archive_path`]
//! (`target/qosd-image.tar`); its index names the image `docker.io/library/qosd:<version>`,
//! the name kubelet looks up for `image: qosd:<version>`, so that
//! `ctr -n k8s.io images import` on a node makes it available to the DaemonSet.
//!
//! Verified for real: the archive is unpacked by umoci into a fresh bundle whose configuration
//! must be `qosd run`, and `qosd --help` and `qosd --version` run inside it with runc (the
//! runtime containerd starts pods with; read-only root file system), their output checked.
//! (Not crun: 1.8 refuses this host's hybrid cgroups, "cgroups in hybrid mode not supported".)
//! `cargo xtask image --check` verifies the existing archive without building.
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use crate::{bench, setup, vm};

/// The image's tag: the workspace version, which is also qosd's (`qosd --version` is checked
/// against it).
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The image's repository name (`qosd:<version>` in the DaemonSet).
const REPOSITORY: &str = "qosd";
/// Where the binary is in the image.
const BINARY: &str = "/usr/local/bin/qosd";
/// The annotation containerd's import reads the image's name from.
const CONTAINERD_NAME: &str = "io.containerd.image.name";
/// The OCI annotation holding the tag in the layout's index.
const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// Every timestamp in the image (file times, `created`, history): the build is reproducible, so
/// the same binary gives the same digest.
const EPOCH: &str = "1970-01-01T00:00:00Z";
/// Empty directories of the root file system: mount points the runtimes and kubelet use
/// (they create missing ones themselves, except on a read-only root) and a scratch `/tmp`.
const DIRECTORIES: [(&str, u32); 5] = [
    ("etc", 0o755),
    ("proc", 0o555),
    ("sys", 0o555),
    ("dev", 0o755),
    ("tmp", 0o1777),
];

/// A built and verified image.
#[derive(Debug)]
pub(crate) struct Built {
    /// The release qosd the image holds.
    pub binary: PathBuf,
    pub archive: PathBuf,
    pub size: u64,
    pub digest: String,
    pub build: Duration,
    pub pack: Duration,
    pub verify: Duration,
}

impl Built {
    /// One line: where, how big, which digest, what ran in it and how long each step took.
    pub(crate) fn summary(&self) -> String {
        format!(
            "{} {} {} ({}); qosd --help and --version ran in it under runc; release build {:.1}s, image {:.1}s, run {:.1}s",
            self.archive.display(),
            mib(self.size),
            self.digest,
            full_name(),
            self.build.as_secs_f64(),
            self.pack.as_secs_f64(),
            self.verify.as_secs_f64()
        )
    }
}

/// `cargo xtask image [--check]`.
pub(crate) fn run(check_only: bool) -> Result<()> {
    if check_only {
        let archive = archive_path();
        if !archive.is_file() {
            bail!(
                "{} does not exist; `cargo xtask image` builds it",
                archive.display()
            );
        }
        require_root()?;
        setup::image_tools()?;
        let started = Instant::now();
        let digest = verify(&archive)?;
        println!(
            "image {}: {} {digest}; qosd --help and --version ran in it under runc ({}s)",
            archive.display(),
            mib(file_size(&archive)?),
            started.elapsed().as_secs()
        );
        return Ok(());
    }
    let built = build_and_verify()?;
    println!("\nimage:   {}", built.archive.display());
    println!("size:    {} ({} bytes)", mib(built.size), built.size);
    println!("digest:  {}", built.digest);
    println!("name:    {} (image: qosd:{VERSION})", full_name());
    println!("checked: qosd --help and qosd --version ran inside it under runc");
    println!(
        "time:    release build {:.1}s, image {:.1}s, run {:.1}s",
        built.build.as_secs_f64(),
        built.pack.as_secs_f64(),
        built.verify.as_secs_f64()
    );
    println!(
        "on a node: ctr -n k8s.io images import {} (deploy/README.md)",
        built.archive.display()
    );
    Ok(())
}

/// Builds the release qosd, packs the image archive and verifies it.
pub(crate) fn build_and_verify() -> Result<Built> {
    require_root()?;
    let toolchain = setup::image_tools()?;
    let started = Instant::now();
    let binary = bench::build_release_qosd(&toolchain)?;
    let build = started.elapsed();
    let started = Instant::now();
    let archive = archive_path();
    pack(&binary, &archive)?;
    let pack = started.elapsed();
    let started = Instant::now();
    let digest = verify(&archive)?;
    Ok(Built {
        binary,
        size: file_size(&archive)?,
        archive,
        digest,
        build,
        pack,
        verify: started.elapsed(),
    })
}

/// The image archive: `<target>/qosd-image.tar`.
pub(crate) fn archive_path() -> PathBuf {
    crate::target_dir().join("qosd-image.tar")
}

fn work_dir() -> PathBuf {
    crate::target_dir().join("qosd-image")
}

/// The image's full name, as containerd stores the image kubelet asks for as `qosd:<version>`.
fn full_name() -> String {
    format!("docker.io/library/{REPOSITORY}:{VERSION}")
}

fn require_root() -> Result<()> {
    if !crate::is_root() {
        bail!(
            "building and running the image needs root (umoci unpack keeps file owners; runc runs it)"
        );
    }
    Ok(())
}

/// Builds the OCI layout from `binary` and packs it into `archive`.
fn pack(binary: &Path, archive: &Path) -> Result<()> {
    let work = work_dir().join("build");
    reset_dir(&work)?;
    let layout = work.join("layout");
    let bundle = work.join("bundle");
    let image = format!("{}:{VERSION}", layout.display());
    println!("== image: {image}");
    umoci(&["init", "--layout"], &[&layout])?;
    umoci(&["new", "--image", &image], &[])?;
    umoci(&["unpack", "--image", &image], &[&bundle])?;
    let rootfs = bundle.join("rootfs");
    vm::install_with_libraries(&rootfs, binary, BINARY)
        .context("copying qosd and its shared libraries into the image")?;
    for (dir, mode) in DIRECTORIES {
        let path = rootfs.join(dir);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("setting the mode of {}", path.display()))?;
    }
    // File times into the layer as EPOCH (`touch -h`: symlinks themselves, not their targets).
    setup::run(
        Command::new("find")
            .arg(&rootfs)
            .args(["-exec", "touch", "-h", "-d", EPOCH, "{}", "+"]),
    )
    .context("setting the image's file times")?;
    umoci(
        &[
            "repack",
            "--image",
            &image,
            "--history.created",
            EPOCH,
            "--history.created_by",
            "cargo xtask image: qosd and its shared libraries",
        ],
        &[&bundle],
    )?;
    let architecture = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let labels = [
        format!("org.opencontainers.image.title={REPOSITORY}"),
        format!("org.opencontainers.image.version={VERSION}"),
        "org.opencontainers.image.description=qosd: Linux node agent measuring pods' cgroups with eBPF beside kubelet".to_owned(),
        "org.opencontainers.image.licenses=Apache-2.0".to_owned(),
    ];
    let mut config = vec![
        "config".to_owned(),
        "--image".to_owned(),
        image,
        format!("--config.entrypoint={BINARY}"),
        "--config.cmd=run".to_owned(),
        "--config.env=PATH=/usr/local/bin:/usr/bin:/bin".to_owned(),
        "--config.workingdir=/".to_owned(),
        "--config.exposedports=9464/tcp".to_owned(),
        "--os=linux".to_owned(),
        format!("--architecture={architecture}"),
        format!("--created={EPOCH}"),
        format!("--history.created={EPOCH}"),
        "--history.created_by=cargo xtask image: entrypoint qosd, command run".to_owned(),
    ];
    config.extend(labels.iter().map(|l| format!("--config.label={l}")));
    let config: Vec<&str> = config.iter().map(String::as_str).collect();
    umoci(&config, &[])?;
    umoci(&["gc", "--layout"], &[&layout])?;
    name_for_containerd(&layout.join("index.json"))?;
    if archive.exists() {
        std::fs::remove_file(archive)
            .with_context(|| format!("removing the old {}", archive.display()))?;
    }
    setup::run(
        Command::new("tar")
            .args([
                "--sort=name",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
                "--mtime=@0",
                "-cf",
            ])
            .arg(archive)
            .arg("-C")
            .arg(&layout)
            .args(["oci-layout", "index.json", "blobs"]),
    )
    .context("packing the OCI layout")?;
    Ok(())
}

/// Adds containerd's name annotation to the index entry of our tag: `ctr images import` then
/// stores the image under [`full_name`] (a bare OCI tag such as `0.1.0` is no image name).
fn name_for_containerd(index_path: &Path) -> Result<()> {
    let mut index = read_json(index_path)?;
    let manifests = index
        .get_mut("manifests")
        .and_then(Value::as_array_mut)
        .context("index.json has no manifests")?;
    let mut named = 0;
    for manifest in manifests {
        if manifest.pointer(&format!("/annotations/{}", REF_NAME.replace('/', "~1")))
            == Some(&Value::from(VERSION))
            && let Some(annotations) = manifest
                .get_mut("annotations")
                .and_then(Value::as_object_mut)
        {
            annotations.insert(CONTAINERD_NAME.to_owned(), Value::from(full_name()));
            named += 1;
        }
    }
    if named != 1 {
        bail!(
            "{}: expected one manifest tagged {VERSION}, found {named}",
            index_path.display()
        );
    }
    write_json(index_path, &index)
}

/// Unpacks `archive` into a fresh bundle and runs `qosd --help` and `qosd --version` in it
/// with runc; returns the image's manifest digest.
fn verify(archive: &Path) -> Result<String> {
    let work = work_dir().join("check");
    reset_dir(&work)?;
    let layout = work.join("layout");
    std::fs::create_dir_all(&layout).with_context(|| format!("creating {}", layout.display()))?;
    setup::run(
        Command::new("tar")
            .arg("-xf")
            .arg(archive)
            .arg("-C")
            .arg(&layout),
    )
    .with_context(|| format!("unpacking {}", archive.display()))?;
    let digest = manifest_digest(&read_json(&layout.join("index.json"))?)?;
    let bundle = work.join("bundle");
    umoci(
        &[
            "unpack",
            "--image",
            &format!("{}:{VERSION}", layout.display()),
        ],
        &[&bundle],
    )?;
    let config_path = bundle.join("config.json");
    let mut config = read_json(&config_path)?;
    let args = config.pointer("/process/args").cloned();
    if args != Some(serde_json::json!([BINARY, "run"])) {
        bail!("the image runs {args:?}, not [\"{BINARY}\", \"run\"]");
    }
    let help = run_in_bundle(&bundle, &mut config, "--help")?;
    if !help.contains("Usage: qosd") || !help.contains("run") {
        bail!("`qosd --help` in the image printed something else:\n{help}");
    }
    let version = run_in_bundle(&bundle, &mut config, "--version")?;
    if version.trim() != format!("qosd {VERSION}") {
        bail!(
            "`qosd --version` in the image printed {:?}, expected \"qosd {VERSION}\"",
            version.trim()
        );
    }
    println!(
        "image check: `qosd --help` ({} lines) and `qosd --version` ({}) ran in {} under runc",
        help.lines().count(),
        version.trim(),
        archive.display()
    );
    Ok(digest)
}

/// The digest of the manifest tagged [`VERSION`] and named for containerd.
fn manifest_digest(index: &Value) -> Result<String> {
    let manifests = index
        .get("manifests")
        .and_then(Value::as_array)
        .context("index.json has no manifests")?;
    let ours: Vec<&Value> = manifests
        .iter()
        .filter(|m| {
            m.get("annotations").and_then(|a| a.get(REF_NAME)) == Some(&Value::from(VERSION))
        })
        .collect();
    let [manifest] = ours.as_slice() else {
        bail!(
            "index.json: expected one manifest tagged {VERSION}, found {}",
            ours.len()
        );
    };
    let name = manifest
        .get("annotations")
        .and_then(|a| a.get(CONTAINERD_NAME))
        .and_then(Value::as_str);
    if name != Some(full_name().as_str()) {
        bail!(
            "index.json: {CONTAINERD_NAME} is {name:?}, expected {}",
            full_name()
        );
    }
    manifest
        .get("digest")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .context("index.json: the manifest has no digest")
}

/// Runs `qosd <arg>` as the bundle's process with runc and returns its stdout.
fn run_in_bundle(bundle: &Path, config: &mut Value, arg: &str) -> Result<String> {
    config["process"]["args"] = serde_json::json!([BINARY, arg]);
    config["process"]["terminal"] = Value::Bool(false);
    config["root"]["readonly"] = Value::Bool(true);
    write_json(&bundle.join("config.json"), config)?;
    let id = format!("qosd-image-check-{}", std::process::id());
    let out = Command::new("runc")
        .args(["run", "--bundle"])
        .arg(bundle)
        .arg(&id)
        .stdin(Stdio::null())
        .output()
        .context("starting runc")?;
    if !out.status.success() {
        bail!(
            "runc run (qosd {arg}) failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(crate) fn umoci(args: &[&str], paths: &[&Path]) -> Result<()> {
    let mut cmd = Command::new("umoci");
    cmd.args(args).args(paths);
    setup::run(&mut cmd).context("umoci (Debian's umoci package)")
}

fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

fn write_json(path: &Path, value: &Value) -> Result<()> {
    std::fs::write(path, serde_json::to_vec(value)?)
        .with_context(|| format!("writing {}", path.display()))
}

pub(crate) fn reset_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

fn file_size(path: &Path) -> Result<u64> {
    Ok(std::fs::metadata(path)
        .with_context(|| format!("reading the size of {}", path.display()))?
        .len())
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(annotations: &Value) -> Value {
        serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": "sha256:abc",
                "size": 1,
                "annotations": annotations,
            }],
        })
    }

    #[test]
    fn the_digest_is_read_only_from_our_named_tag() {
        let named = index(&serde_json::json!({
            REF_NAME: VERSION,
            CONTAINERD_NAME: full_name(),
        }));
        assert_eq!(manifest_digest(&named).unwrap(), "sha256:abc");
        let unnamed = index(&serde_json::json!({ REF_NAME: VERSION }));
        assert!(manifest_digest(&unnamed).is_err());
        let other_tag =
            index(&serde_json::json!({ REF_NAME: "latest", CONTAINERD_NAME: full_name() }));
        assert!(manifest_digest(&other_tag).is_err());
    }

    #[test]
    fn the_tag_gets_containerds_name() {
        let dir = std::env::temp_dir().join(format!("xtask-image-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("index.json");
        write_json(&path, &index(&serde_json::json!({ REF_NAME: VERSION }))).unwrap();
        name_for_containerd(&path).unwrap();
        let named = read_json(&path).unwrap();
        assert_eq!(manifest_digest(&named).unwrap(), "sha256:abc");
        assert_eq!(full_name(), format!("docker.io/library/qosd:{VERSION}"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
