//! The kernel programs' rare-path diagnostics in qosd's own log.
//!
//! The programs write a message through aya-log when a kernel read fails or a map refuses a new
//! entry (at most once per kind per CPU every 10 s; see the eBPF crate's `diag`). Each load of
//! the object has its own ring buffer (`AYA_LOGS`): [`KernelLogReader::take`] takes it out of
//! the object after the load, and [`KernelLogReader::forward`] waits on its descriptor (no
//! polling: the task sleeps until the kernel writes) and hands every record to `tracing` under
//! the target `qosd::kernel`, with the object (`sched_switch` or `numa`) as a field.
use aya::Ebpf;
use aya_log::EbpfLogger;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Size of each object's log ring buffer: the messages are rare and short (a 16 KiB ring
/// holds well over a hundred), and aya-log's default (128 KiB) would be locked kernel memory
/// for nothing.
pub(crate) const RING_BYTES: u32 = 16 * 1024;

/// Hands aya-log's records to `tracing`.
#[derive(Clone, Copy, Debug)]
pub struct KernelLog {
    /// Which load of the object wrote the record.
    object: &'static str,
}

impl log::Log for KernelLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let object = self.object;
        let message = record.args();
        match record.level() {
            log::Level::Error => tracing::error!(target: "qosd::kernel", object, "{message}"),
            log::Level::Warn => tracing::warn!(target: "qosd::kernel", object, "{message}"),
            log::Level::Info => tracing::info!(target: "qosd::kernel", object, "{message}"),
            log::Level::Debug => tracing::debug!(target: "qosd::kernel", object, "{message}"),
            log::Level::Trace => tracing::trace!(target: "qosd::kernel", object, "{message}"),
        }
    }

    fn flush(&self) {}
}

/// One object's log ring buffer, read into `tracing`.
pub struct KernelLogReader {
    logger: EbpfLogger<KernelLog>,
    object: &'static str,
}

impl KernelLogReader {
    /// Takes the log ring buffer out of a loaded object (the programs keep writing to it).
    /// Without one (an object built without diagnostics), qosd says so and goes on.
    pub(crate) fn take(ebpf: &mut Ebpf, object: &'static str) -> Option<Self> {
        match EbpfLogger::init_with_logger(ebpf, KernelLog { object }) {
            Ok(logger) => Some(Self { logger, object }),
            Err(e) => {
                tracing::warn!(object, error = %e, "the kernel programs' diagnostics cannot be read");
                None
            }
        }
    }

    /// Forwards records as the kernel writes them, until the ring buffer's descriptor fails
    /// (never while the object is loaded). Runs as a task of the daemon's runtime.
    pub async fn forward(self) {
        let Self { logger, object } = self;
        // SAFETY: the descriptor is the ring buffer map's, owned by `logger` (its `MapData`),
        // which the `AsyncFd` owns from here on; nothing closes or replaces it meanwhile, and
        // `as_raw_fd` returns that same descriptor every time.
        let registered = unsafe { AsyncFd::register_with_interest(logger, Interest::READABLE) };
        let mut ready = match registered {
            Ok(fd) => fd,
            Err(e) => {
                tracing::warn!(object, error = %e, "waiting on the kernel programs' diagnostics");
                return;
            }
        };
        loop {
            let mut guard = match ready.readable_mut().await {
                Ok(guard) => guard,
                Err(e) => {
                    tracing::warn!(object, error = %e, "waiting on the kernel programs' diagnostics");
                    return;
                }
            };
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
    }
}
