//! Output sized for a model's context: the head and tail of a stream kept, the middle
//! replaced by a marker that says how much was left out; grep's matches listed up to a
//! number, with what was left out said.

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

/// `grep`'s answer: one `path:line: text` per match, at most `max_items` of them, then
/// what was left out (the rest, and whether the search itself stopped at its cap).
pub(crate) fn grep_answer(found: &sandcell::GrepOutput, max_items: usize) -> String {
    let mut out = String::new();
    for m in found.iter().take(max_items) {
        let cut = if m.line_truncated { " [line cut]" } else { "" };
        out.push_str(&format!("{}:{}: {}{cut}\n", m.path, m.line_number, m.line));
    }
    let more = found.len().saturating_sub(max_items);
    match (more, found.truncated) {
        (0, false) => {}
        (more, false) => out.push_str(&format!("[... {more} more matches]\n")),
        (0, true) => out.push_str(
            "[... the search stopped here at its cap: narrow the pattern or the path for \
             the rest]\n",
        ),
        (more, true) => out.push_str(&format!(
            "[... {more} more matches, and the search stopped there at its cap: \
             narrow the pattern or the path for the rest]\n"
        )),
    }
    if out.is_empty() {
        out.push_str("(no match)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn grep_says_what_it_left_out() {
        use bytes::Bytes;
        use sandcell::{SandboxBackend, SandboxBackendExt, SandboxPath};
        let b = sandcell::testing::MockBackend::new();
        let id = b
            .create(&sandcell::SandboxSpec::default())
            .await
            .unwrap()
            .id;
        let file = SandboxPath::new("f.txt").unwrap();
        let many = "x\n".repeat(sandcell::GREP_MAX_MATCHES + 1);
        let long = format!("x{}\n", "y".repeat(sandcell::GREP_MAX_LINE_BYTES));
        b.write(&id, &file, Bytes::from(long + &many))
            .await
            .unwrap();
        let found = b.grep(&id, &file, "x").await.unwrap();

        let answer = grep_answer(&found, 2);
        let lines: Vec<&str> = answer.lines().collect();
        assert_eq!(lines.len(), 3, "{answer}");
        assert!(lines[0].starts_with("f.txt:1: xyy") && lines[0].ends_with("y [line cut]"));
        assert_eq!(lines[1], "f.txt:2: x");
        let more = sandcell::GREP_MAX_MATCHES - 2;
        assert!(
            lines[2].starts_with(&format!("[... {more} more matches, and the search stopped")),
            "{answer}"
        );
        let all = grep_answer(&found, sandcell::GREP_MAX_MATCHES);
        assert!(
            all.ends_with("x\n[... the search stopped here at its cap: narrow the pattern or the path for the rest]\n"),
            "{}",
            &all[all.len() - 200..]
        );
        assert_eq!(
            grep_answer(&sandcell::GrepOutput::default(), 2),
            "(no match)\n"
        );
    }

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
