//! The caller's hold on an MCP call in flight: its progress, relayed from the
//! upstream, and its cancellation. The front is stateless, so a client's
//! `notifications/cancelled` (its own POST) reaches the call it names through a table
//! of the calls in flight, keyed so that only the caller who made a call can cancel it.

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::model::{ProgressNotificationParam, ProgressToken, RequestId};
use serde_json::{Value, json};

use crate::call::{CallSignals, Progress};
use crate::gateway::Gateway;

/// Whether `body` is a `notifications/cancelled` (a JSON-RPC notification, no `id`);
/// then the request id it names, when it names a valid one.
pub(crate) fn cancelled_request(body: &[u8]) -> Option<Option<RequestId>> {
    #[derive(serde::Deserialize)]
    struct Notification {
        method: String,
        #[serde(default)]
        params: Option<Value>,
        id: Option<Value>,
    }
    const METHOD: &[u8] = b"notifications/cancelled";
    // Most bodies are not one: do not parse them twice.
    if !body.windows(METHOD.len()).any(|w| w == METHOD) {
        return None;
    }
    let notification: Notification = serde_json::from_slice(body).ok()?;
    if notification.method != "notifications/cancelled" || notification.id.is_some() {
        return None;
    }
    Some(
        notification
            .params
            .as_ref()
            .and_then(|p| p.get("requestId"))
            .and_then(|id| serde_json::from_value::<RequestId>(id.clone()).ok()),
    )
}

/// An MCP progress notification of `token` carrying `progress`.
pub(crate) fn progress_param(
    token: &ProgressToken,
    progress: Progress,
) -> ProgressNotificationParam {
    let mut param = ProgressNotificationParam::new(token.clone(), progress.progress);
    param.total = progress.total;
    param.message = progress.message;
    param
}

/// Who may cancel an MCP call in flight: the same credential, role and run, naming
/// the call's JSON-RPC request id, on the same gateway.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct InFlightKey {
    gateway: usize,
    token_sha256: String,
    role_id: Option<String>,
    run_id: Option<String>,
    request_id: String,
}

impl InFlightKey {
    pub(crate) fn of(
        gateway: &Arc<Gateway>,
        token: Option<&str>,
        role_id: &Option<String>,
        run_id: &Option<String>,
        request_id: &RequestId,
    ) -> InFlightKey {
        InFlightKey {
            gateway: Arc::as_ptr(gateway) as usize,
            token_sha256: crate::canonical::sha256_hex(token.unwrap_or_default().as_bytes()),
            role_id: role_id.clone(),
            run_id: run_id.clone(),
            request_id: json!(request_id).to_string(),
        }
    }
}

/// The MCP calls in flight in this process, by who may cancel them. An entry lives
/// as long as its call's handler, so the table holds at most the calls running.
pub(crate) struct InFlightCalls;

/// The calls in flight under one key, each with the serial of its registration.
type InFlightTable = HashMap<InFlightKey, Vec<(u64, CallSignals)>>;

static IN_FLIGHT: std::sync::LazyLock<std::sync::Mutex<InFlightTable>> =
    std::sync::LazyLock::new(Default::default);
static NEXT_IN_FLIGHT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A registration in [`IN_FLIGHT`], removed on drop.
pub(crate) struct Registered {
    key: InFlightKey,
    serial: u64,
}

impl InFlightCalls {
    pub(crate) fn register(key: InFlightKey, signals: &CallSignals) -> Registered {
        let serial = NEXT_IN_FLIGHT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut table) = IN_FLIGHT.lock() {
            table
                .entry(key.clone())
                .or_default()
                .push((serial, signals.clone()));
        }
        Registered { key, serial }
    }

    /// Cancels every call in flight under `key`; returns how many.
    pub(crate) fn cancel(key: &InFlightKey) -> usize {
        let found: Vec<CallSignals> = IN_FLIGHT
            .lock()
            .map(|table| {
                table
                    .get(key)
                    .map(|calls| calls.iter().map(|(_, s)| s.clone()).collect())
                    .unwrap_or_default()
            })
            .unwrap_or_default();
        for signals in &found {
            signals.cancel.cancel();
        }
        found.len()
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Ok(mut table) = IN_FLIGHT.lock()
            && let Some(calls) = table.get_mut(&self.key)
        {
            calls.retain(|(serial, _)| *serial != self.serial);
            if calls.is_empty() {
                table.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn only_cancellation_notifications_are_read() {
        let id = |body: &str| cancelled_request(body.as_bytes());
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":8}}"#),
            Some(Some(RequestId::Number(8)))
        );
        assert_eq!(
            id(
                r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"a"}}"#
            ),
            Some(Some(RequestId::String("a".into())))
        );
        // No usable id: accepted and ignored.
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{}}"#),
            Some(None)
        );
        // A request (it has an id), another method, or the words in an argument.
        for other in [
            r#"{"jsonrpc":"2.0","id":1,"method":"notifications/cancelled","params":{"requestId":8}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"notifications/cancelled"}}"#,
            "notifications/cancelled",
        ] {
            assert_eq!(id(other), None, "{other}");
        }
    }
}
