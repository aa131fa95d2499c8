//! Output sized for a model's context: the head and tail of a stream kept, the middle
//! replaced by a marker that says how much was left out.

use bytes::{Bytes, BytesMut};

/// Keeps the first and last bytes of a stream, at most `limit` in all.
#[derive(Debug)]
pub(crate) struct HeadTail {
    head: BytesMut,
    tail: std::collections::VecDeque<u8>,
    head_limit: usize,
    tail_limit: usize,
    total: u64,
}

impl HeadTail {
    /// A collector keeping at most `limit` bytes: half from the start, half from the end.
    pub(crate) fn new(limit: usize) -> Self {
        let head_limit = limit / 2;
        HeadTail {
            head: BytesMut::new(),
            tail: std::collections::VecDeque::new(),
            head_limit,
            tail_limit: limit - head_limit,
            total: 0,
        }
    }

    pub(crate) fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        let room = self.head_limit.saturating_sub(self.head.len());
        let into_head = room.min(data.len());
        self.head.extend_from_slice(&data[..into_head]);
        data = &data[into_head..];
        if data.len() >= self.tail_limit {
            self.tail.clear();
            self.tail.extend(&data[data.len() - self.tail_limit..]);
        } else {
            let overflow = (self.tail.len() + data.len()).saturating_sub(self.tail_limit);
            self.tail.drain(..overflow);
            self.tail.extend(data);
        }
    }

    /// Every byte seen.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Whether bytes were left out.
    pub(crate) fn truncated(&self) -> bool {
        self.total > (self.head.len() + self.tail.len()) as u64
    }

    /// The text kept: lossy UTF-8, with a marker where the middle was left out.
    pub(crate) fn text(&self) -> String {
        let head = String::from_utf8_lossy(&self.head);
        let tail: Bytes = self.tail.iter().copied().collect::<Vec<u8>>().into();
        let tail = String::from_utf8_lossy(&tail);
        if self.truncated() {
            let left_out = self.total - (self.head.len() + self.tail.len()) as u64;
            format!(
                "{head}\n[... {left_out} bytes of {} truncated; redirect the output to a file and read it in ranges to see it all ...]\n{tail}",
                self.total
            )
        } else {
            format!("{head}{tail}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_is_kept_whole() {
        let mut out = HeadTail::new(10);
        out.push(b"abc");
        out.push(b"de");
        assert_eq!(out.text(), "abcde");
        assert!(!out.truncated());
    }

    #[test]
    fn long_output_keeps_head_and_tail_with_a_marker() {
        let mut out = HeadTail::new(6);
        for chunk in [&b"012"[..], b"3456", b"789", b"ab"] {
            out.push(chunk);
        }
        assert_eq!(out.total(), 12);
        assert!(out.truncated());
        let text = out.text();
        assert!(
            text.starts_with("012\n[... 6 bytes of 12 truncated"),
            "{text}"
        );
        assert!(text.ends_with("\n9ab"), "{text}");
        // One huge chunk too.
        let mut out = HeadTail::new(4);
        out.push(&[b'x'; 1000]);
        assert!(out.text().starts_with("xx\n[... 996 bytes"));
    }
}
