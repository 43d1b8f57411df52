//! A private apt setup under `<cache>/apt/`, used only to download Debian kernel packages.
//!
//! apt-get and apt-cache run with `APT_CONFIG=<cache>/apt/apt.conf`. apt reads that file
//! before anything in /etc, and it points every directory apt would use (sources, preferences,
//! `apt.conf.d`, trusted keys, index lists, caches, dpkg status) at the private tree or at
//! /dev/null. So the host's apt sources and state are never read or written, and the host's
//! `apt.conf.d` hooks (`APT::Update::Post-Invoke` and friends) do not run for our updates.
//! To inspect the index by hand: `APT_CONFIG=<cache>/apt/apt.conf apt-cache policy <package>`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, Result, bail};

/// The archive keyring Debian's debian-archive-keyring package installs.
const SYSTEM_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
/// A keyring placed at this name in the private apt directory takes precedence (see
/// [`Apt::keyring_hint`]).
const LOCAL_KEYRING: &str = "debian-archive-keyring.gpg";

/// (archive, suite) pairs of the private sources list: where the three kernel series live.
const SOURCES: [(&str, &str); 7] = [
    ("http://deb.debian.org/debian", "bullseye"),
    ("http://deb.debian.org/debian-security", "bullseye-security"),
    ("http://deb.debian.org/debian", "bookworm"),
    ("http://deb.debian.org/debian-security", "bookworm-security"),
    ("http://deb.debian.org/debian", "bookworm-backports"),
    ("http://deb.debian.org/debian", "trixie"),
    ("http://deb.debian.org/debian-security", "trixie-security"),
];

/// The private apt tree and the configuration file that selects it.
pub(super) struct Apt {
    root: PathBuf,
    config: PathBuf,
}

impl Apt {
    /// Creates the private tree under `root` and (re)writes its sources list and configuration.
    pub(super) fn prepare(root: &Path) -> Result<Self> {
        for dir in ["lists/partial", "cache/archives/partial", "downloads"] {
            let dir = root.join(dir);
            fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let apt = Self {
            root: root.to_path_buf(),
            config: root.join("apt.conf"),
        };
        let keyring = apt.keyring()?;
        write(&root.join("sources.list"), &sources_list(&keyring))?;
        write(&apt.config, &apt_conf(root))?;
        Ok(apt)
    }

    /// The keyring that verifies the archives: a local override, else the system's.
    fn keyring(&self) -> Result<PathBuf> {
        let local = self.root.join(LOCAL_KEYRING);
        if local.is_file() {
            return Ok(local);
        }
        let system = PathBuf::from(SYSTEM_KEYRING);
        if system.is_file() {
            return Ok(system);
        }
        bail!("no Debian archive keyring: {}", self.keyring_hint());
    }

    /// How to provide a keyring that verifies every suite in the sources list.
    pub(super) fn keyring_hint(&self) -> String {
        format!(
            "install debian-archive-keyring, or place the debian-archive-keyring.gpg of a newer \
             debian-archive-keyring package (`apt-get download debian-archive-keyring` from the \
             newest Debian release, then `dpkg-deb -x` it) at {}",
            self.root.join(LOCAL_KEYRING).display()
        )
    }

    /// A directory for downloads, emptied first.
    pub(super) fn download_dir(&self) -> Result<PathBuf> {
        let dir = self.root.join("downloads");
        if dir.exists() {
            fs::remove_dir_all(&dir).with_context(|| format!("emptying {}", dir.display()))?;
        }
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(dir)
    }

    /// `apt-get update` on the private sources. apt reports an unreachable or unverifiable
    /// suite as a warning and goes on with the others, so what it said is returned as text
    /// (for later error messages) rather than as an error.
    pub(super) fn update(&self) -> Result<Option<String>> {
        let output = self.run("apt-get", &["-q", "update"], None)?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stderr = stderr.trim();
        if output.status.success() && stderr.is_empty() {
            return Ok(None);
        }
        Ok(Some(format!(
            "`apt-get update` ({}) said: {stderr}",
            output.status
        )))
    }

    /// `apt-cache show <package>`: one stanza per available version.
    pub(super) fn show(&self, package: &str) -> Result<String> {
        let output = self.run("apt-cache", &["show", package], None)?;
        if !output.status.success() {
            bail!(
                "`apt-cache show {package}` failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// `apt-get download <package>=<version>` into `dir` (apt verifies it against the index).
    pub(super) fn download(&self, package: &str, version: &str, dir: &Path) -> Result<()> {
        let spec = format!("{package}={version}");
        let output = self.run("apt-get", &["-q", "download", &spec], Some(dir))?;
        if !output.status.success() {
            bail!(
                "`apt-get download {spec}` failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(())
    }

    fn run(&self, program: &str, args: &[&str], cwd: Option<&Path>) -> Result<Output> {
        let mut command = Command::new(program);
        command.args(args).env("APT_CONFIG", &self.config);
        if let Some(cwd) = cwd {
            command.current_dir(cwd);
        }
        command.output().with_context(|| {
            format!(
                "running APT_CONFIG={} {program} {}",
                self.config.display(),
                args.join(" ")
            )
        })
    }
}

fn write(path: &Path, contents: &str) -> Result<()> {
    fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

fn sources_list(keyring: &Path) -> String {
    let mut list =
        String::from("# Written by `cargo xtask vm`: the suites of the guest kernels.\n");
    for (archive, suite) in SOURCES {
        list.push_str(&format!(
            "deb [signed-by={}] {archive} {suite} main\n",
            keyring.display()
        ));
    }
    list
}

fn apt_conf(root: &Path) -> String {
    let dir = |name: &str| root.join(name).display().to_string();
    format!(
        "// Written by `cargo xtask vm`: apt confined to this directory (see xtask/src/vm/apt.rs).\n\
         Dir::Etc::SourceList \"{sources}\";\n\
         Dir::Etc::SourceParts \"/dev/null\";\n\
         Dir::Etc::Parts \"/dev/null\";\n\
         Dir::Etc::Main \"/dev/null\";\n\
         Dir::Etc::Preferences \"/dev/null\";\n\
         Dir::Etc::PreferencesParts \"/dev/null\";\n\
         Dir::Etc::Trusted \"/dev/null\";\n\
         Dir::Etc::TrustedParts \"/dev/null\";\n\
         Dir::State::Lists \"{lists}\";\n\
         Dir::State::Status \"/dev/null\";\n\
         Dir::Cache \"{cache}\";\n\
         Acquire::Languages \"none\";\n\
         // Keep the indexes compressed and the binary caches in memory: they are only needed\n\
         // while fetching, and uncompressed they take over 300 MB.\n\
         Acquire::GzipIndexes \"true\";\n\
         Dir::Cache::pkgcache \"\";\n\
         Dir::Cache::srcpkgcache \"\";\n\
         // The private tree sits under $HOME, which apt's unprivileged _apt user cannot enter.\n\
         APT::Sandbox::User \"root\";\n",
        sources = dir("sources.list"),
        lists = dir("lists"),
        cache = dir("cache"),
    )
}
