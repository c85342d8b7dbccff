//! Read-only access to an audit log (all its segments), for tools that read beside a live gateway
//! (`toolgate audit replay`): no writer, no keys, no checkpoint is ever written.
//!
//! Also the read path of the log itself: events matching a filter, across the segments.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension};

use crate::line::format_timestamp;
use crate::store::{self, map_sqlite};
use crate::{AuditError, EventFilter, StoredEvent};

/// How long opening a segment waits for the writer's lock.
const BUSY_TIMEOUT: Duration = Duration::from_millis(2000);

/// Read-only access to an audit log, across its segments (each opened while read).
pub struct AuditReader {
    path: PathBuf,
}

impl AuditReader {
    /// Opens the log whose first segment is `db` read-only; its newest segment must
    /// exist and be a toolgate audit log.
    pub fn open(db: &Path) -> Result<AuditReader, AuditError> {
        let (_, newest) = crate::segments::newest(db)?;
        drop(crate::store::open_reader(&newest, BUSY_TIMEOUT)?);
        Ok(AuditReader {
            path: db.to_path_buf(),
        })
    }

    /// Events matching `filter`, oldest first (at most `filter.limit`; 0: every match).
    pub fn events(&self, filter: &EventFilter) -> Result<Vec<StoredEvent>, AuditError> {
        read_segment_events(&self.path, filter)
    }

    /// The signed checkpoint notes (stored checkpoints and the signed head of each
    /// segment) with a size in (`above`, `upto`], as (size, note), by size, one per
    /// size.
    pub fn notes_between(&self, above: u64, upto: u64) -> Result<Vec<(u64, String)>, AuditError> {
        let mut out = std::collections::BTreeMap::new();
        for (_, path) in crate::segments::list(&self.path)? {
            let conn = crate::store::open_reader(&path, BUSY_TIMEOUT)?;
            let map = |e: rusqlite::Error| crate::store::map_sqlite(&e, &path);
            let mut stmt = conn
                .prepare(
                    "SELECT size, note FROM checkpoints WHERE size > ?1 AND size <= ?2 \
                     UNION ALL SELECT size, note FROM signed_head WHERE size > ?1 AND size <= ?2",
                )
                .map_err(map)?;
            let rows = stmt
                .query_map(rusqlite::params![above as i64, upto as i64], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
                })
                .map_err(map)?;
            for row in rows {
                let (size, note) = row.map_err(map)?;
                out.entry(size.max(0) as u64).or_insert(note);
            }
        }
        Ok(out.into_iter().collect())
    }
}

/// How long a read waits for the writer's lock.
const READ_BUSY_TIMEOUT: Duration = Duration::from_millis(2000);

/// Reads events matching `filter` across the segments of the log whose first segment
/// is `base`, oldest first: each segment is opened read-only while it is read; a
/// sealed segment wholly at or before `filter.after_seq` is skipped. A segment that
/// vanishes between the listing and its opening (archived meanwhile) is skipped too.
pub(crate) fn read_segment_events(
    base: &std::path::Path,
    filter: &EventFilter,
) -> Result<Vec<StoredEvent>, AuditError> {
    let mut out: Vec<StoredEvent> = Vec::new();
    let segments = crate::segments::list(base)?;
    if segments.is_empty() {
        return Err(AuditError::Io {
            path: base.to_path_buf(),
            what: "no such file".into(),
        });
    }
    for (_, path) in segments {
        let conn = match store::open_reader(&path, READ_BUSY_TIMEOUT) {
            Ok(conn) => conn,
            Err(AuditError::Io { .. }) if !path.exists() => continue,
            Err(e) => return Err(e),
        };
        if let Some(seal) = crate::segments::read_seal(&conn, &path)?
            && seal.last_seq <= filter.after_seq
        {
            continue;
        }
        let mut part = filter.clone();
        if let Some(last) = out.last() {
            part.after_seq = part.after_seq.max(last.seq);
        }
        if filter.limit != 0 {
            part.limit = filter.limit - out.len();
        }
        out.extend(read_events(&conn, &path, &part)?);
        if filter.limit != 0 && out.len() >= filter.limit {
            break;
        }
    }
    Ok(out)
}

/// Reads events matching `filter` over `conn`.
pub(crate) fn read_events(
    conn: &Connection,
    path: &std::path::Path,
    filter: &EventFilter,
) -> Result<Vec<StoredEvent>, AuditError> {
    let map = |e: rusqlite::Error| map_sqlite(&e, path);
    let (sql, args) = events_query(conn, filter).map_err(map)?;
    let mut stmt = conn.prepare_cached(&sql).map_err(map)?;
    let rows = stmt
        .query_map(rusqlite::params_from_iter(args), |r| {
            Ok((r.get::<_, i64>(0)? as u64, r.get::<_, String>(1)?))
        })
        .map_err(map)?;
    let mut out = Vec::new();
    for row in rows {
        let (seq, line) = row.map_err(map)?;
        let value = serde_json::from_str(&line).map_err(|_| AuditError::Corrupt {
            seq,
            what: "the stored line is not JSON".into(),
        })?;
        out.push(StoredEvent { seq, line, value });
    }
    Ok(out)
}

/// The query of [`read_events`] and its arguments.
fn events_query(
    conn: &Connection,
    filter: &EventFilter,
) -> rusqlite::Result<(String, Vec<rusqlite::types::Value>)> {
    let mut sql = String::from("SELECT seq, line FROM events WHERE seq > ?");
    let mut args: Vec<rusqlite::types::Value> =
        vec![(filter.after_seq.min(i64::MAX as u64) as i64).into()];
    if let Some(run) = &filter.run_id {
        sql.push_str(" AND run_id = ?");
        args.push(run.clone().into());
    }
    if !filter.event_types.is_empty() {
        sql.push_str(" AND type IN (");
        sql.push_str(&vec!["?"; filter.event_types.len()].join(", "));
        sql.push(')');
        if !filter
            .event_types
            .iter()
            .any(|t| store::UNINDEXED_TYPES.contains(t))
        {
            // Lets SQLite use the partial index on the other types (store.rs).
            sql.push_str(" AND ");
            sql.push_str(store::UNINDEXED_TYPES_TERM);
        }
        args.extend(
            filter
                .event_types
                .iter()
                .map(|t| t.as_str().to_string().into()),
        );
    }
    if let Some(text) = &filter.contains {
        sql.push_str(" AND instr(line, ?) > 0");
        args.push(text.clone().into());
    }
    // The time bounds become seq bounds (no index on ts); the ts conditions stay, so
    // a row out of order (a database edited by hand) is still never returned.
    if let Some(since) = filter.since {
        let since = format_timestamp(since);
        sql.push_str(" AND seq >= ? AND ts >= ?");
        args.push(seq_bound(conn, &since)?.into());
        args.push(since.into());
    }
    if let Some(until) = filter.until {
        let until = format_timestamp(until);
        sql.push_str(" AND seq < ? AND ts < ?");
        args.push(seq_bound(conn, &until)?.into());
        args.push(until.into());
    }
    let limit = if filter.limit == 0 {
        -1
    } else {
        filter.limit.min(i64::MAX as usize) as i64
    };
    // LIMIT -1: no limit.
    sql.push_str(" ORDER BY seq LIMIT ?");
    args.push(limit.into());
    Ok((sql, args))
}

/// The first seq whose timestamp is at or after `ts` (one past the last event when
/// none is): a binary search over seq, as timestamps never go backwards along it.
fn seq_bound(conn: &Connection, ts: &str) -> rusqlite::Result<i64> {
    let (first, last): (Option<i64>, Option<i64>) =
        conn.query_row("SELECT min(seq), max(seq) FROM events", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    let (Some(mut low), Some(last)) = (first, last) else {
        return Ok(0);
    };
    let mut high = last + 1;
    let mut at =
        conn.prepare_cached("SELECT seq, ts FROM events WHERE seq >= ?1 ORDER BY seq LIMIT 1")?;
    while low < high {
        let middle = low + (high - low) / 2;
        let found: Option<(i64, String)> = at
            .query_row([middle], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        match found {
            Some((seq, found_ts)) if found_ts.as_str() < ts => low = seq + 1,
            _ => high = middle,
        }
    }
    Ok(low)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::Durability;
    use crate::line::event_id;
    use crate::store::INSERT_EVENT;
    use rusqlite::params;
    use time::OffsetDateTime;

    /// Events with these timestamps from seq `first` on (seq `skip` left out, as a
    /// database may have a gap).
    fn events(first: i64, skip: i64, stamps: &[&str]) -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE events (seq INTEGER PRIMARY KEY, event_id TEXT NOT NULL,
             type TEXT NOT NULL, run_id TEXT, ts TEXT NOT NULL, line TEXT NOT NULL,
             hash TEXT NOT NULL)",
        )
        .unwrap();
        for (i, ts) in stamps.iter().enumerate() {
            let seq = first + i as i64;
            if seq != skip {
                conn.execute(
                    "INSERT INTO events VALUES (?1, 'e', 'tool_requested', 'r', ?2, ?3, 'h')",
                    params![seq, ts, format!("{{\"seq\":{seq}}}")],
                )
                .unwrap();
            }
        }
        conn
    }

    /// A database with the writer's schema and events of these types, seq 1 on.
    fn typed_events(dir: &Path, types: &[crate::EventType]) -> Connection {
        let path = dir.join("audit.db");
        let conn =
            store::open_writer(&path, Durability::Normal, Duration::from_secs(1), None).unwrap();
        for (i, t) in types.iter().enumerate() {
            let seq = i as i64 + 1;
            conn.execute(
                INSERT_EVENT,
                params![
                    seq,
                    event_id(seq as u64),
                    t.as_str(),
                    "r",
                    "2026-11-24T10:00:00.000Z",
                    format!("{{\"seq\":{seq}}}"),
                    "h"
                ],
            )
            .unwrap();
        }
        conn
    }

    fn plan(conn: &Connection, filter: &EventFilter) -> String {
        let (sql, args) = events_query(conn, filter).unwrap();
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let rows = stmt
            .query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(3))
            .unwrap();
        rows.map(Result::unwrap).collect::<Vec<_>>().join("; ")
    }

    /// The type index leaves out the two events of every call; a query on other types
    /// uses it, one on those two scans along seq, and both return what a scan returns.
    #[test]
    fn the_partial_type_index_serves_the_rarer_types_and_every_filter_is_exact() {
        use crate::EventType::*;
        let dir = tempfile::tempdir().unwrap();
        let mut types = Vec::new();
        for i in 0..40 {
            types.extend([ToolRequested, ToolExecuted]);
            if i % 7 == 0 {
                types.extend([ApprovalGranted, ToolRequested, ToolDenied]);
            }
            if i % 11 == 0 {
                types.push(SafetyLockEngaged);
            }
        }
        let conn = typed_events(dir.path(), &types);
        let filters: [&[crate::EventType]; 6] = [
            &[ApprovalGranted],
            &[SafetyLockEngaged, SafetyLockReleased],
            &[ToolDenied],
            &[ToolExecuted],
            &[ToolRequested, ToolDenied],
            &[],
        ];
        for wanted in filters {
            let filter = EventFilter {
                event_types: wanted.to_vec(),
                ..EventFilter::default()
            };
            let got: Vec<u64> = read_events(&conn, Path::new("audit.db"), &filter)
                .unwrap()
                .iter()
                .map(|e| e.seq)
                .collect();
            let scan: Vec<u64> = (1..=types.len() as u64)
                .filter(|&seq| wanted.is_empty() || wanted.contains(&types[seq as usize - 1]))
                .collect();
            assert_eq!(got, scan, "{wanted:?}");
            let plan = plan(&conn, &filter);
            let indexed =
                !wanted.is_empty() && !wanted.iter().any(|t| store::UNINDEXED_TYPES.contains(t));
            assert_eq!(
                plan.contains("events_type_rare"),
                indexed,
                "{wanted:?}: {plan}"
            );
        }
        // The schema's index condition is the term the queries repeat.
        let index_sql: String = conn
            .query_row(
                "SELECT sql FROM sqlite_master WHERE name = 'events_type_rare'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(
            index_sql.ends_with(&format!("WHERE {}", store::UNINDEXED_TYPES_TERM)),
            "{index_sql}"
        );
        for t in store::UNINDEXED_TYPES {
            assert!(store::UNINDEXED_TYPES_TERM.contains(&format!("'{}'", t.as_str())));
        }
    }

    /// A database written before the partial index gets it (and loses the full one)
    /// when the writer opens it.
    #[test]
    fn an_older_database_gets_the_partial_type_index() {
        let dir = tempfile::tempdir().unwrap();
        let conn = typed_events(
            dir.path(),
            &[
                crate::EventType::ToolRequested,
                crate::EventType::RunCreated,
            ],
        );
        conn.execute_batch(
            "DROP INDEX events_type_rare; CREATE INDEX events_type ON events (type);",
        )
        .unwrap();
        drop(conn);
        let path = dir.path().join("audit.db");
        let conn =
            store::open_writer(&path, Durability::Normal, Duration::from_secs(1), None).unwrap();
        let mut stmt = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'events' ORDER BY name")
            .unwrap();
        let names: Vec<String> = stmt
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(names, ["events_run_id", "events_type_rare"]);
    }

    fn time(ts: &str) -> OffsetDateTime {
        OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339).unwrap()
    }

    /// The seq bound of every instant, on and between the stored ones, is where a scan
    /// of the timestamps would put it, and a time window returns what a scan returns.
    #[test]
    fn time_bounds_found_by_binary_search_match_a_scan() {
        let stamps = [
            "2026-11-24T10:00:00.000Z",
            "2026-11-24T10:00:00.000Z",
            "2026-11-24T10:00:01.000Z",
            "2026-11-24T10:00:02.500Z",
            "2026-11-24T10:00:02.500Z",
            "2026-11-24T10:00:02.500Z",
            "2026-11-24T10:00:07.000Z",
            "2026-11-24T10:01:00.000Z",
        ];
        let probes = [
            "2026-11-24T09:59:59.000Z",
            "2026-11-24T10:00:00.000Z",
            "2026-11-24T10:00:00.500Z",
            "2026-11-24T10:00:01.000Z",
            "2026-11-24T10:00:02.500Z",
            "2026-11-24T10:00:03.000Z",
            "2026-11-24T10:00:07.000Z",
            "2026-11-24T10:01:00.000Z",
            "2026-11-24T10:02:00.000Z",
        ];
        for (first, skip) in [(1, 0), (100, 0), (100, 103), (1, 1)] {
            let conn = events(first, skip, &stamps);
            let stored: Vec<(i64, &str)> = stamps
                .iter()
                .enumerate()
                .map(|(i, ts)| (first + i as i64, *ts))
                .filter(|(seq, _)| *seq != skip)
                .collect();
            for probe in probes {
                // The same split of the stored events (a bound on a missing seq is
                // as good as the next stored one).
                let bound = seq_bound(&conn, probe).unwrap();
                let below: Vec<bool> = stored.iter().map(|(seq, _)| *seq < bound).collect();
                let earlier: Vec<bool> = stored.iter().map(|(_, ts)| *ts < probe).collect();
                assert_eq!(below, earlier, "{first} {skip} {probe}");
            }
            for since in probes {
                for until in probes {
                    let filter = EventFilter {
                        since: Some(time(since)),
                        until: Some(time(until)),
                        ..Default::default()
                    };
                    let got: Vec<i64> = read_events(&conn, Path::new("t"), &filter)
                        .unwrap()
                        .iter()
                        .map(|e| e.seq as i64)
                        .collect();
                    let want: Vec<i64> = stored
                        .iter()
                        .filter(|(_, ts)| *ts >= since && *ts < until)
                        .map(|(seq, _)| *seq)
                        .collect();
                    assert_eq!(got, want, "{first} {skip} {since}..{until}");
                }
            }
        }
        assert_eq!(seq_bound(&events(1, 0, &[]), probes[0]).unwrap(), 0);
    }

    /// A row whose timestamp was edited out of order may be missed by a window, but
    /// an event outside the window is never returned.
    #[test]
    fn a_timestamp_out_of_order_is_never_returned_outside_the_window() {
        let conn = events(
            1,
            0,
            &[
                "2026-11-24T10:00:00.000Z",
                "2026-11-24T12:00:00.000Z",
                "2026-11-24T10:00:02.000Z",
                "2026-11-24T10:00:03.000Z",
            ],
        );
        for (since, until) in [
            ("2026-11-24T10:00:01.000Z", "2026-11-24T10:00:04.000Z"),
            ("2026-11-24T11:00:00.000Z", "2026-11-24T13:00:00.000Z"),
            ("2026-11-24T09:00:00.000Z", "2026-11-24T11:00:00.000Z"),
        ] {
            let filter = EventFilter {
                since: Some(time(since)),
                until: Some(time(until)),
                ..Default::default()
            };
            for event in read_events(&conn, Path::new("t"), &filter).unwrap() {
                let ts = event.value["seq"].as_i64().unwrap();
                let stored: String = conn
                    .query_row("SELECT ts FROM events WHERE seq = ?1", [ts], |r| r.get(0))
                    .unwrap();
                assert!(
                    stored.as_str() >= since && stored.as_str() < until,
                    "{stored}"
                );
            }
        }
    }
}
