//! Webhook checkpoint sinks: each signed note POSTed as `text/plain` over the one
//! outgoing HTTP stack (`outbound`). The audit crate holds the mailbox, the ordering
//! and the other sinks; it asks [`Webhooks`] for one [`NoteTarget`] per url.
//!
//! INVARIANT: a webhook POST takes at most [`WEBHOOK_TIMEOUT`].

use std::path::Path;
use std::time::Duration;

use super::sink::{Delivery, NoteTarget, WebhookClient};
use crate::outbound::{self, CaBundle, error_chain};

/// The longest one webhook POST may take, connecting included.
pub const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a webhook connection (TCP and TLS) may take to set up.
const WEBHOOK_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The application's [`WebhookClient`]: reqwest over rustls (`outbound`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Webhooks;

impl WebhookClient for Webhooks {
    /// Checks every url (`http://` or `https://`) and builds its client: with `ca`,
    /// https trusts only that CA bundle, else the system's roots.
    fn targets(
        &self,
        urls: &[String],
        ca: Option<&Path>,
    ) -> Result<Vec<Box<dyn NoteTarget>>, String> {
        let ca = match ca {
            Some(path) => Some(CaBundle::load(path).map_err(|e| e.to_string())?),
            None => None,
        };
        let mut targets: Vec<Box<dyn NoteTarget>> = Vec::new();
        let mut https = false;
        for url in urls {
            let parsed = webhook_url(url)?;
            https |= parsed.scheme() == "https";
            let builder = match &ca {
                Some(ca) => outbound::builder_trusting(ca),
                None => outbound::builder(),
            };
            let client = builder
                .connect_timeout(WEBHOOK_CONNECT_TIMEOUT)
                .timeout(WEBHOOK_TIMEOUT)
                .build()
                .map_err(|e| {
                    format!(
                        "cannot build the client of webhook `{url}`: {}",
                        error_chain(&e)
                    )
                })?;
            targets.push(Box::new(Webhook {
                url: parsed,
                client,
            }));
        }
        if let Some(ca) = &ca
            && !https
        {
            return Err(format!(
                "a checkpoint sink CA (`{}`) is given but no checkpoint sink is an https:// url",
                ca.path().display()
            ));
        }
        Ok(targets)
    }
}

/// One webhook sink.
struct Webhook {
    url: reqwest::Url,
    client: reqwest::Client,
}

impl NoteTarget for Webhook {
    fn name(&self) -> String {
        format!("webhook {}", self.url)
    }

    fn deliver<'a>(&'a self, note: &'a str) -> Delivery<'a> {
        Box::pin(async move {
            let response = self
                .client
                .post(self.url.clone())
                .header(reqwest::header::CONTENT_TYPE, "text/plain; charset=utf-8")
                .body(note.to_string())
                .send()
                .await
                .map_err(|e| error_chain(&e.without_url()))?;
            if response.status().is_success() {
                Ok(())
            } else {
                Err(format!("answered {}", response.status()))
            }
        })
    }
}

/// A webhook url: absolute `http://` or `https://` with a host and no user info.
fn webhook_url(url: &str) -> Result<reqwest::Url, String> {
    let bad = || format!("webhook url `{url}` must be `http(s)://host[:port]/path`");
    let parsed = reqwest::Url::parse(url).map_err(|_| bad())?;
    if !matches!(parsed.scheme(), "http" | "https")
        || parsed.host_str().is_none_or(str::is_empty)
        || !parsed.username().is_empty()
        || parsed.password().is_some()
    {
        return Err(bad());
    }
    Ok(parsed)
}
