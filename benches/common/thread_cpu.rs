//! The CPU time of the calling thread: a measurement's own work, without the time it waited for a
//! core on a loaded machine (which the wall clock counts). Shared by the benches and the timing
//! examples (`#[path]`-included, like `poi_boxes.rs`).

/// CPU time the calling thread has used so far, in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

/// The same in seconds.
#[allow(dead_code)] // not every includer needs both
pub fn thread_cpu_s() -> f64 {
    thread_cpu_ns() as f64 * 1e-9
}
