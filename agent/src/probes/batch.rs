//! Reading a per-CPU array's first elements, or a whole per-CPU hash map, in one or a few
//! system calls (`BPF_MAP_LOOKUP_BATCH`, Linux 5.6+) instead of one or two `bpf(2)` per element:
//! the counter maps are read this way at every scrape and every feedback window, so the cost no
//! longer grows with the number of cgroups. aya 0.14 has no batch operations, hence the raw
//! `bpf(2)` call here; where the kernel refuses it the maps are read element by element as
//! before.
use std::io;
use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd};

use aya::maps::{IterableMap, MapData, MapError, PerCpuHashMap, PerCpuValues};

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

/// One `BPF_MAP_LOOKUP_BATCH` call with the buffers `attr` names. `Ok(true)` when the map's end
/// was reached (`ENOENT`); `attr.count` then holds how many elements were copied, as it does
/// on success.
fn lookup_batch(attr: &mut BatchAttr) -> io::Result<bool> {
    // SAFETY: bpf(2) reads `attr` (a valid, fully initialised struct of the size passed) and
    // writes at most `attr.count` keys and values into the buffers it points to, which the
    // callers size for that many and keep alive across the call, and `attr.count` itself.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_LOOKUP_BATCH,
            std::ptr::from_mut(attr),
            size_of::<BatchAttr>(),
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENOENT) {
            Ok(true)
        } else {
            Err(e)
        };
    }
    Ok(false)
}

/// Reads a `T` from the start of `bytes`.
fn read_value<T: aya::Pod>(bytes: &[u8]) -> T {
    assert!(bytes.len() >= size_of::<T>(), "value buffer too short");
    // SAFETY: `bytes` holds at least size_of::<T>() initialised bytes the kernel copied from a
    // value of type T (aya::Pod: plain old data, any bit pattern is valid); the read is
    // unaligned-safe.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) }
}

/// The kernel copies each CPU's value of a per-CPU map rounded up to 8 bytes.
fn stride<T>() -> usize {
    size_of::<T>().next_multiple_of(8)
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
    let stride = stride::<T>();
    let mut values = vec![0u8; elements * cpus * stride];
    let mut keys = vec![0u32; elements];
    let mut out_batch = 0u32;
    let mut attr = BatchAttr {
        out_batch: std::ptr::from_mut(&mut out_batch) as u64,
        keys: keys.as_mut_ptr() as u64,
        values: values.as_mut_ptr() as u64,
        count,
        map_fd: u32::try_from(map.as_raw_fd()).map_err(io::Error::other)?,
        ..BatchAttr::default()
    };
    lookup_batch(&mut attr)?;
    let filled = usize::try_from(attr.count)
        .map_err(io::Error::other)?
        .min(elements);
    Ok((0..filled)
        .map(|element| {
            (0..cpus)
                .map(|cpu| read_value::<T>(&values[(element * cpus + cpu) * stride..]))
                .collect()
        })
        .collect())
}

/// Every (key, per-CPU values) of a per-CPU hash map: in batches where the kernel allows, else
/// by iterating it.
pub fn per_cpu_hash<K: aya::Pod, V: aya::Pod>(
    map: &PerCpuHashMap<&MapData, K, V>,
) -> Result<Vec<(K, Vec<V>)>, MapError> {
    let batched = aya::util::nr_cpus().map_err(|(_, e)| e).and_then(|cpus| {
        per_cpu_hash_batched::<K, V>(
            IterableMap::<K, PerCpuValues<V>>::map(map).fd().as_fd(),
            cpus,
        )
    });
    match batched {
        Ok(entries) => Ok(entries),
        Err(e) => {
            tracing::debug!(error = %e, "no batch lookup; iterating the hash");
            map.iter()
                .map(|entry| entry.map(|(k, v)| (k, v.iter().copied().collect())))
                .collect()
        }
    }
}

/// [`per_cpu_hash`] in batches only.
fn per_cpu_hash_batched<K: aya::Pod, V: aya::Pod>(
    map: BorrowedFd<'_>,
    cpus: usize,
) -> io::Result<Vec<(K, Vec<V>)>> {
    let fd = u32::try_from(map.as_raw_fd()).map_err(io::Error::other)?;
    let stride = stride::<V>();
    let mut chunk: u32 = 256;
    let mut out = Vec::new();
    // A hash's batch position is an opaque bucket index of 4 bytes; none: from the start.
    let mut position: Option<u32> = None;
    let mut next = 0u32;
    loop {
        let elements = usize::try_from(chunk).map_err(io::Error::other)?;
        let mut keys = vec![0u8; elements * size_of::<K>()];
        let mut values = vec![0u8; elements * cpus * stride];
        let mut attr = BatchAttr {
            in_batch: position
                .as_ref()
                .map_or(0, |p| std::ptr::from_ref(p) as u64),
            out_batch: std::ptr::from_mut(&mut next) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk,
            map_fd: fd,
            ..BatchAttr::default()
        };
        let done = match lookup_batch(&mut attr) {
            Ok(done) => done,
            // One bucket holds more than the buffer: a larger one, from the same position.
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && chunk < 1 << 20 => {
                chunk *= 2;
                continue;
            }
            Err(e) => return Err(e),
        };
        let filled = usize::try_from(attr.count)
            .map_err(io::Error::other)?
            .min(elements);
        for i in 0..filled {
            let key = read_value::<K>(&keys[i * size_of::<K>()..]);
            let per_cpu = (0..cpus)
                .map(|cpu| read_value::<V>(&values[(i * cpus + cpu) * stride..]))
                .collect();
            out.push((key, per_cpu));
        }
        if done {
            return Ok(out);
        }
        position = Some(next);
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{FromRawFd as _, OwnedFd};

    use super::*;

    const BPF_MAP_CREATE: libc::c_long = 0;
    const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
    const BPF_MAP_TYPE_PERCPU_HASH: u32 = 5;
    const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;

    /// The `map_create` member of `union bpf_attr` (its first fields).
    #[repr(C)]
    #[derive(Default)]
    struct CreateAttr {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        map_flags: u32,
    }

    /// The `map_elem` member of `union bpf_attr`.
    #[repr(C)]
    #[derive(Default)]
    struct ElemAttr {
        map_fd: u32,
        pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }

    /// A kernel map of 8-byte keys and values (4-byte keys for arrays), or `None` where this
    /// process may not create one (not root: the batch path is then covered by the host tier).
    fn create(map_type: u32, key_size: u32, max_entries: u32) -> Option<OwnedFd> {
        let mut attr = CreateAttr {
            map_type,
            key_size,
            value_size: 8,
            max_entries,
            map_flags: 0,
        };
        // SAFETY: bpf(2) reads the fully initialised attr of the size passed and returns a new
        // descriptor or -1.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_CREATE,
                std::ptr::from_mut(&mut attr),
                size_of::<CreateAttr>(),
            )
        };
        if fd < 0 {
            eprintln!(
                "skipped: cannot create a BPF map here ({}); the batch reads run in the host tier",
                io::Error::last_os_error()
            );
            return None;
        }
        // SAFETY: `fd` was just returned by bpf(2) and is owned by nothing else.
        Some(unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).ok()?) })
    }

    fn update(map: &OwnedFd, key: &[u8], per_cpu: &[u64]) {
        let mut attr = ElemAttr {
            map_fd: u32::try_from(map.as_raw_fd()).expect("fd"),
            key: key.as_ptr() as u64,
            value: per_cpu.as_ptr() as u64,
            ..ElemAttr::default()
        };
        // SAFETY: bpf(2) reads the key and one 8-byte value per possible CPU from the buffers
        // named, which live across the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_UPDATE_ELEM,
                std::ptr::from_mut(&mut attr),
                size_of::<ElemAttr>(),
            )
        };
        assert_eq!(rc, 0, "update: {}", io::Error::last_os_error());
    }

    #[test]
    fn a_per_cpu_hash_read_in_batches_holds_every_entry_and_cpu() {
        let Some(map) = create(BPF_MAP_TYPE_PERCPU_HASH, 8, 4096) else {
            return;
        };
        let cpus = aya::util::nr_cpus().expect("cpus");
        // More entries than one batch (256), so the reading goes on from a position.
        for key in 1..=700u64 {
            let values: Vec<u64> = (0..cpus).map(|cpu| key * 10 + cpu as u64).collect();
            update(&map, &key.to_ne_bytes(), &values);
        }
        let mut read = per_cpu_hash_batched::<u64, u64>(map.as_fd(), cpus).expect("batched");
        read.sort_by_key(|(k, _)| *k);
        assert_eq!(read.len(), 700);
        for (key, per_cpu) in &read {
            let want: Vec<u64> = (0..cpus).map(|cpu| key * 10 + cpu as u64).collect();
            assert_eq!(per_cpu, &want, "key {key}");
        }
        // An empty map.
        let empty = create(BPF_MAP_TYPE_PERCPU_HASH, 8, 16).expect("map");
        assert!(
            per_cpu_hash_batched::<u64, u64>(empty.as_fd(), cpus)
                .expect("batched")
                .is_empty()
        );
    }

    #[test]
    fn a_per_cpu_arrays_first_elements_in_one_call() {
        let Some(map) = create(BPF_MAP_TYPE_PERCPU_ARRAY, 4, 64) else {
            return;
        };
        let cpus = aya::util::nr_cpus().expect("cpus");
        for index in 0..64u32 {
            let values: Vec<u64> = (0..cpus)
                .map(|cpu| u64::from(index) * 100 + cpu as u64)
                .collect();
            update(&map, &index.to_ne_bytes(), &values);
        }
        let first = percpu_array::<u64>(map.as_fd(), 10, cpus).expect("batched");
        assert_eq!(first.len(), 10);
        assert_eq!(
            first[7],
            (0..cpus).map(|cpu| 700 + cpu as u64).collect::<Vec<_>>()
        );
        // All of it: the end of the array is reached (ENOENT), every element still read.
        let all = percpu_array::<u64>(map.as_fd(), 64, cpus).expect("batched");
        assert_eq!(all.len(), 64);
        assert_eq!(all[63][0], 6300);
    }
}
