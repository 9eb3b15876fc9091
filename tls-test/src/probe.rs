//! A TLS client that reports what a server serves.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::fingerprint;

/// What a server served in one handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// SHA-256 of the leaf's DER, lower-case hex.
    pub fingerprint: String,
    /// The chain as sent, leaf first.
    pub chain: Vec<CertificateDer<'static>>,
}

/// Completes a TLS handshake with `addr` for `server_name` and reports the certificate served.
///
/// The chain is not checked against any root, but the server's handshake signature *is* checked
/// against the leaf's public key: a server whose key does not match its certificate fails here.
///
/// # Errors
/// Connection and handshake failures.
pub async fn probe(addr: SocketAddr, server_name: &str) -> io::Result<Served> {
    let (config, seen) = recording_client()?;
    handshake(addr, server_name, config).await?;
    let chain = seen.lock().expect("not poisoned").clone();
    let leaf = chain
        .first()
        .ok_or_else(|| io::Error::other("no certificate served"))?;
    Ok(Served {
        fingerprint: fingerprint(leaf),
        chain,
    })
}

/// Completes a verified TLS handshake: the chain must lead to one of `roots` and be valid for
/// `server_name` now.
///
/// # Errors
/// Connection failures, and any verification failure (as `InvalidData`).
pub async fn probe_trusting(
    addr: SocketAddr,
    server_name: &str,
    roots: &[CertificateDer<'static>],
) -> io::Result<Served> {
    let mut store = RootCertStore::empty();
    for root in roots {
        store.add(root.clone()).map_err(io::Error::other)?;
    }
    let config = ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(io::Error::other)?
    .with_root_certificates(store)
    .with_no_client_auth();
    let chain = handshake(addr, server_name, config).await?;
    let leaf = chain
        .first()
        .ok_or_else(|| io::Error::other("no certificate served"))?;
    Ok(Served {
        fingerprint: fingerprint(leaf),
        chain,
    })
}

/// Sends `GET path` over HTTP/1.1 on a TLS connection (any certificate accepted, signature
/// checked as in [`probe`]) and returns the status code, the body and what was served.
///
/// # Errors
/// Connection, handshake and HTTP framing failures.
pub async fn https_get(
    addr: SocketAddr,
    server_name: &str,
    path: &str,
) -> io::Result<(u16, String, Served)> {
    https_get_as(addr, server_name, path, None).await
}

/// Like [`https_get`], presenting `client` as the client certificate (mTLS) when given.
///
/// # Errors
/// Connection, handshake (a refused client certificate included) and HTTP framing failures.
pub async fn https_get_as(
    addr: SocketAddr,
    server_name: &str,
    path: &str,
    client: Option<&crate::TestCert>,
) -> io::Result<(u16, String, Served)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (mut config, seen) = match client {
        None => recording_client()?,
        Some(cert) => recording_client_with(Some(cert))?,
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = ServerName::try_from(server_name.to_owned()).map_err(io::Error::other)?;
    let tcp = TcpStream::connect(addr).await?;
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?;
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    match tls.read_to_end(&mut response).await {
        Ok(_) => {}
        // Some servers close without close_notify; what was read is complete for Connection: close.
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {}
        Err(e) => return Err(e),
    }
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::other("no end of headers"))?;
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::other("no status code"))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    let chain = seen.lock().expect("not poisoned").clone();
    let leaf = chain
        .first()
        .ok_or_else(|| io::Error::other("no certificate served"))?;
    Ok((
        code,
        body,
        Served {
            fingerprint: fingerprint(leaf),
            chain,
        },
    ))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

type Seen = Arc<Mutex<Vec<CertificateDer<'static>>>>;

/// A client config that accepts any chain (checking the handshake signature against the leaf)
/// and records the chain it was served.
/// A client configuration that accepts any certificate (its handshake signatures still checked),
/// as [`probe`] uses: set ALPN or anything else on it, then [`connect`].
///
/// # Panics
/// If aws-lc-rs supports no safe protocol version.
pub fn client_config() -> ClientConfig {
    recording_client()
        .expect("aws-lc-rs supports TLS 1.2 and 1.3")
        .0
}

/// Like [`client_config`], presenting `cert` (its chain and key) as the client's certificate.
///
/// # Panics
/// If the certificate's key cannot be used.
pub fn client_config_with_cert(cert: &crate::TestCert) -> ClientConfig {
    recording_client_with(Some(cert))
        .expect("aws-lc-rs supports TLS 1.2 and 1.3, and the key is usable")
        .0
}

/// Connects and completes a TLS handshake with `config`.
///
/// # Errors
/// Connection and handshake failures.
pub async fn connect(
    addr: SocketAddr,
    server_name: &str,
    config: ClientConfig,
) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let name = ServerName::try_from(server_name.to_owned()).map_err(io::Error::other)?;
    let tcp = TcpStream::connect(addr).await?;
    TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
}

fn recording_client() -> io::Result<(ClientConfig, Seen)> {
    recording_client_with(None)
}

fn recording_client_with(client: Option<&crate::TestCert>) -> io::Result<(ClientConfig, Seen)> {
    let provider = crate::provider();
    let seen = Seen::default();
    let verifier = Arc::new(Recording {
        provider: provider.clone(),
        seen: seen.clone(),
    });
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some(cert) => builder
            .with_client_auth_cert(
                vec![cert.cert_der.clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_der.clone().into()),
            )
            .map_err(io::Error::other)?,
    };
    Ok((config, seen))
}

async fn handshake(
    addr: SocketAddr,
    server_name: &str,
    config: ClientConfig,
) -> io::Result<Vec<CertificateDer<'static>>> {
    let name = ServerName::try_from(server_name.to_owned()).map_err(io::Error::other)?;
    let tcp = TcpStream::connect(addr).await?;
    let tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?;
    let (_, conn) = tls.get_ref();
    Ok(conn
        .peer_certificates()
        .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
        .unwrap_or_default())
}

#[derive(Debug)]
struct Recording {
    provider: Arc<CryptoProvider>,
    seen: Seen,
}

impl ServerCertVerifier for Recording {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let mut chain = vec![end_entity.clone().into_owned()];
        chain.extend(intermediates.iter().map(|c| c.clone().into_owned()));
        *self.seen.lock().expect("not poisoned") = chain;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A plain-HTTP `GET path` from `addr` (`Connection: close`): the whole response, status line
/// and headers included. For endpoints without TLS (a metrics port, the API emulator).
///
/// # Errors
/// Connection and I/O failures.
pub async fn plain_get(addr: SocketAddr, path: &str) -> io::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut tcp = TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    tcp.read_to_string(&mut response).await?;
    Ok(response)
}
