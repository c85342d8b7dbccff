//! How far the hub holds each sidecar's log, in time, and the lines of the fleet's logs
//! that name one approval: what a sidecar reads to learn whether another sidecar
//! already used (or decided) an approval.
//!
//! Coverage: each shipper round reads the database's clock, then its local log's
//! committed head; when the hub then holds the log up to that head, every event the
//! sidecar committed before that clock reading is in the hub, and the shipper records
//! the reading in `hub_logs.covered_until` (only ever forward). An idle sidecar does
//! this every round too, so its coverage keeps up with the clock; a sidecar that
//! stopped, or whose shipping fails, falls behind.
//!
//! INVARIANT: coverage is only recorded for a clock reading taken before the local head
//! was read, so it never claims an event the hub does not hold (one clock: the
//! database's).

use std::time::Duration;

use super::{HubError, db_error, pool_error};

/// The hub's tables gain each log's coverage, and whether the log is closed (its
/// sidecar stopped with the hub holding all of it) (a versioned migration of the
/// cluster database).
pub const SCHEMA_COVERAGE: &str = "
ALTER TABLE hub_logs ADD COLUMN covered_until timestamptz;
ALTER TABLE hub_logs ADD COLUMN closed boolean NOT NULL DEFAULT false;
";

/// The longest one read of the hub may take.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The hub's coverage of every sidecar log, read at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coverage {
    /// The database's clock, Unix milliseconds.
    pub now_ms: i64,
    /// Each registered origin and the time up to which the hub holds every event its
    /// sidecar committed (None: never recorded, e.g. shipped by an older toolgate;
    /// `i64::MAX`: closed, the hub holds the whole log of a sidecar that stopped).
    pub logs: Vec<(String, Option<i64>)>,
}

async fn client(pool: &deadpool_postgres::Pool) -> Result<deadpool_postgres::Object, HubError> {
    tokio::time::timeout(READ_TIMEOUT, pool.get())
        .await
        .map_err(|_| HubError::Unavailable("no database connection in time".into()))?
        .map_err(|e| pool_error(&e))
}

/// The database's clock now, in Unix milliseconds.
pub async fn clock_ms(pool: &deadpool_postgres::Pool) -> Result<i64, HubError> {
    let client = client(pool).await?;
    let row = tokio::time::timeout(
        READ_TIMEOUT,
        client.query_one(
            "SELECT (extract(epoch FROM statement_timestamp()) * 1000)::bigint",
            &[],
        ),
    )
    .await
    .map_err(|_| HubError::Unavailable("the hub did not answer in time".into()))?
    .map_err(|e| db_error(&e))?;
    Ok(row.get(0))
}

/// Records that the hub holds every event of `origin`'s log committed before
/// `covered_ms` (a database clock reading taken before the local head was read).
pub async fn record(
    pool: &deadpool_postgres::Pool,
    origin: &str,
    covered_ms: i64,
) -> Result<(), HubError> {
    let client = client(pool).await?;
    tokio::time::timeout(
        READ_TIMEOUT,
        client.execute(
            "UPDATE hub_logs SET covered_until = to_timestamp($2::bigint / 1000.0) \
             WHERE origin = $1 AND (covered_until IS NULL OR covered_until < to_timestamp($2::bigint / 1000.0))",
            &[&origin, &covered_ms],
        ),
    )
    .await
    .map_err(|_| HubError::Unavailable("the hub did not answer in time".into()))?
    .map_err(|e| db_error(&e))?;
    Ok(())
}

/// Closes the coverage of `origin`'s log at a graceful stop: the log appends nothing
/// more and the hub holds all of it (`size` events), so it is covered for good, until
/// [`reopen`].
pub async fn close(
    pool: &deadpool_postgres::Pool,
    origin: &str,
    size: u64,
) -> Result<(), HubError> {
    let client = client(pool).await?;
    let size = i64::try_from(size).unwrap_or(i64::MAX);
    tokio::time::timeout(
        READ_TIMEOUT,
        client.execute(
            "UPDATE hub_logs SET closed = true, covered_until = statement_timestamp() \
             WHERE origin = $1 AND size >= $2",
            &[&origin, &size],
        ),
    )
    .await
    .map_err(|_| HubError::Unavailable("the hub did not answer in time".into()))?
    .map_err(|e| db_error(&e))?;
    Ok(())
}

/// Opens `origin`'s coverage again when its sidecar starts, before it serves a call:
/// from now on it may decide and use approvals, and the others wait for its coverage.
pub async fn reopen(pool: &deadpool_postgres::Pool, origin: &str) -> Result<(), HubError> {
    let client = client(pool).await?;
    tokio::time::timeout(
        READ_TIMEOUT,
        client.execute(
            "UPDATE hub_logs SET closed = false WHERE origin = $1 AND closed",
            &[&origin],
        ),
    )
    .await
    .map_err(|_| HubError::Unavailable("the hub did not answer in time".into()))?
    .map_err(|e| db_error(&e))?;
    Ok(())
}

/// Every registered log's coverage, with the database's clock.
pub async fn coverage(pool: &deadpool_postgres::Pool) -> Result<Coverage, HubError> {
    let client = client(pool).await?;
    let rows = tokio::time::timeout(
        READ_TIMEOUT,
        client.query(
            "SELECT (extract(epoch FROM statement_timestamp()) * 1000)::bigint, l.origin, \
             CASE WHEN l.closed THEN 9223372036854775807 \
                  ELSE (extract(epoch FROM l.covered_until) * 1000)::bigint END \
             FROM (SELECT 1) AS one LEFT JOIN hub_logs AS l ON true ORDER BY 2",
            &[],
        ),
    )
    .await
    .map_err(|_| HubError::Unavailable("the hub did not answer in time".into()))?
    .map_err(|e| db_error(&e))?;
    let now_ms = rows.first().map(|r| r.get::<_, i64>(0)).unwrap_or(0);
    let logs = rows
        .iter()
        .filter_map(|r| Some((r.get::<_, Option<String>>(1)?, r.get(2))))
        .collect();
    Ok(Coverage { now_ms, logs })
}

/// The lines of run `run_id` in the hub, of every origin but `except`, whose text holds
/// `needle` (an approval id): `(origin, seq, line)` in each origin's order. The caller
/// parses them and checks the fields it means.
pub async fn lines_naming(
    pool: &deadpool_postgres::Pool,
    run_id: &str,
    needle: &str,
    except: &str,
) -> Result<Vec<(String, u64, String)>, HubError> {
    let client = client(pool).await?;
    let rows = tokio::time::timeout(
        READ_TIMEOUT,
        client.query(
            "SELECT origin, seq, line FROM hub_events \
             WHERE run_id = $1 AND origin <> $3 AND strpos(line, $2) > 0 ORDER BY origin, seq",
            &[&run_id, &needle, &except],
        ),
    )
    .await
    .map_err(|_| HubError::Unavailable("the hub did not answer in time".into()))?
    .map_err(|e| db_error(&e))?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                r.get::<_, String>(0),
                r.get::<_, i64>(1).max(0) as u64,
                r.get::<_, String>(2),
            )
        })
        .collect())
}
