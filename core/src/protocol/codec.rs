//! Frame codec: turns a byte stream into protocol messages and back.
//!
//! # Framing
//!
//! Every frame is a 4-byte big-endian unsigned length `N` followed by exactly `N` bytes of
//! UTF-8 JSON. Each frame carries one message, a JSON object whose string field `"type"`
//! names the message (`"SUBMIT"`, `"HEARTBEAT"`, ...). `N` must be at least 1 and at most the
//! configured frame limit ([`FRAME_BYTES_MAX_DEFAULT`] unless configured otherwise, never more
//! than [`FRAME_BYTES_MAX_CEILING`]).
//!
//! # Error contract
//!
//! [`FrameDecoder`] is fed whatever bytes arrived and hands out whole frames. A bad header
//! (zero length, or a length beyond the limit) is reported as soon as the four header bytes are
//! in, without waiting for the body or keeping any of it. A payload that is not a well-formed message is
//! reported by [`decode_message`] with a precise [`FrameError`]. Every `FrameError` is fatal
//! for the connection: the stream can no longer be trusted to be aligned on frame boundaries
//! (or the peer is broken), so the caller should report [`FrameError::code`] if it can and then
//! close. The decoder enforces this itself: once it has returned an error it drops its buffer,
//! ignores further input, and returns the same error from every later call.
//!
//! [`encode_frame`] is the inverse. It refuses messages that would exceed the limit and leaves
//! its output buffer untouched when it refuses.
//!
//! # Binary frames
//!
//! The link between the coordinators of a group carries the same frames with a MessagePack
//! payload instead of JSON ([`encode_binary_frame`], [`decode_binary_message`],
//! [`FrameDecoder::next_binary_message`]): the same serde data, field names kept, in a compact
//! form that is cheaper to write and to read. Only Herder's own processes speak that link; the
//! worker and client links stay JSON, for people and for other languages.
//!
//! This module is sans-IO: it never reads a clock, a socket or a file.

use std::io;
use std::ops::Range;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::limits::{FRAME_BYTES_MAX_CEILING, FRAME_BYTES_MAX_DEFAULT, FRAME_HEADER_BYTES};

// The header is read as a `u32`; a different header width would need a different reader.
const _: () = assert!(FRAME_HEADER_BYTES == 4);

/// Longest text (in bytes) an error keeps from the peer's input (details, unknown type names).
/// Error texts may be echoed back to the peer or logged, so they must not grow with the frame.
pub const ERROR_DETAIL_BYTES_MAX: usize = 256;

/// A per-direction message enum that can travel in a frame.
///
/// Implemented (elsewhere, by a macro) for each per-direction message enum, which derives
/// `Serialize`/`Deserialize` with `#[serde(tag = "type")]`.
pub trait WireMessage: Serialize + DeserializeOwned {
    /// True if `tag` names a variant of this enum.
    fn is_known_type(tag: &str) -> bool;
    /// The tag of this message, for logs.
    fn type_name(&self) -> &'static str;
}

/// Typed reasons a frame cannot be decoded.
///
/// After any of these the connection must be closed; the decoder refuses further use and
/// returns the same error again.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The header announced a payload longer than the limit (detected from the header alone).
    #[error("frame of {length} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge {
        /// The announced payload length.
        length: u64,
        /// The decoder's limit.
        max: usize,
    },
    /// The header announced a payload of zero bytes.
    #[error("frame has zero length")]
    EmptyFrame,
    /// The payload is not UTF-8.
    #[error("frame payload is not valid UTF-8 (valid up to byte {valid_up_to})")]
    InvalidUtf8 {
        /// Length of the longest valid UTF-8 prefix of the payload.
        valid_up_to: usize,
    },
    /// The payload is not JSON, or is JSON but not an object.
    #[error("frame payload is not a JSON object: {detail}")]
    InvalidJson {
        /// What was wrong, for logs (bounded by [`ERROR_DETAIL_BYTES_MAX`]).
        detail: String,
    },
    /// The payload is an object without a string `"type"` field.
    #[error("message has no string \"type\" field")]
    MissingType,
    /// The `"type"` field names no message this side accepts.
    #[error("unknown message type {type_name:?}")]
    UnknownType {
        /// The received tag (bounded by [`ERROR_DETAIL_BYTES_MAX`]).
        type_name: String,
    },
    /// The type is known but the other fields do not fit it.
    #[error("invalid {type_name} message: {detail}")]
    InvalidMessage {
        /// The received tag.
        type_name: String,
        /// What was wrong, for logs (bounded by [`ERROR_DETAIL_BYTES_MAX`]).
        detail: String,
    },
    /// A binary payload that is not one whole MessagePack message of the expected kind (or
    /// has bytes after it).
    #[error("binary frame payload is not a message: {detail}")]
    InvalidBinary {
        /// What was wrong, for logs (bounded by [`ERROR_DETAIL_BYTES_MAX`]).
        detail: String,
    },
}

impl FrameError {
    /// A stable machine-readable code for this error, suitable for an error reply.
    pub fn code(&self) -> &'static str {
        match self {
            FrameError::FrameTooLarge { .. } => "FRAME_TOO_LARGE",
            FrameError::EmptyFrame => "EMPTY_FRAME",
            FrameError::InvalidUtf8 { .. } => "INVALID_UTF8",
            FrameError::InvalidJson { .. } => "INVALID_JSON",
            FrameError::MissingType => "MISSING_TYPE",
            FrameError::UnknownType { .. } => "UNKNOWN_TYPE",
            FrameError::InvalidMessage { .. } | FrameError::InvalidBinary { .. } => {
                "INVALID_MESSAGE"
            }
        }
    }
}

/// Reasons a message cannot be encoded into a frame.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The JSON form of the message is longer than the limit.
    #[error("message of {length} bytes exceeds the frame limit of {max} bytes")]
    TooLarge {
        /// Length of the message's JSON.
        length: usize,
        /// The limit it was checked against.
        max: usize,
    },
    /// The message could not be turned into JSON.
    #[error("message cannot be serialized: {detail}")]
    Serialize {
        /// What went wrong (bounded by [`ERROR_DETAIL_BYTES_MAX`]).
        detail: String,
    },
}

/// Brings a configured frame limit into `1..=FRAME_BYTES_MAX_CEILING`.
fn clamp_frame_limit(max_frame_bytes: usize) -> usize {
    max_frame_bytes.clamp(1, FRAME_BYTES_MAX_CEILING)
}

/// Cuts `text` to at most [`ERROR_DETAIL_BYTES_MAX`] bytes, on a character boundary.
fn bounded(text: String) -> String {
    crate::text::cut_within(text, ERROR_DETAIL_BYTES_MAX)
}

/// The payload length announced by the header at the start of `bytes`, if all of it is there.
fn read_header(bytes: &[u8]) -> Option<u32> {
    let header: [u8; FRAME_HEADER_BYTES] = bytes.get(..FRAME_HEADER_BYTES)?.try_into().ok()?;
    Some(u32::from_be_bytes(header))
}

/// Incremental decoder: feed it whatever bytes arrived; take out whole frames.
///
/// Received bytes live in one buffer read from an offset, so taking many small frames out of a
/// large buffer costs time proportional to the bytes taken; consumed bytes are dropped (by
/// moving the unread tail to the front) only when they are at least as many as the unread
/// ones, which keeps the copying linear overall and the buffer at most about twice the unread
/// bytes plus the latest input.
pub struct FrameDecoder {
    /// Received bytes; `buf[start..]` is not yet returned as frames.
    buf: Vec<u8>,
    /// Read offset into `buf`; always `<= buf.len()`.
    start: usize,
    /// Largest payload accepted.
    max_frame_bytes: usize,
    /// The first error returned; once set, the decoder is finished.
    failed: Option<FrameError>,
}

impl FrameDecoder {
    /// A decoder accepting payloads of up to `max_frame_bytes` bytes.
    ///
    /// `max_frame_bytes` is clamped to `1..=FRAME_BYTES_MAX_CEILING`.
    pub fn new(max_frame_bytes: usize) -> FrameDecoder {
        FrameDecoder {
            buf: Vec::new(),
            start: 0,
            max_frame_bytes: clamp_frame_limit(max_frame_bytes),
            failed: None,
        }
    }

    /// The largest payload this decoder accepts (after clamping).
    pub fn max_frame_bytes(&self) -> usize {
        self.max_frame_bytes
    }

    /// Accepts payloads up to `max_frame_bytes` from the next frame on, if that is more than
    /// before (a link whose first message is small reads it under a small limit first).
    pub fn raise_max_frame_bytes(&mut self, max_frame_bytes: usize) {
        self.max_frame_bytes = self.max_frame_bytes.max(clamp_frame_limit(max_frame_bytes));
    }

    /// Appends received bytes. Never panics.
    ///
    /// If the next frame's header is complete and bad, the decoder fails right here and drops
    /// everything, so the body of an oversized frame is never kept; the error is returned by
    /// the next call to [`next_frame`](Self::next_frame). After a failure input is ignored.
    pub fn extend(&mut self, bytes: &[u8]) {
        if self.failed.is_some() || bytes.is_empty() {
            return;
        }
        self.compact();
        self.buf.extend_from_slice(bytes);
        if let Err(error) = self.pending_payload_len() {
            self.fail(error);
        }
    }

    /// The next complete frame's payload, `Ok(None)` if more bytes are needed, `Err` on a bad
    /// header (or if the decoder already failed).
    ///
    /// Consumes exactly one frame's bytes (never more), leaving the rest buffered.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        let Some(range) = self.take_frame()? else {
            return Ok(None);
        };
        Ok(Some(self.buf.get(range).unwrap_or_default().to_vec()))
    }

    /// The next complete frame, decoded as a message ([`next_frame`](Self::next_frame) plus
    /// [`decode_message`]). A payload that does not decode fails the decoder like a bad header.
    pub fn next_message<M: WireMessage>(&mut self) -> Result<Option<M>, FrameError> {
        self.next_decoded(decode_message::<M>)
    }

    /// The next complete frame, decoded as a binary (MessagePack) message
    /// ([`decode_binary_message`]). A payload that does not decode fails the decoder.
    pub fn next_binary_message<M: DeserializeOwned>(&mut self) -> Result<Option<M>, FrameError> {
        self.next_decoded(decode_binary_message::<M>)
    }

    fn next_decoded<M>(
        &mut self,
        decode: fn(&[u8]) -> Result<M, FrameError>,
    ) -> Result<Option<M>, FrameError> {
        let Some(range) = self.take_frame()? else {
            return Ok(None);
        };
        match decode(self.buf.get(range).unwrap_or_default()) {
            Ok(message) => Ok(Some(message)),
            Err(error) => Err(self.fail(error)),
        }
    }

    /// Bytes received but not yet returned as frames (0 once the decoder has failed).
    pub fn buffered_len(&self) -> usize {
        self.buf.len().saturating_sub(self.start)
    }

    /// The unread bytes.
    fn unread(&self) -> &[u8] {
        self.buf.get(self.start..).unwrap_or_default()
    }

    /// The payload length of the next frame if its header is complete and acceptable.
    fn pending_payload_len(&self) -> Result<Option<usize>, FrameError> {
        let Some(length) = read_header(self.unread()) else {
            return Ok(None);
        };
        if length == 0 {
            return Err(FrameError::EmptyFrame);
        }
        match usize::try_from(length) {
            Ok(length) if length <= self.max_frame_bytes => Ok(Some(length)),
            _ => Err(FrameError::FrameTooLarge {
                length: u64::from(length),
                max: self.max_frame_bytes,
            }),
        }
    }

    /// Advances past the next frame if it is complete, returning where its payload sits in
    /// `buf`. The returned range stays valid until the next `extend`.
    fn take_frame(&mut self) -> Result<Option<Range<usize>>, FrameError> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        let length = match self.pending_payload_len() {
            Ok(Some(length)) => length,
            Ok(None) => return Ok(None),
            Err(error) => return Err(self.fail(error)),
        };
        let payload_start = self.start.saturating_add(FRAME_HEADER_BYTES);
        let payload_end = payload_start.saturating_add(length);
        if payload_end > self.buf.len() {
            return Ok(None);
        }
        self.start = payload_end;
        Ok(Some(payload_start..payload_end))
    }

    /// Drops consumed bytes when that is cheap enough to keep the total copying linear.
    fn compact(&mut self) {
        let start = self.start.min(self.buf.len());
        if start == 0 {
            return;
        }
        let unread = self.buf.len() - start;
        if unread == 0 {
            self.buf.clear();
            self.start = 0;
        } else if start >= unread {
            self.buf.drain(..start);
            self.start = 0;
        }
    }

    /// Records `error` as final, releases the buffer, and hands the error back.
    fn fail(&mut self, error: FrameError) -> FrameError {
        self.buf = Vec::new();
        self.start = 0;
        self.failed = Some(error.clone());
        error
    }
}

impl Default for FrameDecoder {
    /// A decoder with the default frame limit, [`FRAME_BYTES_MAX_DEFAULT`].
    fn default() -> Self {
        FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT)
    }
}

impl std::fmt::Debug for FrameDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The buffer itself may be large and is peer data; show only its size.
        f.debug_struct("FrameDecoder")
            .field("buffered_len", &self.buffered_len())
            .field("max_frame_bytes", &self.max_frame_bytes)
            .field("failed", &self.failed)
            .finish()
    }
}

/// Decodes one frame payload into a message.
///
/// The payload is checked to be UTF-8 and then parsed straight into `M`. Only when that fails
/// is it examined again to say precisely why: not JSON or not an object, no string `"type"`,
/// a type `M` does not know, or a known type with wrong fields.
pub fn decode_message<M: WireMessage>(payload: &[u8]) -> Result<M, FrameError> {
    // Checked up front (cheap next to parsing) so that invalid UTF-8 is refused even where
    // serde_json would skip over it, e.g. inside an ignored field.
    let text = std::str::from_utf8(payload).map_err(|error| FrameError::InvalidUtf8 {
        valid_up_to: error.valid_up_to(),
    })?;
    let typed_error = match serde_json::from_str::<M>(text) {
        Ok(message) => return Ok(message),
        Err(error) => error,
    };
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|error| FrameError::InvalidJson {
            detail: bounded(error.to_string()),
        })?;
    let Some(object) = value.as_object() else {
        return Err(FrameError::InvalidJson {
            detail: format!("expected a JSON object, found {}", json_kind(&value)),
        });
    };
    let Some(serde_json::Value::String(type_name)) = object.get("type") else {
        return Err(FrameError::MissingType);
    };
    if !M::is_known_type(type_name) {
        return Err(FrameError::UnknownType {
            type_name: bounded(type_name.clone()),
        });
    }
    Err(FrameError::InvalidMessage {
        type_name: bounded(type_name.clone()),
        detail: bounded(typed_error.to_string()),
    })
}

/// The JSON kind of `value`, for error details.
fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// How deeply a binary payload may nest (maps in arrays in maps ...): far beyond any message
/// Herder sends, and shallow enough that a hostile payload cannot exhaust the stack.
pub const BINARY_NESTING_MAX: usize = 64;

/// Decodes one binary frame payload: exactly one MessagePack value of type `M`, nothing after.
pub fn decode_binary_message<M: DeserializeOwned>(payload: &[u8]) -> Result<M, FrameError> {
    let mut deserializer = rmp_serde::Deserializer::new(io::Cursor::new(payload));
    deserializer.set_max_depth(BINARY_NESTING_MAX);
    let message = M::deserialize(&mut deserializer).map_err(|error| FrameError::InvalidBinary {
        detail: bounded(error.to_string()),
    })?;
    let read = deserializer.position();
    if read != payload.len() as u64 {
        return Err(FrameError::InvalidBinary {
            detail: format!(
                "{} bytes follow the message",
                (payload.len() as u64).saturating_sub(read)
            ),
        });
    }
    Ok(message)
}

/// Writes `value` in the binary form: MessagePack with field names kept, the form of the
/// coordinators' link, of snapshots and of the store's records alike.
pub fn write_binary<T: Serialize + ?Sized, W: io::Write>(
    value: &T,
    out: W,
) -> Result<(), rmp_serde::encode::Error> {
    value.serialize(&mut rmp_serde::Serializer::new(out).with_struct_map())
}

/// Appends the binary frame (header and [`write_binary`]'s form) of `message` to `out`;
/// otherwise as [`encode_frame`].
pub fn encode_binary_frame<M: Serialize>(
    message: &M,
    max_frame_bytes: usize,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    encode_with(max_frame_bytes, out, |sink| {
        write_binary(message, sink).map_err(|error| error.to_string())
    })
}

/// Bytes `value` takes in a binary frame's payload, counted as it is written, never kept.
pub fn binary_encoded_len<M: Serialize>(value: &M) -> Result<usize, String> {
    let mut counter = BoundedSink {
        out: &mut Vec::new(),
        budget: 0,
        written: 0,
    };
    write_binary(value, &mut counter).map_err(|error| error.to_string())?;
    Ok(counter.written)
}

/// Appends the frame (header and JSON) of `message` to `out`.
///
/// `max_frame_bytes` is clamped like [`FrameDecoder::new`]. On error `out` is left exactly as
/// it was (same length and contents). The JSON is written straight into `out` and stops being
/// stored once it passes the limit, so an oversized message costs no more memory than the
/// limit; it is still measured to the end so that the error reports its full length.
pub fn encode_frame<M: Serialize>(
    message: &M,
    max_frame_bytes: usize,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    encode_with(max_frame_bytes, out, |sink| {
        serde_json::to_writer(sink, message).map_err(|error| error.to_string())
    })
}

/// Appends a frame whose payload `write` produces: the header, then the payload as written,
/// stored only up to the limit; `out` is left as it was on any error.
fn encode_with(
    max_frame_bytes: usize,
    out: &mut Vec<u8>,
    write: impl FnOnce(&mut BoundedSink<'_>) -> Result<(), String>,
) -> Result<(), EncodeError> {
    let max = clamp_frame_limit(max_frame_bytes);
    let original_len = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
    let mut sink = BoundedSink {
        out: &mut *out,
        budget: max,
        written: 0,
    };
    let result = write(&mut sink);
    let length = sink.written;
    let header = match (result, u32::try_from(length)) {
        (Err(error), _) => Err(EncodeError::Serialize {
            detail: bounded(error),
        }),
        (Ok(()), _) if length == 0 => Err(EncodeError::Serialize {
            detail: "message serialized to nothing".to_owned(),
        }),
        (Ok(()), Ok(header)) if length <= max => Ok(header),
        (Ok(()), _) => Err(EncodeError::TooLarge { length, max }),
    };
    match header {
        Ok(header) => {
            if let Some(slot) = out.get_mut(original_len..original_len + FRAME_HEADER_BYTES) {
                slot.copy_from_slice(&header.to_be_bytes());
            }
            Ok(())
        }
        Err(error) => {
            out.truncate(original_len);
            Err(error)
        }
    }
}

/// Appends to a buffer until `budget` bytes have been written, then only counts.
struct BoundedSink<'a> {
    out: &'a mut Vec<u8>,
    budget: usize,
    written: usize,
}

impl io::Write for BoundedSink<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.written = self.written.saturating_add(bytes.len());
        if self.written <= self.budget {
            self.out.extend_from_slice(bytes);
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::sample::Index;
    use serde::Deserialize;
    use std::collections::BTreeMap;

    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
    enum TestMsg {
        Ping { seq: u64 },
        Echo { text: String },
    }

    impl WireMessage for TestMsg {
        fn is_known_type(tag: &str) -> bool {
            matches!(tag, "PING" | "ECHO")
        }

        fn type_name(&self) -> &'static str {
            match self {
                TestMsg::Ping { .. } => "PING",
                TestMsg::Echo { .. } => "ECHO",
            }
        }
    }

    /// A frame around `payload`, built by hand.
    fn raw_frame(payload: &[u8]) -> Vec<u8> {
        let length = u32::try_from(payload.len()).expect("test payload fits a header");
        let mut bytes = length.to_be_bytes().to_vec();
        bytes.extend_from_slice(payload);
        bytes
    }

    fn encoded(message: &TestMsg) -> Vec<u8> {
        let mut out = Vec::new();
        encode_frame(message, FRAME_BYTES_MAX_DEFAULT, &mut out).expect("test message encodes");
        out
    }

    fn ping(seq: u64) -> TestMsg {
        TestMsg::Ping { seq }
    }

    fn echo(text: &str) -> TestMsg {
        TestMsg::Echo {
            text: text.to_owned(),
        }
    }

    /// Feeds `payload` as one frame and returns what `next_message` makes of it.
    fn decode_via_decoder(payload: &[u8]) -> Result<Option<TestMsg>, FrameError> {
        let mut decoder = FrameDecoder::default();
        decoder.extend(&raw_frame(payload));
        decoder.next_message::<TestMsg>()
    }

    #[test]
    fn one_byte_at_a_time() {
        let messages = [ping(7), echo("héllo\n\"quoted\""), ping(u64::MAX)];
        let wire: Vec<u8> = messages.iter().flat_map(encoded).collect();
        let mut decoder = FrameDecoder::default();
        let mut got = Vec::new();
        for byte in &wire {
            decoder.extend(std::slice::from_ref(byte));
            while let Some(message) = decoder.next_message::<TestMsg>().expect("valid stream") {
                got.push(message);
            }
        }
        assert_eq!(got, messages);
        assert_eq!(decoder.buffered_len(), 0);
    }

    #[test]
    fn several_frames_in_one_buffer() {
        let messages = [ping(1), echo("two"), ping(3)];
        let wire: Vec<u8> = messages.iter().flat_map(encoded).collect();
        let mut decoder = FrameDecoder::default();
        decoder.extend(&wire);
        for message in &messages {
            assert_eq!(decoder.next_message::<TestMsg>(), Ok(Some(message.clone())));
        }
        assert_eq!(decoder.next_message::<TestMsg>(), Ok(None));
        assert_eq!(decoder.buffered_len(), 0);
    }

    #[test]
    fn consumes_exactly_one_frame() {
        let first = encoded(&ping(1));
        let second = encoded(&echo("second"));
        let mut decoder = FrameDecoder::default();
        decoder.extend(&first);
        // Only part of the second frame has arrived.
        decoder.extend(&second[..6]);
        let payload = decoder
            .next_frame()
            .expect("good header")
            .expect("whole frame");
        assert_eq!(payload, &first[FRAME_HEADER_BYTES..]);
        assert_eq!(decoder.buffered_len(), 6);
        assert_eq!(decoder.next_frame(), Ok(None));
        assert_eq!(decoder.buffered_len(), 6);
        decoder.extend(&second[6..]);
        assert_eq!(decoder.next_message::<TestMsg>(), Ok(Some(echo("second"))));
        assert_eq!(decoder.buffered_len(), 0);
    }

    #[test]
    fn header_split_across_reads() {
        let wire = encoded(&echo("split"));
        let mut decoder = FrameDecoder::default();
        decoder.extend(&wire[..1]);
        assert_eq!(decoder.next_frame(), Ok(None));
        decoder.extend(&wire[1..3]);
        assert_eq!(decoder.next_frame(), Ok(None));
        assert_eq!(decoder.buffered_len(), 3);
        decoder.extend(&wire[3..5]);
        assert_eq!(decoder.next_frame(), Ok(None));
        decoder.extend(&wire[5..]);
        assert_eq!(decoder.next_message::<TestMsg>(), Ok(Some(echo("split"))));
    }

    #[test]
    fn oversized_length_rejected_from_header_alone() {
        let max = 100;
        let mut decoder = FrameDecoder::new(max);
        decoder.extend(&101u32.to_be_bytes());
        let expected = FrameError::FrameTooLarge { length: 101, max };
        assert_eq!(decoder.next_frame(), Err(expected.clone()));
        assert_eq!(decoder.buffered_len(), 0);
        assert_eq!(expected.code(), "FRAME_TOO_LARGE");

        // The largest header there is, behind a valid frame, with the default limit.
        let mut decoder = FrameDecoder::default();
        let mut wire = encoded(&ping(1));
        wire.extend_from_slice(&u32::MAX.to_be_bytes());
        decoder.extend(&wire);
        assert_eq!(decoder.next_message::<TestMsg>(), Ok(Some(ping(1))));
        assert_eq!(
            decoder.next_frame(),
            Err(FrameError::FrameTooLarge {
                length: u64::from(u32::MAX),
                max: FRAME_BYTES_MAX_DEFAULT,
            })
        );
    }

    #[test]
    fn oversized_body_is_not_buffered() {
        let mut decoder = FrameDecoder::new(8);
        let mut wire = 1000u32.to_be_bytes().to_vec();
        wire.extend_from_slice(&[b'x'; 500]);
        // Header and part of the body arrive together; nothing is kept.
        decoder.extend(&wire);
        assert_eq!(decoder.buffered_len(), 0);
        assert_eq!(decoder.buf.capacity(), 0);
        decoder.extend(&[b'x'; 500]);
        assert_eq!(decoder.buffered_len(), 0);
        assert_eq!(
            decoder.next_frame(),
            Err(FrameError::FrameTooLarge {
                length: 1000,
                max: 8
            })
        );
    }

    #[test]
    fn length_exactly_at_max_is_accepted() {
        let payload = br#"{"type":"PING","seq":12345}"#;
        let mut decoder = FrameDecoder::new(payload.len());
        decoder.extend(&raw_frame(payload));
        assert_eq!(decoder.next_message::<TestMsg>(), Ok(Some(ping(12345))));

        let mut decoder = FrameDecoder::new(payload.len() - 1);
        decoder.extend(&raw_frame(payload));
        assert_eq!(
            decoder.next_frame(),
            Err(FrameError::FrameTooLarge {
                length: payload.len() as u64,
                max: payload.len() - 1,
            })
        );

        let mut out = Vec::new();
        assert_eq!(encode_frame(&ping(12345), payload.len(), &mut out), Ok(()));
        assert_eq!(out, raw_frame(payload));
    }

    #[test]
    fn zero_length_is_rejected() {
        let mut decoder = FrameDecoder::default();
        decoder.extend(&[0, 0, 0, 0]);
        assert_eq!(decoder.next_frame(), Err(FrameError::EmptyFrame));
        assert_eq!(FrameError::EmptyFrame.code(), "EMPTY_FRAME");
    }

    #[test]
    fn invalid_utf8() {
        let payload = b"{\"type\":\"ECHO\",\"text\":\"ab\xff\"}";
        let error = decode_via_decoder(payload).expect_err("not UTF-8");
        assert_eq!(error, FrameError::InvalidUtf8 { valid_up_to: 25 });
        assert_eq!(error.code(), "INVALID_UTF8");
        // Also inside a field the message type would ignore.
        let payload = b"{\"type\":\"PING\",\"seq\":1,\"extra\":\"\xc3\x28\"}";
        assert_eq!(
            decode_message::<TestMsg>(payload),
            Err(FrameError::InvalidUtf8 { valid_up_to: 32 })
        );
    }

    #[test]
    fn invalid_json() {
        for payload in [
            &b"not json"[..],
            b"{\"type\":\"PING\",\"seq\":1",
            b"{\"type\":\"PING\",\"seq\":1} trailing",
            b"   ",
        ] {
            let error = decode_via_decoder(payload).expect_err("not JSON");
            assert!(
                matches!(error, FrameError::InvalidJson { .. }),
                "{payload:?} gave {error:?}"
            );
            assert_eq!(error.code(), "INVALID_JSON");
        }
    }

    #[test]
    fn json_that_is_not_an_object() {
        for payload in [
            &br#"[{"type":"PING","seq":1}]"#[..],
            b"\"PING\"",
            b"42",
            b"null",
        ] {
            let error = decode_via_decoder(payload).expect_err("not an object");
            assert!(
                matches!(error, FrameError::InvalidJson { .. }),
                "{payload:?} gave {error:?}"
            );
        }
        assert_eq!(
            decode_message::<TestMsg>(b"[1,2]"),
            Err(FrameError::InvalidJson {
                detail: "expected a JSON object, found an array".to_owned()
            })
        );
    }

    #[test]
    fn missing_type() {
        let error = decode_via_decoder(br#"{"seq":1}"#).expect_err("no type");
        assert_eq!(error, FrameError::MissingType);
        assert_eq!(error.code(), "MISSING_TYPE");
        assert_eq!(
            decode_message::<TestMsg>(b"{}"),
            Err(FrameError::MissingType)
        );
    }

    #[test]
    fn non_string_type() {
        for payload in [
            &br#"{"type":1,"seq":1}"#[..],
            br#"{"type":null}"#,
            br#"{"type":["PING"],"seq":1}"#,
            br#"{"type":{"PING":true}}"#,
        ] {
            assert_eq!(
                decode_message::<TestMsg>(payload),
                Err(FrameError::MissingType),
                "{payload:?}"
            );
        }
    }

    #[test]
    fn unknown_type() {
        let error = decode_via_decoder(br#"{"type":"PONG","seq":1}"#).expect_err("unknown");
        assert_eq!(
            error,
            FrameError::UnknownType {
                type_name: "PONG".to_owned()
            }
        );
        assert_eq!(error.code(), "UNKNOWN_TYPE");
        // Tags are case-sensitive.
        assert!(matches!(
            decode_message::<TestMsg>(br#"{"type":"ping","seq":1}"#),
            Err(FrameError::UnknownType { .. })
        ));
    }

    #[test]
    fn known_type_with_bad_fields() {
        for payload in [
            &br#"{"type":"PING"}"#[..],
            br#"{"type":"PING","seq":"one"}"#,
            br#"{"type":"PING","seq":-1}"#,
            br#"{"type":"ECHO","text":5}"#,
        ] {
            let error = decode_via_decoder(payload).expect_err("bad fields");
            match &error {
                FrameError::InvalidMessage { type_name, detail } => {
                    assert!(type_name == "PING" || type_name == "ECHO");
                    assert!(!detail.is_empty());
                }
                other => panic!("{payload:?} gave {other:?}"),
            }
            assert_eq!(error.code(), "INVALID_MESSAGE");
        }
    }

    #[test]
    fn error_details_are_bounded() {
        let long = "é".repeat(10_000);
        let payload = format!(r#"{{"type":"PING","seq":"{long}"}}"#);
        match decode_message::<TestMsg>(payload.as_bytes()) {
            Err(FrameError::InvalidMessage { detail, .. }) => {
                assert!(detail.len() <= ERROR_DETAIL_BYTES_MAX);
            }
            other => panic!("unexpected {other:?}"),
        }
        let payload = format!(r#"{{"type":"{long}"}}"#);
        match decode_message::<TestMsg>(payload.as_bytes()) {
            Err(FrameError::UnknownType { type_name }) => {
                assert!(type_name.len() <= ERROR_DETAIL_BYTES_MAX);
                assert!(type_name.starts_with("éé"));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn error_is_sticky() {
        let mut decoder = FrameDecoder::default();
        let mut wire = raw_frame(br#"{"type":"NOPE"}"#);
        wire.extend(encoded(&ping(2)));
        decoder.extend(&wire);
        let error = FrameError::UnknownType {
            type_name: "NOPE".to_owned(),
        };
        assert_eq!(decoder.next_message::<TestMsg>(), Err(error.clone()));
        assert_eq!(decoder.buffered_len(), 0);
        // The good frame that followed is gone, and new input is refused.
        decoder.extend(&encoded(&ping(3)));
        assert_eq!(decoder.buffered_len(), 0);
        assert_eq!(decoder.next_message::<TestMsg>(), Err(error.clone()));
        assert_eq!(decoder.next_frame(), Err(error.clone()));
        assert_eq!(decoder.next_frame(), Err(error));

        let mut decoder = FrameDecoder::default();
        decoder.extend(&[0, 0, 0, 0]);
        decoder.extend(&encoded(&ping(4)));
        assert_eq!(decoder.next_frame(), Err(FrameError::EmptyFrame));
        assert_eq!(
            decoder.next_message::<TestMsg>(),
            Err(FrameError::EmptyFrame)
        );
    }

    #[test]
    fn limit_is_clamped() {
        assert_eq!(FrameDecoder::new(0).max_frame_bytes(), 1);
        assert_eq!(
            FrameDecoder::new(usize::MAX).max_frame_bytes(),
            FRAME_BYTES_MAX_CEILING
        );
        assert_eq!(FrameDecoder::new(4096).max_frame_bytes(), 4096);
        assert_eq!(
            FrameDecoder::default().max_frame_bytes(),
            FRAME_BYTES_MAX_DEFAULT
        );
        let mut decoder = FrameDecoder::new(0);
        decoder.extend(&raw_frame(b"7"));
        assert_eq!(decoder.next_frame(), Ok(Some(b"7".to_vec())));
    }

    #[test]
    fn codes_are_stable() {
        let errors = [
            FrameError::FrameTooLarge { length: 2, max: 1 },
            FrameError::EmptyFrame,
            FrameError::InvalidUtf8 { valid_up_to: 0 },
            FrameError::InvalidJson {
                detail: String::new(),
            },
            FrameError::MissingType,
            FrameError::UnknownType {
                type_name: String::new(),
            },
            FrameError::InvalidMessage {
                type_name: String::new(),
                detail: String::new(),
            },
        ];
        let codes: Vec<&str> = errors.iter().map(FrameError::code).collect();
        // These travel on the wire; changing one breaks peers.
        assert_eq!(
            codes,
            [
                "FRAME_TOO_LARGE",
                "EMPTY_FRAME",
                "INVALID_UTF8",
                "INVALID_JSON",
                "MISSING_TYPE",
                "UNKNOWN_TYPE",
                "INVALID_MESSAGE",
            ]
        );
    }

    #[test]
    fn encode_writes_header_and_json() {
        let mut out = b"prefix".to_vec();
        encode_frame(&ping(9), FRAME_BYTES_MAX_DEFAULT, &mut out).expect("encodes");
        let json = br#"{"type":"PING","seq":9}"#;
        let mut expected = b"prefix".to_vec();
        expected.extend(raw_frame(json));
        assert_eq!(out, expected);
        assert_eq!(ping(9).type_name(), "PING");
        assert_eq!(echo("").type_name(), "ECHO");
    }

    #[test]
    fn encode_too_large_leaves_out_unchanged() {
        let before = b"earlier frames".to_vec();
        let mut out = before.clone();
        let message = echo(&"x".repeat(1000));
        let length = serde_json::to_vec(&message).expect("json").len();
        assert_eq!(
            encode_frame(&message, 100, &mut out),
            Err(EncodeError::TooLarge { length, max: 100 })
        );
        assert_eq!(out, before);
        // One byte over the limit is refused too; exactly at it is fine.
        assert_eq!(
            encode_frame(&message, length - 1, &mut out),
            Err(EncodeError::TooLarge {
                length,
                max: length - 1
            })
        );
        assert_eq!(out, before);
        assert_eq!(encode_frame(&message, length, &mut out), Ok(()));
        assert_eq!(out.len(), before.len() + FRAME_HEADER_BYTES + length);
    }

    #[test]
    fn encode_serialize_error_leaves_out_unchanged() {
        // JSON object keys must be strings; a tuple key cannot be written.
        let mut map = BTreeMap::new();
        map.insert((1u8, 2u8), 3u8);
        let before = vec![1, 2, 3];
        let mut out = before.clone();
        let result = encode_frame(&map, FRAME_BYTES_MAX_DEFAULT, &mut out);
        assert!(
            matches!(result, Err(EncodeError::Serialize { .. })),
            "{result:?}"
        );
        assert_eq!(out, before);
    }

    #[test]
    fn many_small_frames_from_a_big_buffer() {
        let count = 20_000u64;
        let wire: Vec<u8> = (0..count).flat_map(|seq| encoded(&ping(seq))).collect();
        let mut decoder = FrameDecoder::default();
        decoder.extend(&wire);
        for seq in 0..count {
            assert_eq!(decoder.next_message::<TestMsg>(), Ok(Some(ping(seq))));
        }
        // Taking frames only moved the read offset; nothing was copied.
        assert_eq!(decoder.buf.len(), wire.len());
        assert_eq!(decoder.buffered_len(), 0);
        decoder.extend(&encoded(&ping(0)));
        assert_eq!(decoder.buf.len(), decoder.buffered_len());
    }

    #[test]
    fn buffer_stays_small_when_drained_as_it_fills() {
        let frame = encoded(&echo("steady"));
        let mut decoder = FrameDecoder::default();
        for _ in 0..5_000 {
            // Deliver each frame in two pieces misaligned with frame boundaries.
            decoder.extend(&frame[..3]);
            while decoder.next_frame().expect("valid").is_some() {}
            decoder.extend(&frame[3..]);
            while decoder.next_frame().expect("valid").is_some() {}
            assert!(decoder.buf.len() <= 2 * frame.len());
        }
        assert_eq!(decoder.buffered_len(), 0);
    }

    fn arb_message() -> impl Strategy<Value = TestMsg> {
        prop_oneof![
            any::<u64>().prop_map(|seq| TestMsg::Ping { seq }),
            any::<String>().prop_map(|text| TestMsg::Echo { text }),
        ]
    }

    /// `bytes` cut at the given points (in any order, repeats allowed).
    fn split<'a>(bytes: &'a [u8], cuts: &[Index]) -> Vec<&'a [u8]> {
        let mut points: Vec<usize> = cuts.iter().map(|cut| cut.index(bytes.len() + 1)).collect();
        points.push(bytes.len());
        points.sort_unstable();
        let mut pieces = Vec::new();
        let mut from = 0;
        for to in points {
            pieces.push(&bytes[from..to]);
            from = to;
        }
        pieces
    }

    /// What a decoder limited to `max` should produce from all of `bytes`, computed directly.
    fn reference_frames(bytes: &[u8], max: usize) -> (Vec<Vec<u8>>, Option<FrameError>) {
        let mut frames = Vec::new();
        let mut rest = bytes;
        while rest.len() >= 4 {
            let length = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            if length == 0 {
                return (frames, Some(FrameError::EmptyFrame));
            }
            if length > max {
                let length = length as u64;
                return (frames, Some(FrameError::FrameTooLarge { length, max }));
            }
            if rest.len() < 4 + length {
                break;
            }
            frames.push(rest[4..4 + length].to_vec());
            rest = &rest[4 + length..];
        }
        (frames, None)
    }

    /// Byte streams that are mostly frame-shaped, with lengths that may or may not match.
    fn arb_stream() -> impl Strategy<Value = Vec<u8>> {
        let chunk = (
            0u32..64,
            proptest::collection::vec(any::<u8>(), 0..48),
            proptest::bool::weighted(0.8),
        )
            .prop_map(|(length, body, honest)| {
                let length = if honest { body.len() as u32 } else { length };
                let mut bytes = length.to_be_bytes().to_vec();
                bytes.extend(body);
                bytes
            });
        prop_oneof![
            1 => proptest::collection::vec(any::<u8>(), 0..512),
            3 => proptest::collection::vec(chunk, 0..10).prop_map(|chunks| chunks.concat()),
        ]
    }

    /// Strings that look like messages, to reach every classification.
    fn arb_json_like() -> impl Strategy<Value = String> {
        let tag = proptest::option::weighted(
            0.8,
            proptest::sample::select(vec![r#""PING""#, r#""ECHO""#, r#""PONG""#, "1", "null"]),
        );
        let key = proptest::sample::select(vec!["seq", "text", "x"]);
        let value = prop_oneof![
            any::<u64>().prop_map(|n| n.to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            "\"[a-z]{0,4}\"",
            Just("null".to_owned()),
            Just("[]".to_owned()),
            Just("true".to_owned()),
        ];
        let object =
            (tag, proptest::collection::vec((key, value), 0..3)).prop_map(|(tag, fields)| {
                let mut parts = Vec::new();
                if let Some(tag) = tag {
                    parts.push(format!("\"type\":{tag}"));
                }
                for (key, value) in fields {
                    parts.push(format!("\"{key}\":{value}"));
                }
                format!("{{{}}}", parts.join(","))
            });
        prop_oneof![
            4 => object.clone(),
            1 => object.clone().prop_map(|text| format!("[{text}]")),
            // Cut short; the text is ASCII, so any cut is a character boundary.
            1 => (object, any::<Index>()).prop_map(|(text, cut)| {
                let end = cut.index(text.len());
                text[..end].to_owned()
            }),
        ]
    }

    proptest! {
        #[test]
        fn prop_messages_survive_any_split(
            messages in proptest::collection::vec(arb_message(), 0..20),
            cuts in proptest::collection::vec(any::<Index>(), 0..24),
        ) {
            let mut wire = Vec::new();
            for message in &messages {
                prop_assert_eq!(encode_frame(message, FRAME_BYTES_MAX_DEFAULT, &mut wire), Ok(()));
            }
            let mut decoder = FrameDecoder::default();
            let mut got = Vec::new();
            for piece in split(&wire, &cuts) {
                decoder.extend(piece);
                loop {
                    match decoder.next_message::<TestMsg>() {
                        Ok(Some(message)) => got.push(message),
                        Ok(None) => break,
                        Err(error) => return Err(TestCaseError::fail(error.to_string())),
                    }
                }
            }
            prop_assert_eq!(got, messages);
            prop_assert_eq!(decoder.buffered_len(), 0);
        }

        #[test]
        fn prop_arbitrary_bytes_are_handled(
            bytes in arb_stream(),
            cuts in proptest::collection::vec(any::<Index>(), 0..24),
            max in 1usize..96,
        ) {
            let mut decoder = FrameDecoder::new(max);
            let mut frames = Vec::new();
            let mut failure: Option<FrameError> = None;
            let mut fed = 0usize;
            let mut consumed = 0usize;
            for piece in split(&bytes, &cuts) {
                decoder.extend(piece);
                fed += piece.len();
                loop {
                    match decoder.next_frame() {
                        Ok(Some(frame)) => {
                            prop_assert!(failure.is_none());
                            prop_assert!(!frame.is_empty() && frame.len() <= max);
                            consumed += FRAME_HEADER_BYTES + frame.len();
                            frames.push(frame);
                        }
                        Ok(None) => {
                            prop_assert!(failure.is_none());
                            break;
                        }
                        Err(error) => {
                            if let Some(first) = &failure {
                                prop_assert_eq!(first, &error);
                            }
                            failure = Some(error);
                            break;
                        }
                    }
                }
                prop_assert!(consumed <= fed);
                if failure.is_none() {
                    prop_assert_eq!(consumed + decoder.buffered_len(), fed);
                } else {
                    prop_assert_eq!(decoder.buffered_len(), 0);
                }
            }
            let (expected_frames, expected_failure) = reference_frames(&bytes, max);
            prop_assert_eq!(frames, expected_frames);
            prop_assert_eq!(failure, expected_failure);
        }

        #[test]
        fn prop_decode_message_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_message::<TestMsg>(&bytes);
        }

        #[test]
        fn prop_decode_message_classifies_json_like(text in arb_json_like()) {
            match decode_message::<TestMsg>(text.as_bytes()) {
                Ok(message) => {
                    // Whatever decodes re-encodes and decodes to the same message.
                    let mut wire = Vec::new();
                    prop_assert_eq!(encode_frame(&message, FRAME_BYTES_MAX_DEFAULT, &mut wire), Ok(()));
                    let mut decoder = FrameDecoder::default();
                    decoder.extend(&wire);
                    prop_assert_eq!(decoder.next_message::<TestMsg>(), Ok(Some(message)));
                }
                Err(FrameError::UnknownType { type_name }) => {
                    prop_assert!(!TestMsg::is_known_type(&type_name));
                }
                Err(FrameError::InvalidMessage { type_name, .. }) => {
                    prop_assert!(TestMsg::is_known_type(&type_name));
                }
                Err(FrameError::InvalidJson { .. } | FrameError::MissingType) => {}
                Err(other) => prop_assert!(false, "unexpected {:?}", other),
            }
        }
    }
}
