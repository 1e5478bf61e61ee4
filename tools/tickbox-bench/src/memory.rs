//! The process's resident memory, read from `/proc/self/status` (Linux;
//! 0 elsewhere).

/// A field of /proc/self/status in MiB.
fn proc_status_mb(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        })
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The resident set now (VmRSS), in MiB.
pub(crate) fn rss_mb() -> f64 {
    proc_status_mb("VmRSS:")
}

/// The peak resident set (VmHWM), in MiB.
pub(crate) fn peak_rss_mb() -> f64 {
    proc_status_mb("VmHWM:")
}
