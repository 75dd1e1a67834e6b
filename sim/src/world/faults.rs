//! Faults: the fault tick, which picks one of the kinds the seed enabled, and every fault
//! action — crashing, restarting, pausing and resuming coordinators and workers, resetting
//! connections, starting and healing partitions — up to the end of faults, when the liveness
//! phase begins.

use std::collections::BTreeSet;

use herder_core::coordinator::Coordinator;
use herder_core::protocol::codec::FrameError;
use herder_core::time::UnixMillis;
use herder_core::worker::Worker;

use super::events::Ev;
use super::network::{Close, Dir, Partition, Peer, Up, RETRANSMIT_US};
use super::nodes::{clock_for, coordinator_config, Drain, DrainPhase};
use super::{NodeRef, World};
use crate::checker::{Check, Disk};

/// The longest a crashed coordinator stays down.
pub(super) const COORDINATOR_DOWN_MAX_US: u64 = 3_000_000;

/// How often a draining worker's driver looks whether it is drained.
const DRAIN_POLL_US: u64 = 20_000;

impl World {
    pub(super) fn fault_tick(&mut self) -> Check {
        if !self.faults_active {
            return Ok(());
        }
        let faults = self.scenario.faults.clone();
        let mut kinds = Vec::new();
        if faults.coordinator_crash {
            kinds.push(0);
        }
        if faults.worker_crash {
            kinds.push(1);
        }
        if faults.worker_pause {
            kinds.push(2);
        }
        if faults.connection_reset {
            kinds.push(3);
        }
        if faults.coordinator_pause {
            kinds.push(4);
        }
        if faults.partition {
            kinds.push(5);
        }
        if faults.disk_loss {
            kinds.push(6);
        }
        if faults.worker_leave {
            kinds.push(7);
        }
        if faults.malformed {
            kinds.push(8);
        }
        if faults.stalled_reader {
            kinds.push(9);
        }
        if faults.drain {
            kinds.push(10);
        }
        if faults.impostors {
            kinds.push(11);
        }
        if faults.clock_step {
            kinds.push(12);
        }
        let kind = self.fault_rng.pick(&kinds).copied();
        let result = match kind {
            Some(0) => {
                let c = self.fault_target();
                self.crash_coordinator(c, false)
            }
            Some(1) => {
                let w = self.fault_rng.below(self.workers.len() as u64) as usize;
                self.crash_worker(w)
            }
            Some(2) => {
                let w = self.fault_rng.below(self.workers.len() as u64) as usize;
                self.pause_worker(w)
            }
            Some(3) => {
                let open: Vec<usize> = self.open_conns.iter().copied().collect();
                if let Some(&conn) = self.fault_rng.pick(&open) {
                    // Usually both ends get the reset; sometimes one or neither does (the
                    // connection silently goes dead, and only silence tells).
                    let (coord, peer, what) = match self.fault_rng.below(6) {
                        0 => (
                            true,
                            false,
                            "fault: connection dies, only the coordinator told",
                        ),
                        1 => (false, true, "fault: connection dies, only the peer told"),
                        2 => (false, false, "fault: connection dies silently"),
                        _ => (true, true, "fault: connection reset"),
                    };
                    self.count(what);
                    self.note(NodeRef::World, format_args!("FAULT conn {conn}: {what}"));
                    self.close_conn(
                        conn,
                        Close::Reset {
                            tell_coord: coord,
                            tell_peer: peer,
                        },
                    );
                }
                Ok(())
            }
            Some(4) => {
                let c = self.fault_target();
                self.pause_coordinator(c)
            }
            Some(5) => {
                self.start_partition();
                Ok(())
            }
            Some(6) => self.lose_disk(),
            Some(7) => self.worker_leaves(),
            Some(8) => self.send_garbage(),
            Some(9) => {
                let open: Vec<usize> = self.open_conns.iter().copied().collect();
                if let Some(&conn) = self.fault_rng.pick(&open) {
                    // Scaled to the simulated timings, as the runtime's 30 s is to its own.
                    let stall = self.fault_rng.range(
                        self.heartbeat_timeout_micros(),
                        4 * self.heartbeat_timeout_micros(),
                    );
                    self.count("fault: a peer stops reading");
                    self.note(
                        NodeRef::World,
                        format_args!("FAULT conn {conn}: its peer stops reading for {stall} us"),
                    );
                    self.stop_reading(conn, stall);
                }
                Ok(())
            }
            Some(10) => self.begin_drain(),
            Some(11) => self.knock(),
            Some(12) => {
                let c = self.fault_target();
                self.step_clock(c)
            }
            _ => Ok(()),
        };
        let gap = self
            .fault_rng
            .range(1, 2 * self.scenario.faults.tick_mean_us);
        self.push(self.now + gap, Ev::FaultTick);
        result
    }

    /// Bytes the coordinator cannot decode go up an open connection, as a buggy or hostile
    /// peer would send them (the connection's own messages before them still arrive first).
    fn send_garbage(&mut self) -> Check {
        let open: Vec<usize> = self.open_conns.iter().copied().collect();
        let Some(&conn) = self.fault_rng.pick(&open) else {
            return Ok(());
        };
        let error = match self.fault_rng.below(5) {
            0 => FrameError::EmptyFrame,
            1 => FrameError::InvalidJson {
                detail: "expected value at line 1 column 1".into(),
            },
            2 => FrameError::FrameTooLarge {
                length: u64::from(u32::MAX),
                max: self.scenario.coordinator.max_frame_bytes,
            },
            // The other link's first message: a worker at the client port, or the reverse.
            3 => FrameError::UnknownType {
                type_name: match self.conns[conn].peer {
                    Peer::Worker(_) => "SUBMIT".into(),
                    Peer::Client(_) => "REGISTER".into(),
                },
            },
            _ => FrameError::InvalidMessage {
                type_name: "HEARTBEAT".into(),
                detail: "unknown field `beat`".into(),
            },
        };
        self.count("fault: undecodable bytes on a connection");
        self.note(
            NodeRef::World,
            format_args!("FAULT conn {conn}: undecodable bytes ({error})"),
        );
        self.send_up(conn, Up::Garbage(error), false)
    }

    /// Which coordinator a crash or pause hits: with faults aimed at consensus, the leader
    /// half of the time (when there is one), otherwise any member.
    fn fault_target(&mut self) -> usize {
        let n = self.coords.len() as u64;
        if self.scenario.faults.leader_faults && self.fault_rng.chance(0.5) {
            if let Some(leader) = self.current_leader() {
                self.leadership_shaken();
                return leader;
            }
        }
        self.fault_rng.below(n) as usize
    }

    /// The running member that believes it leads the highest term, if any.
    pub(super) fn current_leader(&self) -> Option<usize> {
        (0..self.coords.len())
            .filter(|&c| {
                self.coords[c]
                    .machine
                    .as_ref()
                    .is_some_and(|m| m.replica().is_leader())
            })
            .max_by_key(|&c| self.coords[c].machine.as_ref().map(|m| m.replica().term()))
    }

    /// Members that have not finished rejoining after an empty start: still abstaining, or
    /// down with a disk that is empty or says it abstains.
    fn recovering(&self) -> usize {
        self.coords
            .iter()
            .filter(|node| match &node.machine {
                Some(m) => m.replica().is_abstaining(),
                None => node.disk.hard_state.abstaining || node.disk == Disk::default(),
            })
            .count()
    }

    /// A member loses its disk and restarts empty, if no more than a minority would then be
    /// without their data.
    fn lose_disk(&mut self) -> Check {
        let n = self.coords.len();
        if n < 3 || self.recovering() + 1 > (n - 1) / 2 {
            return Ok(());
        }
        let c = self.fault_rng.below(n as u64) as usize;
        self.wiped += 1;
        self.count("fault: coordinator restarts from an empty disk");
        self.crash_coordinator(c, true)
    }

    /// A worker crashes and never comes back (one always stays).
    fn worker_leaves(&mut self) -> Check {
        let staying: Vec<usize> = (0..self.workers.len())
            .filter(|w| !self.left.contains(w))
            .collect();
        if staying.len() < 2 {
            return Ok(());
        }
        let Some(&w) = self.fault_rng.pick(&staying) else {
            return Ok(());
        };
        self.left.insert(w);
        self.count("fault: worker leaves for good");
        self.note(NodeRef::Worker(w), format_args!("FAULT leaves for good"));
        self.crash_worker(w)
    }

    fn crash_coordinator(&mut self, c: usize, lose_disk: bool) -> Check {
        self.crash_coordinator_for(c, lose_disk, (50_000, 3_000_000), false)
    }

    /// Member `c`, whose process `gen` has just granted a vote or acknowledged a snapshot
    /// chunk (`what` counts which), dies now and restarts within a few election timeouts,
    /// while the election or the install may still be going on.
    pub(super) fn crash_mid_consensus(&mut self, c: usize, gen: u64, what: &'static str) -> Check {
        if self.coords[c].gen != gen || !self.faults_active {
            return Ok(());
        }
        self.count(what);
        self.crash_coordinator_for(c, false, (10_000, 400_000), false)
    }

    /// Crashes member `c`; it restarts after a delay drawn from `down_us`. With `host_dies`,
    /// its host goes quiet too, so nothing it had buffered is ever sent (otherwise that is
    /// drawn).
    pub(super) fn crash_coordinator_for(
        &mut self,
        c: usize,
        lose_disk: bool,
        down_us: (u64, u64),
        host_dies: bool,
    ) -> Check {
        if self.coords[c].machine.is_none() && !lose_disk {
            return Ok(());
        }
        let was_leading = self.coords[c]
            .machine
            .as_ref()
            .is_some_and(Coordinator::is_acting_leader);
        // A failover is timed from a crash of the acting leader while every member was up,
        // until a member leads again; a second crash meanwhile spoils the sample.
        let all_up = self.coords.iter().all(|node| node.machine.is_some());
        self.failover_from = None;
        if was_leading && self.coords.len() > 1 && all_up {
            self.failover_from = Some(self.now);
        }
        let torn = self.fault_rng.chance(self.scenario.faults.torn_tail);
        let pending = self.coords[c].pending.len() as u64;
        let landed = if torn {
            self.fault_rng.below(pending + 1) as usize
        } else {
            0
        };
        let down = self.fault_rng.range(down_us.0, down_us.1);
        let node = &mut self.coords[c];
        node.machine = None;
        node.gen += 1;
        node.paused = false;
        node.stalled.clear();
        let lost = self.crash_disk(c, landed)?;
        if lose_disk {
            self.coords[c].disk = Disk::default();
            self.checker.disk_lost(c);
        }
        self.count("fault: coordinator crash");
        if landed > 0 {
            self.count("fault: crash with unreported batches on disk");
        }
        self.note(
            NodeRef::Coordinator(c),
            format_args!(
                "FAULT crash: {landed} unreported batches reached the disk, {lost} lost{}; restart in {down} us",
                if lose_disk { ", then the disk is lost" } else { "" }
            ),
        );
        let conns: Vec<usize> = self
            .open_conns
            .iter()
            .copied()
            .filter(|&conn| self.conns[conn].coord == c)
            .collect();
        // A dead process's kernel still sends what it had buffered, then closes; a dead host
        // just goes quiet.
        let how = if !host_dies && self.fault_rng.chance(0.5) {
            Close::ByCoord
        } else {
            Close::Reset {
                tell_coord: false,
                tell_peer: false,
            }
        };
        for conn in conns {
            self.close_conn(conn, how);
        }
        self.push(self.now + down, Ev::CoordRestart { coord: c });
        Ok(())
    }

    pub(super) fn restart_coordinator(&mut self, c: usize) -> Check {
        if self.coords[c].machine.is_some() {
            return Ok(());
        }
        let process = self.coords[c].gen;
        let clock = clock_for(
            self.seed,
            NodeRef::Coordinator(c),
            process,
            self.now,
            &self.scenario,
        );
        let config = coordinator_config(&self.scenario, c, &clock, self.coords[c].wall_step_ms);
        let node = &mut self.coords[c];
        node.clock = clock;
        let seed = node.seeds.next_u64();
        let local = node.clock.local(self.now);
        let machine = Coordinator::recover(config, seed, local, node.disk.durable_state())
            .map_err(|e| format!("recovery from the durable state failed: {e}"))?;
        let rows_applied = node.disk.applied;
        self.checker.process_started(c, rows_applied, &machine);
        node.machine = Some(machine);
        node.last_durable_at = self.now;
        node.timer_floor = 0;
        self.note(
            NodeRef::Coordinator(c),
            format_args!("restarted from disk (process seed {seed:#x})"),
        );
        self.greet_peers(c);
        self.drain_coord(c)
    }

    /// A worker begins a graceful shutdown, as the runtime's driver runs one: it tells the
    /// coordinator it takes no new work; its running attempts may finish until the drain
    /// timeout, are then asked to stop and handed back as each one does, and whatever still runs
    /// after the stop wait is handed back anyway; the process stops once drained (every result
    /// acknowledged, and not before a linger, so an assignment crossing the drain is handed
    /// back), or when the wait for acknowledgements runs out. Usually a new process serving the
    /// same kinds starts a while later; sometimes the worker leaves for good (one always stays).
    /// Crashes, pauses and partitions may strike meanwhile.
    fn begin_drain(&mut self) -> Check {
        let candidates: Vec<usize> = (0..self.workers.len())
            .filter(|&w| {
                let node = &self.workers[w];
                !node.paused
                    && node.drain.is_none()
                    && node.machine.as_ref().is_some_and(|m| !m.is_draining())
            })
            .collect();
        // Mostly a worker that is running something, so there is something to hand back.
        let busy: Vec<usize> = candidates
            .iter()
            .copied()
            .filter(|&w| !self.workers[w].tasks.is_empty())
            .collect();
        let pool = if !busy.is_empty() && self.fault_rng.chance(0.7) {
            &busy
        } else {
            &candidates
        };
        let Some(&w) = self.fault_rng.pick(pool) else {
            return Ok(());
        };
        let staying = (0..self.workers.len())
            .filter(|w| !self.left.contains(w))
            .count();
        // Scaled to the simulated timings, as the runtime's 30 s, 10 s, 5 s and 1 s are to its
        // own; half the time short enough that attempts are still running when it ends.
        let timeout = match self.fault_rng.below(4) {
            0 | 1 => self.fault_rng.range(0, 30_000),
            2 => self.fault_rng.range(30_000, 300_000),
            _ => self.fault_rng.range(300_000, 2_000_000),
        };
        let stop_wait = self.fault_rng.range(50_000, 2_000_000);
        let ack_wait = 2 * self.heartbeat_timeout_micros() + self.fault_rng.range(0, 1_000_000);
        let linger = self.fault_rng.range(0, 1_000_000);
        let leaves = staying >= 2 && self.fault_rng.chance(0.25);
        let restart_after = (!leaves).then(|| self.fault_rng.range(100_000, 3_000_000));
        if leaves {
            self.left.insert(w);
        }
        let now = self.now;
        let node = &mut self.workers[w];
        node.drain = Some(Drain {
            phase: DrainPhase::Finishing,
            linger_until: now + linger,
            stop_wait,
            ack_wait,
            restart_after,
        });
        let local = node.clock.local(now);
        let gen = node.gen;
        if let Some(m) = &mut node.machine {
            m.begin_drain(local);
        }
        self.count("fault: worker drains");
        self.note(
            NodeRef::Worker(w),
            format_args!(
                "FAULT drain: running attempts get {timeout} us, then {stop_wait} us to stop; stops once drained{}",
                if leaves {
                    ", then leaves for good"
                } else {
                    ", then restarts"
                }
            ),
        );
        self.push(now + timeout, Ev::DrainTimeout { worker: w, gen });
        self.push(now + DRAIN_POLL_US, Ev::DrainCheck { worker: w, gen });
        self.drain_worker(w)
    }

    /// The drain timeout ended: every attempt still running is asked to stop, and is handed
    /// back (not charged) once it has.
    pub(super) fn drain_timeout(&mut self, w: usize, gen: u64) -> Check {
        let now = self.now;
        let node = &mut self.workers[w];
        if node.gen != gen {
            return Ok(());
        }
        let local = node.clock.local(now);
        let (Some(m), Some(drain)) = (&mut node.machine, &mut node.drain) else {
            return Ok(());
        };
        if drain.phase != DrainPhase::Finishing {
            return Ok(());
        }
        drain.phase = DrainPhase::Stopping {
            force_at: now + drain.stop_wait,
        };
        let running = m.running().count();
        m.stop_running(local);
        self.note(
            NodeRef::Worker(w),
            format_args!("drain timeout: {running} running attempts asked to stop"),
        );
        self.drain_worker(w)
    }

    /// The draining worker's driver looks where its drain stands: it stops once drained (and
    /// done lingering), forces the hand-back when the stop wait runs out, and stops anyway when
    /// the wait for acknowledgements does.
    pub(super) fn drain_check(&mut self, w: usize, gen: u64) -> Check {
        let now = self.now;
        let node = &mut self.workers[w];
        if node.gen != gen {
            return Ok(());
        }
        let local = node.clock.local(now);
        let (Some(m), Some(drain)) = (&mut node.machine, &mut node.drain) else {
            return Ok(());
        };
        let drained = m.is_drained();
        let stop = match drain.phase {
            _ if drained => now >= drain.linger_until,
            DrainPhase::Stopping { force_at } if now >= force_at => {
                drain.phase = DrainPhase::Acknowledging {
                    give_up_at: now + drain.ack_wait,
                };
                let running = m.running().count();
                m.release_running(local);
                if running > 0 {
                    self.count("worker: a drain forces the hand-back of what ignored its stop");
                }
                self.note(
                    NodeRef::Worker(w),
                    format_args!("drain stop wait over: {running} attempts handed back anyway"),
                );
                self.drain_worker(w)?;
                false
            }
            DrainPhase::Acknowledging { give_up_at } => now >= give_up_at,
            _ => false,
        };
        if !stop {
            self.push(now + DRAIN_POLL_US, Ev::DrainCheck { worker: w, gen });
            return Ok(());
        }
        let restart_after = self.workers[w].drain.and_then(|d| d.restart_after);
        self.count(if drained {
            "worker: stops once drained"
        } else {
            "worker: stops with results unacknowledged after its drain"
        });
        self.note(
            NodeRef::Worker(w),
            format_args!(
                "stops after its drain ({})",
                if drained {
                    "drained"
                } else {
                    "not drained: results unacknowledged"
                }
            ),
        );
        let node = &mut self.workers[w];
        node.machine = None;
        node.gen += 1;
        node.tasks.clear();
        node.attempt = None;
        node.drain = None;
        if let Some(conn) = node.conn.take() {
            self.close_conn(conn, Close::ByPeer);
        }
        if let Some(after) = restart_after {
            self.push(self.now + after, Ev::WorkerRestart { worker: w });
        }
        Ok(())
    }

    fn crash_worker(&mut self, w: usize) -> Check {
        if self.workers[w].machine.is_none() {
            return Ok(());
        }
        let down = self.fault_rng.range(100_000, 3_000_000);
        let node = &mut self.workers[w];
        node.machine = None;
        node.gen += 1;
        node.paused = false;
        node.stalled.clear();
        node.tasks.clear();
        node.attempt = None;
        node.drain = None;
        let conn = node.conn.take();
        self.count("fault: worker crash");
        self.note(
            NodeRef::Worker(w),
            format_args!("FAULT crash; restart in {down} us"),
        );
        if let Some(conn) = conn {
            let how = match self.fault_rng.below(4) {
                0 | 1 => Close::ByPeer,
                2 => Close::Reset {
                    tell_coord: true,
                    tell_peer: false,
                },
                _ => Close::Reset {
                    tell_coord: false,
                    tell_peer: false,
                },
            };
            self.close_conn(conn, how);
        }
        if !self.left.contains(&w) {
            self.push(self.now + down, Ev::WorkerRestart { worker: w });
        }
        Ok(())
    }

    pub(super) fn restart_worker(&mut self, w: usize) -> Check {
        if self.workers[w].machine.is_some() || self.left.contains(&w) {
            return Ok(());
        }
        let process = self.workers[w].gen;
        let clock = clock_for(
            self.seed,
            NodeRef::Worker(w),
            process,
            self.now,
            &self.scenario,
        );
        let node = &mut self.workers[w];
        node.clock = clock;
        let seed = node.seeds.next_u64();
        let local = node.clock.local(self.now);
        let machine = Worker::new(node.config.clone(), seed, local)
            .map_err(|e| format!("worker restart failed: {e}"))?;
        let incarnation = machine.incarnation();
        let id = node.config.worker_id.clone();
        node.machine = Some(machine);
        node.timer_floor = 0;
        let tasks = node.config.tasks.clone();
        self.checker.worker_process(&id, incarnation, &tasks);
        self.incarnations.insert((w, process), incarnation);
        self.note(
            NodeRef::Worker(w),
            format_args!("restarted as a new process (incarnation {incarnation})"),
        );
        self.drain_worker(w)
    }

    fn pause_worker(&mut self, w: usize) -> Check {
        let node = &self.workers[w];
        if node.machine.is_none() || node.paused {
            return Ok(());
        }
        let timeout = self.heartbeat_timeout_micros();
        let span = self.fault_rng.range(timeout / 2, 4 * timeout);
        self.workers[w].paused = true;
        self.count("fault: worker pause");
        self.note(
            NodeRef::Worker(w),
            format_args!("FAULT pause for {span} us"),
        );
        self.push(self.now + span, Ev::WorkerResume { worker: w });
        Ok(())
    }

    pub(super) fn resume_worker(&mut self, w: usize) -> Check {
        let node = &mut self.workers[w];
        if !node.paused {
            return Ok(());
        }
        node.paused = false;
        let stalled = std::mem::take(&mut node.stalled);
        self.deliver_held(NodeRef::Worker(w), stalled)
    }

    /// A paused node resumes. What reached it meanwhile was already received, in order: it is
    /// handled now, in that order, before anything else, and does not cross the network again.
    fn deliver_held(&mut self, node: NodeRef, stalled: Vec<Ev>) -> Check {
        let count = stalled.len();
        self.note(
            node,
            format_args!("resume ({count} held events handled now)"),
        );
        for ev in stalled {
            self.dispatch(ev).1?;
        }
        Ok(())
    }

    /// Steps coordinator `c`'s wall clock, its monotonic clock steady: forwards by 1 to 60 s
    /// or back by 1 to 10 s (steps back are kept short, so a job it then holds back still
    /// runs within the liveness span). The coordinator is handed the new reading at once, as
    /// the runtime's once-a-second read would hand it; its host keeps the step across restarts.
    fn step_clock(&mut self, c: usize) -> Check {
        let back = self.fault_rng.chance(0.4);
        let millis = if back {
            self.fault_rng.range(1_000, 10_000)
        } else {
            self.fault_rng.range(1_000, 60_000)
        } as i64;
        let step = if back { -millis } else { millis };
        self.coords[c].wall_step_ms += step;
        self.count(if back {
            "fault: a coordinator's wall clock steps back"
        } else {
            "fault: a coordinator's wall clock steps forward"
        });
        self.note(
            NodeRef::Coordinator(c),
            format_args!("FAULT wall clock stepped by {step} ms"),
        );
        self.read_wall_clock(c)
    }

    /// Coordinator `c` reads its host's wall clock (a paused or stopped one does when it runs
    /// again: on resume, or from its configuration when it restarts).
    pub(super) fn read_wall_clock(&mut self, c: usize) -> Check {
        let node = &mut self.coords[c];
        if node.paused {
            return Ok(());
        }
        let local = node.clock.local(self.now);
        let host = node.clock.wall_at_epoch.at(local);
        let Some(machine) = node.machine.as_mut() else {
            return Ok(());
        };
        machine.handle_wall_clock(
            local,
            UnixMillis(host.0.saturating_add_signed(node.wall_step_ms)),
        );
        self.drain_coord(c)
    }

    /// Pauses are drawn relative to the heartbeat timeout, so they cross it sometimes.
    fn heartbeat_timeout_micros(&self) -> u64 {
        u64::try_from(self.scenario.coordinator.heartbeat_timeout.as_micros()).unwrap_or(0)
    }

    fn pause_coordinator(&mut self, c: usize) -> Check {
        let node = &self.coords[c];
        if node.machine.is_none() || node.paused {
            return Ok(());
        }
        // In a group, pauses are drawn around the election timeout: a paused leader sometimes
        // wakes up deposed.
        let timeout = if self.coords.len() > 1 {
            let election = self.scenario.coordinator.election_timeout_max;
            u64::try_from(election.as_micros()).unwrap_or(0)
        } else {
            self.heartbeat_timeout_micros()
        };
        let span = self.fault_rng.range(timeout / 4, 3 * timeout);
        self.coords[c].paused = true;
        self.count("fault: coordinator pause");
        self.note(
            NodeRef::Coordinator(c),
            format_args!("FAULT pause for {span} us"),
        );
        self.push(self.now + span, Ev::CoordResume { coord: c });
        Ok(())
    }

    pub(super) fn resume_coordinator(&mut self, c: usize) -> Check {
        let node = &mut self.coords[c];
        if !node.paused {
            return Ok(());
        }
        node.paused = false;
        let stalled = std::mem::take(&mut node.stalled);
        self.deliver_held(NodeRef::Coordinator(c), stalled)?;
        self.read_wall_clock(c)
    }

    /// Starts a partition of a randomly chosen shape; it heals after a span drawn around the
    /// heartbeat timeout, so it sometimes outlasts it.
    fn start_partition(&mut self) {
        let coords: Vec<NodeRef> = (0..self.coords.len()).map(NodeRef::Coordinator).collect();
        let others: Vec<NodeRef> = (0..self.workers.len())
            .map(NodeRef::Worker)
            .chain((0..self.clients.len()).map(NodeRef::Client))
            .collect();
        let all: Vec<NodeRef> = coords.iter().chain(&others).copied().collect();
        let mut cuts = BTreeSet::new();
        let both = |a: NodeRef, b: NodeRef, cuts: &mut BTreeSet<(NodeRef, NodeRef)>| {
            cuts.insert((a, b));
            cuts.insert((b, a));
        };
        let rng = &mut self.fault_rng;
        let (Some(&coord), Some(&other)) = (rng.pick(&coords), rng.pick(&others)) else {
            return;
        };
        let aimed = self.scenario.faults.leader_faults && coords.len() > 1;
        let leader = self.current_leader().map(NodeRef::Coordinator);
        let rng = &mut self.fault_rng;
        let shape = if aimed && rng.chance(0.5) {
            4 + rng.below(3)
        } else {
            rng.below(4)
        };
        let what = match shape {
            0 => {
                let Some(&lonely) = rng.pick(&all) else {
                    return;
                };
                for &n in all.iter().filter(|&&n| n != lonely) {
                    both(lonely, n, &mut cuts);
                }
                format!("isolate {lonely}")
            }
            1 => {
                both(coord, other, &mut cuts);
                format!("cut {coord} <-> {other}")
            }
            2 => {
                let (from, to) = if rng.chance(0.5) {
                    (coord, other)
                } else {
                    (other, coord)
                };
                cuts.insert((from, to));
                format!("cut {from} -> {to} only")
            }
            3 => {
                // Two sides; in a group, the side with most coordinators is the majority.
                let mut side: Vec<bool> = all.iter().map(|_| rng.chance(0.5)).collect();
                if side.iter().all(|&s| s) || side.iter().all(|&s| !s) {
                    let flip = rng.below(side.len() as u64) as usize;
                    side[flip] = !side[flip];
                }
                for (i, &a) in all.iter().enumerate() {
                    for (j, &b) in all.iter().enumerate() {
                        if side[i] != side[j] {
                            cuts.insert((a, b));
                        }
                    }
                }
                let names = |want: bool| {
                    all.iter()
                        .zip(&side)
                        .filter(|(_, &s)| s == want)
                        .map(|(n, _)| n.to_string())
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                format!("split {{{}}} | {{{}}}", names(true), names(false))
            }
            4 => {
                let Some(lonely) = leader.or_else(|| rng.pick(&coords).copied()) else {
                    return;
                };
                for &n in all.iter().filter(|&&n| n != lonely) {
                    both(lonely, n, &mut cuts);
                }
                format!("isolate the leader {lonely}")
            }
            5 => {
                // The coordinators split into a minority and a majority; every worker and
                // client lands on one side or the other.
                let mut order: Vec<NodeRef> = coords.clone();
                for i in (1..order.len()).rev() {
                    let j = rng.below(i as u64 + 1) as usize;
                    order.swap(i, j);
                }
                let minority: Vec<NodeRef> = order[..(coords.len() - 1) / 2].to_vec();
                let mut side_a: Vec<NodeRef> = minority.clone();
                for &n in &others {
                    if rng.chance(0.5) {
                        side_a.push(n);
                    }
                }
                for &a in &all {
                    for &b in &all {
                        if side_a.contains(&a) != side_a.contains(&b) {
                            cuts.insert((a, b));
                        }
                    }
                }
                let names: Vec<String> = minority.iter().map(|n| n.to_string()).collect();
                format!("split the coordinators: minority {{{}}}", names.join(" "))
            }
            _ => {
                let (Some(&a), Some(&b)) = (rng.pick(&coords), rng.pick(&coords)) else {
                    return;
                };
                if a == b {
                    return;
                }
                cuts.insert((a, b));
                format!("cut {a} -> {b} only (coordinators)")
            }
        };
        let timeout = self.heartbeat_timeout_micros();
        let span = self.fault_rng.range(timeout / 2, 6 * timeout);
        self.next_partition += 1;
        let id = self.next_partition;
        self.partitions.push(Partition { id, cuts });
        self.count(match shape {
            0 => "fault: partition isolating one node",
            1 => "fault: partition cutting a pair",
            2 => "fault: one-way partition",
            3 => "fault: partition splitting the nodes",
            4 => "fault: partition isolating the leader",
            5 => "fault: partition splitting the coordinators",
            _ => "fault: one-way partition between coordinators",
        });
        self.note(
            NodeRef::World,
            format_args!("FAULT partition {id}: {what}; heals in {span} us"),
        );
        self.push(self.now + span, Ev::Heal { id });
        if shape >= 4 {
            self.leadership_shaken();
        }
    }

    /// Heals partition `id` (or all of them), then flushes every link no longer cut.
    pub(super) fn heal(&mut self, id: Option<u64>) -> Check {
        let before = self.partitions.len();
        self.partitions.retain(|p| id.is_some_and(|id| p.id != id));
        if self.partitions.len() == before {
            return Ok(());
        }
        match id {
            Some(id) => self.note(NodeRef::World, format_args!("partition {id} heals")),
            None => self.note(NodeRef::World, format_args!("every partition heals")),
        }
        for conn in 0..self.conns.len() {
            for dir in [Dir::Up, Dir::Down] {
                let c = &mut self.conns[conn];
                if c.held(dir).is_empty() || *c.flushing(dir) || self.link_cut(conn, dir) {
                    continue;
                }
                // TCP's next retransmission gets through.
                let at = self.now + self.latency() + self.net.range(0, RETRANSMIT_US);
                *self.conns[conn].flushing(dir) = true;
                self.push(at, Ev::Flush { conn, dir });
            }
        }
        Ok(())
    }

    pub(super) fn faults_end(&mut self) -> Check {
        self.faults_active = false;
        self.note(
            NodeRef::World,
            format_args!("faults stop; liveness phase begins"),
        );
        self.heal(None)?;
        for w in 0..self.workers.len() {
            self.resume_worker(w)?;
        }
        for c in 0..self.coords.len() {
            self.resume_coordinator(c)?;
        }
        Ok(())
    }
}
