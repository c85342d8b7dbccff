//! Versioned schema migrations of the cluster database, applied at start under an
//! advisory lock (sidecars starting together migrate once); a database whose schema is
//! newer than this binary is refused.

use super::{ClusterDb, ClusterError, QUERY_TIMEOUT};

/// The migrations, in order; migration `i` brings the schema to version `i + 1`.
/// Never edit one that shipped: append a new one.
const MIGRATIONS: &[&str] = &[
    // 1: runs, run tokens, the safety lock, idempotency claims.
    r#"
    CREATE TABLE toolgate_runs (
        run_id text PRIMARY KEY,
        status text NOT NULL,
        scope jsonb NOT NULL,
        policy_versions jsonb NOT NULL,
        created_at text NOT NULL,
        created_by text NOT NULL,
        updated_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE toolgate_run_tokens (
        token_sha256 text PRIMARY KEY,
        token_id text NOT NULL UNIQUE,
        run_id text NOT NULL REFERENCES toolgate_runs (run_id),
        role_id text NOT NULL,
        lanes jsonb NOT NULL,
        expires_unix bigint NOT NULL,
        revoked boolean NOT NULL DEFAULT false
    );
    CREATE TABLE toolgate_safety_lock (
        id smallint PRIMARY KEY CHECK (id = 1),
        engaged boolean NOT NULL,
        reason text,
        changed_by text,
        changed_at timestamptz NOT NULL DEFAULT now()
    );
    INSERT INTO toolgate_safety_lock (id, engaged) VALUES (1, false);
    CREATE TABLE toolgate_idempotency (
        run_id text NOT NULL,
        role_id text NOT NULL,
        tool_name text NOT NULL,
        idempotency_key text NOT NULL,
        fingerprint text NOT NULL,
        state text NOT NULL CHECK (state IN ('in_flight', 'done')),
        outcome jsonb,
        node_id text NOT NULL,
        claimed_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (run_id, role_id, tool_name, idempotency_key)
    );
    "#,
    // 2: the audit hub: every sidecar's shipped log and the fleet log (`hub`).
    crate::hub::SCHEMA,
    // 3: the counters of call budgets and rates (`cluster::counters`).
    r#"
    CREATE TABLE toolgate_counters (
        counter text PRIMARY KEY,
        used bigint NOT NULL DEFAULT 0 CHECK (used >= 0)
    );
    CREATE TABLE toolgate_rate_events (
        id bigint PRIMARY KEY,
        counter text NOT NULL REFERENCES toolgate_counters (counter),
        at_ms bigint NOT NULL
    );
    CREATE INDEX toolgate_rate_events_by_counter ON toolgate_rate_events (counter, at_ms);
    "#,
    // 4: the approvals shared by a fleet (`cluster::approvals`).
    r#"
    CREATE TABLE toolgate_approvals (
        seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
        approval_id text PRIMARY KEY,
        status text NOT NULL CHECK (status IN ('pending', 'approved', 'denied', 'expired', 'used')),
        run_id text NOT NULL,
        call_digest text NOT NULL,
        created_at_ms bigint NOT NULL,
        expires_at_ms bigint NOT NULL,
        expiry_audited boolean NOT NULL DEFAULT false,
        record jsonb NOT NULL
    );
    CREATE INDEX toolgate_approvals_status ON toolgate_approvals (status, expires_at_ms);
    CREATE INDEX toolgate_approvals_run ON toolgate_approvals (run_id, status);
    CREATE INDEX toolgate_approvals_digest ON toolgate_approvals (call_digest, status);
    "#,
    // 5: the fleet key the fleet log is bound to (`hub`).
    crate::hub::SCHEMA_FLEET_KEY,
    // 6: the witnesses' cosignatures of fleet checkpoints (`hub::witness`).
    crate::hub::witness::SCHEMA,
    // 7: the claim to audit an approval's expiry (`cluster::approvals`).
    r#"
    ALTER TABLE toolgate_approvals ADD COLUMN expiry_claimed_at_ms bigint;
    ALTER TABLE toolgate_approvals ADD COLUMN expiry_claimed_by text;
    "#,
    // 8: the runs each sidecar holds events of that the hub does not (`hub::tail`).
    crate::hub::tail::SCHEMA,
    // 9: up to when the hub holds each sidecar's log (`hub::coverage`).
    crate::hub::coverage::SCHEMA_COVERAGE,
];

/// The schema version this binary writes and reads.
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// An arbitrary constant naming toolgate's migration advisory lock.
const MIGRATION_LOCK: i64 = 0x746f_6f6c_6761_7465;

/// Applies the missing migrations; refuses a schema newer than [`SCHEMA_VERSION`].
pub(super) async fn migrate(db: &ClusterDb) -> Result<(), ClusterError> {
    let failed = |e: String| ClusterError::Migration(format!("schema migration failed: {e}"));
    let mut client = db.pool.get().await.map_err(|e| {
        ClusterError::Unreachable(format!("no connection to the cluster database: {e}"))
    })?;
    let work = async {
        let tx = client
            .transaction()
            .await
            .map_err(|e| failed(e.to_string()))?;
        // Another sidecar may be migrating: wait for it longer than a query may take.
        tx.batch_execute("SET LOCAL lock_timeout = '30s'; SET LOCAL statement_timeout = '30s'")
            .await
            .map_err(|e| failed(e.to_string()))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(|e| failed(e.to_string()))?;
        // Created only when missing: a sidecar role without CREATE (docs/deployment.md)
        // starts on a schema the owner migrated.
        let exists: bool = tx
            .query_one("SELECT to_regclass('toolgate_schema') IS NOT NULL", &[])
            .await
            .map_err(|e| failed(e.to_string()))?
            .get(0);
        if !exists {
            tx.batch_execute(
                "CREATE TABLE toolgate_schema (
                version integer PRIMARY KEY,
                applied_at timestamptz NOT NULL DEFAULT now(),
                applied_by text NOT NULL
            )",
            )
            .await
            .map_err(|e| failed(e.to_string()))?;
        }
        let row = tx
            .query_one("SELECT coalesce(max(version), 0) FROM toolgate_schema", &[])
            .await
            .map_err(|e| failed(e.to_string()))?;
        let found: i32 = row.get(0);
        if found > SCHEMA_VERSION {
            return Err(ClusterError::SchemaNewer {
                found,
                supported: SCHEMA_VERSION,
            });
        }
        let by = format!("toolgate {}", env!("CARGO_PKG_VERSION"));
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
            let version = i as i32 + 1;
            tx.batch_execute(sql)
                .await
                .map_err(|e| failed(format!("version {version}: {e}")))?;
            tx.execute(
                "INSERT INTO toolgate_schema (version, applied_by) VALUES ($1, $2)",
                &[&version, &by],
            )
            .await
            .map_err(|e| failed(e.to_string()))?;
        }
        tx.commit().await.map_err(|e| failed(e.to_string()))
    };
    // Waiting for another sidecar's migration counts against the bound too.
    tokio::time::timeout(QUERY_TIMEOUT * 15, work)
        .await
        .map_err(|_| failed("it did not finish within 30 s".into()))?
}
