//! Key lanes: a keyed message goes along each of its routes only after the
//! earlier messages of its key this bus holds for that route, one at a
//! time, lowest sequence number first. Messages without a key, other keys
//! and other routes never wait for each other.
//!
//! The lanes keep the order in memory, so that a handler (or the relay)
//! almost always receives a key's messages in order; the handler's progress
//! in its key, checked in the delivery's own transaction, keeps it whatever
//! reaches it from other processes or after a crash.

use crate::message::Envelope;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use uuid::Uuid;

/// One route's key: whose messages go one at a time.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct LaneId {
    /// The route: `<module>/<handler>`, or the relay.
    route: String,
    /// The module that numbered the key.
    publisher: String,
    /// The topic.
    topic: String,
    /// The ordering key.
    key: String,
}

/// The messages of one lane.
#[derive(Default)]
struct Lane {
    /// Waiting for their turn, by sequence number (then id).
    waiting: BTreeSet<(i64, Uuid)>,
    /// The message that has the turn, if one has.
    holder: Option<(i64, Uuid)>,
    /// Wakes the waiting when the turn passes.
    passed: Arc<Notify>,
    /// Tells the holder that an earlier message of the key came in behind
    /// it (the holder may be waiting for exactly that one).
    earlier_came: Arc<Notify>,
}

/// Every lane of a bus.
#[derive(Default)]
pub(crate) struct Lanes {
    lanes: Mutex<HashMap<LaneId, Lane>>,
}

/// A message's turn in its lane, held while it goes along the route;
/// dropping it passes the turn on.
pub(crate) struct Turn<'a> {
    lanes: &'a Lanes,
    id: LaneId,
    /// Notified when an earlier message of the key joins the lane.
    earlier_came: Arc<Notify>,
}

/// A message waiting in its lane: dropped before its turn came (the bus
/// stopped), it leaves the lane.
struct Waiting<'a> {
    lanes: &'a Lanes,
    id: LaneId,
    place: (i64, Uuid),
    granted: bool,
}

impl Lanes {
    /// Waits for `envelope`'s turn on `route`; `None` for a message without
    /// a key, which needs none.
    pub(crate) async fn turn(&self, route: &str, envelope: &Envelope) -> Option<Turn<'_>> {
        let keyed = envelope.keyed.as_ref()?;
        let id = LaneId {
            route: route.to_string(),
            publisher: keyed.publisher.clone(),
            topic: envelope.topic.clone(),
            key: keyed.key.clone(),
        };
        let place = (keyed.sequence, envelope.id);
        let mut waiting = Waiting {
            lanes: self,
            id: id.clone(),
            place,
            granted: false,
        };
        let passed = {
            let mut lanes = self.lock();
            let lane = lanes.entry(id.clone()).or_default();
            lane.waiting.insert(place);
            if lane.holder.is_some_and(|holder| place < holder) {
                lane.earlier_came.notify_one();
            }
            lane.passed.clone()
        };
        loop {
            let notified = passed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut lanes = self.lock();
                let lane = lanes
                    .get_mut(&id)
                    .expect("a waiting message keeps its lane");
                if lane.holder.is_none() && lane.waiting.first() == Some(&place) {
                    lane.waiting.remove(&place);
                    lane.holder = Some(place);
                    // A wake-up meant for an earlier holder is stale.
                    lane.earlier_came = Arc::new(Notify::new());
                    waiting.granted = true;
                    let earlier_came = lane.earlier_came.clone();
                    return Some(Turn {
                        lanes: self,
                        id,
                        earlier_came,
                    });
                }
            }
            notified.await;
        }
    }

    /// Lanes with messages in them (for tests and figures).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<LaneId, Lane>> {
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the turn or a waiting place back; drops the lane once empty.
    fn leave(&self, id: &LaneId, place: Option<(i64, Uuid)>) {
        let mut lanes = self.lock();
        let Some(lane) = lanes.get_mut(id) else {
            return;
        };
        match place {
            Some(place) => {
                lane.waiting.remove(&place);
            }
            None => lane.holder = None,
        }
        if lane.holder.is_none() && lane.waiting.is_empty() {
            lanes.remove(id);
        } else {
            lane.passed.notify_waiters();
        }
    }
}

impl Turn<'_> {
    /// Resolves when a message of the key with a lower sequence number than
    /// this one's joins the lane: the one it may be waiting for.
    pub(crate) async fn earlier_came(&self) {
        self.earlier_came.notified().await;
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.lanes.leave(&self.id, None);
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.granted {
            self.lanes.leave(&self.id, Some(self.place));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Keyed;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    /// Polls once: whether the future is still waiting.
    fn pending<F: Future>(future: Pin<&mut F>) -> bool {
        let mut context = Context::from_waker(Waker::noop());
        matches!(future.poll(&mut context), Poll::Pending)
    }

    fn keyed(key: &str, sequence: i64) -> Envelope {
        let mut envelope = Envelope::new("t", "{}".into(), None);
        envelope.keyed = Some(Keyed {
            key: key.into(),
            sequence,
            publisher: "p".into(),
            previous_at_us: None,
        });
        envelope
    }

    #[tokio::test]
    async fn a_key_goes_one_message_at_a_time_lowest_sequence_first() {
        let lanes = Lanes::default();
        let (first, second, third, other) =
            (keyed("a", 1), keyed("a", 2), keyed("a", 3), keyed("b", 7));
        let holder = lanes.turn("r", &first).await.expect("keyed");
        // 3 comes in before 2; both wait while 1 holds the key.
        let late = lanes.turn("r", &third);
        let early = lanes.turn("r", &second);
        tokio::pin!(late, early);
        assert!(pending(late.as_mut()));
        assert!(pending(early.as_mut()));
        // Another key, and another route, are not held up.
        let other_key = lanes.turn("r", &other).await.expect("keyed");
        let other_route = lanes.turn("s", &third).await.expect("keyed");
        drop(holder);
        assert!(pending(late.as_mut()), "3 waits for 2");
        let turn = early.await.expect("keyed");
        assert!(pending(late.as_mut()), "3 waits while 2 holds the key");
        drop(turn);
        let last = late.await.expect("keyed");
        drop((last, other_key, other_route));
        assert_eq!(lanes.len(), 0, "empty lanes are dropped");
    }

    #[tokio::test]
    async fn a_message_without_a_key_takes_no_turn_and_a_dropped_wait_leaves_the_lane() {
        let lanes = Lanes::default();
        assert!(lanes
            .turn("r", &Envelope::new("t", "{}".into(), None))
            .await
            .is_none());
        let holder = lanes.turn("r", &keyed("a", 1)).await.expect("keyed");
        {
            let second = keyed("a", 2);
            let waiting = lanes.turn("r", &second);
            tokio::pin!(waiting);
            assert!(pending(waiting.as_mut()));
        }
        drop(holder);
        assert_eq!(lanes.len(), 0);
    }

    #[tokio::test]
    async fn the_holder_learns_when_an_earlier_message_comes_in() {
        let lanes = Lanes::default();
        let (first, second, third) = (keyed("a", 1), keyed("a", 2), keyed("a", 3));
        let holder = lanes.turn("r", &second).await.expect("keyed");
        let later = lanes.turn("r", &third);
        tokio::pin!(later);
        let earlier = lanes.turn("r", &first);
        tokio::pin!(earlier);
        {
            let told = holder.earlier_came();
            tokio::pin!(told);
            assert!(pending(later.as_mut()));
            assert!(pending(told.as_mut()), "a later message is no news");
            assert!(pending(earlier.as_mut()));
            assert!(!pending(told.as_mut()), "an earlier one is");
        }
        drop(holder);
        let turn = earlier.await.expect("keyed");
        assert!(pending(later.as_mut()), "1 goes before 3");
        drop(turn);
        drop(later.await);
    }
}
