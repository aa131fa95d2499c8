//! Deterministic workspace trees for the snapshot benches: mixed sizes, mixed
//! compressibility, nested directories.

#![allow(dead_code)]

use std::fs;
use std::io::Write;
use std::path::Path;

/// An integer from the environment, or `default`.
pub(crate) fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The median of a set of timings.
pub(crate) fn median(mut v: Vec<std::time::Duration>) -> std::time::Duration {
    v.sort();
    v[v.len() / 2]
}

/// xorshift64*: a tiny deterministic generator, so every run packs the same bytes.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }
    pub(crate) fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

const WORDS: &[&str] = &[
    "fn",
    "let",
    "mut",
    "self",
    "return",
    "match",
    "impl",
    "struct",
    "pub",
    "async",
    "await",
    "Result",
    "Error",
    "Vec",
    "String",
    "sandbox",
    "workspace",
    "agent",
    "process",
    "snapshot",
    "archive",
    "path",
    "config",
    "value",
    "index",
    "buffer",
    "stream",
    "handle",
    "(",
    ")",
    "{",
    "}",
    ";",
    "=",
    "->",
    "::",
    "0",
    "1",
    "42",
    "true",
    "false",
    "None",
    "Some",
    "Ok",
    "if",
    "else",
    "for",
    "in",
    "while",
];

/// Source-like text: compresses roughly 4-6x.
fn text(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 16);
    while out.len() < len {
        let w = WORDS[rng.range(0, WORDS.len() as u64) as usize];
        out.extend_from_slice(w.as_bytes());
        out.push(if rng.range(0, 12) == 0 { b'\n' } else { b' ' });
    }
    out.truncate(len);
    out
}

fn contents(rng: &mut Rng, len: usize) -> Vec<u8> {
    match rng.range(0, 20) {
        // 50% text
        0..=9 => text(rng, len),
        // 25% incompressible (images, wheels, .git packs)
        10..=14 => {
            let mut v = vec![0u8; len];
            rng.fill(&mut v);
            v
        }
        // 15% highly repetitive (zeros, padding, lock files)
        15..=17 => {
            let unit = text(rng, 64);
            unit.iter().cycle().take(len).copied().collect()
        }
        // 10% mixed halves
        _ => {
            let mut v = text(rng, len / 2);
            let mut tail = vec![0u8; len - len / 2];
            rng.fill(&mut tail);
            v.extend_from_slice(&tail);
            v
        }
    }
}

/// What `generate` wrote.
pub(crate) struct TreeStats {
    pub(crate) files: u64,
    pub(crate) bytes: u64,
}

/// Writes `files` files (about `files * 18.9 KB`) under `root` in nested directories.
/// Sizes: 90% small (0.5-8 KiB), 9.9% medium (16-224 KiB), 0.1% large (1-3.5 MiB).
pub(crate) fn generate(root: &Path, files: u64, seed: u64) -> std::io::Result<TreeStats> {
    let mut rng = Rng::new(seed);
    let mut bytes = 0u64;
    for i in 0..files {
        let dir = root
            .join(format!("pkg{:02}", i % 50))
            .join(format!("mod{:02}", (i / 50) % 8));
        if i < 400 {
            fs::create_dir_all(&dir)?;
        }
        let bucket = rng.range(0, 1000);
        let len = if bucket < 900 {
            rng.range(512, 8 * 1024)
        } else if bucket < 999 {
            rng.range(16 * 1024, 224 * 1024)
        } else {
            rng.range(1 << 20, 3584 * 1024)
        } as usize;
        let data = contents(&mut rng, len);
        let mut f = fs::File::create(dir.join(format!("file{i:05}.rs")))?;
        f.write_all(&data)?;
        bytes += len as u64;
    }
    Ok(TreeStats { files, bytes })
}

/// Total bytes and files under `root` (regular files only).
pub(crate) fn measure(root: &Path) -> std::io::Result<TreeStats> {
    let mut stats = TreeStats { files: 0, bytes: 0 };
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                stats.files += 1;
                stats.bytes += meta.len();
            }
        }
    }
    Ok(stats)
}
