//! Per-client limits of the HTTP front: connections per peer address, connections in
//! total, and a request rate per peer address (a token bucket).
//!
//! A connection over either connection cap is not left waiting in the accept queue:
//! it is admitted as an *overflow* connection, which answers `/healthz` and `/readyz`
//! and refuses everything else with a structured 429 (see `server/overflow.rs`). Overflow
//! connections are bounded too ([`MAX_OVERFLOW`]); beyond that a connection is closed
//! at once. So a flood of idle sockets can neither exhaust the service for other
//! clients nor make the health endpoints unanswerable.
//!
//! INVARIANT: every count taken is given back by a permit's `Drop`; the tables are
//! bounded (an address with no connection is forgotten; rate buckets are capped at
//! [`MAX_TRACKED_CLIENTS`] and the idle ones are dropped first).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The most overflow connections (health answers and 429s) open at once.
pub const MAX_OVERFLOW: usize = 16_384;
/// The most client addresses whose request rate is tracked at once.
pub const MAX_TRACKED_CLIENTS: usize = 65_536;

/// The configured limits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitOptions {
    /// Connections served at once, all clients together.
    pub max_connections: usize,
    /// Connections served at once from one peer address.
    pub max_connections_per_client: usize,
    /// Requests per second from one peer address (0: unlimited); bursts of twice this.
    pub max_requests_per_second_per_client: u32,
}

impl Default for LimitOptions {
    fn default() -> Self {
        LimitOptions {
            max_connections: 4096,
            max_connections_per_client: 256,
            max_requests_per_second_per_client: 0,
        }
    }
}

/// How a new connection is served.
pub enum Admission {
    /// Served in full; the permit is held for the connection's life.
    Full(Permit),
    /// Over a connection cap: health endpoints only, everything else 429.
    Overflow(Permit),
    /// Over every cap: closed at once.
    Closed,
}

/// Why a request or connection was limited, for the 429's details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    ConnectionsPerClient,
    Connections,
    RequestsPerSecond,
}

impl Limit {
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::ConnectionsPerClient => "connections_per_client",
            Limit::Connections => "connections",
            Limit::RequestsPerSecond => "requests_per_second_per_client",
        }
    }
}

#[derive(Debug, Default)]
struct State {
    per_client: HashMap<IpAddr, usize>,
    total: usize,
    overflow: usize,
    buckets: HashMap<IpAddr, Bucket>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    updated: Instant,
}

/// The limits and their counters; shared by the accept loop and every connection.
#[derive(Debug)]
pub struct ClientLimits {
    options: LimitOptions,
    state: Mutex<State>,
}

impl ClientLimits {
    pub fn new(options: LimitOptions) -> Arc<ClientLimits> {
        Arc::new(ClientLimits {
            options,
            state: Mutex::new(State::default()),
        })
    }

    pub fn options(&self) -> LimitOptions {
        self.options
    }

    /// Admits a new connection from `ip`.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Admission {
        let Ok(mut state) = self.state.lock() else {
            return Admission::Closed;
        };
        let mine = state.per_client.get(&ip).copied().unwrap_or(0);
        let over = if mine >= self.options.max_connections_per_client {
            Some(Limit::ConnectionsPerClient)
        } else if state.total >= self.options.max_connections {
            Some(Limit::Connections)
        } else {
            None
        };
        match over {
            None => {
                state.total += 1;
                *state.per_client.entry(ip).or_insert(0) += 1;
                Admission::Full(Permit {
                    limits: self.clone(),
                    ip,
                    overflow: None,
                })
            }
            Some(limit) if state.overflow < MAX_OVERFLOW => {
                state.overflow += 1;
                Admission::Overflow(Permit {
                    limits: self.clone(),
                    ip,
                    overflow: Some(limit),
                })
            }
            Some(_) => Admission::Closed,
        }
    }

    /// Takes one request from `ip`'s bucket; on refusal, how long until one is free.
    pub fn allow_request(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        let rate = f64::from(self.options.max_requests_per_second_per_client);
        if rate <= 0.0 {
            return Ok(());
        }
        let burst = rate * 2.0;
        let Ok(mut state) = self.state.lock() else {
            return Err(Duration::from_secs(1));
        };
        if !state.buckets.contains_key(&ip) && state.buckets.len() >= MAX_TRACKED_CLIENTS {
            // Forget the clients idle long enough to have a full bucket again.
            let full_after = Duration::from_secs_f64(burst / rate);
            state
                .buckets
                .retain(|_, b| now.saturating_duration_since(b.updated) < full_after);
            if state.buckets.len() >= MAX_TRACKED_CLIENTS {
                return Err(Duration::from_secs(1));
            }
        }
        let bucket = state.buckets.entry(ip).or_insert(Bucket {
            tokens: burst,
            updated: now,
        });
        let elapsed = now.saturating_duration_since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(burst);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / rate))
        }
    }

    /// Connections served in full and overflow connections open now.
    pub fn open(&self) -> (usize, usize) {
        self.state
            .lock()
            .map(|s| (s.total, s.overflow))
            .unwrap_or((0, 0))
    }
}

/// A connection's place under the limits, given back when dropped.
#[derive(Debug)]
pub struct Permit {
    limits: Arc<ClientLimits>,
    ip: IpAddr,
    /// Set for an overflow connection: the cap it was over.
    overflow: Option<Limit>,
}

impl Permit {
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// The cap an overflow connection was over.
    pub fn overflow(&self) -> Option<Limit> {
        self.overflow
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let Ok(mut state) = self.limits.state.lock() else {
            return;
        };
        if self.overflow.is_some() {
            state.overflow = state.overflow.saturating_sub(1);
            return;
        }
        state.total = state.total.saturating_sub(1);
        if let Some(count) = state.per_client.get_mut(&self.ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                state.per_client.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn per_client_and_total_caps_overflow_and_give_back() {
        let limits = ClientLimits::new(LimitOptions {
            max_connections: 3,
            max_connections_per_client: 2,
            max_requests_per_second_per_client: 0,
        });
        let a1 = limits.admit(ip(1));
        let a2 = limits.admit(ip(1));
        assert!(matches!(a1, Admission::Full(_)) && matches!(a2, Admission::Full(_)));
        let Admission::Overflow(p) = limits.admit(ip(1)) else {
            panic!("per-client cap")
        };
        assert_eq!(p.overflow(), Some(Limit::ConnectionsPerClient));
        let b = limits.admit(ip(2));
        assert!(matches!(b, Admission::Full(_)));
        let Admission::Overflow(q) = limits.admit(ip(3)) else {
            panic!("total cap")
        };
        assert_eq!(q.overflow(), Some(Limit::Connections));
        assert_eq!(limits.open(), (3, 2));
        drop((a1, a2, p, b, q));
        assert_eq!(limits.open(), (0, 0));
        assert!(limits.state.lock().unwrap().per_client.is_empty());
    }

    #[test]
    fn the_request_rate_is_a_token_bucket() {
        let limits = ClientLimits::new(LimitOptions {
            max_requests_per_second_per_client: 10,
            ..LimitOptions::default()
        });
        let t0 = Instant::now();
        for _ in 0..20 {
            assert!(limits.allow_request(ip(1), t0).is_ok());
        }
        let wait = limits.allow_request(ip(1), t0).unwrap_err();
        assert!(wait <= Duration::from_millis(100), "{wait:?}");
        // Another client has its own bucket; time refills.
        assert!(limits.allow_request(ip(2), t0).is_ok());
        assert!(
            limits
                .allow_request(ip(1), t0 + Duration::from_millis(200))
                .is_ok()
        );
    }
}
