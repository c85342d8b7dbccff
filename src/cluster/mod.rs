//! The fleet's shared state in PostgreSQL (`serve --cluster-db URL`): runs and their
//! status, run tokens (sha256 only), the safety lock, and idempotency claims and
//! outcomes, so sidecars of one fleet decide on the same state.
//!
//! Without the flag none of this exists and the embedded state (in memory, rebuilt
//! from the local audit log) is used exactly as before. With it, PostgreSQL is the
//! authority: every call re-reads the run (and its run token) from it before deciding,
//! idempotency keys are claimed with `INSERT ... ON CONFLICT DO NOTHING RETURNING`,
//! and the safety lock is watched (LISTEN/NOTIFY and a poll every
//! [`LOCK_POLL_EVERY`]); a sidecar that has not confirmed the lock's state within
//! [`LOCK_BOUND`] treats it as engaged (`safety_lock_unconfirmed`). Every query is
//! bounded by [`QUERY_TIMEOUT`]; the database being down refuses the calls that need
//! it (`cluster_unavailable`), never deciding on a guess. The local audit log still
//! records every change this sidecar makes, written inside the database transaction
//! that makes it, before the commit.

use std::str::FromStr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime, Timeouts};
use serde_json::{Value, json};
use tokio_postgres::error::SqlState;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::diagnostic::{Reason, Refusal};

pub mod approvals;
pub mod counters;
mod schema;
pub mod state;

/// The longest any one query (or taking a connection) may take.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the safety lock is re-read even without a notification.
pub const LOCK_POLL_EVERY: Duration = Duration::from_millis(250);
/// A sidecar that has not confirmed the safety lock's state for this long treats it as
/// engaged; an engaged or released lock reaches every sidecar within this bound.
pub const LOCK_BOUND: Duration = Duration::from_secs(2);
/// The connections one sidecar keeps to the database, at most.
pub const POOL_SIZE: usize = 16;
/// The notification channel of safety-lock changes.
const LOCK_CHANNEL: &str = "toolgate_safety_lock";

/// Why the cluster database could not be joined at start.
#[derive(Debug)]
pub enum ClusterError {
    /// The URL is not a `postgres://` URL tokio-postgres accepts.
    InvalidUrl(String),
    /// No connection within the timeout, or the host refused it.
    Unreachable(String),
    /// The server refused the credentials or the database name.
    AuthFailed(String),
    /// Something answered, but not as PostgreSQL does.
    NotPostgres(String),
    /// The database's schema is newer than this binary knows.
    SchemaNewer { found: i32, supported: i32 },
    /// Applying a migration failed.
    Migration(String),
}

impl ClusterError {
    /// The stable code printed at start-up.
    pub fn code(&self) -> &'static str {
        match self {
            ClusterError::InvalidUrl(_) => "cluster_db_invalid_url",
            ClusterError::Unreachable(_) => "cluster_db_unreachable",
            ClusterError::AuthFailed(_) => "cluster_db_auth_failed",
            ClusterError::NotPostgres(_) => "cluster_db_not_postgres",
            ClusterError::SchemaNewer { .. } => "cluster_db_schema_newer",
            ClusterError::Migration(_) => "cluster_db_migration_failed",
        }
    }

    /// What to do about it.
    pub fn help(&self) -> &'static str {
        match self {
            ClusterError::InvalidUrl(_) => {
                "use postgres://USER:PASSWORD@HOST:PORT/DATABASE (sslmode=require for TLS)"
            }
            ClusterError::Unreachable(_) => {
                "check the host and port, and that PostgreSQL runs and accepts TCP connections"
            }
            ClusterError::AuthFailed(_) => {
                "check the user, password and database name, and pg_hba.conf"
            }
            ClusterError::NotPostgres(_) => "the URL must name a PostgreSQL server's port",
            ClusterError::SchemaNewer { .. } => {
                "a newer toolgate migrated this database: upgrade this sidecar"
            }
            ClusterError::Migration(_) => {
                "the role needs CREATE on the schema for the first start (docs/deployment.md)"
            }
        }
    }

    /// The structured start-up error, one JSON object.
    pub fn to_json(&self, url: &str) -> Value {
        let message = match self {
            ClusterError::InvalidUrl(m)
            | ClusterError::Unreachable(m)
            | ClusterError::AuthFailed(m)
            | ClusterError::NotPostgres(m)
            | ClusterError::Migration(m) => m.clone(),
            ClusterError::SchemaNewer { found, supported } => format!(
                "the cluster database has schema version {found}; this binary knows up to {supported}"
            ),
        };
        json!({
            "error": self.code(),
            "message": message,
            "help": self.help(),
            "cluster_db": redact(url),
        })
    }
}

impl std::fmt::Display for ClusterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.to_json("")["message"].as_str().unwrap_or(""))
    }
}

/// The URL with its password replaced by `***` (for logs and errors).
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "(not a URL)".into();
    };
    // The last `@` ends the user information (a raw `@` in a password stays hidden).
    match rest.rsplit_once('@') {
        Some((user, host)) => {
            let user = user.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_string(),
    }
}

/// The safety lock's state as the database holds it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LockState {
    pub engaged: bool,
    pub reason: Option<String>,
    pub changed_by: Option<String>,
}

/// The state of the safety lock as last confirmed from the database.
#[derive(Debug, Clone)]
struct LockView {
    lock: LockState,
    confirmed: Option<Instant>,
}

/// A connection pool to the cluster database and the watched safety lock.
pub struct ClusterDb {
    pool: Pool,
    pg_config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    lock: RwLock<LockView>,
    /// This sidecar's id in idempotency claims.
    pub node_id: String,
}

impl std::fmt::Debug for ClusterDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterDb")
            .field("node_id", &self.node_id)
            .finish()
    }
}

impl ClusterDb {
    /// Connects, checks the server is PostgreSQL and the schema not newer than this
    /// binary, applies the missing migrations, reads the safety lock, and starts
    /// watching it.
    pub async fn connect(url: &str) -> Result<Arc<ClusterDb>, ClusterError> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(ClusterError::InvalidUrl(
                "the cluster database URL must start with postgres:// or postgresql://".into(),
            ));
        }
        let mut pg_config = tokio_postgres::Config::from_str(url)
            .map_err(|e| ClusterError::InvalidUrl(format!("not a usable PostgreSQL URL: {e}")))?;
        pg_config
            .connect_timeout(QUERY_TIMEOUT)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10))
            .application_name("toolgate")
            .options(format!(
                "-c statement_timeout={} -c lock_timeout={}",
                QUERY_TIMEOUT.as_millis(),
                QUERY_TIMEOUT.as_millis()
            ));
        let tls = crate::outbound::system_tls_config()
            .map(MakeRustlsConnect::new)
            .map_err(ClusterError::InvalidUrl)?;
        let manager = Manager::from_config(
            pg_config.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .timeouts(Timeouts {
                wait: Some(QUERY_TIMEOUT),
                create: Some(QUERY_TIMEOUT),
                recycle: Some(QUERY_TIMEOUT),
            })
            .build()
            .map_err(|e| ClusterError::InvalidUrl(e.to_string()))?;
        // The first connection tells an unreachable host from refused credentials
        // from a server that is not PostgreSQL.
        let first = tokio::time::timeout(QUERY_TIMEOUT * 2, pg_config.connect(tls.clone()))
            .await
            .map_err(|_| {
                ClusterError::Unreachable(format!(
                    "no answer from the cluster database within {} s",
                    (QUERY_TIMEOUT * 2).as_secs()
                ))
            })?;
        match first {
            Ok((client, connection)) => {
                drop(client);
                drop(connection);
            }
            Err(e) => return Err(classify(&e)),
        }
        let db = ClusterDb {
            pool,
            pg_config,
            tls,
            lock: RwLock::new(LockView {
                lock: LockState::default(),
                confirmed: None,
            }),
            node_id: format!("node-{}", uuid::Uuid::new_v4()),
        };
        schema::migrate(&db).await?;
        db.refresh_lock()
            .await
            .map_err(|r| ClusterError::Migration(r.message))?;
        let db = Arc::new(db);
        tokio::spawn(watch_lock(Arc::downgrade(&db)));
        Ok(db)
    }

    /// A pooled connection within [`QUERY_TIMEOUT`], or `cluster_unavailable`.
    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Object, Refusal> {
        self.pool
            .get()
            .await
            .map_err(|e| unavailable(format!("no connection to the cluster database: {e}")))
    }

    /// The safety lock as last confirmed; engaged (fail closed) with
    /// `confirmed: false` when it was not confirmed within [`LOCK_BOUND`].
    pub fn safety_lock(&self) -> (LockState, bool) {
        let Ok(view) = self.lock.read() else {
            return (unconfirmed_lock(), false);
        };
        match view.confirmed {
            Some(at) if at.elapsed() <= LOCK_BOUND => (view.lock.clone(), true),
            _ => (unconfirmed_lock(), false),
        }
    }

    /// Re-reads the safety lock from the database.
    pub async fn refresh_lock(&self) -> Result<LockState, Refusal> {
        let client = self.client().await?;
        let row = bounded(client.query_one(
            "SELECT engaged, reason, changed_by FROM toolgate_safety_lock WHERE id = 1",
            &[],
        ))
        .await?;
        let lock = LockState {
            engaged: row.get(0),
            reason: row.get(1),
            changed_by: row.get(2),
        };
        self.confirm_lock(lock.clone());
        Ok(lock)
    }

    fn confirm_lock(&self, lock: LockState) {
        if let Ok(mut view) = self.lock.write() {
            *view = LockView {
                lock,
                confirmed: Some(Instant::now()),
            };
        }
    }

    /// Drops the confirmation: the lock reads as engaged until it is re-read.
    pub fn forget_lock(&self) {
        if let Ok(mut view) = self.lock.write() {
            view.confirmed = None;
        }
    }

    /// Sets the safety lock in the database and notifies every sidecar; `record`
    /// writes the local audit event inside the transaction, before the commit.
    pub async fn set_safety_lock<F, Fut>(&self, new: &LockState, record: F) -> Result<(), Refusal>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<(), Refusal>>,
    {
        let mut client = self.client().await?;
        let tx = bounded(client.transaction()).await?;
        bounded(tx.execute(
            "UPDATE toolgate_safety_lock SET engaged = $1, reason = $2, changed_by = $3, changed_at = now() WHERE id = 1",
            &[&new.engaged, &new.reason, &new.changed_by],
        ))
        .await?;
        bounded(tx.execute("SELECT pg_notify($1, '')", &[&LOCK_CHANNEL])).await?;
        record().await?;
        bounded(tx.commit()).await?;
        self.confirm_lock(new.clone());
        Ok(())
    }
}

/// The lock a sidecar enforces when it cannot confirm the real one.
fn unconfirmed_lock() -> LockState {
    LockState {
        engaged: true,
        reason: Some(format!(
            "the safety lock's state could not be confirmed from the cluster database within {} ms",
            LOCK_BOUND.as_millis()
        )),
        changed_by: None,
    }
}

/// Keeps the safety lock confirmed over a connection of its own (not the pool, so
/// calls cannot starve it): LISTEN wakes it on every change, and it re-reads the lock
/// every [`LOCK_POLL_EVERY`] regardless. A failed connection is replaced after
/// [`LOCK_POLL_EVERY`]. Ends when the database handle is dropped.
async fn watch_lock(db: std::sync::Weak<ClusterDb>) {
    loop {
        let Some(strong) = db.upgrade() else {
            return;
        };
        let (config, tls) = (strong.pg_config.clone(), strong.tls.clone());
        drop(strong);
        watch_on_one_connection(&db, config, tls).await;
        tokio::time::sleep(LOCK_POLL_EVERY).await;
    }
}

/// One watching connection: returns when it fails (or the handle is dropped).
async fn watch_on_one_connection(
    db: &std::sync::Weak<ClusterDb>,
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
) {
    let Ok(Ok((client, mut connection))) =
        tokio::time::timeout(QUERY_TIMEOUT, config.connect(tls)).await
    else {
        tracing::warn!("the safety lock watcher cannot connect to the cluster database");
        return;
    };
    let (wake, mut woken) = tokio::sync::mpsc::channel::<()>(16);
    let driver = tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(tokio_postgres::AsyncMessage::Notification(_)) => {
                    let _ = wake.try_send(());
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    let listening = bounded(client.batch_execute(&format!("LISTEN {LOCK_CHANNEL}"))).await;
    if listening.is_ok() {
        loop {
            let Some(strong) = db.upgrade() else {
                break;
            };
            let read = bounded(client.query_one(
                "SELECT engaged, reason, changed_by FROM toolgate_safety_lock WHERE id = 1",
                &[],
            ))
            .await;
            match read {
                Ok(row) => strong.confirm_lock(LockState {
                    engaged: row.get(0),
                    reason: row.get(1),
                    changed_by: row.get(2),
                }),
                Err(refusal) => {
                    tracing::warn!(message = %refusal.message, "the safety lock could not be re-read");
                    if client.is_closed() {
                        break;
                    }
                }
            }
            drop(strong);
            tokio::select! {
                _ = woken.recv() => {},
                _ = tokio::time::sleep(LOCK_POLL_EVERY) => {},
            }
        }
    }
    driver.abort();
}

/// Runs a query within [`QUERY_TIMEOUT`], mapping failures to `cluster_unavailable`.
pub(crate) async fn bounded<T>(
    query: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, Refusal> {
    match tokio::time::timeout(QUERY_TIMEOUT, query).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(unavailable(format!(
            "the cluster database refused a query: {e}"
        ))),
        Err(_) => Err(unavailable(format!(
            "the cluster database did not answer within {} ms",
            QUERY_TIMEOUT.as_millis()
        ))),
    }
}

/// The refusal of a call that needs the cluster database when it cannot be used.
pub fn unavailable(message: String) -> Refusal {
    Refusal::new(Reason::ClusterUnavailable, message)
}

/// Sorts a failed first connection into the start-up errors.
fn classify(e: &tokio_postgres::Error) -> ClusterError {
    if let Some(code) = e.code() {
        if *code == SqlState::INVALID_PASSWORD
            || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
            || *code == SqlState::INVALID_CATALOG_NAME
            || *code == SqlState::INSUFFICIENT_PRIVILEGE
        {
            return ClusterError::AuthFailed(format!(
                "the cluster database refused the connection: {e}"
            ));
        }
        return ClusterError::Unreachable(format!("the cluster database refused to serve: {e}"));
    }
    // tokio-postgres says "error connecting to server" when no TCP connection (or
    // name resolution) came about; anything else after connecting means the peer did
    // not answer the startup message as PostgreSQL does.
    let text = e.to_string();
    if text.starts_with("error connecting to server") || text.contains("timed out") {
        return ClusterError::Unreachable(format!("cannot connect to the cluster database: {e}"));
    }
    ClusterError::NotPostgres(format!(
        "the server at the cluster database URL does not speak the PostgreSQL protocol: {e}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_never_survives_redaction() {
        let cases = [
            (
                "postgres://u:secret@db:5432/x",
                "postgres://u:***@db:5432/x",
            ),
            ("postgresql://u:se@cr@et@db/x", "postgresql://u:***@db/x"),
            ("postgres://db/x", "postgres://db/x"),
            ("not a url secret", "(not a URL)"),
        ];
        for (url, want) in cases {
            assert_eq!(redact(url), want);
            assert!(!redact(url).contains("secret") && !redact(url).contains("cr@et"));
        }
    }

    #[test]
    fn every_start_up_error_has_its_own_code_and_no_password() {
        let url = "postgres://u:hunter2@db/x";
        let errors = [
            ClusterError::InvalidUrl("m".into()),
            ClusterError::Unreachable("m".into()),
            ClusterError::AuthFailed("m".into()),
            ClusterError::NotPostgres("m".into()),
            ClusterError::SchemaNewer {
                found: 3,
                supported: 1,
            },
            ClusterError::Migration("m".into()),
        ];
        let codes: std::collections::BTreeSet<&str> = errors.iter().map(|e| e.code()).collect();
        assert_eq!(codes.len(), errors.len());
        for e in &errors {
            let json = e.to_json(url);
            assert_eq!(json["error"], e.code());
            assert!(!json.to_string().contains("hunter2"), "{json}");
            assert!(!json["message"].as_str().unwrap_or("").is_empty());
        }
    }
}
