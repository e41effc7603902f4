//! What a listener refuses, counted for the binaries' own metrics and logged once per
//! streak rather than once per connection, so a flood neither goes unseen nor floods
//! the log.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Refusals less than this apart belong to one streak, logged once.
pub const STREAK_GAP: Duration = Duration::from_secs(10);

/// Why a connection was denied a regular slot: the `reason` label of the binaries'
/// `…_http_connections_refused_total`. A refused connection may still ask the health
/// paths through the health reserve; when the reserve is full too it is closed at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its client address already held `max_connections_per_address` connections.
    PerAddress,
    /// The listener already held `max_connections`.
    MaxConnections,
}

impl Refusal {
    /// Every reason, in the order [`ListenerStats::refused_counts`] gives them.
    pub const ALL: [Refusal; 2] = [Refusal::PerAddress, Refusal::MaxConnections];

    /// The label value.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::PerAddress => "per_address",
            Refusal::MaxConnections => "max_connections",
        }
    }

    fn index(self) -> usize {
        match self {
            Refusal::PerAddress => 0,
            Refusal::MaxConnections => 1,
        }
    }
}

/// A listener's refusals: counted per reason, logged once per streak. Shared between
/// the accept loop (through [`crate::Limits::stats`]) and the binary's metrics.
#[derive(Debug)]
pub struct ListenerStats {
    refused: [AtomicU64; 2],
    streaks: [RefusalStreak; 2],
}

impl Default for ListenerStats {
    fn default() -> Self {
        ListenerStats {
            refused: Default::default(),
            streaks: [
                RefusalStreak::new(STREAK_GAP),
                RefusalStreak::new(STREAK_GAP),
            ],
        }
    }
}

impl ListenerStats {
    /// Connections denied a regular slot for `reason` since the start.
    pub fn refused(&self, reason: Refusal) -> u64 {
        self.refused[reason.index()].load(Ordering::Relaxed)
    }

    /// Every reason's count, in [`Refusal::ALL`]'s order.
    pub fn refused_counts(&self) -> [u64; 2] {
        Refusal::ALL.map(|reason| self.refused(reason))
    }

    /// Counts one refusal, and logs it when it begins a streak.
    pub fn refuse(&self, reason: Refusal, remote: SocketAddr, limit: usize) {
        self.refused[reason.index()].fetch_add(1, Ordering::Relaxed);
        if !self.streaks[reason.index()].begins(Instant::now()) {
            return;
        }
        match reason {
            Refusal::PerAddress => tracing::warn!(
                %remote,
                max_connections_per_address = limit,
                "a client address holds its connection limit; its new connections may ask \
                 only the health paths (logged once per streak of refusals; counted in \
                 http_connections_refused_total{{reason=\"per_address\"}})"
            ),
            Refusal::MaxConnections => tracing::warn!(
                %remote,
                max_connections = limit,
                "connection limit reached; new connections may ask only the health paths \
                 (logged once per streak of refusals; counted in \
                 http_connections_refused_total{{reason=\"max_connections\"}})"
            ),
        }
    }
}

/// Rate-limits the log of a kind of refusal to one line per streak: a streak begins
/// with a refusal that comes [`RefusalStreak::new`]'s `gap` or more after the previous
/// one (or with the first ever), and every refusal less than `gap` after the previous
/// one continues it, however long it lasts.
#[derive(Debug)]
pub struct RefusalStreak {
    gap: Duration,
    last: Mutex<Option<Instant>>,
}

impl RefusalStreak {
    pub const fn new(gap: Duration) -> Self {
        RefusalStreak {
            gap,
            last: Mutex::new(None),
        }
    }

    /// Notes a refusal at `now`; true when it begins a streak (then log it).
    pub fn begins(&self, now: Instant) -> bool {
        let Ok(mut last) = self.last.lock() else {
            return false;
        };
        let begins = last.is_none_or(|last| now.saturating_duration_since(last) >= self.gap);
        *last = Some(now);
        begins
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streak_is_logged_once_however_long_it_lasts() {
        let streak = RefusalStreak::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert!(streak.begins(t0), "the first refusal begins a streak");
        // One refusal every 9 s for 15 minutes: one streak.
        for i in 1..100u32 {
            assert!(!streak.begins(t0 + Duration::from_secs(9) * i));
        }
        let end = t0 + Duration::from_secs(9) * 99;
        assert!(!streak.begins(end + Duration::from_millis(9_999)));
        let quiet_from = end + Duration::from_millis(9_999);
        assert!(
            streak.begins(quiet_from + Duration::from_secs(10)),
            "a refusal after a quiet gap begins a new streak"
        );
    }

    #[test]
    fn refusals_are_counted_per_reason() {
        let stats = ListenerStats::default();
        let remote: SocketAddr = "192.0.2.1:4000".parse().expect("addr");
        for _ in 0..3 {
            stats.refuse(Refusal::PerAddress, remote, 2);
        }
        stats.refuse(Refusal::MaxConnections, remote, 8);
        assert_eq!(stats.refused(Refusal::PerAddress), 3);
        assert_eq!(stats.refused(Refusal::MaxConnections), 1);
        assert_eq!(stats.refused_counts(), [3, 1]);
    }
}
