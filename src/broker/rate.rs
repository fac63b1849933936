//! Per-principal request rate limit of the location path (`location.max_requests_per_s_per_principal`):
//! one token bucket per principal, holding one second's worth of requests and refilled continuously.
//! Time is passed in (the broker reads tokio's clock), so the bucket is tested without sleeping.
use std::collections::HashMap;

use tokio::time::Instant;

/// A token bucket: `capacity` tokens, refilled at `rate` per second.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    tokens: f64,
    updated: Instant,
    /// Whether the last take was refused (so a burst of refusals is logged once).
    limited: bool,
}

/// What a take decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    Allowed,
    /// Refused; `first` when the previous take was allowed.
    Refused {
        first: bool,
    },
}

impl TokenBucket {
    pub fn full(capacity: f64, now: Instant) -> TokenBucket {
        TokenBucket {
            tokens: capacity,
            updated: now,
            limited: false,
        }
    }

    pub fn take(&mut self, rate: f64, capacity: f64, now: Instant) -> Take {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(capacity);
        self.updated = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            self.limited = false;
            Take::Allowed
        } else {
            let first = !self.limited;
            self.limited = true;
            Take::Refused { first }
        }
    }
}

/// The buckets of every principal that submitted (bounded by the configured principals).
#[derive(Debug, Default)]
pub struct RateLimiter {
    buckets: HashMap<String, TokenBucket>,
}

impl RateLimiter {
    /// Takes one request of `principal` at `rate` per second (the bucket holds `rate` requests).
    pub fn take(&mut self, principal: &str, rate: f64, now: Instant) -> Take {
        let capacity = rate.max(1.0);
        match self.buckets.get_mut(principal) {
            Some(bucket) => bucket.take(rate, capacity, now),
            None => {
                let mut bucket = TokenBucket::full(capacity, now);
                let taken = bucket.take(rate, capacity, now);
                self.buckets.insert(principal.to_string(), bucket);
                taken
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn bucket_allows_a_second_of_requests_then_refills() {
        let start = Instant::now();
        let mut limiter = RateLimiter::default();
        for _ in 0..10 {
            assert_eq!(limiter.take("p", 10.0, start), Take::Allowed);
        }
        assert_eq!(
            limiter.take("p", 10.0, start),
            Take::Refused { first: true }
        );
        assert_eq!(
            limiter.take("p", 10.0, start),
            Take::Refused { first: false }
        );
        // Another principal has its own bucket.
        assert_eq!(limiter.take("q", 10.0, start), Take::Allowed);
        // 100 ms refill one token.
        let later = start + Duration::from_millis(100);
        assert_eq!(limiter.take("p", 10.0, later), Take::Allowed);
        assert_eq!(
            limiter.take("p", 10.0, later),
            Take::Refused { first: true }
        );
        // Never more than capacity, however long it waited.
        let much_later = start + Duration::from_secs(3600);
        let allowed = (0..100)
            .filter(|_| limiter.take("p", 10.0, much_later) == Take::Allowed)
            .count();
        assert_eq!(allowed, 10);
    }
}
