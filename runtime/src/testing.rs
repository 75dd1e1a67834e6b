//! Starting a group of coordinators in this process, on loopback, for tests: the one launcher
//! the runtime's and the HTTP server's tests share. (Tests of the `herder` binary start real
//! processes instead, so they can signal, pause and isolate them.)
//!
//! Every member's ports are bound before any member starts, so each is started knowing the
//! others' real peer addresses; ports are picked by the OS, so tests never collide.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use herder_core::coordinator::CoordinatorConfig;
use herder_core::ids::NodeId;

use crate::auth::ServerCredentials;
use crate::coordinator::{
    self, CoordinatorError, CoordinatorHandle, CoordinatorOptions, Listeners,
};

/// A unique directory under the system temp dir, removed when dropped.
pub struct TestDir {
    path: PathBuf,
}

impl TestDir {
    pub fn new(name: &str) -> TestDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = std::env::temp_dir().join(format!(
            "herder-it-{name}-{}-{nanos}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        TestDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if self.path.is_dir() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// One member started by [`LocalGroup::start`].
pub struct LocalMember {
    pub id: NodeId,
    pub client_addr: SocketAddr,
    pub worker_addr: SocketAddr,
    /// `None` while stopped.
    pub handle: Option<CoordinatorHandle>,
    pub dir: TestDir,
}

/// Coordinators `c1`, `c2`, ... started together in this process.
pub struct LocalGroup {
    pub members: Vec<LocalMember>,
}

fn loopback_any() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

impl LocalGroup {
    /// Starts `size` members; `config(id, peers)` is member `id`'s configuration (the launcher
    /// fills in its id and peers). A group of one has no peer port.
    pub async fn start(
        size: usize,
        config: impl Fn(&NodeId, Vec<NodeId>) -> CoordinatorConfig,
        credentials: ServerCredentials,
    ) -> Result<LocalGroup, CoordinatorError> {
        let ids: Vec<NodeId> = (1..=size).map(|n| NodeId(format!("c{n}"))).collect();
        let options = |id: &NodeId, data_dir: PathBuf, peers: BTreeMap<NodeId, String>| {
            let mut config = config(id, peers.keys().cloned().collect());
            config.node_id = id.clone();
            config.peers = peers.keys().cloned().collect();
            CoordinatorOptions {
                config,
                data_dir,
                worker_addr: loopback_any(),
                client_addr: loopback_any(),
                peer_addr: (size > 1).then(loopback_any),
                peers,
                seed: None,
                limits: Default::default(),
                credentials: credentials.clone(),
            }
        };
        let mut bound = Vec::new();
        for id in &ids {
            bound.push(Listeners::bind(&options(id, PathBuf::new(), BTreeMap::new())).await?);
        }
        let peer_addrs: BTreeMap<NodeId, String> = ids
            .iter()
            .zip(&bound)
            .filter_map(|(id, l)| Some((id.clone(), l.peer_addr()?.to_string())))
            .collect();
        let mut members = Vec::new();
        for (id, listeners) in ids.iter().zip(bound) {
            let dir = TestDir::new(&format!("group-{id}"));
            let others: BTreeMap<NodeId, String> = peer_addrs
                .iter()
                .filter(|(other, _)| *other != id)
                .map(|(other, addr)| (other.clone(), addr.clone()))
                .collect();
            let mut member = options(id, dir.path().to_owned(), others);
            member.peer_addr = listeners.peer_addr();
            let handle = coordinator::start_on(listeners, member).await?;
            members.push(LocalMember {
                id: id.clone(),
                client_addr: handle.client_addr(),
                worker_addr: handle.worker_addr(),
                handle: Some(handle),
                dir,
            });
        }
        Ok(LocalGroup { members })
    }

    /// Every member's client address, in member order.
    pub fn client_addrs(&self) -> Vec<String> {
        let addrs = self.members.iter().map(|m| m.client_addr.to_string());
        addrs.collect()
    }

    /// Every member's worker address, in member order.
    pub fn worker_addrs(&self) -> Vec<String> {
        let addrs = self.members.iter().map(|m| m.worker_addr.to_string());
        addrs.collect()
    }
}
