//! The invariant checker: the safety invariants of docs/SIMULATION.md, checked as the world
//! runs.
//!
//! It judges with knowledge of its own, never by re-running the code it checks:
//!
//! - a mirror of every coordinator's disk, fed with exactly the records that became durable
//!   there, so "durable on a majority" is a count of mirrors;
//! - the committed log, learned from what coordinators apply (an entry can only be applied once
//!   it is on the applier's disk, so the mirror says what it was), and checked for state machine
//!   safety: no two members ever apply different entries at one index;
//! - the reference [`Model`] of the job rules, fed with the committed log, against which every
//!   coordinator's table is compared whenever it has applied exactly as far as the model;
//! - consensus invariants: at most one leader per term, committed entries held unchanged by
//!   every member that has committed them (log matching), and by every member that takes over
//!   as leader (leader completeness);
//! - every visible output (`SUBMIT_ACCEPTED`, `TASK_ASSIGN`, `RESULT_ACK`, `TASK_CANCEL`,
//!   `CANCEL_RESULT`, `SUBMIT_REJECTED`) against the model: its fact committed, durable on a
//!   majority and on the sender's disk, and true;
//! - task sets: every committed `Assign` names a worker process whose registered kinds include
//!   the job's (so a kind no worker serves is never assigned), and a queued job of a kind no
//!   worker serves is shown to clients as `unserved`;
//! - every answer to a submission (a `SUBMIT`, a line of a `SUBMIT_BATCH_RESULT`, or the
//!   `ERROR` failing a whole batch) against the checker's own reading of the submission checks
//!   ([`crate::submission`]) and the model's record of which key is bound to which job: an
//!   `ERROR` only for a check the submission fails, or a key bound to a job with other
//!   options; an accepted job with exactly the options sent.
//!
//! Every error names the job, lease, entry or member concerned; the world prefixes the time and
//! node.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use herder_core::command::{Command, LogEntry};
use herder_core::coordinator::{Coordinator, DiskImage, Output, Record, WorkerEntry};
use herder_core::ids::{Incarnation, JobId, LeaseId, LogIndex, NodeId, Term, WorkerId};
use herder_core::job::JobState;
use herder_core::protocol::{
    AttemptOutcome, CancelReason, ClientReply, CoordinatorToWorker, ErrorCode, JobSubmission,
    JobView, PeerMessage, SubmitResult,
};

mod consensus;
mod reads;

pub use consensus::ReadMark;
pub use reads::{Floor, ListFloor, ReadFloor};

use crate::model::Model;
use crate::submission::{self, code_name, Rules, Subject, Verdict};

pub type Check = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// A coordinator's disk: exactly the batches that became durable, applied in order.
pub type Disk = DiskImage;

/// Who a coordinator connection belongs to, as the world knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConnOwner {
    Worker(WorkerId),
    Client,
    Unknown,
}

/// Every log entry that ever reached one coordinator's disk, as the disk now holds it
/// (truncations remove entries; discarding applied entries does not, since the mirror is only
/// asked about entries the coordinator had when it applied or acknowledged them).
#[derive(Clone, Debug, Default)]
struct Mirror {
    log: BTreeMap<LogIndex, LogEntry>,
    /// The highest snapshot installed: the disk holds the effect of every entry up to it.
    snapshot: LogIndex,
    /// Every entry up to here is on this disk (or covered by its snapshot): what an append
    /// acknowledgement may claim.
    contiguous: LogIndex,
    /// Every vote that became durable here: term -> the candidate.
    votes: BTreeMap<Term, NodeId>,
    /// The durable term: the highest any hard-state record here has set.
    term: Term,
    /// The term of the entry at `snapshot`.
    snapshot_term: Term,
}

impl Mirror {
    fn write(&mut self, records: &[Record]) {
        for record in records {
            match record {
                Record::Log(entry) => {
                    self.log.insert(entry.index, LogEntry::clone(entry));
                }
                Record::TruncateLogAfter(index) => {
                    self.log.retain(|i, _| i <= index);
                    self.contiguous = self.contiguous.min(*index);
                }
                Record::Snapshot { index, term, .. } => {
                    if *index >= self.snapshot {
                        self.snapshot = *index;
                        self.snapshot_term = *term;
                    }
                    self.contiguous = self.contiguous.max(*index);
                }
                Record::HardState(hard_state) => {
                    if let Some(candidate) = &hard_state.voted_for {
                        self.votes.insert(hard_state.term, candidate.clone());
                    }
                    self.term = self.term.max(hard_state.term);
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
        while self.log.contains_key(&self.contiguous.next()) {
            self.contiguous = self.contiguous.next();
        }
    }

    /// Whether this disk holds `entry` (or a snapshot covering it).
    fn holds(&self, entry: &LogEntry) -> bool {
        entry.index <= self.snapshot || self.log.get(&entry.index) == Some(entry)
    }
}

/// Where a log ends: its last index and that entry's term.
type LogEnd = (LogIndex, Term);

/// What the checker follows of one coordinator process.
#[derive(Clone, Debug, Default)]
struct Follow {
    /// The last applied index seen (entries up to it were checked).
    applied: LogIndex,
    /// The applied index seen at the look before that: what the process had applied when it
    /// took the input it is now answering (a reply may be decided before the same step applies
    /// more entries).
    applied_before: LogIndex,
    /// Committed entries up to here were checked against this member's log.
    commit_checked: LogIndex,
    /// The applied index at which its table was last compared with the model.
    compared: Option<LogIndex>,
    /// Whether it was the acting leader at the last look.
    acting: bool,
    /// When it led at the last look: its term and commit index then.
    leading: Option<(Term, LogIndex)>,
    /// The applied index at which its table last passed its invariant check (a table changes
    /// only by applying, so it need not be checked again until that moves).
    table_checked: Option<LogIndex>,
    /// Worker processes this process, leading, heard were draining: (worker, incarnation,
    /// term, the end of its log then). It must propose no `Assign` to them after that.
    drains_heard: Vec<(WorkerId, Incarnation, Term, LogIndex)>,
    /// Its log was searched for such proposals up to here.
    assigns_scanned: LogIndex,
}

#[derive(Clone, Debug, Default)]
pub struct Checker {
    quorum: usize,
    mirrors: Vec<Mirror>,
    /// Disks as they were when they were lost: an entry they held was durable there, so an
    /// acknowledgement that counted them was honest (the loss is the fault, within a minority).
    lost: Vec<(usize, Mirror)>,
    follow: Vec<Follow>,
    /// The committed log: index -> the entry every member applies there, and the term of the
    /// member that first applied it (a term in which it was already committed).
    committed: BTreeMap<LogIndex, (LogEntry, Term)>,
    pub model: Model,
    leaders_by_term: BTreeMap<Term, usize>,
    /// (voter, candidate, term) -> the end of the candidate's log as its `VOTE` said, and of
    /// the voter's log when that `VOTE` reached it: a grant must respect the election
    /// restriction between the two.
    votes_asked: HashMap<(usize, NodeId, Term), (LogEnd, LogEnd)>,
    /// Every lease id ever sent in a `TASK_ASSIGN`.
    leases_sent: HashSet<LeaseId>,
    /// (job, attempt) -> (lease, worker) of its one assignment.
    attempts: HashMap<(JobId, u32), (LeaseId, WorkerId)>,
    /// Jobs acknowledged by `SUBMIT_ACCEPTED`.
    acked: BTreeSet<JobId>,
    /// Jobs a `SUBMIT_ACCEPTED` with `existing: false` has named.
    acked_new: HashSet<JobId>,
    pub assignments: u64,
    pub completions: u64,
    /// The task kinds each worker process registered with (the world says, as it starts
    /// each process), and every kind any of them serves.
    worker_sets: HashMap<(WorkerId, Incarnation), BTreeSet<String>>,
    served_ever: BTreeSet<String>,
    /// The coordinators' default per-attempt deadline, when the world says.
    default_timeout_millis: Option<u64>,
    /// What the coordinators check submissions against (limits, defaults), when the world says.
    rules: Rules,
    /// Raft's rules, judged from messages and disks (see [`consensus`]).
    ledger: consensus::Ledger,
    /// Elections judged from the votes delivered (for the coverage report).
    pub elections_judged: u64,
}

impl Checker {
    /// A checker for a group of `coordinators` members, named `coord-0`, `coord-1`, ... until
    /// [`Checker::set_members`] names them otherwise.
    pub fn new(coordinators: usize) -> Checker {
        let mut checker = Checker {
            quorum: coordinators / 2 + 1,
            mirrors: vec![Mirror::default(); coordinators],
            follow: vec![Follow::default(); coordinators],
            model: Model::new(),
            ..Checker::default()
        };
        checker.set_members(
            (0..coordinators)
                .map(|c| NodeId(format!("coord-{c}")))
                .collect(),
        );
        checker
    }

    pub fn acked(&self) -> &BTreeSet<JobId> {
        &self.acked
    }

    /// The coordinators' default per-attempt deadline (a job without its own gets this one).
    pub fn set_default_timeout(&mut self, millis: u64) {
        self.default_timeout_millis = Some(millis);
    }

    /// The coordinators' admission limit, default attempt budget and frame limit, against which
    /// submissions are judged.
    pub fn set_rules(&mut self, rules: Rules) {
        self.rules = rules;
    }

    /// A worker process started: it registers `tasks`, and may only be given work of those.
    /// Every process of the run is known from its start, so `served_ever` lists every kind
    /// any worker could ever run.
    pub fn worker_process(&mut self, id: &WorkerId, incarnation: Incarnation, tasks: &[String]) {
        let set: BTreeSet<String> = tasks.iter().cloned().collect();
        self.served_ever.extend(set.iter().cloned());
        self.worker_sets.insert((id.clone(), incarnation), set);
    }

    /// The kinds worker process `(id, incarnation)` registered, if such a process started.
    pub fn worker_set(&self, id: &WorkerId, incarnation: Incarnation) -> Option<&BTreeSet<String>> {
        self.worker_sets.get(&(id.clone(), incarnation))
    }

    /// Whether any worker process of the run serves `kind`.
    pub fn served_ever(&self, kind: &str) -> bool {
        self.served_ever.contains(kind)
    }

    /// A worker reported how an attempt ended (what it sent, whether or not it arrived): a
    /// `Release` or a permanent failure in the log must come from such a report.
    pub fn worker_reported(&mut self, lease_id: LeaseId, outcome: &AttemptOutcome) {
        match outcome {
            AttemptOutcome::Released {} => {
                self.model.reported_released.insert(lease_id);
            }
            AttemptOutcome::Failed {
                permanent: true, ..
            } => {
                self.model.reported_permanent.insert(lease_id);
            }
            _ => {}
        }
    }

    /// A committed entry, before the model applies it: an `Assign` must name a worker process
    /// that registered the job's kind.
    pub fn check_committed(&self, entry: &LogEntry) -> Check {
        let Command::Assign { job_id, lease, .. } = &entry.command else {
            return Ok(());
        };
        let Some(job) = self.model.jobs.get(job_id) else {
            return Ok(());
        };
        let kind = job.task.kind();
        ensure!(
            self.served_ever.contains(kind),
            "task sets: job {job_id} of kind {kind:?}, which no worker serves, was assigned to {} (lease {}, entry {})",
            lease.worker,
            lease.id,
            entry.index
        );
        let Some(set) = self
            .worker_sets
            .get(&(lease.worker.clone(), lease.incarnation))
        else {
            return Err(format!(
                "task sets: job {job_id} was assigned to {} incarnation {}, a process that never ran (entry {})",
                lease.worker, lease.incarnation.0, entry.index
            ));
        };
        ensure!(
            set.contains(kind),
            "task sets: job {job_id} of kind {kind:?} was assigned to {} (lease {}, entry {}), which serves only {set:?}",
            lease.worker,
            lease.id,
            entry.index
        );
        Ok(())
    }

    /// A batch became durable on coordinator `c`'s disk.
    pub fn record_durable(&mut self, c: usize, records: &[Record]) -> Check {
        self.write_disk(c, records)
    }

    /// Coordinator `c`'s disk was lost: it starts again empty.
    pub fn disk_lost(&mut self, c: usize) {
        let lost = std::mem::take(&mut self.mirrors[c]);
        self.lost.push((c, lost));
        self.consensus_disk_lost(c);
    }

    /// A new process of coordinator `c` started on a disk whose job rows reflect every entry up
    /// to `rows_applied`. Whatever it applied beyond them at start (a group of one replays its
    /// log) is checked at the next look, from the mirror.
    pub fn process_started(&mut self, c: usize, rows_applied: LogIndex, machine: &Coordinator) {
        let applied = machine.table().applied_index();
        self.consensus_process_started(c, rows_applied);
        self.follow[c] = Follow {
            applied: rows_applied.min(applied),
            applied_before: rows_applied.min(applied),
            commit_checked: rows_applied.min(applied),
            compared: None,
            acting: false,
            leading: None,
            table_checked: None,
            drains_heard: Vec::new(),
            assigns_scanned: machine.replica().last_index(),
        };
    }

    /// Coordinator `c`, acting as leader, registered worker process (`worker`, `incarnation`)
    /// as draining (a `DRAINING`, or a registration that says so), when its log ended at
    /// `log_end`: from then on it must propose no `Assign` to that process.
    pub fn drain_heard(
        &mut self,
        c: usize,
        worker: &WorkerId,
        incarnation: Incarnation,
        term: Term,
        log_end: LogIndex,
    ) {
        self.follow[c]
            .drains_heard
            .push((worker.clone(), incarnation, term, log_end));
    }

    /// A leader proposes no `Assign` to a worker process it knows is draining: every entry of
    /// its own term that it appended since the last look is searched.
    fn check_no_work_for_draining(&mut self, c: usize, machine: &Coordinator) -> Check {
        let replica = machine.replica();
        let last = replica.last_index();
        let from = self.follow[c].assigns_scanned.min(last);
        self.follow[c].assigns_scanned = last;
        if !replica.is_leader() || self.follow[c].drains_heard.is_empty() {
            return Ok(());
        }
        let term = replica.term();
        let mut index = from.max(replica.log().base_index());
        while index < last {
            index = index.next();
            let Some(entry) = replica.log().get(index) else {
                continue;
            };
            let Command::Assign { job_id, lease, .. } = &entry.command else {
                continue;
            };
            if entry.term != term {
                continue;
            }
            let heard = self.follow[c].drains_heard.iter().find(|(w, inc, t, end)| {
                *w == lease.worker && *inc == lease.incarnation && *t == term && index > *end
            });
            if let Some((_, _, _, end)) = heard {
                return Err(format!(
                    "drain: coord-{c} proposed at entry {index} to assign job {job_id} to {} (lease {}), which it had registered as draining when its log ended at {end}",
                    lease.worker, lease.id
                ));
            }
        }
        Ok(())
    }

    /// Looks at coordinator `c` after it handled an input: what it applied joins the committed
    /// log (and the model), and the consensus invariants are checked.
    pub fn observe(&mut self, c: usize, machine: &Coordinator) -> Check {
        let replica = machine.replica();
        let applied = machine.table().applied_index();
        // Entries applied since the last look, as its disk holds them.
        let mut index = self.follow[c].applied;
        while index < applied {
            index = index.next();
            // A follower that installed the leader's table moved past these entries without
            // applying them (the snapshot record reaches its disk with its next batch).
            if index <= replica.installed_snapshot() {
                continue;
            }
            let mirror = &self.mirrors[c];
            let Some(entry) = mirror.log.get(&index).cloned() else {
                ensure!(
                    index <= mirror.snapshot,
                    "coord-{c} applied entry {index}, which never became durable on its disk"
                );
                continue;
            };
            match self.committed.get(&index) {
                Some((known, _)) => ensure!(
                    *known == entry,
                    "state machine safety: coord-{c} applied {entry:?} at {index}, but {known:?} was applied there before"
                ),
                None => {
                    self.committed.insert(index, (entry, replica.term()));
                }
            }
        }
        self.follow[c].applied_before = self.follow[c].applied;
        self.follow[c].applied = applied;
        while let Some((entry, _)) = self.committed.get(&self.model.applied.next()) {
            let entry = entry.clone();
            self.check_committed(&entry)?;
            self.model.apply(&entry)?;
        }
        // At most one leader per term (paper 5.2).
        if replica.is_leader() {
            let first = *self.leaders_by_term.entry(replica.term()).or_insert(c);
            ensure!(
                first == c,
                "election safety: coord-{first} and coord-{c} both led term {}",
                replica.term().0
            );
        }
        // Log matching: what this member has committed, it holds as committed (paper 5.3).
        let base = replica.log().base_index();
        let commit = replica.committed_index().min(replica.last_index());
        let from = self.follow[c].commit_checked.max(base);
        let unchecked = if commit > from {
            self.committed.range(from.next()..=commit)
        } else {
            self.committed.range(LogIndex(1)..LogIndex(1))
        };
        for (index, (entry, _)) in unchecked {
            let held = replica.term_at(*index);
            ensure!(
                held == Some(entry.term),
                "log matching: coord-{c} committed entry {index} holding term {held:?}, but the committed entry there has term {}",
                entry.term.0
            );
        }
        self.follow[c].commit_checked = self.follow[c].commit_checked.max(commit);
        // Leader completeness (paper 5.4): a member taking over holds every entry committed in
        // an earlier term.
        let acting = machine.is_acting_leader();
        if acting && !self.follow[c].acting {
            for (index, (entry, seen_in)) in self.committed.range(base.next()..) {
                if *seen_in >= replica.term() {
                    continue;
                }
                ensure!(
                    replica.term_at(*index) == Some(entry.term),
                    "leader completeness: coord-{c} took over term {} without committed entry {index} (term {})",
                    replica.term().0,
                    entry.term.0
                );
            }
        }
        self.follow[c].acting = acting;
        self.check_leader_commit(c, machine)?;
        self.check_no_work_for_draining(c, machine)?;
        // Identical tables at the same applied index: the model's.
        if applied == self.model.applied && self.follow[c].compared != Some(applied) {
            self.follow[c].compared = Some(applied);
            self.compare_with_model(c, machine)?;
        }
        Ok(())
    }

    /// A leader's commit index moves only onto entries durable on a majority of disks, and (in
    /// a group) only by counting an entry of its own term (paper 5.4.2, figure 8: an entry of
    /// an earlier term on a majority can still be overwritten).
    fn check_leader_commit(&mut self, c: usize, machine: &Coordinator) -> Check {
        let replica = machine.replica();
        if !replica.is_leader() {
            self.follow[c].leading = None;
            return Ok(());
        }
        let (term, commit) = (replica.term(), replica.committed_index());
        let before = self.follow[c].leading.replace((term, commit));
        let Some((led, from)) = before else {
            return Ok(());
        };
        if led != term || commit <= from {
            return Ok(());
        }
        if self.mirrors.len() > 1 {
            let at = replica.term_at(commit);
            ensure!(
                at == Some(term),
                "commit rule: coord-{c}, leading term {}, moved its commit index to {commit}, an entry of term {at:?}",
                term.0
            );
        }
        let mut index = from;
        while index < commit {
            index = index.next();
            let Some(entry) = replica.log().get(index) else {
                continue;
            };
            let holders = self.holders(entry);
            ensure!(
                holders >= self.quorum,
                "commit rule: coord-{c} counted entry {index} committed while {holders} disks held it (a majority is {})",
                self.quorum
            );
        }
        Ok(())
    }

    /// A `VOTE` from `candidate` reached member `voter`: remembers what both logs ended with,
    /// unless the voter had already voted for that candidate in that term (a repeat request,
    /// granted again without a new decision).
    pub fn vote_asked(
        &mut self,
        voter: usize,
        candidate: &NodeId,
        term: Term,
        asked: LogEnd,
        replica: &herder_core::replica::Replica,
    ) {
        if term < replica.term()
            || (term == replica.term() && replica.voted_for() == Some(candidate))
        {
            return;
        }
        let held = (replica.last_index(), replica.last_term());
        self.votes_asked
            .insert((voter, candidate.clone(), term), (asked, held));
    }

    /// A consensus message that promises something about the sender's disk leaves only once
    /// its disk holds it: a granted vote, an append acknowledgement (paper figure 2: respond
    /// only after persisting).
    fn check_peer_message(&mut self, c: usize, to: &NodeId, message: &PeerMessage) -> Check {
        let mirror = &self.mirrors[c];
        match message {
            PeerMessage::VoteReply {
                term,
                granted: true,
            } => {
                ensure!(
                    mirror.votes.get(term) == Some(to),
                    "vote durability: coord-{c} granted {to} its vote in term {} before that vote was on its disk (disk: {:?})",
                    term.0,
                    mirror.votes.get(term)
                );
                // Paper 5.4.1: only to a candidate whose log is at least as up to date.
                if let Some((asked, held)) = self.votes_asked.remove(&(c, to.clone(), *term)) {
                    let up_to_date = asked.1 > held.1 || (asked.1 == held.1 && asked.0 >= held.0);
                    ensure!(
                        up_to_date,
                        "election restriction: coord-{c} voted for {to} in term {}, whose log ends at {} (term {}), while its own ended at {} (term {})",
                        term.0,
                        asked.0,
                        asked.1 .0,
                        held.0,
                        held.1 .0
                    );
                }
            }
            PeerMessage::AppendReply {
                success: true,
                index,
                ..
            } => ensure!(
                *index <= mirror.contiguous,
                "append durability: coord-{c} acknowledged entries up to {index}, but its disk holds them only up to {}",
                mirror.contiguous
            ),
            _ => {}
        }
        Ok(())
    }

    fn compare_with_model(&mut self, c: usize, machine: &Coordinator) -> Check {
        let table = machine.table();
        for row in table.jobs() {
            self.model
                .matches(row)
                .map_err(|e| format!("coord-{c} at entry {}: {e}", table.applied_index()))?;
        }
        ensure!(
            table.len() == self.model.jobs.len(),
            "coord-{c} holds {} jobs at entry {}, the rules {}",
            table.len(),
            table.applied_index(),
            self.model.jobs.len()
        );
        ensure!(
            table.active_jobs() == self.model.active(),
            "coord-{c} counts {} non-terminal jobs at entry {}, the rules {}",
            table.active_jobs(),
            table.applied_index(),
            self.model.active()
        );
        Ok(())
    }

    /// How many members' disks hold `entry`, or held it when they were lost (an acknowledgement
    /// counted before the loss was honest: the loss is the fault, within a minority).
    fn holders(&self, entry: &LogEntry) -> usize {
        (0..self.mirrors.len())
            .filter(|&d| {
                self.mirrors[d].holds(entry)
                    || self.lost.iter().any(|(l, m)| *l == d && m.holds(entry))
            })
            .count()
    }

    /// Whether the committed entry at `index` is durable on a majority of disks and on `c`'s.
    fn durable(&self, c: usize, index: LogIndex, what: &str) -> Check {
        let Some((entry, _)) = self.committed.get(&index) else {
            return Err(format!(
                "durability: {what} left coord-{c} before entry {index} was committed"
            ));
        };
        let holders = self.holders(entry);
        ensure!(
            holders >= self.quorum && self.mirrors[c].holds(entry),
            "durability: {what} left coord-{c} while entry {index} was durable on {holders} disks (a majority is {}){}",
            self.quorum,
            if self.mirrors[c].holds(entry) { "" } else { ", not on its own" }
        );
        Ok(())
    }

    /// A `TASK_ASSIGN` left a coordinator for `worker`.
    pub fn observe_assign(
        &mut self,
        job_id: JobId,
        lease_id: LeaseId,
        attempt: u32,
        max_attempts: u32,
        worker: &WorkerId,
    ) -> Check {
        ensure!(
            self.leases_sent.insert(lease_id),
            "lease {lease_id} (job {job_id}) was sent in a TASK_ASSIGN before: lease ids must be unique"
        );
        ensure!(
            attempt >= 1 && attempt <= max_attempts,
            "TASK_ASSIGN for job {job_id} carries attempt {attempt} of {max_attempts}"
        );
        if let Some((lease, owner)) = self.attempts.get(&(job_id, attempt)) {
            // A released attempt was given back to the budget: its number is assigned again.
            ensure!(
                self.model.released.contains(lease),
                "attempt {attempt} of job {job_id} assigned twice: lease {lease} to {owner}, then lease {lease_id} to {worker}"
            );
        }
        self.attempts
            .insert((job_id, attempt), (lease_id, worker.clone()));
        self.assignments += 1;
        Ok(())
    }

    /// Checks one output of coordinator `c` before it takes effect. `slots` is the fewest
    /// admission slots the submission a `SUBMIT_REJECTED` answers could take.
    pub fn check_output(
        &mut self,
        c: usize,
        machine: &Coordinator,
        output: &Output,
        owner: &ConnOwner,
        key: Option<(&str, LogIndex)>,
        slots: u64,
    ) -> Check {
        match output {
            Output::ToWorker { message, conn } => match message {
                CoordinatorToWorker::TaskAssign {
                    job_id,
                    lease_id,
                    attempt,
                    max_attempts,
                    timeout_millis,
                    ..
                } => {
                    let ConnOwner::Worker(worker) = owner else {
                        return Err(format!(
                            "TASK_ASSIGN {job_id}/{lease_id} sent on connection {conn}, which is not a worker's ({owner:?})"
                        ));
                    };
                    let Some((index, job, to)) = self.model.assigned_at.get(lease_id).cloned()
                    else {
                        return Err(format!(
                            "durability: TASK_ASSIGN job {job_id} lease {lease_id} left before its Assign was committed"
                        ));
                    };
                    ensure!(
                        job == *job_id && to == *worker,
                        "TASK_ASSIGN job {job_id} lease {lease_id} sent to {worker}, but the committed Assign gave it to {to} for job {job}"
                    );
                    self.durable(
                        c,
                        index,
                        &format!("TASK_ASSIGN job {job_id} lease {lease_id}"),
                    )?;
                    // The attempt's deadline is the one its submission chose, else the default.
                    if let (Some(default), Some(job)) =
                        (self.default_timeout_millis, self.model.job_ever(job_id))
                    {
                        let expected = job.timeout_millis.unwrap_or(default);
                        ensure!(
                            *timeout_millis == expected,
                            "TASK_ASSIGN job {job_id} lease {lease_id} carries a deadline of {timeout_millis} ms, but the job's is {expected} ms"
                        );
                    }
                    self.observe_assign(*job_id, *lease_id, attempt.0, *max_attempts, worker)?;
                }
                CoordinatorToWorker::ResultAck {
                    job_id,
                    lease_id,
                    accepted: true,
                    ..
                } => {
                    let index = self.model.settled_at.get(lease_id).copied().ok_or_else(|| {
                        format!("durability: RESULT_ACK(accepted) job {job_id} lease {lease_id} before its settlement was committed")
                    })?;
                    self.durable(c, index, &format!("RESULT_ACK(accepted) job {job_id}"))?;
                }
                CoordinatorToWorker::ResultAck {
                    job_id,
                    lease_id,
                    accepted: false,
                    ..
                } => {
                    // A refusal is final (the worker drops its result), so it is right only for
                    // a lease that is no longer current: leases never become current again, and
                    // the committed log is at least as far as the sender's table.
                    let current = self.model.jobs.get(job_id).is_some_and(|job| {
                        job.state == JobState::Running
                            && job.lease.as_ref().is_some_and(|lease| {
                                lease.id == *lease_id
                                    && matches!(owner, ConnOwner::Worker(w) if *w == lease.worker)
                            })
                    });
                    ensure!(
                        !current,
                        "RESULT_ACK(refused) for job {job_id} lease {lease_id} from its worker, while the committed log holds that lease current and the job running"
                    );
                }
                CoordinatorToWorker::TaskCancel {
                    job_id,
                    lease_id,
                    reason: CancelReason::JobCancelled,
                    ..
                } => {
                    let index = self.model.cancelled_at.get(job_id).copied().ok_or_else(|| {
                        format!("durability: TASK_CANCEL(job cancelled) job {job_id} lease {lease_id} before the cancel was committed")
                    })?;
                    self.durable(
                        c,
                        index,
                        &format!("TASK_CANCEL(job cancelled) job {job_id}"),
                    )?;
                }
                CoordinatorToWorker::TaskCancel {
                    job_id,
                    lease_id,
                    reason: CancelReason::DeadlineExpired,
                    ..
                } => {
                    let index = self.model.settled_at.get(lease_id).copied().ok_or_else(|| {
                        format!("durability: TASK_CANCEL(deadline) job {job_id} lease {lease_id} before the failure was committed")
                    })?;
                    self.durable(c, index, &format!("TASK_CANCEL(deadline) job {job_id}"))?;
                }
                _ => {}
            },
            Output::ToClient { message, .. } => {
                self.check_reply(c, machine, message, key, slots)?
            }
            Output::ToPeer { to, message } => self.check_peer_message(c, to, message)?,
            _ => {}
        }
        Ok(())
    }

    fn check_reply(
        &mut self,
        c: usize,
        machine: &Coordinator,
        reply: &ClientReply,
        key: Option<(&str, LogIndex)>,
        slots: u64,
    ) -> Check {
        match reply {
            ClientReply::SubmitAccepted {
                job_id, existing, ..
            } => self.check_accepted(c, job_id, *existing, key)?,
            ClientReply::SubmitRejected {
                max_active_jobs,
                queue: Some(queue),
                ..
            } => self.check_queue_rejected(queue, *max_active_jobs)?,
            ClientReply::SubmitRejected {
                active_jobs,
                admitting_jobs,
                max_active_jobs,
                ..
            } => self.check_rejected(
                c,
                machine,
                (*active_jobs, *admitting_jobs, *max_active_jobs),
                slots,
                None,
            )?,
            ClientReply::CancelResult {
                job,
                cancelled: true,
                ..
            } => {
                let index = self.model.cancelled_at.get(&job.id).copied().ok_or_else(|| {
                    format!("durability: CANCEL_RESULT(cancelled) for job {} before the cancel was committed", job.id)
                })?;
                ensure!(
                    job.state == herder_core::job::JobState::Cancelled,
                    "CANCEL_RESULT(cancelled) shows job {} as {}",
                    job.id,
                    job.state
                );
                self.durable(c, index, &format!("CANCEL_RESULT job {}", job.id))?;
            }
            ClientReply::WaitResult {
                job,
                timed_out: false,
                ..
            } => ensure!(
                job.state.is_terminal(),
                "WAIT_RESULT for job {} answered early in state {}",
                job.id,
                job.state
            ),
            _ => {}
        }
        if let Some(view) = terminal_view(reply) {
            self.check_view(view)?;
        }
        match reply {
            ClientReply::Job { job, .. }
            | ClientReply::WaitResult { job, .. }
            | ClientReply::CancelResult { job, .. } => self.check_unserved(job)?,
            ClientReply::JobList { jobs, .. } => {
                for job in jobs {
                    self.check_unserved(job)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// A submission answered accepted (alone, or as a job of a batch) with `job_id`.
    fn check_accepted(
        &mut self,
        c: usize,
        job_id: &JobId,
        existing: bool,
        key: Option<(&str, LogIndex)>,
    ) -> Check {
        let index = self
            .model
            .submitted_at
            .get(job_id)
            .copied()
            .ok_or_else(|| {
                format!(
                    "durability: SUBMIT_ACCEPTED for job {job_id} before its Submit was committed"
                )
            })?;
        self.durable(c, index, &format!("SUBMIT_ACCEPTED job {job_id}"))?;
        // At most one answer calls the job new. It need not come first: a deposed
        // leader that wakes up may still commit its own entry (a majority holds it) and
        // answer the first request after the new leader has answered a resend.
        if !existing {
            ensure!(
                self.acked_new.insert(*job_id),
                "job {job_id} acknowledged as new twice"
            );
        }
        if let Some((key, committed_on_arrival)) = key {
            // (Or a purge committed after the request arrived took the job and its key
            // along; a purge committed before it must have been seen.)
            let bound = self.model.keys.get(key);
            let purged_since = self
                .model
                .purged
                .get(job_id)
                .is_some_and(|(index, _)| *index > committed_on_arrival);
            ensure!(
                bound == Some(job_id) || purged_since,
                "a submission with idempotency key {key:?} was answered with job {job_id}, but the key is bound to {bound:?}"
            );
        }
        self.acked.insert(*job_id);
        Ok(())
    }

    /// A submission refused by its queue's admission limit: the rules gave the queue that
    /// limit. Whether it was right to refuse is the model's to judge when the entry applies:
    /// it counts the queue's unfinished jobs itself, and a job the table refused but the rules
    /// admitted (or the other way round) is a difference between the two.
    fn check_queue_rejected(&self, queue: &str, max_active_jobs: u64) -> Check {
        // (Set by an entry applied before the refusal; a later one may have changed it since.)
        let set = self.model.queues.get(queue).is_some_and(|changes| {
            changes
                .iter()
                .any(|(_, rules)| rules.max_active_jobs == Some(max_active_jobs))
        });
        ensure!(
            set,
            "SUBMIT_REJECTED by queue {queue:?} at a limit of {max_active_jobs}, which the rules never gave it"
        );
        Ok(())
    }

    /// A submission refused by admission (alone, or as a job of a batch) that could take no
    /// fewer than `slots`; `counts` are the active, admitting and maximum the refusal gave.
    /// `arrived` is what the coordinator had applied when the request reached it, for an
    /// answer that leaves later than that (a batch's, which waits for its other jobs).
    fn check_rejected(
        &mut self,
        c: usize,
        machine: &Coordinator,
        (active_jobs, admitting_jobs, max_active_jobs): (u64, u64, u64),
        slots: u64,
        arrived: Option<LogIndex>,
    ) -> Check {
        // A rejection only when the limit was really reached, counting the submissions
        // the leader was still writing: at most those in its log past what it had
        // applied when it took the request (every one of its own term, since it leads
        // only once every earlier entry is applied). A refusal at apply is a finding of
        // the model: a leader that counts what it writes never writes a refused one.
        let applied = machine.table().applied_index();
        let before = arrived
            .unwrap_or(self.follow[c].applied_before)
            .min(applied);
        let log = machine.replica().log();
        // (An entry applied in this step may already be compacted away: the committed
        // log has it.)
        let writing: u64 = (before.0 + 1..=log.last_index().0)
            .filter_map(|i| {
                let index = LogIndex(i);
                log.get(index)
                    .or_else(|| self.committed.get(&index).map(|(entry, _)| entry))
            })
            .map(|entry| match &entry.command {
                Command::Submit { partitions, .. } => 1 + partitions.len() as u64,
                _ => 0,
            })
            .sum();
        ensure!(
            admitting_jobs <= writing,
            "SUBMIT_REJECTED counts {admitting_jobs} slots being admitted, but the submissions past entry {before} in the leader's log take only {writing}"
        );
        ensure!(
            active_jobs + admitting_jobs + slots > max_active_jobs,
            "SUBMIT_REJECTED with {active_jobs} active and {admitting_jobs} being admitted of {max_active_jobs} slots: there was room for {slots}"
        );
        // A count the table had at some point between the request's arrival and now.
        let lo = LogIndex(arrived.unwrap_or(applied).0.saturating_sub(64));
        let seen =
            (lo.0..=applied.0).any(|i| self.model.active_at(LogIndex(i)) == Some(active_jobs));
        ensure!(
            seen,
            "SUBMIT_REJECTED reports {active_jobs} non-terminal jobs, a count the rules never had between entries {lo} and {applied}"
        );
        Ok(())
    }

    /// The answer to a `SUBMIT` (`SUBMIT_ACCEPTED`, `SUBMIT_REJECTED` or `ERROR`), judged
    /// against what was sent (the checks of `check_reply` come on top): a submission that fails
    /// a check must get that check's `ERROR`, an accepted one must be the job it names, and an
    /// `ERROR` must fit the submission. `committed` is how far the committed log went when the
    /// request arrived.
    pub fn check_submit_reply(
        &mut self,
        subject: Subject,
        sent: &JobSubmission,
        committed: LogIndex,
        reply: &ClientReply,
    ) -> Check {
        let verdict = submission::verdict(sent, &self.rules);
        match reply {
            ClientReply::SubmitAccepted { job_id, .. } => {
                self.refused_only_by_checks(subject, sent, &verdict, "SUBMIT_ACCEPTED")?;
                self.check_options(subject, job_id, sent)
            }
            ClientReply::SubmitRejected { .. } => {
                self.refused_only_by_checks(subject, sent, &verdict, "SUBMIT_REJECTED")
            }
            ClientReply::Error { code, message, .. } => {
                self.judge_error(subject, sent, &verdict, committed, (*code, message), false)
            }
            _ => Ok(()),
        }
    }

    /// A submission that a check of steps 1 to 6 refuses, or (without a key to answer it from)
    /// the slot check of step 8, gets that check's `ERROR`, never `answer`.
    fn refused_only_by_checks(
        &self,
        subject: Subject,
        sent: &JobSubmission,
        verdict: &Verdict,
        answer: &str,
    ) -> Check {
        if let Some((code, why)) = verdict.invalid {
            return Err(format!(
                "submission checks: {subject} was answered {answer}, but it holds {why}, which must be answered ERROR {}",
                code_name(code)
            ));
        }
        ensure!(
            !verdict.oversize || sent.idempotency_key.is_some(),
            "submission checks: {subject} was answered {answer}, but it needs {} admission slots under a limit of {}, which must be answered ERROR INVALID_REQUEST",
            submission::fewest_slots(&sent.task, sent.partitions),
            self.rules.max_active_jobs
        );
        Ok(())
    }

    /// An `ERROR` answering a submission (a `SUBMIT`, or a line of a batch's reply) must be
    /// one a `SUBMIT` of it alone could get: the code of the first check it fails; else an
    /// `IDEMPOTENCY_CONFLICT` when its key is bound to a job with other options; else
    /// `INVALID_REQUEST` when the job and its partitions could never fit under the admission
    /// limit, or `INVALID_TASK` when a reply about it might not fit a frame (a line of a batch
    /// gets neither: those checks fail the whole batch).
    fn judge_error(
        &self,
        subject: Subject,
        sent: &JobSubmission,
        verdict: &Verdict,
        committed: LogIndex,
        (code, message): (ErrorCode, &str),
        batch_line: bool,
    ) -> Check {
        let name = code_name(code);
        if let Some((must, why)) = verdict.invalid {
            ensure!(
                code == must || (code == ErrorCode::InvalidTask && verdict.maybe_too_large),
                "submission checks: {subject} was answered ERROR {name} ({message:?}), but it holds {why}, which is answered {} first",
                code_name(must)
            );
            return Ok(());
        }
        match code {
            ErrorCode::IdempotencyConflict => self.check_conflict(subject, sent, committed),
            ErrorCode::InvalidRequest if verdict.oversize && !batch_line => Ok(()),

            ErrorCode::InvalidTask if verdict.maybe_too_large && !batch_line => Ok(()),
            ErrorCode::InvalidRequest | ErrorCode::InvalidTask if batch_line => Err(format!(
                "submission checks: {subject} was answered ERROR {name} ({message:?}) on its own line; a batch's jobs are checked before any is admitted, and a job that fails a check fails the whole batch"
            )),
            ErrorCode::InvalidRequest => Err(format!(
                "submission checks: {subject} was answered ERROR INVALID_REQUEST ({message:?}), but every field of it is in range and its {} admission slots fit under the limit of {}",
                submission::fewest_slots(&sent.task, sent.partitions),
                self.rules.max_active_jobs
            )),
            ErrorCode::InvalidTask => Err(format!(
                "submission checks: {subject} was answered ERROR INVALID_TASK ({message:?}), but its task {} is valid and small",
                sent.task
            )),
            _ => Err(format!(
                "submission checks: {subject} was answered ERROR {name} ({message:?}); a submission that passes every check is accepted, refused for room, or (keyed) an IDEMPOTENCY_CONFLICT"
            )),
        }
    }

    /// An `IDEMPOTENCY_CONFLICT` needs a key bound, by the committed log, to a job submitted
    /// with other options: the job it is bound to now, or one a purge committed after the
    /// request arrived removed (which took the key along). A binding a purge had removed before
    /// the request arrived is a stale read.
    fn check_conflict(&self, subject: Subject, sent: &JobSubmission, committed: LogIndex) -> Check {
        let Some(key) = &sent.idempotency_key else {
            return Err(format!(
                "idempotency: {subject}, which carries no idempotency key, was answered ERROR IDEMPOTENCY_CONFLICT"
            ));
        };
        let mut bound: Vec<JobId> = self.model.keys.get(key).copied().into_iter().collect();
        bound.extend(
            self.model
                .purged
                .iter()
                .filter(|(_, (at, job))| *at > committed && job.key.as_ref() == Some(key))
                .map(|(id, _)| *id),
        );
        bound.sort();
        ensure!(
            !bound.is_empty(),
            "idempotency: {subject} was answered ERROR IDEMPOTENCY_CONFLICT, but by the committed log no job holds key {key:?} (nor did one a purge removed after the request arrived)"
        );
        let differs = bound.iter().any(|id| {
            self.model
                .job_ever(id)
                .is_some_and(|job| submission::differences(job, sent, &self.rules).is_some())
        });
        ensure!(
            differs,
            "idempotency: {subject} was answered ERROR IDEMPOTENCY_CONFLICT, but key {key:?} is bound to job {}, submitted with the same task, max attempts, timeout and partition request",
            bound
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" or job ")
        );
        Ok(())
    }

    /// A submission answered accepted names the job it is: one with its task, max attempts
    /// (the default filled in), timeout and partition request. A keyed one whose key's job has
    /// other options is a conflict, not that job.
    fn check_options(&self, subject: Subject, job_id: &JobId, sent: &JobSubmission) -> Check {
        let Some(job) = self.model.job_ever(job_id) else {
            return Ok(()); // `check_accepted` fails it: not committed
        };
        if let Some(difference) = submission::differences(job, sent, &self.rules) {
            return Err(format!(
                "submission checks: {subject} was answered accepted with job {job_id}, whose {difference}"
            ));
        }
        Ok(())
    }

    /// A `SUBMIT_BATCH_RESULT` of coordinator `c`: each job's answer checked as a `SUBMIT`'s,
    /// and no job of it may fail a check that fails the whole batch.
    #[allow(clippy::too_many_arguments)]
    pub fn check_batch_result(
        &mut self,
        c: usize,
        machine: &Coordinator,
        (conn, request): (usize, herder_core::ids::RequestId),
        jobs: &[JobSubmission],
        results: &[SubmitResult],
        items: &[(Option<(&str, LogIndex)>, u64)],
        (arrived, committed): (LogIndex, LogIndex),
    ) -> Check {
        ensure!(
            results.len() == items.len() && jobs.len() == items.len(),
            "a batch of {} jobs was answered with {} results",
            items.len(),
            results.len()
        );
        for (index, ((result, (key, slots)), sent)) in
            results.iter().zip(items).zip(jobs).enumerate()
        {
            let subject = Subject::BatchJob {
                conn,
                request,
                index,
            };
            let verdict = submission::verdict(sent, &self.rules);
            self.refused_only_by_checks(
                subject,
                sent,
                &verdict,
                "with a line of a SUBMIT_BATCH_RESULT instead of an ERROR for the whole batch",
            )?;
            match result {
                SubmitResult::Accepted { job_id, existing } => {
                    self.check_accepted(c, job_id, *existing, *key)?;
                    self.check_options(subject, job_id, sent)?;
                }
                SubmitResult::Rejected {
                    max_active_jobs,
                    queue: Some(queue),
                    ..
                } => {
                    // A keyed job waiting on its key's first submission shares that one's
                    // answer, which may name the queue that submission was sent to.
                    ensure!(
                        sent.queue.as_deref().unwrap_or(herder_core::queues::DEFAULT_QUEUE) == queue
                            || sent.idempotency_key.is_some(),
                        "{subject}: refused by the limit of queue {queue:?}, but it was sent to {:?}",
                        sent.queue
                    );
                    self.check_queue_rejected(queue, *max_active_jobs)?
                }
                SubmitResult::Rejected {
                    active_jobs,
                    admitting_jobs,
                    max_active_jobs,
                    ..
                } => self.check_rejected(
                    c,
                    machine,
                    (*active_jobs, *admitting_jobs, *max_active_jobs),
                    *slots,
                    Some(arrived),
                )?,
                SubmitResult::Error { code, message } => {
                    self.judge_error(subject, sent, &verdict, committed, (*code, message), true)?
                }
            }
        }
        Ok(())
    }

    /// A `SUBMIT_BATCH` answered by one `ERROR`: the whole batch failed the checks. It must be
    /// a batch of no jobs or too many (`INVALID_REQUEST`), or hold a job that fails a check of
    /// steps 1 to 6 or 8, after jobs that all pass them, with that check's code (step 8 is
    /// skipped for a job its key answers, so a keyed job that needs too many slots may, or may
    /// not, be the one). A message naming `job N of the batch` must name such a job.
    pub fn check_batch_error(
        &self,
        (conn, request): (usize, herder_core::ids::RequestId),
        jobs: &[JobSubmission],
        code: ErrorCode,
        message: &str,
    ) -> Check {
        let name = code_name(code);
        let most = submission::batch_jobs_max(&self.rules);
        if jobs.is_empty() || jobs.len() > most {
            ensure!(
                code == ErrorCode::InvalidRequest,
                "submission checks: the SUBMIT_BATCH of request {} on conn {conn} holds {} jobs (1 to {most} allowed), but was answered ERROR {name} ({message:?})",
                request.0,
                jobs.len()
            );
            return Ok(());
        }
        // The jobs that may fail the batch, with their code, up to the first that must.
        let mut may: Vec<(usize, ErrorCode)> = Vec::new();
        for (index, sent) in jobs.iter().enumerate() {
            let verdict = submission::verdict(sent, &self.rules);
            if verdict.maybe_too_large {
                may.push((index, ErrorCode::InvalidTask));
            }
            if let Some((code, _)) = verdict.invalid {
                may.push((index, code));
                break;
            }
            if verdict.oversize {
                may.push((index, ErrorCode::InvalidRequest));
                if sent.idempotency_key.is_none() {
                    break;
                }
            }
        }
        let named = message
            .strip_prefix("job ")
            .and_then(|rest| rest.split_once(" of the batch:"))
            .and_then(|(index, _)| index.parse::<usize>().ok());
        let fits = may
            .iter()
            .any(|(index, must)| *must == code && named.is_none_or(|n| n == *index));
        if fits {
            return Ok(());
        }
        let why = match named.map(|n| (n, jobs.get(n))) {
            Some((n, Some(sent))) => {
                let verdict = submission::verdict(sent, &self.rules);
                match verdict.invalid {
                    Some((must, why)) => {
                        format!(
                            "it names job {n}, which holds {why}, answered {}",
                            code_name(must)
                        )
                    }
                    None if verdict.passes() => {
                        format!("it names job {n}, which passes every check")
                    }
                    None => format!("it names job {n}, judged {verdict:?}"),
                }
            }
            Some((n, None)) => format!("it names job {n}, which the batch does not hold"),
            None => "it names no job".to_owned(),
        };
        let may: Vec<String> = may
            .iter()
            .map(|(index, code)| format!("job {index}: {}", code_name(*code)))
            .collect();
        Err(format!(
            "submission checks: the SUBMIT_BATCH of request {} on conn {conn} ({} jobs) was answered ERROR {name} ({message:?}): {why}; the jobs that may fail the batch first: [{}]",
            request.0,
            jobs.len(),
            may.join(", ")
        ))
    }

    /// A job of a kind no worker serves is never assigned, so while it is not terminal it (or
    /// a partition of it) waits (queued, scheduled or blocked): its view must say nobody
    /// serves it.
    fn check_unserved(&self, view: &JobView) -> Check {
        let kind = view.task.kind();
        ensure!(
            view.state.is_terminal() || self.served_ever.contains(kind) || view.unserved,
            "job {} of kind {kind:?}, which no worker serves, is shown {} without `unserved`",
            view.id,
            view.state
        );
        Ok(())
    }

    /// A terminal job shown to a client must be terminal in the committed log, the same way.
    fn check_view(&self, view: &JobView) -> Check {
        // A view may be answered just before the same step applies a purge of the job.
        let Some(job) = self.model.job_ever(&view.id) else {
            return Err(format!(
                "job {} shown to a client as {}, but the rules never created it",
                view.id, view.state
            ));
        };
        ensure!(
            job.state == view.state && job.result == view.result,
            "job {} shown to a client as {} {:?}, but by the committed log it is {} {:?}",
            view.id,
            view.state,
            view.result,
            job.state,
            job.result
        );
        Ok(())
    }

    /// Checks a live coordinator's own state (after every step, and right after a recovery).
    pub fn check_state<'a>(
        &mut self,
        c: usize,
        table: &herder_core::table::JobTable,
        workers: impl Iterator<Item = &'a WorkerEntry>,
    ) -> Check {
        let applied = table.applied_index();
        if self.follow[c].table_checked != Some(applied) {
            table
                .check_invariants()
                .map_err(|violation| format!("job table invariant: {violation}"))?;
            self.follow[c].table_checked = Some(applied);
        }
        for worker in workers {
            ensure!(
                worker.leases.len() <= worker.capacity as usize + worker.prefetch as usize,
                "worker {} holds {} leases with capacity {} and prefetch {}: {:?}",
                worker.id,
                worker.leases.len(),
                worker.capacity,
                worker.prefetch,
                worker.leases.keys().collect::<Vec<_>>()
            );
            ensure!(
                worker
                    .ends
                    .keys()
                    .chain(&worker.overdue)
                    .all(|lease| worker.leases.contains_key(lease)),
                "worker {} keeps the end of a lease it no longer holds",
                worker.id
            );
        }
        Ok(())
    }

    /// Whether a committed purge removed `job`.
    pub fn purged(&self, job: &JobId) -> bool {
        self.model.purged.contains_key(job)
    }

    /// Counts completions as jobs reach `COMPLETED` by the committed log (for the report).
    pub fn count_completions(&mut self) {
        self.completions = self
            .model
            .jobs
            .values()
            .filter(|j| j.state == herder_core::job::JobState::Completed)
            .count() as u64;
    }
}

fn terminal_view(reply: &ClientReply) -> Option<&JobView> {
    match reply {
        ClientReply::Job { job, .. }
        | ClientReply::WaitResult { job, .. }
        | ClientReply::CancelResult { job, .. }
            if job.state.is_terminal() =>
        {
            Some(job)
        }
        _ => None,
    }
}
