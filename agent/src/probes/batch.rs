//! Reading the first elements of a per-CPU array in one system call
//! (`BPF_MAP_LOOKUP_BATCH`, Linux 5.6+), instead of one `bpf(2)` per element: the counter slots
//! are read this way at every scrape and every feedback window, so the cost no longer grows with
//! the number of cgroups. aya 0.14 has no batch operations, hence the one raw `bpf(2)` call here;
//! where the kernel refuses it the caller reads element by element as before.
use std::io;
use std::os::fd::{AsRawFd as _, BorrowedFd};

/// `BPF_MAP_LOOKUP_BATCH` in `enum bpf_cmd` (include/uapi/linux/bpf.h).
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// The `batch` member of `union bpf_attr` (include/uapi/linux/bpf.h, since 5.6).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// The per-CPU values of elements `0..count` of the per-CPU array `map`, on `cpus` possible
/// CPUs: `out[element][cpu]`.
pub fn percpu_array<T: aya::Pod>(
    map: BorrowedFd<'_>,
    count: u32,
    cpus: usize,
) -> io::Result<Vec<Vec<T>>> {
    if count == 0 {
        return Ok(Vec::new());
    }
    let elements = usize::try_from(count).map_err(io::Error::other)?;
    // The kernel copies each CPU's value rounded up to 8 bytes.
    let stride = size_of::<T>().next_multiple_of(8);
    let mut values = vec![0u8; elements * cpus * stride];
    let mut keys = vec![0u32; elements];
    let mut out_batch = 0u32;
    let fd = u32::try_from(map.as_raw_fd()).map_err(io::Error::other)?;
    let mut attr = BatchAttr {
        in_batch: 0,
        out_batch: std::ptr::from_mut(&mut out_batch) as u64,
        keys: keys.as_mut_ptr() as u64,
        values: values.as_mut_ptr() as u64,
        count,
        map_fd: fd,
        elem_flags: 0,
        flags: 0,
    };
    // SAFETY: bpf(2) reads `attr` (a valid, fully initialised struct of the size passed) and
    // writes at most `count` keys (u32 each) and `count * cpus * stride` value bytes into the
    // buffers it points to, which are that large and live until the call returns.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_LOOKUP_BATCH,
            std::ptr::from_mut(&mut attr),
            size_of::<BatchAttr>(),
        )
    };
    // ENOENT: the end of the array was reached, `count` says how many were copied.
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOENT) {
            return Err(e);
        }
    }
    let filled = usize::try_from(attr.count).map_err(io::Error::other)?;
    let mut out = Vec::with_capacity(filled);
    for element in 0..filled.min(elements) {
        let mut per_cpu = Vec::with_capacity(cpus);
        for cpu in 0..cpus {
            let offset = (element * cpus + cpu) * stride;
            let bytes = &values[offset..offset + size_of::<T>()];
            // SAFETY: `bytes` holds size_of::<T>() initialised bytes the kernel copied from a
            // value of type T (aya::Pod: plain old data, any bit pattern is valid); the read
            // is unaligned-safe.
            per_cpu.push(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) });
        }
        out.push(per_cpu);
    }
    Ok(out)
}
