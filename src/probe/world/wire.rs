//! The rendezvous' messages and how they travel: each is JSON preceded by its length as four
//! big-endian bytes, and carries the protocol version, so a rank running another gpubake is
//! refused by name instead of misread. Reads run against a deadline: a peer that stops
//! talking costs at most the time left, never a hang.

use serde::{Deserialize, Serialize};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The protocol this gpubake speaks. Raise it with any change to the messages.
pub const VERSION: u32 = 2;

/// No message is larger: a report with every fact is well under a megabyte, and a peer that
/// is not gpubake must not make us allocate what its first bytes claim.
const LARGEST: u32 = 16 << 20;

/// One message, in the order they are sent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Body {
    /// A rank to rank 0, first: who it is.
    Hello {
        /// Its rank.
        rank: u32,
        /// The world size its launcher told it.
        world_size: u32,
        /// Its host name.
        host: String,
        /// Its process id, to find it on its node.
        pid: u32,
        /// The launcher's job identity, where there is one.
        job: Option<String>,
        /// Its gpubake version, to name a mismatch.
        gpubake: String,
        /// It has a GPU (and NCCL) to bring to the communicator across ranks.
        #[serde(default)]
        brings_gpu: bool,
    },
    /// Rank 0 to each rank once every rank has said hello (or the hello deadline passed):
    /// the blob every rank needs, hex-encoded (NCCL's unique id when there is a
    /// communicator), and this rank's seat in it.
    Welcome {
        /// The bytes.
        blob: String,
        /// Its seat in the communicator across ranks; None when it has none.
        #[serde(default)]
        seat: Option<super::nccl::Seat>,
        /// The unique id of a second run under NCCL's defaults, hex, when the preset sets
        /// variables to compare.
        #[serde(default)]
        second: Option<String>,
    },
    /// Rank 0 to a rank it will not count, with the reason.
    Refused {
        /// Why.
        reason: String,
    },
    /// A rank to rank 0: its local probe's report and exit code, and the digest of the blob
    /// it received, so rank 0 can tell the broadcast arrived whole.
    Report {
        /// Its rank, again: a report is checked against the hello of its connection.
        rank: u32,
        /// Its local exit code.
        exit_code: i32,
        /// sha256 of the blob, hex.
        blob_sha256: String,
        /// The report, as `gpubake probe --json` prints it.
        report: serde_json::Value,
    },
    /// Rank 0 to a rank, once it has gathered every report it will: this one is counted.
    Counted,
}

/// Why a message did not arrive.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The peer closed the connection (or it was reset): the process died or gave up.
    #[error("the connection closed")]
    Closed,
    /// The deadline passed first.
    #[error("nothing within the deadline")]
    Late,
    /// Bytes that are not a message of this protocol.
    #[error("{0}")]
    Malformed(String),
    /// Anything else the socket said.
    #[error("{0}")]
    Io(std::io::Error),
}

impl From<std::io::Error> for WireError {
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe => WireError::Closed,
            ErrorKind::WouldBlock | ErrorKind::TimedOut => WireError::Late,
            _ => WireError::Io(e),
        }
    }
}

/// Sends `body`, giving up at `deadline`.
pub fn send(stream: &mut TcpStream, body: &Body, deadline: Instant) -> Result<(), WireError> {
    let mut value = serde_json::to_value(body)
        .map_err(|e| WireError::Malformed(format!("cannot encode the message: {e}")))?;
    if let Some(fields) = value.as_object_mut() {
        fields.insert("version".into(), VERSION.into());
    }
    let json = serde_json::to_vec(&value)
        .map_err(|e| WireError::Malformed(format!("cannot encode the message: {e}")))?;
    let length = u32::try_from(json.len())
        .ok()
        .filter(|n| *n <= LARGEST)
        .ok_or_else(|| {
            WireError::Malformed(format!("{} bytes is too large to send", json.len()))
        })?;
    stream.set_write_timeout(Some(time_left(deadline)?))?;
    stream.write_all(&length.to_be_bytes())?;
    stream.write_all(&json)?;
    stream.flush()?;
    Ok(())
}

/// Receives one message, giving up at `deadline`.
pub fn receive(stream: &mut TcpStream, deadline: Instant) -> Result<Body, WireError> {
    let mut length = [0u8; 4];
    read_exact_by(stream, &mut length, deadline)?;
    let length = u32::from_be_bytes(length);
    if length > LARGEST {
        return Err(WireError::Malformed(format!(
            "a message of {length} bytes announced: not gpubake's rendezvous, or damaged"
        )));
    }
    let mut json = vec![0u8; length as usize];
    read_exact_by(stream, &mut json, deadline)?;
    decode(&json)
}

/// A frame's JSON as a message, refusing another protocol version by number.
fn decode(json: &[u8]) -> Result<Body, WireError> {
    let value: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| WireError::Malformed(format!("not JSON: {e}")))?;
    match value.get("version").and_then(|v| v.as_u64()) {
        Some(v) if v == u64::from(VERSION) => {}
        Some(v) => {
            return Err(WireError::Malformed(format!(
                "speaks rendezvous protocol {v}, this gpubake speaks {VERSION}: run one \
                 gpubake version on every node"
            )));
        }
        None => return Err(WireError::Malformed("a message without a version".into())),
    }
    // The version field is not part of the body; serde passes over it.
    serde_json::from_value(value)
        .map_err(|e| WireError::Malformed(format!("not a rendezvous message: {e}")))
}

/// `read_exact`, with the socket's timeout reset before each read to what is left, so a
/// peer that trickles bytes still cannot outlast the deadline.
fn read_exact_by(
    stream: &mut TcpStream,
    mut buf: &mut [u8],
    deadline: Instant,
) -> Result<(), WireError> {
    while !buf.is_empty() {
        stream.set_read_timeout(Some(time_left(deadline)?))?;
        match stream.read(buf) {
            Ok(0) => return Err(WireError::Closed),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The time until `deadline`; Late once it has passed (a zero timeout would mean "forever").
fn time_left(deadline: Instant) -> Result<Duration, WireError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(WireError::Late)
    } else {
        Ok(left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (client, server)
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[test]
    fn messages_travel_whole() {
        let (mut a, mut b) = pair();
        let hello = Body::Hello {
            rank: 2,
            world_size: 3,
            host: "node-b".into(),
            pid: 42,
            job: Some("7".into()),
            gpubake: "0.1.0".into(),
            brings_gpu: true,
        };
        send(&mut a, &hello, soon()).unwrap();
        send(&mut a, &Body::Counted, soon()).unwrap();
        assert_eq!(receive(&mut b, soon()).unwrap(), hello);
        assert_eq!(receive(&mut b, soon()).unwrap(), Body::Counted);
    }

    #[test]
    fn silence_closing_and_garbage_are_told_apart() {
        let (mut a, mut b) = pair();
        let quick = Instant::now() + Duration::from_millis(100);
        assert!(matches!(receive(&mut b, quick), Err(WireError::Late)));

        a.write_all(&u32::MAX.to_be_bytes()).unwrap();
        assert!(matches!(
            receive(&mut b, soon()),
            Err(WireError::Malformed(_))
        ));

        let (mut a, mut b) = pair();
        a.write_all(&5u32.to_be_bytes()).unwrap();
        a.write_all(b"hello").unwrap();
        let err = receive(&mut b, soon()).unwrap_err();
        assert!(err.to_string().contains("not JSON"), "{err}");

        let (mut a, mut b) = pair();
        let other = br#"{"version":1,"type":"counted"}"#;
        a.write_all(&(other.len() as u32).to_be_bytes()).unwrap();
        a.write_all(other).unwrap();
        let err = receive(&mut b, soon()).unwrap_err();
        assert!(err.to_string().contains("protocol 1"), "{err}");

        let (mut a, mut b) = pair();
        let unknown = br#"{"version":2,"type":"shout"}"#;
        a.write_all(&(unknown.len() as u32).to_be_bytes()).unwrap();
        a.write_all(unknown).unwrap();
        assert!(matches!(
            receive(&mut b, soon()),
            Err(WireError::Malformed(_))
        ));

        let (mut a, mut b) = pair();
        a.write_all(&[0, 0]).unwrap();
        drop(a);
        assert!(matches!(receive(&mut b, soon()), Err(WireError::Closed)));
    }
}
