//! [`Endpoint`]: one client's own way into the emulator, whose traffic can be faulted while
//! every other client carries on: a partition (requests hang, or connections are reset) or a
//! pause (requests held, then delivered late, as from a process stopped and resumed).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::Shared;

/// How a client's link to the API server is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Traffic flows.
    Up,
    /// Partitioned, requests hang: nothing is delivered either way and nothing is refused (a
    /// dropped route). On [`heal`](Endpoint::heal) the held connections are reset.
    Hang,
    /// Partitioned, connections are reset: open ones are dropped, new ones accepted and closed.
    Reset,
    /// Paused: bytes either way are held, and delivered on [`resume`](Endpoint::resume) (a
    /// request sent before the pause reaches the server late, against whatever is stored then).
    Paused,
}

/// What the emulator knows of one endpoint's traffic.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) requests: AtomicU64,
    pub(super) log: Mutex<Vec<String>>,
}

/// One client's own port into the emulator (see [`KubeApi::endpoint`](super::KubeApi::endpoint)).
/// Connections through it reach the same store as every other client; faults on it touch only
/// its own traffic. Stops when dropped.
#[derive(Debug)]
pub struct Endpoint {
    addr: SocketAddr,
    link: watch::Sender<Link>,
    connections: Arc<Mutex<JoinSet<()>>>,
    counters: Arc<Counters>,
    accept: tokio::task::JoinHandle<()>,
}

impl Endpoint {
    pub(super) async fn start(upstream: SocketAddr, shared: Arc<Shared>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let link = watch::channel(Link::Up).0;
        let connections = Arc::new(Mutex::new(JoinSet::new()));
        let counters = Arc::new(Counters::default());
        let accept = tokio::spawn(accept(
            listener,
            upstream,
            shared,
            link.clone(),
            Arc::clone(&connections),
            Arc::clone(&counters),
        ));
        Self {
            addr,
            link,
            connections,
            counters,
            accept,
        }
    }

    /// The base URL, for `kube::Config::new(url.parse()?)`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How the link is now.
    pub fn link(&self) -> Link {
        *self.link.borrow()
    }

    /// Partitions this client from the API: `Link::Hang` or `Link::Reset`.
    ///
    /// # Panics
    /// For `Link::Up` or `Link::Paused` (use [`heal`](Self::heal), [`pause`](Self::pause)).
    pub fn partition(&self, how: Link) {
        assert!(
            matches!(how, Link::Hang | Link::Reset),
            "a partition hangs or resets, not {how:?}"
        );
        self.link.send_replace(how);
        if how == Link::Reset {
            self.drop_connections();
        }
    }

    /// Ends a partition: held connections are reset (their bytes are lost, as across a real
    /// partition) and new ones flow.
    pub fn heal(&self) {
        let was = self.link.send_replace(Link::Up);
        if matches!(was, Link::Hang | Link::Reset) {
            self.drop_connections();
        }
    }

    /// Holds this client's traffic, both ways, from now on.
    pub fn pause(&self) {
        self.link.send_replace(Link::Paused);
    }

    /// Delivers what was held during a pause, late, and lets traffic flow again.
    pub fn resume(&self) {
        self.link.send_if_modified(|link| {
            let paused = *link == Link::Paused;
            if paused {
                *link = Link::Up;
            }
            paused
        });
    }

    /// How many requests reached the server through this endpoint.
    pub fn requests(&self) -> u64 {
        self.counters.requests.load(Ordering::Relaxed)
    }

    /// The requests that reached the server through this endpoint, as `METHOD path?query`.
    pub fn request_log(&self) -> Vec<String> {
        self.counters
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn drop_connections(&self) {
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .abort_all();
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.accept.abort();
        self.drop_connections();
    }
}

async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    link: watch::Sender<Link>,
    connections: Arc<Mutex<JoinSet<()>>>,
    counters: Arc<Counters>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if *link.borrow() == Link::Reset {
            drop(client); // Accepted and closed: a reset.
            continue;
        }
        let Ok(server) = TcpStream::connect(upstream).await else {
            continue; // The server is down (restarting): the client sees a closed connection.
        };
        // The server tells this endpoint's requests by the proxy's address.
        if let Ok(local) = server.local_addr() {
            shared.register(local, Arc::clone(&counters));
        }
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        let mut set = connections.lock().unwrap_or_else(PoisonError::into_inner);
        set.spawn(pump(client_read, server_write, link.subscribe()));
        set.spawn(pump(server_read, client_write, link.subscribe()));
        while set.try_join_next().is_some() {}
    }
}

/// Copies `from` to `to`, holding each chunk while the link is not up.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut link: watch::Receiver<Link>,
) {
    let mut buf = vec![0; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        match link.wait_for(|l| *l == Link::Up || *l == Link::Reset).await {
            Ok(l) if *l == Link::Up => {}
            _ => return,
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}
