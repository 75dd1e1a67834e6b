//! Node timers: which running node's `poll_timeout` falls due first, in virtual time (each node
//! reads its own clock), firing it, and noticing a deadline that `handle_timeout` did not
//! consume.

use herder_core::time::Instant;

use super::{Clock, NodeRef, World};
use crate::checker::Check;

/// How often the simulated driver polls a node whose deadline `handle_timeout` did not consume.
const STUCK_POLL_US: u64 = 5_000;

impl World {
    /// The earliest due timer of a running node, in virtual time.
    pub(super) fn next_timer(&self) -> Option<(u64, NodeRef)> {
        let mut best: Option<(u64, NodeRef)> = None;
        let mut consider = |due: Option<Instant>, clock: &Clock, floor: u64, node: NodeRef| {
            if let Some(due) = due {
                let at = clock.global_at(due, self.now.max(floor));
                if best.is_none_or(|(b, _)| at < b) {
                    best = Some((at, node));
                }
            }
        };
        for (i, c) in self.coords.iter().enumerate() {
            if let (Some(m), false) = (&c.machine, c.paused) {
                consider(
                    m.poll_timeout(),
                    &c.clock,
                    c.timer_floor,
                    NodeRef::Coordinator(i),
                );
            }
        }
        for (i, w) in self.workers.iter().enumerate() {
            if let (Some(m), false) = (&w.machine, w.paused) {
                consider(
                    m.poll_timeout(),
                    &w.clock,
                    w.timer_floor,
                    NodeRef::Worker(i),
                );
            }
        }
        for (i, c) in self.clients.iter().enumerate() {
            consider(
                c.machine.poll_timeout(),
                &c.clock,
                c.timer_floor,
                NodeRef::Client(i),
            );
        }
        best
    }

    fn timeout_of(&self, node: NodeRef) -> Option<Instant> {
        match node {
            NodeRef::Coordinator(c) => self.coords[c].machine.as_ref()?.poll_timeout(),
            NodeRef::Worker(w) => self.workers[w].machine.as_ref()?.poll_timeout(),
            NodeRef::Client(c) => self.clients[c].machine.poll_timeout(),
            NodeRef::World => None,
        }
    }

    fn stuck_mut(&mut self, node: NodeRef) -> Option<&mut Option<Instant>> {
        match node {
            NodeRef::Coordinator(c) => Some(&mut self.coords[c].stuck),
            NodeRef::Worker(w) => Some(&mut self.workers[w].stuck),
            NodeRef::Client(c) => Some(&mut self.clients[c].stuck),
            NodeRef::World => None,
        }
    }

    /// Fires `node`'s due timer. A deadline still reported by `poll_timeout` after
    /// `handle_timeout` ran at or past it was not consumed: a real driver would wake again at
    /// once, over and over. That is recorded as a finding; the simulated driver then keeps
    /// polling that node every `STUCK_POLL_US` (a spinning driver, sampled coarsely) so the
    /// node's other deadlines, hidden behind the stuck one, still fire.
    pub(super) fn fire_timer(&mut self, node: NodeRef) -> Check {
        let due = self.timeout_of(node);
        self.fire_timer_inner(node)?;
        let after = self.timeout_of(node);
        if due.is_some() && after == due {
            let due = due.unwrap_or(Instant::ZERO);
            if self.stuck_mut(node).is_some_and(|s| s.is_none()) && self.findings.len() < 20 {
                self.findings.push(format!(
                    "t={} {node}: poll_timeout still returns {due} after handle_timeout at or past it (a driver would busy-loop)",
                    Instant::from_micros(self.now)
                ));
            }
            if self.stuck_mut(node).is_some_and(|s| *s != Some(due)) {
                self.note(
                    node,
                    format_args!("timer {due} not consumed by handle_timeout"),
                );
            }
            let floor = self.now + STUCK_POLL_US;
            if let Some(stuck) = self.stuck_mut(node) {
                *stuck = Some(due);
            }
            match node {
                NodeRef::Coordinator(c) => self.coords[c].timer_floor = floor,
                NodeRef::Worker(w) => self.workers[w].timer_floor = floor,
                NodeRef::Client(c) => self.clients[c].timer_floor = floor,
                NodeRef::World => {}
            }
        }
        Ok(())
    }

    fn fire_timer_inner(&mut self, node: NodeRef) -> Check {
        let now = self.now;
        self.note(node, format_args!("timer"));
        match node {
            NodeRef::Coordinator(c) => {
                let coord = &mut self.coords[c];
                coord.timer_floor = now + 1;
                let local = coord.clock.local(now);
                if let Some(m) = &mut coord.machine {
                    m.handle_timeout(local);
                }
                self.drain_coord(c)
            }
            NodeRef::Worker(w) => {
                let worker = &mut self.workers[w];
                worker.timer_floor = now + 1;
                let local = worker.clock.local(now);
                if let Some(m) = &mut worker.machine {
                    m.handle_timeout(local);
                }
                self.drain_worker(w)
            }
            NodeRef::Client(c) => {
                let client = &mut self.clients[c];
                client.timer_floor = now + 1;
                let local = client.clock.local(now);
                client.machine.handle_timeout(local);
                self.drain_client(c)
            }
            NodeRef::World => Ok(()),
        }
    }
}
