//! What an upstream MCP server sends on its own, and the requests in flight to it:
//! progress notifications routed to the call they belong to (by the session's own
//! progress token), and a request cancelled upstream when its call is dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::model::{ClientConfig, ProgressNotificationParam, ProgressToken, ServerResult};
use rmcp::service::{NotificationContext, RequestHandle, ServiceError};
use rmcp::{ClientHandler, RoleClient};

use super::client_config;
use crate::call::{CallSignals, MAX_PROGRESS_MESSAGE_BYTES, Progress};

/// The calls waiting for progress, by the progress token sent upstream.
#[derive(Default)]
pub(super) struct ProgressRoutes {
    pub(super) by_token: Mutex<HashMap<ProgressToken, CallSignals>>,
}

impl ProgressRoutes {
    pub(super) fn deliver(&self, params: ProgressNotificationParam) {
        let signals = self
            .by_token
            .lock()
            .ok()
            .and_then(|routes| routes.get(&params.progress_token).cloned());
        if let Some(signals) = signals {
            let message = params
                .message
                .map(|m| crate::adapter::truncate(&m, MAX_PROGRESS_MESSAGE_BYTES));
            signals.report(Progress {
                progress: params.progress,
                total: params.total,
                message,
            });
        }
    }
}

/// A progress route, removed when the call ends.
pub(super) struct Route<'a> {
    pub(super) routes: &'a ProgressRoutes,
    pub(super) token: ProgressToken,
}

impl Drop for Route<'_> {
    fn drop(&mut self) {
        if let Ok(mut routes) = self.routes.by_token.lock() {
            routes.remove(&self.token);
        }
    }
}

/// How toolgate answers what an upstream sends on its own: progress is routed to
/// the call it belongs to; everything else is rmcp's default.
#[derive(Clone)]
pub(super) struct Upcalls {
    pub(super) routes: Arc<ProgressRoutes>,
}

impl ClientHandler for Upcalls {
    fn get_info(&self) -> ClientConfig {
        client_config()
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.routes.deliver(params);
    }
}

/// A request in flight upstream: cancelled there (`notifications/cancelled`) if it
/// is dropped before its answer arrived.
pub(super) struct InFlight {
    pub(super) handle: Option<RequestHandle<RoleClient>>,
}

impl InFlight {
    pub(super) async fn response(&mut self) -> Result<ServerResult, ServiceError> {
        let Some(handle) = self.handle.as_mut() else {
            return Err(ServiceError::TransportClosed);
        };
        let answer = (&mut handle.rx).await;
        self.handle = None;
        answer.unwrap_or(Err(ServiceError::TransportClosed))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(handle.cancel(Some(
                "the caller cancelled the call or its deadline passed".into(),
            )));
        }
    }
}
