//! Memorized anonymity sets: a defence against query tracking for users who keep asking.
//!
//! A user who sends a request every few seconds can be followed by intersecting the user sets of the
//! groups that cloaked his successive requests (Gruteser & Hoh; the continuous-query literature): each
//! group is k-anonymous, yet the intersection over a session can shrink to one person. Here a user's
//! *session* starts when his first request is cloaked (the group's formation time, which providers see
//! as the end of the cloaking interval) and lasts `session_ms`; it memorizes the user set of that
//! group. A group formed during the session may hold a request of the user only if it is drawn from
//! the memorized set, and the memorized set becomes that group's users.
//!
//! The rule is pairwise, so it fits the constraint graph: an edge joins two requests only when each
//! user lies in the other's memorized set (a user without a live session accepts anyone). A clique
//! therefore lies inside every member's memorized set, and the sets only shrink within a session:
//! `G_1 ⊇ G_2 ⊇ ...`, so the intersection of all groups of a session is its last group. A request in a
//! session also needs a group at least as large as the largest k cloaked so far in that session (its
//! *effective k*), so the intersection never holds fewer users than any k the user asked for in it.
//! A request whose memorized set is too small for its effective k can never be cloaked and expires at
//! once; under [`SessionPolicy::Expire`] a request in a session that finds no group on arrival also
//! expires at once instead of waiting for the memorized users until its deadline.
//!
//! Invariant (checked by the brute-force checker over the engine's outcomes): for every user and every
//! session, the users common to all groups formed in it that hold a request of his number at least the
//! largest k among those requests.
//!
//! State is bounded by the users with a live session, each holding at most one group's users; sessions
//! are forgotten once `session_ms` has passed since their start (time is an argument).

use std::collections::{HashMap, VecDeque};

use super::UserKey;

/// What happens to a request in a session that cannot be cloaked with its memorized users at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionPolicy {
    /// It stays pending until its deadline, waiting for members of its memorized set.
    Hold,
    /// It expires at once (never forwarded), so the client learns it without waiting.
    Expire,
}

/// The engine's session settings: `session_ms == 0` turns memorized sets off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionSettings {
    pub session_ms: u64,
    pub policy: SessionPolicy,
}

impl SessionSettings {
    pub const OFF: SessionSettings = SessionSettings {
        session_ms: 0,
        policy: SessionPolicy::Hold,
    };

    pub fn enabled(&self) -> bool {
        self.session_ms > 0
    }
}

/// One user's live session.
#[derive(Debug, Clone)]
struct Session {
    start_ms: i64,
    /// The users of the session's last group (sorted, the user himself included).
    memorized: Vec<UserKey>,
    /// The largest k cloaked in the session so far.
    k: u32,
}

/// The memorized anonymity sets of every user with a live session.
#[derive(Debug, Default)]
pub struct SessionTable {
    settings: Option<SessionSettings>,
    sessions: HashMap<UserKey, Session>,
    /// (start, user) in start order, to forget sessions once they end.
    starts: VecDeque<(i64, UserKey)>,
}

impl SessionTable {
    pub fn new(settings: SessionSettings) -> SessionTable {
        SessionTable {
            settings: settings.enabled().then_some(settings),
            sessions: HashMap::new(),
            starts: VecDeque::new(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.settings.is_some()
    }

    pub fn policy(&self) -> SessionPolicy {
        self.settings.map_or(SessionPolicy::Hold, |s| s.policy)
    }

    /// Users with a live session.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// The live session of `user` at `now_ms`, if any.
    fn session(&self, user: UserKey, now_ms: i64) -> Option<&Session> {
        let settings = self.settings?;
        let session = self.sessions.get(&user)?;
        let end = session
            .start_ms
            .saturating_add(i64::try_from(settings.session_ms).unwrap_or(i64::MAX));
        (now_ms < end).then_some(session)
    }

    /// The k a request of `user` must be cloaked with at `now_ms`: its own, or the session's largest.
    pub fn effective_k(&self, user: UserKey, now_ms: i64, k: u32) -> u32 {
        self.session(user, now_ms).map_or(k, |s| s.k.max(k))
    }

    /// True when `user` is in a session whose memorized set holds fewer than `k` users, so a request
    /// of his needing `k` cannot be cloaked before the session ends.
    pub fn hopeless(&self, user: UserKey, now_ms: i64, k: u32) -> bool {
        self.session(user, now_ms)
            .is_some_and(|s| s.memorized.len() < k as usize)
    }

    /// The memorized users (sorted, the user included) of `user`'s live session at `now_ms`.
    pub fn memorized(&self, user: UserKey, now_ms: i64) -> Option<&[UserKey]> {
        self.session(user, now_ms).map(|s| s.memorized.as_slice())
    }

    /// True when `user` has a live session at `now_ms`.
    pub fn in_session(&self, user: UserKey, now_ms: i64) -> bool {
        self.session(user, now_ms).is_some()
    }

    /// Whether requests of `a` and `b` may share a group formed at `now_ms`: each user lies in the
    /// other's memorized set, where one is live.
    pub fn compatible(&self, a: UserKey, b: UserKey, now_ms: i64) -> bool {
        if self.settings.is_none() {
            return true;
        }
        let admits = |session: Option<&Session>, other: UserKey| {
            session.is_none_or(|s| s.memorized.binary_search(&other).is_ok())
        };
        admits(self.session(a, now_ms), b) && admits(self.session(b, now_ms), a)
    }

    /// Records a group formed at `now_ms`; `members` are (user, k) of each member. A member with a
    /// live session narrows it to the group; any other member starts a session now.
    pub fn record_group(&mut self, members: &[(UserKey, u32)], now_ms: i64) {
        if self.settings.is_none() {
            return;
        }
        let mut users: Vec<UserKey> = members.iter().map(|m| m.0).collect();
        users.sort_unstable();
        for &(user, k) in members {
            if self.session(user, now_ms).is_some() {
                if let Some(session) = self.sessions.get_mut(&user) {
                    session.memorized.clone_from(&users);
                    session.k = session.k.max(k);
                }
            } else {
                self.sessions.insert(
                    user,
                    Session {
                        start_ms: now_ms,
                        memorized: users.clone(),
                        k,
                    },
                );
                self.starts.push_back((now_ms, user));
            }
        }
    }

    /// Forgets the sessions that ended before `now_ms`.
    pub fn forget_ended(&mut self, now_ms: i64) {
        let Some(settings) = self.settings else {
            return;
        };
        let length = i64::try_from(settings.session_ms).unwrap_or(i64::MAX);
        while let Some(&(start_ms, user)) = self.starts.front() {
            if start_ms.saturating_add(length) > now_ms {
                break;
            }
            self.starts.pop_front();
            // Only the entry of the session that is still recorded for this user removes it.
            if self
                .sessions
                .get(&user)
                .is_some_and(|s| s.start_ms == start_ms)
            {
                self.sessions.remove(&user);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(policy: SessionPolicy) -> SessionTable {
        SessionTable::new(SessionSettings {
            session_ms: 60_000,
            policy,
        })
    }

    #[test]
    fn off_admits_everyone_and_records_nothing() {
        let mut t = SessionTable::new(SessionSettings::OFF);
        t.record_group(&[(1, 2), (2, 2)], 0);
        assert!(t.is_empty());
        assert!(t.compatible(1, 3, 10));
        assert_eq!(t.effective_k(1, 10, 2), 2);
    }

    #[test]
    fn sessions_narrow_to_the_last_group_and_end() {
        let mut t = table(SessionPolicy::Hold);
        t.record_group(&[(1, 3), (2, 3), (3, 3), (4, 2)], 0);
        assert!(t.compatible(1, 2, 1_000));
        assert!(!t.compatible(1, 5, 1_000), "5 is not memorized by 1");
        assert!(!t.compatible(5, 1, 1_000), "the rule is symmetric");
        assert_eq!(t.effective_k(1, 1_000, 2), 3);
        assert_eq!(t.effective_k(4, 1_000, 2), 2);
        assert!(!t.hopeless(1, 1_000, 4));
        assert!(t.hopeless(1, 1_000, 5));
        t.record_group(&[(1, 3), (2, 3), (3, 3)], 1_000);
        assert!(!t.compatible(1, 4, 2_000));
        assert!(t.hopeless(1, 2_000, 4));
        // User 4's own session still memorizes 1..=4, but 1's no longer holds 4.
        assert!(!t.compatible(4, 1, 2_000));
        assert!(t.compatible(4, 2, 2_000) == t.compatible(2, 4, 2_000));
        // After the session (started at 0), anyone again; the next group starts a new one.
        assert!(t.compatible(1, 5, 60_000));
        assert_eq!(t.len(), 4);
        t.forget_ended(60_000);
        assert!(t.is_empty());
        t.record_group(&[(1, 2), (5, 2)], 60_000);
        assert!(!t.compatible(1, 2, 60_001));
        assert!(t.compatible(1, 5, 119_999));
        assert!(t.compatible(1, 2, 120_000));
    }
}
