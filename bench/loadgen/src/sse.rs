//! Just enough of Server-Sent Events to see where frames end and what they are called.
//!
//! The benchmark measures the time to the first *event* frame, so comment frames (keepalives,
//! `: ...`) must not count, and a frame only counts once its terminating blank line arrived:
//! that is when a client could act on it.

/// Splits a byte stream into SSE frames and yields the event name of each complete one.
#[derive(Default)]
pub struct FrameReader {
    buf: Vec<u8>,
}

impl FrameReader {
    /// Adds a chunk of the body; returns the names of the event frames it completed, in order.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        // Servers end lines with "\n" (Spindle) or "\r\n" (sse-starlette); dropping every "\r"
        // leaves one separator to look for.
        self.buf
            .extend(chunk.iter().copied().filter(|&b| b != b'\r'));
        let mut names = Vec::new();
        while let Some(end) = find_blank_line(&self.buf) {
            let frame: Vec<u8> = self.buf.drain(..end + 2).collect();
            if let Some(name) = event_name(&frame[..end]) {
                names.push(name);
            }
        }
        names
    }
}

fn find_blank_line(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\n\n")
}

/// The frame's event name: its `event:` field, `message` when it has only data, none for a
/// frame of comments.
fn event_name(frame: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(frame);
    let mut has_data = false;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("event:") {
            return Some(name.trim().to_string());
        }
        has_data |= line.starts_with("data:");
    }
    has_data.then(|| "message".to_string())
}

#[cfg(test)]
mod tests {
    use super::FrameReader;

    #[test]
    fn frames_split_across_chunks_and_crlf() {
        let mut r = FrameReader::default();
        assert!(r.push(b"event: meta").is_empty());
        assert_eq!(
            r.push(b"data\r\ndata: {}\r\n\r\n: keepalive\n\n"),
            vec!["metadata"]
        );
        assert_eq!(
            r.push(b"data: x\n\nevent: values\ndata: 1\n\n"),
            vec!["message", "values"]
        );
    }
}
