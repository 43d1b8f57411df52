//! Host-side stub so the package has a library target; the kernel programs are in `main.rs`.
#![no_std]
