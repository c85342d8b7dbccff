//! Readings of the server process (CPU time, context switches, /metrics samples) and
//! the arithmetic over them (nearest-rank percentiles, rounding).

/// A `/metrics` text.
pub(crate) struct Scrape(pub(crate) String);

impl Scrape {
    /// The value of an unlabelled sample, e.g. `toolgate_audit_batch_events_sum`.
    pub(crate) fn sample(&self, name: &str) -> Option<f64> {
        self.0.lines().find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            (series == name).then(|| value.parse().ok()).flatten()
        })
    }

    /// The mean of histogram `name` over the observations made since `before`.
    pub(crate) fn mean_since(&self, before: &Scrape, name: &str) -> Option<f64> {
        let delta = |suffix: &str| {
            let key = format!("{name}_{suffix}");
            Some(self.sample(&key)? - before.sample(&key).unwrap_or(0.0))
        };
        let (sum, count) = (delta("sum")?, delta("count")?);
        (count > 0.0).then(|| sum / count)
    }
}

/// The CPU time (user + system) process `pid` has used so far, in microseconds, from
/// `/proc/<pid>/stat` (fields 14 and 15, in clock ticks); None if unreadable.
pub(crate) fn process_cpu_us(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3, so utime (14) and stime (15) are at 11 and 12.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_second > 0).then(|| ticks as f64 * 1e6 / per_second as f64)
}

/// The context switches of each thread of process `pid` so far (voluntary and
/// involuntary, from `/proc/<pid>/task/<tid>/status`), by thread id; None if the
/// process cannot be read.
pub(crate) fn thread_switches(pid: u32) -> Option<std::collections::BTreeMap<u32, u64>> {
    let mut switches = std::collections::BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<u32>().ok())
        else {
            continue;
        };
        // A thread that ended since the listing has nothing left to count.
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        let count: u64 = status
            .lines()
            .filter(|l| {
                l.starts_with("voluntary_ctxt_switches:")
                    || l.starts_with("nonvoluntary_ctxt_switches:")
            })
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum();
        switches.insert(tid, count);
    }
    Some(switches)
}

/// The context switches between two [`thread_switches`] readings: a thread that
/// started in between counts whole; one that ended in between is not counted.
pub(crate) fn switches_between(
    first: &std::collections::BTreeMap<u32, u64>,
    last: &std::collections::BTreeMap<u32, u64>,
) -> u64 {
    last.iter()
        .map(|(tid, n)| n.saturating_sub(first.get(tid).copied().unwrap_or(0)))
        .sum()
}

/// The nearest-rank percentile of sorted values (0 for none).
pub(crate) fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub(crate) fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn switches_count_each_thread_from_its_first_reading() {
        let first = std::collections::BTreeMap::from([(1, 100), (2, 50), (3, 7)]);
        // Thread 1 switched 10 times, thread 2 not at all, thread 3 ended, thread 4
        // started and switched 5 times.
        let last = std::collections::BTreeMap::from([(1, 110), (2, 50), (4, 5)]);
        assert_eq!(switches_between(&first, &last), 15);
        // This process's own threads, read twice: never negative, and this thread's
        // sleep in between is a switch.
        let pid = std::process::id();
        let a = thread_switches(pid).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = thread_switches(pid).unwrap();
        assert!(switches_between(&a, &b) >= 1);
        assert!(thread_switches(u32::MAX).is_none());
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.50), 50);
        assert_eq!(percentile(&v, 0.95), 95);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&[7], 0.99), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    #[test]
    fn histogram_means_come_from_deltas() {
        let before = Scrape("x_sum 10\nx_count 2\n".into());
        let after = Scrape("x_sum 40\nx_count 8\n".into());
        assert_eq!(after.mean_since(&before, "x"), Some(5.0));
        assert_eq!(after.mean_since(&after, "x"), None);
    }
}
