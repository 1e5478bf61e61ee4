//! A consumer's acknowledgements, coalesced: the broker handles each ack as
//! a unit of work (for a quorum queue, an entry in its log), so the
//! deliveries that finished together are acknowledged with one `multiple`
//! ack where they can be. An ack only ever covers deliveries that are done:
//! `multiple` reaches up to the oldest delivery still running, never past
//! it; a finished delivery behind a slow one is acknowledged alone once it
//! has waited [`ALONE_AFTER`], so a slow message never holds back the
//! others' acks (nor, through the prefetch, the queue).

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use tokio::time::{Duration, Instant};

/// How long finished deliveries wait to be acknowledged together.
pub(crate) const LINGER: Duration = Duration::from_millis(2);

/// How long a finished delivery behind a running one waits before it is
/// acknowledged alone.
pub(crate) const ALONE_AFTER: Duration = Duration::from_millis(20);

/// One ack to send: up to and including `tag` (`multiple`), or `tag` alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ack {
    pub(crate) tag: u64,
    pub(crate) multiple: bool,
}

/// The deliveries of one channel: running, and finished but not yet
/// acknowledged.
#[derive(Debug, Default)]
pub(crate) struct Acks {
    /// Delivery tags taken and not finished (or finished without an ack:
    /// left for the broker to give again).
    running: BTreeSet<u64>,
    /// Finished deliveries to acknowledge, and when each finished.
    finished: BTreeMap<u64, Instant>,
}

impl Acks {
    /// A delivery was taken from the queue.
    pub(crate) fn taken(&mut self, tag: u64) {
        self.running.insert(tag);
    }

    /// A delivery is over; `ack` if it is to be acknowledged (handled,
    /// skipped as a duplicate, or a dead letter). One left unacknowledged
    /// stays in `running`: no `multiple` ack may cover it.
    pub(crate) fn finished(&mut self, tag: u64, ack: bool, now: Instant) {
        if ack {
            self.running.remove(&tag);
            self.finished.insert(tag, now);
        }
    }

    /// When the next flush is due, if anything waits.
    pub(crate) fn due(&self) -> Option<Instant> {
        let first = self.finished.values().min()?;
        Some(*first + LINGER)
    }

    /// The acks to send now: one `multiple` ack for the finished deliveries
    /// older than every running one, and single acks for those that have
    /// waited [`ALONE_AFTER`] behind a running one (or all of them, with
    /// `all`, when the consumer stops).
    pub(crate) fn flush(&mut self, now: Instant, all: bool) -> Vec<Ack> {
        let mut acks = Vec::new();
        let oldest_running = self.running.first().copied().unwrap_or(u64::MAX);
        let behind = self.finished.split_off(&oldest_running);
        let before = std::mem::replace(&mut self.finished, behind);
        match before.len() {
            0 => {}
            1 => acks.extend(before.keys().map(|&tag| Ack {
                tag,
                multiple: false,
            })),
            _ => acks.push(Ack {
                tag: *before.keys().next_back().expect("two or more"),
                multiple: true,
            }),
        }
        let alone: Vec<u64> = self
            .finished
            .iter()
            .filter(|(_, &at)| all || now.duration_since(at) >= ALONE_AFTER)
            .map(|(&tag, _)| tag)
            .collect();
        for tag in alone {
            self.finished.remove(&tag);
            acks.push(Ack {
                tag,
                multiple: false,
            });
        }
        acks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acks(list: &[(u64, bool)]) -> Vec<Ack> {
        list.iter()
            .map(|&(tag, multiple)| Ack { tag, multiple })
            .collect()
    }

    #[test]
    fn finished_deliveries_older_than_every_running_one_go_in_one_ack() {
        let (mut state, now) = (Acks::default(), Instant::now());
        for tag in 1..=5 {
            state.taken(tag);
        }
        for tag in [2, 1, 3] {
            state.finished(tag, true, now);
        }
        assert_eq!(state.flush(now, false), acks(&[(3, true)]));
        assert_eq!(state.flush(now, false), acks(&[]));
        state.finished(4, true, now);
        assert_eq!(state.flush(now, false), acks(&[(4, false)]));
    }

    #[test]
    fn a_finished_delivery_behind_a_running_one_waits_then_goes_alone() {
        let (mut state, now) = (Acks::default(), Instant::now());
        for tag in 1..=3 {
            state.taken(tag);
        }
        state.finished(2, true, now);
        state.finished(3, true, now);
        // 1 still runs: a multiple ack of 3 would cover it.
        assert_eq!(state.flush(now, false), acks(&[]));
        let later = now + ALONE_AFTER;
        assert_eq!(state.flush(later, false), acks(&[(2, false), (3, false)]));
        state.finished(1, true, later);
        assert_eq!(state.flush(later, false), acks(&[(1, false)]));
    }

    #[test]
    fn a_delivery_left_unacknowledged_is_never_covered() {
        let (mut state, now) = (Acks::default(), Instant::now());
        for tag in 1..=3 {
            state.taken(tag);
        }
        state.finished(1, false, now);
        state.finished(2, true, now);
        state.finished(3, true, now);
        assert_eq!(state.flush(now, false), acks(&[]));
        assert_eq!(state.flush(now, true), acks(&[(2, false), (3, false)]));
        assert_eq!(state.due(), None);
    }
}
