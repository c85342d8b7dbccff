//! Call budgets and rates, the gateway's side: the counters (`state::counters`) claimed
//! for a call once steps 1-8 allowed it, and given back when it executed nothing.
//!
//! INVARIANT: a call is counted at admission (after the pure decision, before its
//! `tool_requested`), all of its claims at once or none; a denied or refused call is
//! never counted, and an admitted call that reached no tool is refunded.

use std::path::Path;
use std::sync::Arc;

use serde_json::json;

use super::Gateway;
use crate::call::LimitClaim;
use crate::diagnostic::{Reason, Refusal};
use crate::state::counters::{Admission as Counted, Claim, Counters, SqliteCounters, Ticket};

/// Opens `<data_dir>/counters.db`, or says why it could not (calls with limits are then
/// refused: fail closed).
pub fn open(data_dir: &Path) -> Result<Arc<dyn Counters>, String> {
    SqliteCounters::open(&data_dir.join("counters.db"))
        .map(|c| Arc::new(c) as Arc<dyn Counters>)
        .map_err(|e| e.to_string())
}

/// A call's admission to its budgets and rates: what was counted for it, given back at
/// most once ([`Admission::refund`]) if the call reaches no tool. A dry run, a call
/// without limits and a call not admitted hold nothing.
#[derive(Default)]
pub(crate) struct Admission {
    counted: Option<(Ticket, Arc<dyn Counters>)>,
}

impl Admission {
    /// Gives the counts back (the call reached no tool). Only the first call gives
    /// anything back; later ones do nothing. A failure is logged: the call then stays
    /// counted, which errs on the side of the limit.
    pub(crate) async fn refund(&mut self) {
        let Some((ticket, counters)) = self.counted.take() else {
            return;
        };
        let refunded = tokio::task::spawn_blocking(move || counters.refund(&ticket)).await;
        if !matches!(refunded, Ok(Ok(()))) {
            tracing::warn!("a call's budget and rate counts could not be given back");
        }
    }
}

impl Gateway {
    /// Claims a call's budgets and rates (`count: false` for a dry run: checked, not
    /// counted). An empty admission when the call has no limits.
    pub(crate) async fn admit(
        &self,
        claims: &[LimitClaim],
        count: bool,
    ) -> Result<Admission, Refusal> {
        if claims.is_empty() {
            return Ok(Admission::default());
        }
        let counters = self.counters.clone().map_err(|e| unavailable(&e))?;
        let wanted: Vec<Claim> = claims
            .iter()
            .map(|c| Claim {
                counter: c.counter.clone(),
                max: c.max,
                window_ms: c
                    .per_s
                    .map(|s| i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX)),
            })
            .collect();
        let now = now_ms();
        let admitting = Arc::clone(&counters);
        let admission = tokio::task::spawn_blocking(move || admitting.admit(&wanted, now, count))
            .await
            .map_err(|_| unavailable("the counter task failed"))?
            .map_err(|e| unavailable(&e.to_string()))?;
        match admission {
            Counted::Admitted(ticket) => Ok(Admission {
                counted: count.then_some((ticket, counters)),
            }),
            Counted::Refused {
                index,
                used,
                retry_after_ms,
            } => {
                let claim = claims.get(index).cloned();
                let Some(claim) = claim else {
                    return Err(unavailable("the counters refused an unknown claim"));
                };
                Err(refusal(&claim, used, retry_after_ms))
            }
        }
    }
}

fn refusal(claim: &LimitClaim, used: u64, retry_after_ms: Option<u64>) -> Refusal {
    let mut details = json!({
        "owner": claim.owner,
        "limit": claim.kind,
        "max": claim.max,
        "used": used,
    });
    if let Some(per_s) = claim.per_s {
        details["per_s"] = json!(per_s);
    }
    if let Some(key) = &claim.key {
        details["key"] = json!(key);
        details["key_value"] = claim.key_value.clone();
    }
    match retry_after_ms {
        None => Refusal::new(
            Reason::BudgetExhausted,
            format!(
                "the run has made {used} of the {} calls `{}` allows per run",
                claim.max, claim.owner
            ),
        )
        .with_details(details),
        Some(wait) => {
            details["retry_after_ms"] = json!(wait);
            let per = claim
                .key
                .as_ref()
                .map(|k| format!(" per `{k}`"))
                .unwrap_or_default();
            Refusal::new(
                Reason::RateLimited,
                format!(
                    "`{}` allows {} calls{per} in {} s; retry in {wait} ms",
                    claim.owner,
                    claim.max,
                    claim.per_s.unwrap_or(0)
                ),
            )
            .at_step(8)
            .with_details(details)
        }
    }
}

fn unavailable(why: &str) -> Refusal {
    Refusal::new(
        Reason::CounterStateUnavailable,
        format!("the budget and rate counters are unavailable: {why}"),
    )
}

fn now_ms() -> i64 {
    i64::try_from(time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000).unwrap_or(0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn admitted(counters: &Arc<dyn Counters>, claims: &[Claim]) -> Admission {
        match counters.admit(claims, 0, true).unwrap() {
            Counted::Admitted(ticket) => Admission {
                counted: Some((ticket, Arc::clone(counters))),
            },
            Counted::Refused { used, .. } => panic!("refused at {used}"),
        }
    }

    /// An admission gives its counts back once, however often it is asked: a second
    /// refund would give back another call's count and let a run past its budget.
    #[tokio::test]
    async fn an_admission_is_refunded_at_most_once() {
        let dir = tempfile::tempdir().unwrap();
        let counters: Arc<dyn Counters> =
            Arc::new(SqliteCounters::open(&dir.path().join("counters.db")).unwrap());
        let claims = [Claim {
            counter: "budget".into(),
            max: 2,
            window_ms: None,
        }];
        let mut first = admitted(&counters, &claims);
        let _second = admitted(&counters, &claims);
        first.refund().await;
        first.refund().await;
        // One of the two calls is still counted: one more fits, then the budget is spent.
        let _third = admitted(&counters, &claims);
        assert_eq!(
            counters.admit(&claims, 0, true).unwrap(),
            Counted::Refused {
                index: 0,
                used: 2,
                retry_after_ms: None
            }
        );
        // Nothing counted, nothing to give back.
        Admission::default().refund().await;
    }
}
