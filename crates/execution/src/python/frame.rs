//! Frames of the worker protocol: a 4-byte big-endian length, then one msgpack map
//! `{k, id, re, op, b}` (`docs/python-worker-protocol.md`, "Frames").
//!
//! Bodies stay `rmpv::Value`s: channel values and pre-encoded JSON are `bin` and pass through
//! untouched; a caller that wants a typed body converts with [`to_body`] / [`from_body`].
//! Everything read here comes from another process, so a bad frame is an error value, never a
//! panic.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use rmpv::Value;
use serde::{de::DeserializeOwned, Serialize};
use tokio_util::codec::{Decoder, Encoder};

/// The largest frame either side sends or accepts (the body, without its 4-byte length).
pub const MAX_FRAME: usize = 256 * 1024 * 1024;

/// Bytes of the length prefix.
const HEADER: usize = 4;

/// One frame, checked: each kind carries exactly the keys the contract gives it.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// `k: req`: expects an `ok` or `err` naming `id`.
    Request { id: u64, op: String, body: Value },
    /// `k: ok`: the answer to request `re`.
    Ok { re: u64, body: Value },
    /// `k: err`: request `re` failed; the body is `{code, message, retryable}`.
    Err { re: u64, body: Value },
    /// `k: ev`: one-way, no answer.
    Event { op: String, body: Value },
}

/// Why bytes could not become a frame, or a frame could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {0} bytes is over the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
}

impl Frame {
    /// The frame's `k`, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Frame::Request { .. } => "req",
            Frame::Ok { .. } => "ok",
            Frame::Err { .. } => "err",
            Frame::Event { .. } => "ev",
        }
    }

    /// The whole frame as it goes on the wire, length prefix included.
    pub fn to_bytes(&self) -> Result<Bytes, FrameError> {
        let mut out = BytesMut::new();
        self.encode_into(&mut out)?;
        Ok(out.freeze())
    }

    /// Appends the frame (length prefix included) to `dst`; refuses one over [`MAX_FRAME`]
    /// and leaves `dst` as it was then.
    pub fn encode_into(&self, dst: &mut BytesMut) -> Result<(), FrameError> {
        self.encode_limited(dst, MAX_FRAME)
    }

    fn encode_limited(&self, dst: &mut BytesMut, limit: usize) -> Result<(), FrameError> {
        let start = dst.len();
        dst.put_u32(0); // patched below, once the body's length is known
        let mut writer = dst.writer();
        let written = self.write_map(&mut writer);
        let dst = writer.into_inner();
        if let Err(e) = written {
            dst.truncate(start);
            return Err(FrameError::Malformed(format!("cannot encode: {e}")));
        }
        let len = dst.len() - start - HEADER;
        if len > limit {
            dst.truncate(start);
            return Err(FrameError::TooLarge(len));
        }
        dst[start..start + HEADER].copy_from_slice(&(len as u32).to_be_bytes());
        Ok(())
    }

    /// The map, written key by key so the body (which may hold large `bin`s) is not copied.
    fn write_map(&self, out: &mut impl std::io::Write) -> Result<(), rmpv::encode::Error> {
        use rmp::encode::{write_map_len, write_str, write_uint};
        let (number, op, body) = match self {
            Frame::Request { id, op, body } => (Some(("id", *id)), Some(op), body),
            Frame::Ok { re, body } | Frame::Err { re, body } => (Some(("re", *re)), None, body),
            Frame::Event { op, body } => (None, Some(op), body),
        };
        write_map_len(
            out,
            2 + u32::from(number.is_some()) + u32::from(op.is_some()),
        )?;
        write_str(out, "k")?;
        write_str(out, self.kind())?;
        if let Some((key, n)) = number {
            write_str(out, key)?;
            write_uint(out, n)?;
        }
        if let Some(op) = op {
            write_str(out, "op")?;
            write_str(out, op)?;
        }
        write_str(out, "b")?;
        rmpv::encode::write_value(out, body)
    }

    /// The frame from one msgpack body (the bytes after the length prefix).
    pub fn decode_body(mut body: &[u8]) -> Result<Frame, FrameError> {
        let value = rmpv::decode::read_value(&mut body)
            .map_err(|e| FrameError::Malformed(format!("not msgpack: {e}")))?;
        if !body.is_empty() {
            return Err(FrameError::Malformed(format!(
                "{} bytes after the frame's map",
                body.len()
            )));
        }
        match value {
            Value::Map(entries) => Frame::from_map(entries),
            other => Err(FrameError::Malformed(format!(
                "a frame must hold a msgpack map, got {}",
                type_name(&other)
            ))),
        }
    }

    fn from_map(entries: Vec<(Value, Value)>) -> Result<Frame, FrameError> {
        let mut fields = Fields::default();
        for (key, value) in entries {
            match key.as_str() {
                Some("k") => fields.k = Some(value),
                Some("id") => fields.id = Some(value),
                Some("re") => fields.re = Some(value),
                Some("op") => fields.op = Some(value),
                Some("b") => fields.b = Some(value),
                _ => {} // unknown keys are ignored: a newer peer may add some
            }
        }
        fields.into_frame()
    }
}

/// The keys of a frame as read, before they are checked against its kind.
#[derive(Default)]
struct Fields {
    k: Option<Value>,
    id: Option<Value>,
    re: Option<Value>,
    op: Option<Value>,
    b: Option<Value>,
}

impl Fields {
    fn into_frame(mut self) -> Result<Frame, FrameError> {
        let kind = match &self.k {
            Some(Value::String(s)) => s.as_str().unwrap_or("").to_owned(),
            Some(other) => return Err(bad(format!("`k` must be a string, got {other}"))),
            None => return Err(bad("no `k`".into())),
        };
        let body = self.b.take().unwrap_or(Value::Nil);
        match kind.as_str() {
            "req" => Ok(Frame::Request {
                id: self.number("id")?,
                op: self.op()?,
                body,
            }),
            "ok" => Ok(Frame::Ok {
                re: self.number("re")?,
                body,
            }),
            "err" => Ok(Frame::Err {
                re: self.number("re")?,
                body,
            }),
            "ev" => Ok(Frame::Event {
                op: self.op()?,
                body,
            }),
            other => Err(bad(format!("unknown kind `k: {other:?}`"))),
        }
    }

    fn number(&self, key: &str) -> Result<u64, FrameError> {
        let value = if key == "id" { &self.id } else { &self.re };
        match value {
            Some(v) => v
                .as_u64()
                .ok_or_else(|| bad(format!("`{key}` must be a non-negative integer, got {v}"))),
            None => Err(bad(format!("no `{key}`"))),
        }
    }

    fn op(&self) -> Result<String, FrameError> {
        match &self.op {
            Some(Value::String(s)) if s.is_str() => Ok(s.as_str().unwrap_or_default().to_owned()),
            Some(other) => Err(bad(format!("`op` must be a string, got {other}"))),
            None => Err(bad("no `op`".into())),
        }
    }
}

fn bad(reason: String) -> FrameError {
    FrameError::Malformed(reason)
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Nil => "nil",
        Value::Boolean(_) => "a boolean",
        Value::Integer(_) => "an integer",
        Value::F32(_) | Value::F64(_) => "a float",
        Value::String(_) => "a string",
        Value::Binary(_) => "bin",
        Value::Array(_) => "an array",
        Value::Map(_) => "a map",
        Value::Ext(..) => "an ext value",
    }
}

/// A typed body as a msgpack value: structs become maps with their field names (as the
/// worker reads them), `serde_bytes` fields become `bin`. Goes through rmp-serde's bytes
/// because `rmpv`'s own serializer writes structs as arrays; typed bodies are the small
/// control messages (`init`, `ping`), so the extra pass costs nothing that matters.
pub fn to_body<T: Serialize + ?Sized>(body: &T) -> Result<Value, FrameError> {
    let bytes = rmp_serde::to_vec_named(body)
        .map_err(|e| FrameError::Malformed(format!("cannot encode body: {e}")))?;
    rmpv::decode::read_value(&mut bytes.as_slice())
        .map_err(|e| FrameError::Malformed(format!("cannot encode body: {e}")))
}

/// A body read into a type; the error names what did not fit.
pub fn from_body<T: DeserializeOwned>(body: Value) -> Result<T, FrameError> {
    let mut bytes = vec![];
    rmpv::encode::write_value(&mut bytes, &body)
        .map_err(|e| FrameError::Malformed(format!("cannot read body: {e}")))?;
    rmp_serde::from_slice(&bytes)
        .map_err(|e| FrameError::Malformed(format!("unexpected body: {e}")))
}

/// The tokio codec of frames: u32 big-endian length, then the msgpack map. Written out
/// rather than over `LengthDelimitedCodec` so an oversize length is refused, and named as
/// such, before any of its body is buffered.
#[derive(Debug, Default)]
pub struct FrameCodec;

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        if src.len() < HEADER {
            return Ok(None);
        }
        let len = (&src[..HEADER]).get_u32() as usize;
        if len > MAX_FRAME {
            return Err(FrameError::TooLarge(len));
        }
        if src.len() < HEADER + len {
            src.reserve(HEADER + len - src.len());
            return Ok(None);
        }
        src.advance(HEADER);
        let body = src.split_to(len);
        Frame::decode_body(&body).map(Some)
    }
}

impl Encoder<Frame> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        frame.encode_into(dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(bytes: &[u8]) -> Result<Option<Frame>, FrameError> {
        FrameCodec.decode(&mut BytesMut::from(bytes))
    }

    fn sample_frames() -> Vec<Frame> {
        let body = Value::Map(vec![
            ("blob".into(), Value::Binary(vec![0, 159, 146, 150])),
            ("n".into(), 3.into()),
        ]);
        vec![
            Frame::Request {
                id: 1,
                op: "cp.put".into(),
                body: body.clone(),
            },
            Frame::Ok {
                re: 7,
                body: Value::Nil,
            },
            Frame::Err {
                re: u64::MAX,
                body: body.clone(),
            },
            Frame::Event {
                op: "run.events".into(),
                body,
            },
        ]
    }

    #[test]
    fn every_kind_round_trips() {
        for frame in sample_frames() {
            let bytes = frame.to_bytes().unwrap();
            assert_eq!(decode_all(&bytes).unwrap(), Some(frame));
        }
    }

    #[test]
    fn bytes_stay_bin_on_the_wire() {
        let frame = Frame::Event {
            op: "e".into(),
            body: Value::Binary(b"{\"a\":1}".to_vec()),
        };
        let bytes = frame.to_bytes().unwrap();
        let value = rmpv::decode::read_value(&mut &bytes[HEADER..]).unwrap();
        let b = value
            .as_map()
            .unwrap()
            .iter()
            .find(|(k, _)| k.as_str() == Some("b"));
        assert_eq!(b.unwrap().1, Value::Binary(b"{\"a\":1}".to_vec()));
        // bin 8 marker, then its length: never a string, never an array of integers
        let tail = &bytes[bytes.len() - 9..];
        assert_eq!(tail[0], 0xc4);
        assert_eq!(tail[1], 7);
    }

    #[test]
    fn typed_bodies_keep_bytes_as_bin() {
        #[derive(Serialize, serde::Deserialize, PartialEq, Debug)]
        struct Blob {
            channel: String,
            #[serde(with = "serde_bytes")]
            data: Vec<u8>,
        }
        let blob = Blob {
            channel: "n".into(),
            data: vec![1, 2, 3],
        };
        let value = to_body(&blob).unwrap();
        assert_eq!(value["data"], Value::Binary(vec![1, 2, 3]));
        assert_eq!(from_body::<Blob>(value).unwrap(), blob);
    }

    #[test]
    fn a_truncated_frame_waits_for_more() {
        let bytes = sample_frames()[0].to_bytes().unwrap();
        let mut codec = FrameCodec;
        let mut buf = BytesMut::new();
        for (i, byte) in bytes.iter().enumerate() {
            buf.put_u8(*byte);
            let got = codec.decode(&mut buf).unwrap();
            assert_eq!(got.is_some(), i == bytes.len() - 1, "after {} bytes", i + 1);
        }
        assert!(buf.is_empty());
    }

    #[test]
    fn two_frames_in_one_read_come_out_in_order() {
        let frames = sample_frames();
        let mut buf = BytesMut::new();
        for f in &frames {
            f.encode_into(&mut buf).unwrap();
        }
        let mut codec = FrameCodec;
        let mut out = vec![];
        while let Some(f) = codec.decode(&mut buf).unwrap() {
            out.push(f);
        }
        assert_eq!(out, frames);
    }

    #[test]
    fn an_oversize_length_is_refused_before_reading_the_body() {
        let mut head = ((MAX_FRAME + 1) as u32).to_be_bytes().to_vec();
        head.extend_from_slice(&[0x80]);
        assert!(matches!(decode_all(&head), Err(FrameError::TooLarge(n)) if n == MAX_FRAME + 1));
    }

    #[test]
    fn an_oversize_frame_is_not_sent() {
        // The limit is a parameter here so the test need not build a 256 MiB body.
        let frame = Frame::Event {
            op: "e".into(),
            body: Value::Binary(vec![0; 100]),
        };
        let mut buf = BytesMut::from(&b"kept"[..]);
        let refused = frame.encode_limited(&mut buf, 100);
        assert!(matches!(refused, Err(FrameError::TooLarge(n)) if n > 100));
        assert_eq!(&buf[..], b"kept");
        frame.encode_limited(&mut buf, 200).unwrap();
        assert_eq!(&buf[..4], b"kept");
    }

    fn framed(value: &Value) -> Vec<u8> {
        let mut body = vec![];
        rmpv::encode::write_value(&mut body, value).unwrap();
        let mut out = (body.len() as u32).to_be_bytes().to_vec();
        out.extend(body);
        out
    }

    fn map(entries: &[(&str, Value)]) -> Value {
        Value::Map(
            entries
                .iter()
                .map(|(k, v)| (Value::from(*k), v.clone()))
                .collect(),
        )
    }

    #[test]
    fn malformed_frames_are_errors_not_panics() {
        let cases = [
            Value::Array(vec![]),
            map(&[]),
            map(&[("k", "req".into()), ("op", "x".into())]),
            map(&[("k", "req".into()), ("id", (-1).into()), ("op", "x".into())]),
            map(&[("k", "ok".into())]),
            map(&[("k", "ev".into()), ("op", 3.into())]),
            map(&[("k", "nope".into())]),
            map(&[("k", 1.into())]),
        ];
        for case in cases {
            let got = decode_all(&framed(&case));
            assert!(
                matches!(got, Err(FrameError::Malformed(_))),
                "{case}: {got:?}"
            );
        }
        let garbage = [0, 0, 0, 2, 0xc1, 0xc1];
        assert!(matches!(
            decode_all(&garbage),
            Err(FrameError::Malformed(_))
        ));
        let trailing = [0, 0, 0, 2, 0x80, 0x80];
        assert!(matches!(
            decode_all(&trailing),
            Err(FrameError::Malformed(_))
        ));
    }

    #[test]
    fn a_missing_body_is_nil_and_unknown_keys_are_ignored() {
        let value = map(&[("k", "ev".into()), ("op", "x".into()), ("extra", 1.into())]);
        let got = decode_all(&framed(&value)).unwrap();
        assert_eq!(
            got,
            Some(Frame::Event {
                op: "x".into(),
                body: Value::Nil
            })
        );
    }
}
