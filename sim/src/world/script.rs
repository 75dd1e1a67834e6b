//! Faults at set times, for scripted scenarios (`Scenario::script`): a test stages what a
//! safety argument is about (a leader cut off with writes in flight, a member far behind when
//! the leader dies) and the checker judges everything that follows, as in any seed.

use super::events::Ev;
use super::network::Partition;
use super::{NodeRef, World};
use crate::checker::Check;
use crate::scenario::Scripted;

impl World {
    /// Puts every scripted fault on the queue.
    pub(super) fn schedule_script(&mut self) {
        for step in 0..self.scenario.script.len() {
            let at_ms = self.scenario.script[step].0;
            self.push(at_ms * 1_000, Ev::Script { step });
        }
    }

    /// Scripted fault `step` comes due. One aimed at the leader does nothing while no member
    /// leads.
    pub(super) fn run_script_step(&mut self, step: usize) -> Check {
        let Some((_, what)) = self.scenario.script.get(step).cloned() else {
            return Ok(());
        };
        self.note(NodeRef::World, format_args!("SCRIPT {what:?}"));
        let leader = self.current_leader();
        let target = match what {
            Scripted::Crash { coord, .. } | Scripted::Isolate { coord, .. } => Some(coord),
            _ => leader,
        };
        self.script_targets.push(target);
        if leader.is_some() && target == leader {
            self.leadership_shaken();
        }
        match what {
            Scripted::CrashLeader { down_ms } => match leader {
                Some(c) => self.crash_for(c, down_ms),
                None => Ok(()),
            },
            Scripted::Crash { coord, down_ms } => self.crash_for(coord, down_ms),
            Scripted::IsolateLeader { for_ms } => {
                if let Some(c) = leader {
                    self.cut_off(NodeRef::Coordinator(c), for_ms);
                }
                Ok(())
            }
            Scripted::CutLeaderFromPeers { for_ms } => {
                if let Some(c) = leader {
                    self.cut_from_peers(c, for_ms);
                }
                Ok(())
            }
            Scripted::Isolate { coord, for_ms } => {
                self.cut_off(NodeRef::Coordinator(coord), for_ms);
                Ok(())
            }
            Scripted::PauseLeader { for_ms } => {
                if let Some(c) = leader {
                    self.coords[c].paused = true;
                    self.count("script: the leader paused");
                    self.push(self.now + for_ms * 1_000, Ev::CoordResume { coord: c });
                }
                Ok(())
            }
        }
    }

    fn crash_for(&mut self, c: usize, down_ms: u64) -> Check {
        if c >= self.coords.len() {
            return Err(format!("script: no coordinator {c}"));
        }
        self.count("script: a member crashed");
        let down = down_ms * 1_000;
        self.crash_coordinator_for(c, false, (down, down + 1), true)
    }

    /// Cuts `lonely` off from every other node for `for_ms`.
    fn cut_off(&mut self, lonely: NodeRef, for_ms: u64) {
        let others: Vec<NodeRef> = (0..self.coords.len())
            .map(NodeRef::Coordinator)
            .chain((0..self.workers.len()).map(NodeRef::Worker))
            .chain((0..self.clients.len()).map(NodeRef::Client))
            .filter(|&n| n != lonely)
            .collect();
        self.cut(lonely, others, for_ms);
    }

    /// Cuts member `c` off from the other members (only) for `for_ms`.
    fn cut_from_peers(&mut self, c: usize, for_ms: u64) {
        let others: Vec<NodeRef> = (0..self.coords.len())
            .filter(|&d| d != c)
            .map(NodeRef::Coordinator)
            .collect();
        self.cut(NodeRef::Coordinator(c), others, for_ms);
    }

    /// Cuts every link between `lonely` and `others`, both ways, for `for_ms`.
    fn cut(&mut self, lonely: NodeRef, others: Vec<NodeRef>, for_ms: u64) {
        let mut cuts = std::collections::BTreeSet::new();
        for other in others {
            cuts.insert((lonely, other));
            cuts.insert((other, lonely));
        }
        self.next_partition += 1;
        let id = self.next_partition;
        self.partitions.push(Partition { id, cuts });
        self.count("script: a member cut off");
        self.note(
            NodeRef::World,
            format_args!("SCRIPT partition {id}: cut {lonely} off for {for_ms} ms"),
        );
        self.push(self.now + for_ms * 1_000, Ev::Heal { id });
    }
}
