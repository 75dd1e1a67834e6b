//! Consensus tests, driving replicas by hand on virtual time. Each scenario names the section of
//! the Raft paper (Ongaro and Ousterhout, 2014) or the Raft dissertation (Ongaro, 2014) whose
//! rule it checks. The last test runs many seeded schedules with loss, reordering, partitions
//! and crashes and checks the safety properties after every step.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::ids::JobId;

const FRAME: usize = 64 * 1024;

fn id(i: usize) -> NodeId {
    NodeId(format!("n{i}"))
}

fn config(i: usize, n: usize) -> ReplicaConfig {
    ReplicaConfig {
        id: id(i),
        members: (0..n).map(id).collect(),
        election_timeout_min: Duration::from_millis(100),
        election_timeout_max: Duration::from_millis(200),
        heartbeat_interval: Duration::from_millis(20),
        max_frame_bytes: FRAME,
        retained_entries: crate::limits::LOG_RETAINED_ENTRIES_MAX,
    }
}

/// Decides whether a message (from, to) is lost on its way.
type Drop<'a> = &'a mut dyn FnMut(usize, usize, &PeerMessage) -> bool;

fn requeue(n: u128) -> Command {
    Command::Requeue {
        job_id: JobId(uuid::Uuid::from_u128(n)),
    }
}

fn entry(index: u64, term: u64) -> LogEntry {
    LogEntry {
        index: LogIndex(index),
        term: Term(term),
        at: crate::time::UnixMillis::UNSTAMPED,
        command: requeue(u128::from(index) * 1000 + u128::from(term)),
    }
}

/// What one member's disk holds, rebuilt from the records it was given.
#[derive(Clone, Debug, Default)]
struct Disk {
    hard_state: HardState,
    base: (LogIndex, Term),
    log: BTreeMap<LogIndex, LogEntry>,
}

impl Disk {
    fn write(&mut self, record: &Record) {
        match record {
            Record::HardState(hard_state) => self.hard_state = hard_state.clone(),
            Record::Log(entry) => {
                self.log.insert(entry.index, LogEntry::clone(entry));
            }
            Record::TruncateLogAfter(index) => self.log.retain(|i, _| i <= index),
            Record::Snapshot { index, term, .. } => {
                self.base = (*index, *term);
                self.log.retain(|i, _| i > index);
            }
            Record::Job(_)
            | Record::DeleteJob(_)
            | Record::Queue(_)
            | Record::KeyBucket(_)
            | Record::DeleteKeyBucket { .. }
            | Record::Applied { .. }
            | Record::DiscardLogThrough(_) => {}
        }
    }
}

/// A snapshot source for tests: the "table" is the applied index alone.
struct AppliedOnly(LogIndex);

impl SnapshotSource for AppliedOnly {
    fn snapshot(&self) -> (LogIndex, Vec<u8>) {
        (self.0, b"[]".to_vec())
    }
}

/// Several replicas, a lossy network under test control, and a disk for each.
struct Net {
    replicas: Vec<Option<Replica>>,
    disks: Vec<Disk>,
    /// Records taken from a replica but not yet durable (held when `hold_disk` is set).
    unwritten: Vec<Vec<Record>>,
    hold_disk: BTreeSet<usize>,
    now: Instant,
    /// (from, to, the process of `to` it was sent to, message).
    queue: VecDeque<(usize, usize, u64, PeerMessage)>,
    /// Process generation of each member: what was sent to an earlier process is lost, as it
    /// is with TCP (a restarted process is reached on new connections).
    gens: Vec<u64>,
    /// Directed links that drop everything.
    cut: BTreeSet<(usize, usize)>,
    applied: Vec<Vec<LogEntry>>,
    /// Every entry each member ever applied, across its restarts.
    applied_ever: Vec<BTreeMap<LogIndex, LogEntry>>,
    events: Vec<(usize, ReplicaEvent)>,
    sent: Vec<(usize, usize, PeerMessage)>,
    seed: u64,
}

impl Net {
    fn new(n: usize) -> Net {
        Net::with_logs(vec![Vec::new(); n])
    }

    /// Members whose disks already hold these log entries (terms as given).
    fn with_logs(logs: Vec<Vec<LogEntry>>) -> Net {
        let n = logs.len();
        let mut net = Net {
            replicas: Vec::new(),
            disks: vec![Disk::default(); n],
            unwritten: vec![Vec::new(); n],
            hold_disk: BTreeSet::new(),
            now: Instant::ZERO,
            queue: VecDeque::new(),
            gens: vec![0; n],
            cut: BTreeSet::new(),
            applied: vec![Vec::new(); n],
            applied_ever: vec![BTreeMap::new(); n],
            events: Vec::new(),
            sent: Vec::new(),
            seed: 1,
        };
        for (i, log) in logs.into_iter().enumerate() {
            let term = log.last().map_or(Term(0), |e| e.term);
            net.disks[i].hard_state.term = term;
            for e in log {
                net.disks[i].log.insert(e.index, e);
            }
            net.replicas.push(None);
        }
        for i in 0..n {
            net.start(i);
        }
        net
    }

    fn n(&self) -> usize {
        self.replicas.len()
    }

    fn start(&mut self, i: usize) {
        self.seed += 1;
        let disk = &self.disks[i];
        let replica = Replica::new(
            config(i, self.n()),
            self.seed * 7919 + i as u64,
            self.now,
            disk.hard_state.clone(),
            disk.base,
            disk.log.values().cloned().collect(),
        );
        self.applied[i].clear();
        self.replicas[i] = Some(replica);
        // The new process connects to every running member and they to it: each side's
        // `HELLO` arrives before anything else it sends on the new connection.
        let now = self.now;
        for j in 0..self.n() {
            if j == i || self.replicas[j].is_none() {
                continue;
            }
            if let Some(replica) = self.replicas[j].as_mut() {
                replica.peer_connected(now, &id(i));
            }
            self.rm(i).peer_connected(now, &id(j));
            self.settle(j);
        }
    }

    fn crash(&mut self, i: usize) {
        self.replicas[i] = None;
        self.gens[i] += 1;
        self.unwritten[i].clear();
    }

    fn r(&self, i: usize) -> &Replica {
        self.replicas[i].as_ref().expect("running")
    }

    fn rm(&mut self, i: usize) -> &mut Replica {
        self.replicas[i].as_mut().expect("running")
    }

    /// Persists (unless held), flushes, collects messages, events and applied entries.
    fn settle(&mut self, i: usize) {
        let Some(replica) = self.replicas[i].as_mut() else {
            return;
        };
        let records: Vec<Record> = replica.take_records().collect();
        self.unwritten[i].extend(records);
        if !self.hold_disk.contains(&i) {
            self.write_disk(i);
        }
        let Some(replica) = self.replicas[i].as_mut() else {
            return;
        };
        let applied = replica.applied_index();
        replica.flush(&AppliedOnly(applied));
        while let Some((to, message)) = replica.poll_message() {
            let to: usize = to.0[1..].parse().expect("node id");
            self.sent.push((i, to, message.clone()));
            let gen = self.gens[to];
            self.queue.push_back((i, to, gen, message));
        }
        while let Some(event) = replica.poll_event() {
            if let ReplicaEvent::SnapshotReceived { index, term, .. } = &event {
                replica.install_snapshot(*index, *term, Default::default());
                self.applied[i].clear();
            }
            self.events.push((i, event));
        }
        while let Some(entry) = replica.pop_committed() {
            self.applied_ever[i].insert(entry.index, entry.clone());
            self.applied[i].push(entry);
        }
        replica.compact();
    }

    fn write_disk(&mut self, i: usize) {
        let records = std::mem::take(&mut self.unwritten[i]);
        for record in &records {
            self.disks[i].write(record);
        }
        if let Some(replica) = self.replicas[i].as_mut() {
            let taken = replica.records_taken();
            replica.handle_persisted(taken);
        }
    }

    fn release_disk(&mut self, i: usize) {
        self.hold_disk.remove(&i);
        self.write_disk(i);
        self.settle(i);
    }

    fn settle_all(&mut self) {
        for i in 0..self.n() {
            self.settle(i);
        }
    }

    /// Delivers queued messages until none are left (messages on cut links are lost).
    fn deliver(&mut self) {
        self.deliver_with(&mut |_, _, _| false);
    }

    /// Like `deliver`, and `drop` picks further messages to lose.
    fn deliver_with(&mut self, drop: Drop) {
        self.settle_all();
        let mut steps = 0;
        while let Some((from, to, gen, message)) = self.queue.pop_front() {
            steps += 1;
            assert!(steps < 100_000, "messages never stop");
            if self.cut.contains(&(from, to)) || gen != self.gens[to] || drop(from, to, &message) {
                continue;
            }
            let now = self.now;
            if let Some(replica) = self.replicas[to].as_mut() {
                replica.handle_message(now, &id(from), message);
                self.settle(to);
            }
        }
    }

    /// Advances time by `millis` in small steps, firing timers and delivering messages.
    fn run(&mut self, millis: u64) {
        let all: Vec<usize> = (0..self.n()).collect();
        self.run_with(millis, &all, &mut |_, _, _| false);
    }

    /// Like `run`, but only the members in `timers` see their timers fire, and `drop` picks
    /// further messages to lose.
    fn run_with(&mut self, millis: u64, timers: &[usize], drop: Drop) {
        let end = self.now.saturating_add(Duration::from_millis(millis));
        while self.now < end {
            self.now = self.now.saturating_add(Duration::from_millis(1)).min(end);
            for &i in timers {
                let now = self.now;
                if let Some(replica) = self.replicas[i].as_mut() {
                    if replica.poll_timeout().is_some_and(|at| at <= now) {
                        replica.handle_timeout(now);
                    }
                }
                self.settle(i);
            }
            self.deliver_with(drop);
        }
    }

    /// Lets member `i`'s election timer expire now (pre-vote first).
    fn fire_election_timer(&mut self, i: usize) {
        self.now = self.now.saturating_add(Duration::from_millis(250));
        let now = self.now;
        self.rm(i).handle_timeout(now);
    }

    fn leaders(&self) -> Vec<usize> {
        (0..self.n())
            .filter(|i| self.replicas[*i].as_ref().is_some_and(Replica::is_leader))
            .collect()
    }

    fn leader(&self) -> usize {
        let leaders = self.leaders();
        assert_eq!(leaders.len(), 1, "expected one leader: {leaders:?}");
        leaders[0]
    }

    /// Runs until exactly one leader exists (bounded).
    fn elect(&mut self) -> usize {
        for _ in 0..50 {
            self.run(50);
            if self.leaders().len() == 1 {
                return self.leader();
            }
        }
        panic!("no leader elected within 2.5 s")
    }

    fn isolate(&mut self, i: usize) {
        for j in 0..self.n() {
            if j != i {
                self.cut.insert((i, j));
                self.cut.insert((j, i));
            }
        }
    }

    fn heal(&mut self) {
        self.cut.clear();
    }

    fn propose(&mut self, i: usize, n: u128) -> Proposal {
        let proposal = self
            .rm(i)
            .propose(requeue(n), crate::time::UnixMillis::UNSTAMPED)
            .expect("leads");
        self.settle(i);
        proposal
    }

    /// Member `i` crashes and its disk is lost; it is not restarted.
    fn wipe(&mut self, i: usize) {
        self.crash(i);
        self.disks[i] = Disk::default();
    }

    /// State machine safety (paper figure 3) over the whole run: no two members ever applied
    /// different entries at one index, whatever they lost since.
    fn check_applied_agree(&self) {
        let mut seen: BTreeMap<LogIndex, (usize, &LogEntry)> = BTreeMap::new();
        for (i, applied) in self.applied_ever.iter().enumerate() {
            for (index, e) in applied {
                let (j, known) = *seen.entry(*index).or_insert((i, e));
                assert_eq!(
                    known, e,
                    "n{j} and n{i} applied different entries at {index}"
                );
            }
        }
    }
}

mod elections;
mod lost_disks;
mod operations;
mod paper;
mod random;
mod replication;
