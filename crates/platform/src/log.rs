//! Log lines for what a running service drops, refuses or fails, through
//! `tracing`. Each kind of line is written at most [`PER_SECOND`] times a
//! second, so that a flood of bad input or a dead backend cannot flood the
//! log; a line says how many of its kind were held back before it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Lines of one kind written per second, at most.
pub const PER_SECOND: u64 = 10;

/// The budget of one kind of log line.
pub struct RateLimit {
    /// The second the count is for, since the Unix epoch.
    second: AtomicU64,
    /// Lines asked for in that second.
    count: AtomicU64,
    /// Lines held back since the last one written.
    held: AtomicU64,
}

impl RateLimit {
    pub const fn new() -> RateLimit {
        RateLimit {
            second: AtomicU64::new(0),
            count: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// `Some(held)` if a line may be written now, with how many lines of
    /// this kind were held back before it; `None` if it is held back.
    pub fn allow(&self) -> Option<u64> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if self.second.swap(now, Ordering::Relaxed) != now {
            self.count.store(0, Ordering::Relaxed);
        }
        if self.count.fetch_add(1, Ordering::Relaxed) < PER_SECOND {
            Some(self.held.swap(0, Ordering::Relaxed))
        } else {
            self.held.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

impl Default for RateLimit {
    fn default() -> RateLimit {
        RateLimit::new()
    }
}

/// Writes a `tracing` event at `$level` if `$limit` (a [`RateLimit`])
/// allows it, with the count of lines it held back as field `held_back`.
#[macro_export]
macro_rules! limited {
    ($limit:expr, $level:ident, $($rest:tt)+) => {
        if let Some(held_back) = $limit.allow() {
            tracing::$level!(held_back, $($rest)+);
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_cut_to_the_budget_and_the_rest_counted() {
        let limit = RateLimit::new();
        let allowed: Vec<Option<u64>> = (0..PER_SECOND + 5).map(|_| limit.allow()).collect();
        // Within one second (or across a boundary, where the count restarts).
        let written = allowed.iter().filter(|a| a.is_some()).count() as u64;
        assert!(
            (PER_SECOND..=2 * PER_SECOND).contains(&written),
            "{allowed:?}"
        );
        if written == PER_SECOND {
            assert!(allowed[..PER_SECOND as usize].iter().all(|a| *a == Some(0)));
            assert!(allowed[PER_SECOND as usize..].iter().all(Option::is_none));
            assert_eq!(limit.held.load(Ordering::Relaxed), 5);
        }
    }
}
