//! The simulated network: TCP-like connections between a coordinator and a worker or a client,
//! the messages they carry (`Up` to the coordinator, `Down` from it), and when each arrives:
//! latency with a slow tail, loss turned into retransmission delay, the repeats a correct
//! sender may make, and partitions that hold a link's traffic until they heal. Connecting,
//! sending, closing and flushing are here; `delivery` hands what arrives to the machine at the
//! far end.

mod delivery;
mod peer;

use std::collections::{BTreeSet, VecDeque};
use std::fmt;

use herder_core::client::ConnectAttempt;
use herder_core::limits::FRAME_BYTES_MAX_DEFAULT;
use herder_core::protocol::codec::{encode_frame, FrameDecoder, FrameError, WireMessage};
use herder_core::protocol::{ClientReply, ClientRequest, CoordinatorToWorker, WorkerToCoordinator};

use super::events::Ev;
use super::nodes::address_coordinator;
use super::{NodeRef, World};
use crate::checker::Check;

/// TCP's first retransmission timeout for a lost segment; it doubles on each further loss.
pub(super) const RETRANSMIT_US: u64 = 200_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Peer {
    Worker(usize),
    Client(usize),
}

impl Peer {
    pub(super) fn node(self) -> NodeRef {
        match self {
            Peer::Worker(w) => NodeRef::Worker(w),
            Peer::Client(c) => NodeRef::Client(c),
        }
    }
}

/// A direction on a connection: `Up` is peer to coordinator, `Down` coordinator to peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Dir {
    Up,
    Down,
}

/// How a connection ends.
#[derive(Clone, Copy, Debug)]
pub(super) enum Close {
    /// A network fault: data in flight is lost both ways; the chosen ends are told.
    Reset { tell_coord: bool, tell_peer: bool },
    /// The peer closed its socket, or its process died: what it already sent still arrives,
    /// then the coordinator sees the close. Nothing more reaches the peer.
    ByPeer,
    /// The coordinator closed it (or its process died): what it already sent still arrives,
    /// then the peer sees the close; its own runtime reports the close to it as well.
    ByCoord,
}

/// A network partition: the directed node-to-node links it cuts. A message on a cut link is
/// held (TCP keeps retransmitting it) until the partition heals.
pub(super) struct Partition {
    pub(super) id: u64,
    pub(super) cuts: BTreeSet<(NodeRef, NodeRef)>,
}

#[derive(Clone, Debug)]
pub(super) enum Up {
    Worker(WorkerToCoordinator),
    Client(ClientRequest),
    /// Bytes the coordinator's reader cannot decode (a buggy or hostile peer), as the reader
    /// reports them: the coordinator answers with an `ERROR` and closes the connection.
    Garbage(FrameError),
}

#[derive(Clone, Debug)]
pub(super) enum Down {
    Worker(CoordinatorToWorker),
    Client(ClientReply),
}

pub(super) struct Conn {
    pub(super) coord: usize,
    coord_gen: u64,
    pub(super) peer: Peer,
    pub(super) peer_gen: u64,
    attempt: ConnectAttempt,
    /// Neither end has closed or reset it: both may still send.
    open: bool,
    /// Data in this direction is still delivered (after a close, until the receiver has
    /// seen the close; never after a reset).
    up_live: bool,
    down_live: bool,
    /// Last scheduled delivery time in each direction (TCP order within the connection).
    up_at: u64,
    down_at: u64,
    /// Deliveries held by a partition, in order, and whether a flush is scheduled.
    pub(super) held_up: VecDeque<Ev>,
    pub(super) held_down: VecDeque<Ev>,
    flushing_up: bool,
    flushing_down: bool,
}

impl Conn {
    pub(super) fn held(&mut self, dir: Dir) -> &mut VecDeque<Ev> {
        match dir {
            Dir::Up => &mut self.held_up,
            Dir::Down => &mut self.held_down,
        }
    }

    pub(super) fn flushing(&mut self, dir: Dir) -> &mut bool {
        match dir {
            Dir::Up => &mut self.flushing_up,
            Dir::Down => &mut self.flushing_down,
        }
    }
}

/// One message through the real frame codec: encoded as the sender's runtime would, decoded as
/// the receiver's would. It must come out exactly as it went in.
pub(super) fn through_codec<M>(message: M) -> Result<M, String>
where
    M: WireMessage + PartialEq + fmt::Debug,
{
    let mut frame = Vec::new();
    encode_frame(&message, FRAME_BYTES_MAX_DEFAULT, &mut frame)
        .map_err(|e| format!("codec: cannot encode {message:?}: {e}"))?;
    let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT);
    decoder.extend(&frame);
    match decoder.next_message::<M>() {
        Ok(Some(decoded)) if decoded == message => Ok(decoded),
        Ok(Some(decoded)) => Err(format!(
            "codec: {message:?} came out of the codec as {decoded:?}"
        )),
        Ok(None) => Err(format!(
            "codec: a whole frame of {message:?} did not decode"
        )),
        Err(e) => Err(format!("codec: {message:?} does not decode: {e}")),
    }
}

/// Messages a correct sender may repeat on one connection: a worker reports a finished attempt
/// until a `RESULT_ACK` names its lease, and heartbeats are idempotent. Nothing else is ever
/// sent twice on one connection (a client resends only on a new connection, which its machine
/// does by itself; the coordinator never repeats a reply), so nothing else is repeated here.
fn repeatable_up(msg: &Up) -> bool {
    matches!(
        msg,
        Up::Worker(WorkerToCoordinator::TaskResult { .. } | WorkerToCoordinator::Heartbeat {})
    )
}

impl World {
    fn open_conn(
        &mut self,
        coord: usize,
        peer: Peer,
        peer_gen: u64,
        attempt: ConnectAttempt,
    ) -> usize {
        let id = self.conns.len();
        self.conns.push(Conn {
            coord,
            coord_gen: self.coords[coord].gen,
            peer,
            peer_gen,
            attempt,
            open: true,
            up_live: true,
            down_live: true,
            up_at: self.now,
            down_at: self.now,
            held_up: VecDeque::new(),
            held_down: VecDeque::new(),
            flushing_up: false,
            flushing_down: false,
        });
        self.open_conns.insert(id);
        id
    }

    pub(super) fn schedule_connect(
        &mut self,
        peer: Peer,
        gen: u64,
        attempt: ConnectAttempt,
        address: &str,
    ) {
        let refuse = self.faults_active && self.net.chance(self.scenario.faults.connect_fail);
        let delay = 2 * self.latency();
        self.push(
            self.now + delay,
            Ev::ConnectDone {
                peer,
                gen,
                attempt,
                coord: address_coordinator(address),
                ok: !refuse,
            },
        );
    }

    pub(super) fn latency(&mut self) -> u64 {
        let (lo, hi) = self.scenario.latency_us;
        let mut latency = self.net.range(lo, hi);
        if self.faults_active && self.net.chance(self.scenario.faults.slow_message) {
            latency += self.net.range(0, self.scenario.slow_extra_us);
        }
        latency
    }

    /// One-way transit time of a message: latency, plus retransmission timeouts for every
    /// consecutive loss of its segment (TCP hides loss as delay on a live connection).
    fn transit(&mut self) -> u64 {
        let mut transit = self.latency();
        let loss = self.scenario.faults.loss;
        if self.faults_active && loss > 0.0 {
            let mut rto = RETRANSMIT_US;
            while rto <= 16 * RETRANSMIT_US && self.net.chance(loss) {
                self.count("fault: segment lost, retransmitted");
                transit += rto;
                rto *= 2;
            }
        }
        transit
    }

    /// Whether the sender repeats this message later (a duplicate fault).
    fn duplicate_after(&mut self, repeatable: bool) -> Option<u64> {
        let p = self.scenario.faults.duplicate;
        (self.faults_active && repeatable && p > 0.0 && self.net.chance(p)).then(|| {
            self.count("fault: message sent twice");
            self.net.range(0, 2_000_000)
        })
    }

    pub(super) fn send_up(&mut self, conn: usize, msg: Up, may_repeat: bool) -> Check {
        if !self.conns[conn].open {
            return Ok(());
        }
        if let Some(after) = self.duplicate_after(may_repeat && repeatable_up(&msg)) {
            let copy = msg.clone();
            self.push(self.now + after, Ev::ResendUp { conn, msg: copy });
        }
        let msg = if self.scenario.codec {
            match msg {
                Up::Worker(m) => Up::Worker(through_codec(m)?),
                Up::Client(m) => Up::Client(through_codec(m)?),
                garbage @ Up::Garbage(_) => garbage,
            }
        } else {
            msg
        };
        let at = (self.now + self.transit()).max(self.conns[conn].up_at);
        self.conns[conn].up_at = at;
        self.push(at, Ev::Up { conn, msg });
        Ok(())
    }

    pub(super) fn send_down(&mut self, conn: usize, msg: Down) -> Check {
        if !self.conns.get(conn).is_some_and(|c| c.open) {
            return Ok(());
        }
        let msg = if self.scenario.codec {
            match msg {
                Down::Worker(m) => Down::Worker(through_codec(m)?),
                Down::Client(m) => Down::Client(through_codec(m)?),
            }
        } else {
            msg
        };
        let at = (self.now + self.transit()).max(self.conns[conn].down_at);
        self.conns[conn].down_at = at;
        self.push(at, Ev::Down { conn, msg });
        Ok(())
    }

    /// The peer of `conn` stops reading: nothing more reaches it, while it still sends. After
    /// `stall_us` the coordinator's driver gives up on its blocked write (as the runtime's
    /// write-stall bound does) and closes the connection.
    pub(super) fn stop_reading(&mut self, conn: usize, stall_us: u64) {
        let Some(c) = self.conns.get_mut(conn).filter(|c| c.open) else {
            return;
        };
        c.down_live = false;
        self.push(self.now + stall_us, Ev::StalledOut { conn });
    }

    /// The stall bound ran out: the coordinator closes the connection and is told at once (its
    /// driver closed it); what it had written is lost; the peer learns of the close when it next
    /// touches the socket.
    pub(super) fn stalled_out(&mut self, conn: usize) -> Check {
        if self.conns.get(conn).is_some_and(|c| c.open) {
            self.count("net: a stalled reader's connection closed by the coordinator");
            self.close_conn(
                conn,
                Close::Reset {
                    tell_coord: true,
                    tell_peer: true,
                },
            );
        }
        Ok(())
    }

    /// Ends `conn` as `how` says; the ends told learn of it after whatever is still in
    /// flight towards them.
    pub(super) fn close_conn(&mut self, conn: usize, how: Close) {
        let Some(c) = self.conns.get_mut(conn) else {
            return;
        };
        if !c.open {
            // Both ends closing at once: the closing side stops reading too.
            match how {
                Close::ByPeer => c.down_live = false,
                Close::ByCoord => c.up_live = false,
                Close::Reset { .. } => {
                    c.up_live = false;
                    c.down_live = false;
                }
            }
            return;
        }
        c.open = false;
        let (tell_coord, tell_peer) = match how {
            Close::Reset {
                tell_coord,
                tell_peer,
            } => {
                c.up_live = false;
                c.down_live = false;
                (tell_coord, tell_peer)
            }
            Close::ByPeer => {
                c.down_live = false;
                (true, false)
            }
            Close::ByCoord => {
                c.up_live = false;
                (true, true)
            }
        };
        self.open_conns.remove(&conn);
        if tell_coord {
            let at = (self.now + self.latency()).max(self.conns[conn].up_at);
            self.push(at, Ev::ClosedAtCoord { conn });
        }
        if tell_peer {
            let at = (self.now + self.latency()).max(self.conns[conn].down_at);
            self.push(at, Ev::ClosedAtPeer { conn });
        }
    }

    /// The connection direction a delivery travels, if it is one.
    pub(super) fn link_of(ev: &Ev) -> Option<(usize, Dir)> {
        match ev {
            Ev::Up { conn, .. } | Ev::ClosedAtCoord { conn } => Some((*conn, Dir::Up)),
            Ev::Down { conn, .. } | Ev::ClosedAtPeer { conn } => Some((*conn, Dir::Down)),
            _ => None,
        }
    }

    pub(super) fn is_cut(&self, from: NodeRef, to: NodeRef) -> bool {
        self.partitions.iter().any(|p| p.cuts.contains(&(from, to)))
    }

    pub(super) fn link_cut(&self, conn: usize, dir: Dir) -> bool {
        let c = &self.conns[conn];
        let (coord, peer) = (NodeRef::Coordinator(c.coord), c.peer.node());
        match dir {
            Dir::Up => self.is_cut(peer, coord),
            Dir::Down => self.is_cut(coord, peer),
        }
    }

    /// Delivers the oldest held message on `conn` in direction `dir`, unless a partition cuts
    /// the link again (the next heal resumes). One message per step, in order.
    pub(super) fn flush(&mut self, conn: usize, dir: Dir) -> (NodeRef, Check) {
        *self.conns[conn].flushing(dir) = false;
        if self.link_cut(conn, dir) {
            return (NodeRef::World, Ok(()));
        }
        let Some(ev) = self.conns[conn].held(dir).pop_front() else {
            return (NodeRef::World, Ok(()));
        };
        if !self.conns[conn].held(dir).is_empty() {
            *self.conns[conn].flushing(dir) = true;
            self.push(self.now, Ev::Flush { conn, dir });
        }
        self.dispatch(ev)
    }
}
