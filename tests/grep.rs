//! `grep` stays within its caps while it collects, however much matches: the whole
//! answer (paths repeated in every match included) is bounded, each line is cut, and a
//! search that hits a cap stops and says so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use sandcell::testing::MockBackend;
use sandcell::{
    SandboxBackend, SandboxBackendExt, SandboxPath, SandboxSpec, GREP_MAX_BYTES,
    GREP_MAX_LINE_BYTES, GREP_MAX_MATCHES,
};

fn p(s: &str) -> SandboxPath {
    SandboxPath::new(s).unwrap()
}

/// Bytes the matches hold, counted as the cap counts them.
fn held(found: &sandcell::GrepOutput) -> usize {
    found
        .iter()
        .map(|m| m.path.as_str().len() + m.line.len())
        .sum()
}

/// 1.5 MB of one-character matching lines in a file at a path of about 3,000 bytes:
/// collected whole, the path repeated in each of the 750,000 matches would be about
/// 2 GB.
#[tokio::test]
async fn many_matches_at_a_long_path_stay_within_the_cap() {
    let b = MockBackend::new();
    let id = b.create(&SandboxSpec::default()).await.unwrap().id;
    let dir = vec!["d".repeat(250); 11].join("/");
    let long = p(&format!("{dir}/{}", "f".repeat(200)));
    assert!(long.as_str().len() > 2_900);
    b.write(&id, &long, Bytes::from("x\n".repeat(750_000)))
        .await
        .unwrap();
    // Visited after the cap was reached, so never searched: the search stopped.
    b.write(&id, &p("zz/later.txt"), Bytes::from_static(b"x\n"))
        .await
        .unwrap();

    let found = b.grep(&id, &SandboxPath::root(), "x").await.unwrap();
    assert!(found.truncated, "the cap was reached and said so");
    assert!(!found.is_empty());
    assert!(found.len() <= GREP_MAX_MATCHES, "{} matches", found.len());
    assert!(
        held(&found) <= GREP_MAX_BYTES,
        "{} bytes held",
        held(&found)
    );
    assert!(found.iter().all(|m| m.path == long), "in walk order");
    assert_eq!(found[0].line_number, 1);

    // Short paths: the count is the cap that applies.
    b.write(&id, &p("short.txt"), Bytes::from("x\n".repeat(50_000)))
        .await
        .unwrap();
    let found = b.grep(&id, &p("short.txt"), "x").await.unwrap();
    assert!(found.truncated);
    assert_eq!(found.len(), GREP_MAX_MATCHES);

    // Exactly at the cap, nothing was left out.
    b.write(
        &id,
        &p("exact.txt"),
        Bytes::from("x\n".repeat(GREP_MAX_MATCHES)),
    )
    .await
    .unwrap();
    let found = b.grep(&id, &p("exact.txt"), "x").await.unwrap();
    assert!(!found.truncated);
    assert_eq!(found.len(), GREP_MAX_MATCHES);
    b.destroy(&id).await.unwrap();
}

/// A match keeps the start of its line, cut at a character boundary and marked.
#[tokio::test]
async fn long_lines_are_cut() {
    let b = MockBackend::new();
    let id = b.create(&SandboxSpec::default()).await.unwrap().id;
    // Three-byte characters, so the cap falls inside one.
    let line = format!("needle {}", "€".repeat(1_000_000));
    b.write(
        &id,
        &p("wide.txt"),
        Bytes::from(format!("short needle\n{line}\n")),
    )
    .await
    .unwrap();
    let found = b.grep(&id, &p("wide.txt"), "needle").await.unwrap();
    assert!(!found.truncated);
    assert_eq!(found.len(), 2);
    assert_eq!(found[0].line, "short needle");
    assert!(!found[0].line_truncated);
    assert!(found[1].line_truncated);
    assert!(found[1].line.len() <= GREP_MAX_LINE_BYTES);
    assert!(found[1].line.len() > GREP_MAX_LINE_BYTES - 3);
    assert!(line.starts_with(&found[1].line));
    b.destroy(&id).await.unwrap();
}
