//! What the etcd tests share.

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// A TCP proxy that can be cut (open connections dropped, new ones closed at once) and
/// restored: one client's connection to etcd lost and regained while etcd carries on.
pub struct Link {
    pub addr: SocketAddr,
    up: Arc<AtomicBool>,
    connections: Arc<std::sync::Mutex<JoinSet<()>>>,
    _accept: tokio::task::JoinHandle<()>,
}

impl Link {
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

    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.connections.lock().unwrap().abort_all();
    }

    pub fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}
