//! DNS messages over TCP (RFC 1035 4.2.2: each message after its two-byte length): plain
//! queries, and updates signed with TSIG whose answers' signatures are verified.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use hickory_proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::rdata::tsig::TsigError;
use hickory_proto::rr::{Name, RecordType, TSigner};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Sends `message` to `server` and reads its answer, within `timeout`.
async fn exchange(server: SocketAddr, message: &[u8], timeout: Duration) -> io::Result<Vec<u8>> {
    let length = u16::try_from(message.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a DNS message over 64 KiB"))?;
    let work = async {
        let mut stream = TcpStream::connect(server).await?;
        let mut framed = Vec::with_capacity(message.len() + 2);
        framed.extend_from_slice(&length.to_be_bytes());
        framed.extend_from_slice(message);
        stream.write_all(&framed).await?;
        let mut length = [0; 2];
        stream.read_exact(&mut length).await?;
        let mut answer = vec![0; usize::from(u16::from_be_bytes(length))];
        stream.read_exact(&mut answer).await?;
        Ok(answer)
    };
    tokio::time::timeout(timeout, work)
        .await
        .unwrap_or_else(|_| Err(io::Error::new(io::ErrorKind::TimedOut, "no answer in time")))
}

/// The answer to a query for `name`/`kind` at `server` (no recursion asked: the servers asked
/// are authoritative), or why there is none.
pub(crate) async fn query(
    server: SocketAddr,
    name: &Name,
    kind: RecordType,
    recursion: bool,
    timeout: Duration,
) -> Result<Message, String> {
    let mut message = Message::query();
    message.metadata.recursion_desired = recursion;
    message.add_query(Query::query(name.clone(), kind));
    let id = message.metadata.id;
    let bytes = message.to_vec().map_err(|e| e.to_string())?;
    let answer = exchange(server, &bytes, timeout)
        .await
        .map_err(|e| format!("{server}: {e}"))?;
    let answer = Message::from_vec(&answer).map_err(|e| format!("{server}: {e}"))?;
    if answer.metadata.id != id || answer.metadata.message_type != MessageType::Response {
        return Err(format!("{server}: the answer is not to our query"));
    }
    Ok(answer)
}

/// Sends an update signed by `signer` at `now` and checks the answer's signature and code.
pub(crate) async fn update(
    server: SocketAddr,
    zone: &Name,
    mut message: Message,
    signer: &TSigner,
    now: SystemTime,
    timeout: Duration,
) -> Result<(), String> {
    // Before 1970: 0, which the server refuses as BADTIME, said below.
    let now = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut verifier = message
        .finalize(signer, now)
        .map_err(|e| format!("signing the update: {e}"))?
        .ok_or("signing the update gave no verifier")?;
    let id = message.metadata.id;
    let bytes = message.to_vec().map_err(|e| e.to_string())?;
    let answer = exchange(server, &bytes, timeout)
        .await
        .map_err(|e| format!("the update of zone {zone} at {server}: {e}"))?;
    let parsed = Message::from_vec(&answer)
        .map_err(|e| format!("the update of zone {zone} at {server}: {e}"))?;
    if parsed.metadata.id != id {
        return Err(format!(
            "the update of zone {zone} at {server}: the answer is not to our update"
        ));
    }
    // A server that does not know the key, or found the signature or time wrong, answers
    // unsigned (RFC 8945 5.2): say which.
    if let Some(tsig) = parsed.signature()
        && let Some(error) = &tsig.data.error
    {
        let what = match error {
            TsigError::BadKey => "does not know the key (BADKEY): check its name and algorithm",
            TsigError::BadSig => "found the signature wrong (BADSIG): check the secret",
            TsigError::BadTime => "found our clock too far from its own (BADTIME)",
            _ => "refused the signature",
        };
        return Err(format!(
            "the update of zone {zone} at {server} was refused: the server {what}"
        ));
    }
    if parsed.signature().is_none() {
        return Err(format!(
            "the update of zone {zone} at {server}: the answer ({}) is not signed, so it cannot be trusted",
            parsed.metadata.response_code
        ));
    }
    verifier.verify(&answer).map_err(|e| {
        format!(
            "the update of zone {zone} at {server}: the answer's signature does not verify: {e}"
        )
    })?;
    match parsed.metadata.response_code {
        ResponseCode::NoError => Ok(()),
        ResponseCode::Refused => Err(format!(
            "the update of zone {zone} at {server} was refused (REFUSED): the key may not change this record (its update-policy)"
        )),
        ResponseCode::NotAuth => Err(format!(
            "the update of zone {zone} at {server} was refused (NOTAUTH): the server is not authoritative for the zone"
        )),
        ResponseCode::NotZone => Err(format!(
            "the update of zone {zone} at {server} was refused (NOTZONE): the record is not in the zone"
        )),
        code => Err(format!(
            "the update of zone {zone} at {server} failed: {code}"
        )),
    }
}
