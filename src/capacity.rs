//! Audit capacity: how many bytes the audit log may still take before new calls are
//! refused (`audit_capacity_exhausted`), against `serve --max-audit-bytes` (the
//! database and its WAL together) and `--min-free-disk-bytes` (the free space left on
//! the file system holding them).
//!
//! The sizes are sampled by a background task ([`SAMPLE_EVERY`]), never on a call's
//! path; a call reads the last sample (two atomic loads). New calls are refused once
//! the headroom is under [`RESERVE_BYTES`], which leaves room for the refusals' own
//! bounded closing events and for admin changes (a safety lock, a run closed), so the
//! log refuses before the disk or the cap is hit, not after.
//!
//! INVARIANT: a sample that cannot be taken counts as no headroom (fail closed).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::json;

use crate::diagnostic::{Reason, Refusal};

/// How often the sizes are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// Headroom kept for refusals' events and admin changes once new calls are refused.
pub const RESERVE_BYTES: u64 = 4 * 1024 * 1024;
/// Under this much headroom (the lower half of the reserve, kept for admin changes) a
/// refused call is no longer recorded one by one: it is refused in front of the
/// pipeline and counted (`toolgate_calls_unrecorded_total`), so that callers who prove
/// nothing cannot use up the room the operator needs.
pub const RECORDED_REFUSALS_FLOOR: u64 = RESERVE_BYTES / 2;
/// What one recorded refusal is counted as until the next sample measures it: a
/// one-event commit's WAL pages, more than its line takes. Between two samples the
/// refusals recorded can thus not outgrow their half of the reserve.
const REFUSAL_CHARGE: u64 = 8 * 1024;
/// The WAL counted at its bound: the database may grow only as far as leaves room for
/// a WAL at its largest (the WAL thread truncates it past this size), so the
/// database and its WAL together stay within `--max-audit-bytes`.
pub const WAL_ALLOWANCE: u64 = crate::audit::WAL_TRUNCATE_BYTES;
/// The smallest `--max-audit-bytes` accepted: the WAL's allowance, the reserve twice
/// and 8 MiB for the database.
pub const MIN_MAX_AUDIT_BYTES: u64 = WAL_ALLOWANCE + 2 * RESERVE_BYTES + 8 * 1024 * 1024;

/// The configured bounds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CapacityOptions {
    /// The most bytes the audit database and its WAL may take together.
    pub max_audit_bytes: Option<u64>,
    /// The least free space to leave on the audit database's file system.
    pub min_free_disk_bytes: Option<u64>,
}

/// The last sample, shared with the sampler task.
#[derive(Debug)]
pub struct AuditCapacity {
    options: CapacityOptions,
    db_path: PathBuf,
    /// Bytes of the database and its WAL at the last sample, plus the refusals
    /// recorded since (each [`REFUSAL_CHARGE`]).
    used: AtomicU64,
    /// Bytes of the active WAL at the last sample.
    wal: AtomicU64,
    /// Free bytes on the file system at the last sample (u64::MAX: not sampled).
    free: AtomicU64,
}

/// What `/metrics` and a refusal report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Headroom {
    pub used_bytes: u64,
    pub free_disk_bytes: u64,
    /// Bytes the log may still grow by before the first bound is reached.
    pub headroom_bytes: u64,
}

impl AuditCapacity {
    /// Takes a first sample now; [`AuditCapacity::run`] keeps it fresh.
    pub fn new(db_path: &Path, options: CapacityOptions) -> Arc<AuditCapacity> {
        let capacity = Arc::new(AuditCapacity {
            options,
            db_path: db_path.to_path_buf(),
            used: AtomicU64::new(0),
            wal: AtomicU64::new(0),
            free: AtomicU64::new(u64::MAX),
        });
        capacity.sample();
        capacity
    }

    pub fn options(&self) -> &CapacityOptions {
        &self.options
    }

    /// Samples the sizes every [`SAMPLE_EVERY`] until the runtime stops.
    pub async fn run(self: Arc<Self>) {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let me = self.clone();
            if tokio::task::spawn_blocking(move || me.sample())
                .await
                .is_err()
            {
                return;
            }
        }
    }

    /// Measures the database, its WAL and the free space now.
    pub fn sample(&self) {
        // Every segment still in the data directory counts (archived ones do not).
        let used = crate::audit::segments::total_bytes(&self.db_path);
        let (_, active) = crate::audit::segments::newest(&self.db_path)
            .unwrap_or_else(|_| (1, self.db_path.clone()));
        let mut wal = active.into_os_string();
        wal.push("-wal");
        let wal = std::fs::metadata(&wal).map_or(0, |m| m.len());
        self.wal.store(wal, Ordering::Relaxed);
        self.used.store(used, Ordering::Relaxed);
        if self.options.min_free_disk_bytes.is_some() {
            let dir = self
                .db_path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            // No answer: no headroom (fail closed).
            self.free
                .store(free_disk_bytes(dir).unwrap_or(0), Ordering::Relaxed);
        }
    }

    /// The headroom at the last sample.
    pub fn headroom(&self) -> Headroom {
        let used = self.used.load(Ordering::Relaxed);
        let free = self.free.load(Ordering::Relaxed);
        // The WAL counts at its allowance until it is larger.
        let wal_room = WAL_ALLOWANCE.saturating_sub(self.wal.load(Ordering::Relaxed));
        let by_cap = self.options.max_audit_bytes.map_or(u64::MAX, |max| {
            max.saturating_sub(used.saturating_add(wal_room))
        });
        let by_disk = self
            .options
            .min_free_disk_bytes
            .map_or(u64::MAX, |min| free.saturating_sub(min));
        Headroom {
            used_bytes: used,
            free_disk_bytes: free,
            headroom_bytes: by_cap.min(by_disk),
        }
    }

    /// The refusal of a new call when the headroom is under the reserve; a refusal
    /// that will be recorded is counted against the headroom at once.
    pub fn refusal(&self) -> Option<Refusal> {
        let h = self.headroom();
        if h.headroom_bytes >= RESERVE_BYTES {
            return None;
        }
        self.used.fetch_add(REFUSAL_CHARGE, Ordering::Relaxed);
        Some(self.exhausted(h))
    }

    /// The refusal of a call that is not recorded: the headroom is under
    /// [`RECORDED_REFUSALS_FLOOR`] (`details.recorded` is false).
    pub fn unrecorded_refusal(&self) -> Option<Refusal> {
        let h = self.headroom();
        if h.headroom_bytes >= RECORDED_REFUSALS_FLOOR {
            return None;
        }
        let mut refusal = self.exhausted(h);
        if let serde_json::Value::Object(details) = &mut refusal.details {
            details.insert("recorded".into(), json!(false));
        }
        Some(refusal)
    }

    fn exhausted(&self, h: Headroom) -> Refusal {
        Refusal::new(
                Reason::AuditCapacityExhausted,
                format!(
                    "the audit log has {} bytes of headroom left, under the {RESERVE_BYTES} bytes kept in reserve; new calls are refused until an operator makes room",
                    h.headroom_bytes
                ),
            )
            .with_details(json!({
                "audit_bytes": h.used_bytes,
                "max_audit_bytes": self.options.max_audit_bytes,
                "free_disk_bytes": (h.free_disk_bytes != u64::MAX).then_some(h.free_disk_bytes),
                "min_free_disk_bytes": self.options.min_free_disk_bytes,
                "headroom_bytes": h.headroom_bytes,
            }))
    }
}

/// Free bytes for an unprivileged writer on the file system holding `dir`.
fn free_disk_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `path` is a valid NUL-terminated string and `stat` points to writable
    // memory of the right type; statvfs only writes into it.
    let rc = unsafe { libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled the struct.
    let stat = unsafe { stat.assume_init() };
    // The field types differ between platforms (u32 on some 32-bit targets).
    #[allow(clippy::unnecessary_cast)]
    let (blocks, size) = (stat.f_bavail as u64, stat.f_frsize as u64);
    Some(blocks.saturating_mul(size))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn capped(db: &Path, max: u64) -> Arc<AuditCapacity> {
        AuditCapacity::new(
            db,
            CapacityOptions {
                max_audit_bytes: Some(max),
                min_free_disk_bytes: None,
            },
        )
    }

    #[test]
    fn calls_are_refused_once_the_headroom_is_under_the_reserve() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("audit.db");
        std::fs::write(&db, vec![0u8; 1024 * 1024]).unwrap();
        // No WAL yet: it counts at its allowance.
        let roomy = capped(&db, WAL_ALLOWANCE + RESERVE_BYTES * 4);
        assert!(roomy.refusal().is_none());
        assert_eq!(
            roomy.headroom().headroom_bytes,
            RESERVE_BYTES * 4 - 1024 * 1024
        );
        // A WAL larger than its allowance counts as it is.
        let mut wal = db.clone().into_os_string();
        wal.push("-wal");
        std::fs::write(&wal, vec![0u8; 1024]).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&wal).unwrap();
        file.set_len(WAL_ALLOWANCE + 2 * RESERVE_BYTES).unwrap();
        roomy.sample();
        assert_eq!(
            roomy.headroom().headroom_bytes,
            RESERVE_BYTES * 2 - 1024 * 1024
        );
        std::fs::remove_file(&wal).unwrap();
        let tight = capped(&db, WAL_ALLOWANCE + 1024 * 1024 + RESERVE_BYTES - 1);
        let refusal = tight.refusal().unwrap();
        assert_eq!(refusal.reason, Reason::AuditCapacityExhausted);
        // A free-space floor larger than any disk refuses too.
        let floor = AuditCapacity::new(
            &db,
            CapacityOptions {
                max_audit_bytes: None,
                min_free_disk_bytes: Some(u64::MAX / 2),
            },
        );
        assert!(floor.refusal().is_some());
        assert!(floor.headroom().free_disk_bytes > 0);
    }

    #[test]
    fn recorded_refusals_stop_at_the_half_of_the_reserve_kept_for_admins() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("audit.db");
        std::fs::write(&db, vec![0u8; 1024 * 1024]).unwrap();
        // Room for three recorded refusals above the floor.
        let max = WAL_ALLOWANCE + 1024 * 1024 + RECORDED_REFUSALS_FLOOR + 3 * REFUSAL_CHARGE - 1;
        let capacity = capped(&db, max);
        let mut recorded = 0;
        while capacity.unrecorded_refusal().is_none() {
            assert!(capacity.refusal().is_some());
            recorded += 1;
            assert!(recorded < 100, "refusals never stopped being recorded");
        }
        assert_eq!(recorded, 3);
        let refusal = capacity.unrecorded_refusal().unwrap();
        assert_eq!(refusal.details["recorded"], false, "{}", refusal.details);
        // A new sample measures what was really written (nothing here).
        capacity.sample();
        assert!(capacity.unrecorded_refusal().is_none());
    }
}
