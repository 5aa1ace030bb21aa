//! Wake-ups on SQLite ([`crate::Storage::wakeups`]), where one process has the database to
//! itself: what a write commits that this process's streams and workers wait for and that
//! nothing else tells them. A state edit's event, a thread deleted, runs ended by a cancel or
//! given up after their worker died, a run's end that leaves another queued behind it. The
//! events a run logs are not among them: its worker hands them to the streams itself.
//!
//! Told, streams and idle workers wait instead of polling the database (PostgreSQL's
//! `LISTEN`/`NOTIFY` does the same across processes, `pg_notify`). A write notes its wake-ups
//! on the writer thread as it makes its changes ([`notice`]); the writer drops those of a write
//! that is rolled back and sends the rest once their group has committed, so nobody is woken
//! for a change they cannot read yet.

use std::cell::RefCell;
use std::sync::Mutex;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::{ResourceId, Wakeup};

thread_local! {
    /// The wake-ups noted by the writes of the group the writer thread is running.
    static NOTED: RefCell<Vec<Wakeup>> = const { RefCell::new(Vec::new()) };
}

/// Notes `wakeup` for the commit of the write running on this (the writer) thread.
pub(crate) fn notice(wakeup: Wakeup) {
    NOTED.with(|noted| noted.borrow_mut().push(wakeup));
}

/// The thread's log holds events up to `seq` (`i64::MAX`: the thread is gone).
pub(crate) fn notice_logged(thread_id: ResourceId, seq: i64) {
    notice(Wakeup::Logged { thread_id, seq });
}

/// How many wake-ups are noted so far: what a write about to run may roll back to.
pub(crate) fn noted() -> usize {
    NOTED.with(|noted| noted.borrow().len())
}

/// Forgets the wake-ups noted after `mark` (their write was rolled back).
pub(crate) fn forget_since(mark: usize) {
    NOTED.with(|noted| noted.borrow_mut().truncate(mark));
}

/// Takes every wake-up noted (the group committed, or was rolled back whole).
pub(crate) fn take_noted() -> Vec<Wakeup> {
    NOTED.with(|noted| std::mem::take(&mut *noted.borrow_mut()))
}

/// Where committed wake-ups go: the one listener, once [`Notices::subscribe`] was called.
#[derive(Default)]
pub(crate) struct Notices {
    listener: Mutex<Option<UnboundedSender<Wakeup>>>,
    subscribed: std::sync::atomic::AtomicBool,
}

impl Notices {
    /// The wake-ups of every commit from now on; `None` after the first call.
    pub(crate) fn subscribe(&self) -> Option<UnboundedReceiver<Wakeup>> {
        if self
            .subscribed
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return None;
        }
        let (sender, receiver) = unbounded_channel();
        *self.listener.lock().unwrap_or_else(|e| e.into_inner()) = Some(sender);
        Some(receiver)
    }

    /// Sends a committed group's wake-ups, each once (a thread's log by its highest seq).
    pub(crate) fn send(&self, wakeups: Vec<Wakeup>) {
        if wakeups.is_empty() {
            return;
        }
        let listener = self.listener.lock().unwrap_or_else(|e| e.into_inner());
        let Some(listener) = listener.as_ref() else {
            return;
        };
        for wakeup in merged(wakeups) {
            let _ = listener.send(wakeup);
        }
    }
}

/// `wakeups` without repeats: one `Logged` per thread (its highest seq), one of each other.
fn merged(wakeups: Vec<Wakeup>) -> Vec<Wakeup> {
    let mut out: Vec<Wakeup> = Vec::with_capacity(wakeups.len());
    for wakeup in wakeups {
        if let Wakeup::Logged { thread_id, seq } = &wakeup {
            let known = out.iter_mut().find_map(|w| match w {
                Wakeup::Logged { thread_id: t, seq } if t == thread_id => Some(seq),
                _ => None,
            });
            if let Some(known) = known {
                *known = (*known).max(*seq);
                continue;
            }
        }
        if !out.contains(&wakeup) {
            out.push(wakeup);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_groups_wakeups_are_sent_once_each_after_its_commit() {
        let notices = Notices::default();
        let mut wakeups = notices.subscribe().unwrap();
        assert!(notices.subscribe().is_none(), "one listener");
        let (a, b) = (ResourceId::generate(), ResourceId::generate());
        notice_logged(a, 3);
        notice(Wakeup::RunsQueued);
        let mark = noted();
        notice_logged(b, 1);
        forget_since(mark); // that write was rolled back
        notice_logged(a, 5);
        notice(Wakeup::RunsQueued);
        notices.send(take_noted());
        let mut got = Vec::new();
        while let Ok(w) = wakeups.try_recv() {
            got.push(w);
        }
        assert_eq!(
            got,
            [
                Wakeup::Logged {
                    thread_id: a,
                    seq: 5
                },
                Wakeup::RunsQueued
            ]
        );
        assert!(take_noted().is_empty());
    }
}
