//! Property tests over what hostile input reaches first: archive import, snapshot
//! manifests, `SandboxPath` parsing and the wire protocol's server side. Each property
//! runs `PROPTEST_CASES` cases (proptest's default, 256, in CI; set it higher for a
//! long local run) and must hold for every input: no panic, no write outside the
//! destination, a typed error for what is refused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use proptest::prelude::*;
use sandcell::raw::archive::unpack_to_dir;
use sandcell::snapshot::SnapshotManifest;
use sandcell::testing::fuzz::{check_unpack, check_wire_server, small_limits};
use sandcell::testing::RawTar;
use sandcell::SandboxPath;

/// Found by the long run: a directory entry, then a symlink of the same name leading
/// out, used to have the directory's mode applied through the link at the end.
#[test]
fn a_directory_replaced_by_a_link_out_keeps_its_mode_to_itself() {
    let scratch = tempfile::tempdir().unwrap();
    let victim = scratch.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::set_permissions(&victim, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let tar = RawTar::new()
        .entry(tar::EntryType::Directory, "x/", "", 0o700, b"")
        .symlink("x", victim.to_str().unwrap())
        .finish();
    let dest = scratch.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    let _ = unpack_to_dir(&tar[..], &dest, &small_limits());
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&victim).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o755, "the outside directory's mode changed");
}

/// Entry names: ordinary ones, and the shapes attacks take.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{1,6}(/[a-z]{1,6}){0,3}",
        Just("..".to_owned()),
        Just("../escape".to_owned()),
        Just("/etc/passwd".to_owned()),
        Just("a/../../b".to_owned()),
        Just("./a/./b".to_owned()),
        Just("".to_owned()),
        Just("a//b".to_owned()),
        "[a-z./]{1,20}",
        "\\PC{1,12}",
    ]
}

#[derive(Debug, Clone)]
enum Entry {
    File(String, Vec<u8>),
    Dir(String),
    Symlink(String, String),
    HardLink(String, String),
    Odd(u8, String, String),
}

fn entry() -> impl Strategy<Value = Entry> {
    prop_oneof![
        (name(), proptest::collection::vec(any::<u8>(), 0..2048))
            .prop_map(|(n, d)| Entry::File(n, d)),
        name().prop_map(Entry::Dir),
        (name(), name()).prop_map(|(n, t)| Entry::Symlink(n, t)),
        (name(), name()).prop_map(|(n, t)| Entry::HardLink(n, t)),
        (any::<u8>(), name(), name()).prop_map(|(k, n, t)| Entry::Odd(k, n, t)),
    ]
}

fn build(entries: &[Entry]) -> Vec<u8> {
    let mut tar = RawTar::new();
    for e in entries {
        tar = match e {
            Entry::File(n, d) => tar.file(n, d),
            Entry::Dir(n) => tar.dir(n),
            Entry::Symlink(n, t) => tar.symlink(n, t),
            Entry::HardLink(n, t) => tar.hard_link(n, t),
            Entry::Odd(k, n, t) => tar.entry(tar::EntryType::new(*k), n, t, 0o644, b""),
        };
    }
    tar.finish().to_vec()
}

proptest! {
    /// Any bytes at all: a typed error or a tree beneath the destination.
    #[test]
    fn archive_import_of_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..8192)) {
        check_unpack(&bytes);
    }

    /// Well-formed tar framing around hostile entries: names with `..` and absolute
    /// paths, links anywhere (a later entry through an earlier link included), every
    /// entry type byte.
    #[test]
    fn archive_import_of_hostile_entries(entries in proptest::collection::vec(entry(), 0..12)) {
        check_unpack(&build(&entries));
    }

    /// A hostile tar cut short or with bytes flipped.
    #[test]
    fn archive_import_of_damaged_tars(
        entries in proptest::collection::vec(entry(), 1..6),
        cut in any::<prop::sample::Index>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
    ) {
        let mut tar = build(&entries);
        for (at, byte) in flips {
            let i = at.index(tar.len());
            tar[i] ^= byte;
        }
        let keep = cut.index(tar.len() + 1);
        tar.truncate(keep);
        check_unpack(&tar);
    }

    /// Any text as a manifest: refused as `Corrupt`, or a manifest that survives its
    /// own round trip.
    #[test]
    fn manifests_parse_or_refuse(json in manifest_text()) {
        match SnapshotManifest::from_json(&json) {
            Ok(manifest) => {
                let again = SnapshotManifest::from_json(&manifest.to_json().unwrap()).unwrap();
                prop_assert_eq!(again.to_json().unwrap(), manifest.to_json().unwrap());
            }
            Err(e) => prop_assert!(
                matches!(e.kind(), sandcell::ErrorKind::Corrupt | sandcell::ErrorKind::Unsupported),
                "{e:?}"
            ),
        }
    }

    /// Any string as a sandbox path: refused as `InvalidInput`, or a normalized relative
    /// path that stays beneath any directory it is joined to and parses back to itself.
    #[test]
    fn sandbox_paths_stay_beneath(text in path_text()) {
        match SandboxPath::new(&text) {
            Ok(path) => {
                let relative = path.to_relative_path();
                prop_assert!(!relative.is_absolute());
                prop_assert!(relative
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_))));
                let base = Path::new("/base");
                prop_assert!(base.join(relative).starts_with(base));
                prop_assert_eq!(SandboxPath::new(path.as_str()).unwrap(), path);
            }
            Err(e) => prop_assert_eq!(e.kind(), sandcell::ErrorKind::InvalidInput),
        }
    }
}

fn manifest_text() -> impl Strategy<Value = String> {
    // A real manifest, then damaged: truncated, with a field's value replaced, or not
    // JSON at all.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("file.txt"), "content").unwrap();
    let mut packed = Vec::new();
    let blob = sandcell::snapshot::pack_dir(
        dir.path(),
        &mut packed,
        &sandcell::snapshot::PackOptions::default(),
    )
    .unwrap();
    let valid = SnapshotManifest::new(&blob, "mock", "default")
        .to_json()
        .unwrap();
    let truncated = {
        let valid = valid.clone();
        any::<prop::sample::Index>().prop_map(move |i| {
            let cut = i.index(valid.len() + 1);
            valid.get(..cut).unwrap_or("").to_owned()
        })
    };
    let replaced = {
        let valid = valid.clone();
        (
            prop::sample::select(vec![
                "version",
                "compression",
                "sha256",
                "size_bytes",
                "entries",
                "backend",
                "created_at",
            ]),
            prop_oneof![
                Just("null".to_owned()),
                Just("-1".to_owned()),
                Just("\"\"".to_owned()),
                Just("1e999".to_owned()),
                Just("[[[[[[[[]]]]]]]]".to_owned()),
                "\"\\PC{0,40}\"",
                any::<u64>().prop_map(|n| n.to_string()),
            ],
        )
            .prop_map(move |(field, value)| {
                let mut json: serde_json::Value = serde_json::from_str(&valid).unwrap_or_default();
                if let Some(map) = json.as_object_mut() {
                    map.insert(
                        field.to_owned(),
                        serde_json::from_str(&value).unwrap_or_default(),
                    );
                }
                json.to_string()
            })
    };
    prop_oneof![Just(valid), truncated, replaced, "\\PC{0,200}"]
}

fn path_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z./]{0,30}",
        "(\\.\\.|\\.|[a-z]{1,3}|/){0,10}",
        "\\PC{0,30}",
        any::<Vec<u8>>().prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        Just("a\0b".to_owned()),
        Just("a\\..\\b".to_owned()),
    ]
}

/// One wire frame as a client would send it: a length, a kind byte, a request id, a
/// payload (JSON calls among them).
fn frame() -> impl Strategy<Value = Vec<u8>> {
    let call = prop_oneof![
        Just(r#"{"op":"read","path":"a.txt"}"#.to_owned()),
        Just(r#"{"op":"write","path":"a.txt"}"#.to_owned()),
        Just(r#"{"op":"write","path":"../../etc/x"}"#.to_owned()),
        Just(r#"{"op":"exec","request":{"command":["echo","hi"]}}"#.to_owned()),
        Just(r#"{"op":"import_tar","path":"","options":{}}"#.to_owned()),
        Just(r#"{"op":"list_dir","path":""}"#.to_owned()),
        Just(r#"{"op":"rename","from":"a","to":"/b"}"#.to_owned()),
        Just(r#"{"op":"export_changes"}"#.to_owned()),
        "\\PC{0,60}",
    ]
    .prop_map(String::into_bytes);
    let payload = prop_oneof![call, proptest::collection::vec(any::<u8>(), 0..64)];
    (0u8..12, 0u64..4, payload, any::<bool>()).prop_map(|(kind, id, payload, lie)| {
        let mut out = Vec::new();
        let len = (1 + 8 + payload.len()) as u32;
        // Sometimes the length lies: too short, or huge.
        let len = if lie { len.wrapping_mul(977) } else { len };
        out.extend_from_slice(&len.to_be_bytes());
        out.push(kind);
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&payload);
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: ProptestConfig::default().cases / 4, ..ProptestConfig::default() })]

    /// Any sequence of frames (and then the end of the connection) at the wire
    /// protocol's server: it ends, with no panic, within a bound, and the backend
    /// still answers for the sandbox.
    #[test]
    fn the_wire_server_survives_any_client(frames in proptest::collection::vec(frame(), 0..8)) {
        check_wire_server(&frames.concat());
    }
}
