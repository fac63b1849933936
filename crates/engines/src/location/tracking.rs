//! Session anonymity: what a query-tracking adversary learns by intersecting the groups that cloaked
//! one user's successive requests (Gruteser & Hoh; the continuous-query literature).
//!
//! Input: for every cloaked request, its user, its group (an opaque id shared by the members cloaked
//! together), the group's formation time (the end of its cloaking interval) and the request's k. A
//! user's *session* starts at the formation of the group of his first cloaked request and holds his
//! cloaked requests whose groups formed within `session_ms` of that; the next one starts a new session
//! (the same definition [`crate::location::session`] defends). The session's anonymity is the number of
//! users common to all its groups; it is *below k* when that is smaller than the largest k among its
//! requests. Sessions of a single request are counted but carry no tracking information.

use std::collections::{BTreeSet, HashMap};

/// One cloaked request as an observer of the forwarded groups (who also links a user's requests) sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CloakedObservation {
    pub user: u64,
    pub group: u64,
    pub formed_at_ms: i64,
    pub k: u32,
}

/// The distribution of session anonymity over the sessions of at least two cloaked requests.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct SessionAnonymity {
    pub session_ms: u64,
    /// All sessions, and those with at least two cloaked requests (the ones tracking applies to).
    pub sessions: usize,
    pub repeated_sessions: usize,
    /// Share of the repeated sessions whose common users are fewer than their largest k.
    pub share_below_k: f64,
    /// Share of the repeated sessions whose common users are the user alone.
    pub share_identified: f64,
    /// Percentiles of the number of common users over the repeated sessions.
    pub p10: usize,
    pub p50: usize,
    pub p90: usize,
}

struct Session {
    start_ms: i64,
    common: BTreeSet<u64>,
    largest_k: u32,
    requests: usize,
}

/// Session anonymity of a run (see the module docs). Observations may come in any order.
pub fn session_anonymity(observations: &[CloakedObservation], session_ms: u64) -> SessionAnonymity {
    let mut members: HashMap<u64, BTreeSet<u64>> = HashMap::new();
    for o in observations {
        members.entry(o.group).or_default().insert(o.user);
    }
    let mut ordered: Vec<&CloakedObservation> = observations.iter().collect();
    ordered.sort_by_key(|o| (o.user, o.formed_at_ms, o.group));
    let length = i64::try_from(session_ms).unwrap_or(i64::MAX);
    let mut finished: Vec<Session> = Vec::new();
    let mut current: Option<(u64, Session)> = None;
    for o in ordered {
        let group = &members[&o.group];
        match &mut current {
            Some((user, s))
                if *user == o.user && o.formed_at_ms < s.start_ms.saturating_add(length) =>
            {
                s.common = s.common.intersection(group).copied().collect();
                s.largest_k = s.largest_k.max(o.k);
                s.requests += 1;
            }
            _ => {
                if let Some((_, s)) = current.take() {
                    finished.push(s);
                }
                current = Some((
                    o.user,
                    Session {
                        start_ms: o.formed_at_ms,
                        common: group.clone(),
                        largest_k: o.k,
                        requests: 1,
                    },
                ));
            }
        }
    }
    if let Some((_, s)) = current {
        finished.push(s);
    }
    let mut repeated: Vec<&Session> = finished.iter().filter(|s| s.requests >= 2).collect();
    repeated.sort_by_key(|s| s.common.len());
    let n = repeated.len();
    let share = |f: &dyn Fn(&Session) -> bool| {
        if n == 0 {
            0.0
        } else {
            repeated.iter().filter(|s| f(s)).count() as f64 / n as f64
        }
    };
    let percentile = |q: f64| {
        if n == 0 {
            0
        } else {
            repeated[((n - 1) as f64 * q).round() as usize].common.len()
        }
    };
    SessionAnonymity {
        session_ms,
        sessions: finished.len(),
        repeated_sessions: n,
        share_below_k: share(&|s| s.common.len() < s.largest_k as usize),
        share_identified: share(&|s| s.common.len() <= 1),
        p10: percentile(0.1),
        p50: percentile(0.5),
        p90: percentile(0.9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(user: u64, group: u64, formed_at_ms: i64, k: u32) -> CloakedObservation {
        CloakedObservation {
            user,
            group,
            formed_at_ms,
            k,
        }
    }

    #[test]
    fn intersections_shrink_within_a_session_and_restart_after_it() {
        // User 1 is cloaked with {1,2,3} at 0, with {1,3,4} at 1 s, with {1,5} at 70 s.
        let observations = [
            obs(1, 10, 0, 3),
            obs(2, 10, 0, 3),
            obs(3, 10, 0, 3),
            obs(1, 11, 1_000, 2),
            obs(3, 11, 1_000, 2),
            obs(4, 11, 1_000, 2),
            obs(1, 12, 70_000, 2),
            obs(5, 12, 70_000, 2),
        ];
        let a = session_anonymity(&observations, 60_000);
        // Sessions: user 1 twice (one repeated: {1,3}, k 3 -> below k), users 2, 4, 5 once each,
        // user 3 repeated ({1,3}, k 3 -> below).
        assert_eq!(a.sessions, 6);
        assert_eq!(a.repeated_sessions, 2);
        assert_eq!(a.share_below_k, 1.0);
        assert_eq!(a.share_identified, 0.0);
        assert_eq!((a.p10, a.p50, a.p90), (2, 2, 2));
        // With a 500 ms session nothing repeats.
        assert_eq!(session_anonymity(&observations, 500).repeated_sessions, 0);
    }

    #[test]
    fn a_stable_group_keeps_its_anonymity() {
        let mut observations = Vec::new();
        for (g, t) in [(1u64, 0i64), (2, 5_000), (3, 9_000)] {
            for user in 1..=3 {
                observations.push(obs(user, g, t, 3));
            }
        }
        let a = session_anonymity(&observations, 60_000);
        assert_eq!((a.sessions, a.repeated_sessions), (3, 3));
        assert_eq!(a.share_below_k, 0.0);
        assert_eq!(a.p50, 3);
    }
}
