//! The frame format: a length, a kind, a request id and a payload.

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::error::{Error, ErrorKind, Result};

/// The largest data chunk either side sends in one frame.
pub(crate) const CHUNK: usize = 64 * 1024;
/// The largest payload accepted (JSON calls and replies included).
pub(crate) const MAX_PAYLOAD: usize = 1024 * 1024;
/// Bytes of data one stream may have in flight before the receiver grants more.
pub(crate) const WINDOW: u32 = 1024 * 1024;

/// Which byte stream of a request a data frame belongs to.
pub(crate) const MAIN: u8 = 0;
/// A process's stderr.
pub(crate) const ERR: u8 = 1;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// Client → server: a JSON [`Call`](super::proto::Call) opening request `id`.
    Call = 1,
    /// A chunk of the main stream: stdin, file or archive bytes in; stdout, file or
    /// archive bytes out.
    Data = 2,
    /// Server → client: a chunk of a process's stderr.
    DataErr = 3,
    /// The end of one stream; the payload is the stream tag.
    End = 4,
    /// Server → client: the JSON result of a call.
    Reply = 5,
    /// Server → client: a process's JSON exit status, after both output streams ended.
    Exit = 6,
    /// Client → server: kill the process of request `id`.
    Kill = 7,
    /// More room on a stream: a tag byte and a big-endian `u32` byte count.
    Credit = 8,
    /// A stream ended in an error: a JSON error payload.
    Abort = 9,
    /// Client → server: send a signal (a big-endian `i32`) to the process of request `id`.
    Signal = 10,
    /// Client → server: resize the terminal of the process of request `id` to a
    /// big-endian `u16` of rows and one of columns.
    Resize = 11,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Kind::Call,
            2 => Kind::Data,
            3 => Kind::DataErr,
            4 => Kind::End,
            5 => Kind::Reply,
            6 => Kind::Exit,
            7 => Kind::Kill,
            8 => Kind::Credit,
            9 => Kind::Abort,
            10 => Kind::Signal,
            11 => Kind::Resize,
            _ => return None,
        })
    }
}

/// One frame: `u32` length of what follows, `u8` kind, `u64` request id, payload.
#[derive(Debug, Clone)]
pub(crate) struct Frame {
    pub(crate) kind: Kind,
    pub(crate) id: u64,
    pub(crate) payload: Bytes,
}

impl Frame {
    pub(crate) fn new(kind: Kind, id: u64, payload: impl Into<Bytes>) -> Self {
        Frame {
            kind,
            id,
            payload: payload.into(),
        }
    }

    pub(crate) fn encode(&self, out: &mut BytesMut) {
        out.reserve(13 + self.payload.len());
        // Payloads are capped far below u32::MAX by construction.
        out.put_u32((9 + self.payload.len()) as u32);
        out.put_u8(self.kind as u8);
        out.put_u64(self.id);
        out.put_slice(&self.payload);
    }

    /// The payload as the stream tag of an `End` or `Credit` frame.
    pub(crate) fn tag(&self) -> u8 {
        self.payload.first().copied().unwrap_or(MAIN)
    }
}

/// Reads one frame; `None` at a clean end of stream between frames.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Option<Frame>> {
    let mut len = [0u8; 4];
    match reader.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(Error::io("reading from the sandbox agent", e)),
    }
    let len = u32::from_be_bytes(len) as usize;
    if !(9..=9 + MAX_PAYLOAD).contains(&len) {
        return Err(protocol(format_args!("a frame of {len} bytes")));
    }
    let mut buf = vec![0u8; len];
    reader
        .read_exact(&mut buf)
        .await
        .map_err(|e| Error::io("reading from the sandbox agent", e))?;
    let kind =
        Kind::from_u8(buf[0]).ok_or_else(|| protocol(format_args!("frame kind {}", buf[0])))?;
    let mut id = [0u8; 8];
    id.copy_from_slice(&buf[1..9]);
    let payload = Bytes::from(buf).slice(9..);
    Ok(Some(Frame {
        kind,
        id: u64::from_be_bytes(id),
        payload,
    }))
}

/// The error for a peer that broke the protocol.
pub(crate) fn protocol(what: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::Backend,
        format!("the sandbox agent broke the wire protocol: unexpected {what}"),
    )
}
