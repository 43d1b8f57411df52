//! Rebuild the kernel object when the bpf-linker binary changes (it is an undeclared tool
//! dependency of the BPF target), and declare the `bpf_target_arch` cfg.
use which::which;

fn main() {
    match which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(err) => {
            println!("cargo:warning=bpf-linker not on PATH ({err}); run `cargo xtask setup`");
        }
    }
}
