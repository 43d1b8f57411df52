//! Builds the kernel object (`qosd-ebpf`) for the BPF target with aya-build; the agent embeds it.
//! Needs the nightly toolchain with rust-src and bpf-linker on PATH (`cargo xtask setup`).
//! `AYA_BUILD_SKIP=1` skips it (clippy of user space only); the embedded object is then empty and
//! `qosd run` reports that the probes are unavailable.
use std::{env, fs, path::PathBuf};

use anyhow::Context as _;
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let object = out_dir.join("qosd");
    if env::var_os("AYA_BUILD_SKIP").is_some_and(|v| v == "1") {
        println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
        fs::write(&object, []).with_context(|| format!("writing {}", object.display()))?;
        return Ok(());
    }
    let root_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").context("no manifest dir")?)
        .join("../ebpf");
    let root_dir = root_dir.to_str().context("non-UTF-8 path")?;
    aya_build::build_ebpf(
        [Package {
            name: "qosd-ebpf",
            root_dir,
            ..Package::default()
        }],
        Toolchain::default(),
    )
}
