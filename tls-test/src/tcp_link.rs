//! [`TcpLink`]: a TCP proxy a test cuts and restores.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// A TCP proxy on loopback that can be cut (open connections dropped, new ones closed at once)
/// and restored: one client's connection to a server (etcd) lost and regained while the server
/// carries on, or a process killed as far as the server can tell (it can release nothing).
pub struct TcpLink {
    /// Where clients connect.
    pub addr: SocketAddr,
    up: Arc<AtomicBool>,
    connections: Arc<std::sync::Mutex<JoinSet<()>>>,
    _accept: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for TcpLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpLink")
            .field("addr", &self.addr)
            .field("up", &self.up.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

impl TcpLink {
    /// A proxy on a free loopback port ([`addr`](Self::addr)) to `upstream`.
    pub async fn to(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let connections = Arc::new(std::sync::Mutex::new(JoinSet::new()));
        let accept = tokio::spawn({
            let (up, connections) = (up.clone(), connections.clone());
            async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if !up.load(Ordering::SeqCst) {
                        let _ = inbound.shutdown().await;
                        continue;
                    }
                    connections.lock().unwrap().spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(upstream).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                }
            }
        });
        Self {
            addr,
            up,
            connections,
            _accept: accept,
        }
    }

    /// Drops every open connection and closes new ones at once.
    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.connections.lock().unwrap().abort_all();
    }

    /// Lets new connections through again.
    pub fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}
