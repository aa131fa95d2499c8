//! A sandbox's sparse file through the tree copy that clones use (`raw::tree`): made
//! with `truncate -s 1T`, it costs the sandbox nothing, and a copy that reads its holes
//! as zeros and writes them out fills the host's disk. The copy holds what the source
//! holds, holes as holes. Hard links the same way: 200 links to one file are one file
//! in the copy, with 200 names.

// Test helpers outside #[test] fns report failures by panicking too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::{FileExt, MetadataExt};

/// 1 GiB, 12 KiB of it data: a copy writing the holes out writes the whole GiB.
const SIZE: u64 = 1 << 30;

#[test]
fn a_sparse_file_is_copied_sparse() {
    let base = tempfile::tempdir().unwrap();
    let src = base.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let file = std::fs::File::create(src.join("sparse")).unwrap();
    file.set_len(SIZE).unwrap();
    // Data at the start, in the middle and at the end, holes between.
    for at in [0, SIZE / 2, SIZE - 4096] {
        file.write_all_at(&[0xa5; 4096], at).unwrap();
    }
    drop(file);
    if std::fs::metadata(src.join("sparse")).unwrap().blocks() * 512 > 1 << 20 {
        eprintln!("SKIPPED: this file system does not keep holes");
        return;
    }

    for layer in [false, true] {
        let dst = base.path().join(format!("copy-{layer}"));
        if layer {
            sandcell::raw::tree::copy_layer(&src, &dst).unwrap();
        } else {
            sandcell::raw::tree::copy_tree(&src, &dst).unwrap();
        }
        let copy = dst.join("sparse");
        let meta = std::fs::metadata(&copy).unwrap();
        assert_eq!(meta.len(), SIZE, "the copy keeps the length");
        assert!(
            meta.blocks() * 512 <= 1 << 20,
            "the copy takes {} bytes of disk for 12 KiB of data",
            meta.blocks() * 512
        );
        let copy = std::fs::File::open(&copy).unwrap();
        for at in [0, SIZE / 2, SIZE - 4096] {
            let mut buf = [0u8; 4096];
            copy.read_exact_at(&mut buf, at).unwrap();
            assert!(buf.iter().all(|&b| b == 0xa5), "data at {at} is copied");
        }
        let mut hole = [1u8; 4096];
        copy.read_exact_at(&mut hole, SIZE / 4).unwrap();
        assert!(hole.iter().all(|&b| b == 0), "a hole reads as zeros");
        drop(copy);
        sandcell::raw::tree::remove_dir_all(&dst).unwrap();
    }
}

/// 200 names for one 1 MiB file (a sandbox's `ln f f1; ln f f2; ...`) copy as one file
/// with 200 names, not as 200 MiB; links within a subdirectory too, and a file whose
/// other links are outside the tree is still copied whole.
#[test]
fn hard_links_are_copied_as_links() {
    let base = tempfile::tempdir().unwrap();
    let src = base.path().join("src");
    std::fs::create_dir_all(src.join("deep/er")).unwrap();
    std::fs::write(src.join("big"), vec![7u8; 1 << 20]).unwrap();
    for n in 0..100 {
        std::fs::hard_link(src.join("big"), src.join(format!("link{n}"))).unwrap();
        std::fs::hard_link(src.join("big"), src.join(format!("deep/er/link{n}"))).unwrap();
    }
    // Linked from outside the tree only: a file of its own in the copy.
    std::fs::write(base.path().join("outside"), b"outside").unwrap();
    std::fs::hard_link(base.path().join("outside"), src.join("lone")).unwrap();

    for layer in [false, true] {
        let dst = base.path().join(format!("copy-{layer}"));
        if layer {
            sandcell::raw::tree::copy_layer(&src, &dst).unwrap();
        } else {
            sandcell::raw::tree::copy_tree(&src, &dst).unwrap();
        }
        let big = std::fs::metadata(dst.join("big")).unwrap();
        assert_eq!(
            big.nlink(),
            201,
            "copy_layer={layer}: links copied as files"
        );
        for name in ["link0", "link99", "deep/er/link0", "deep/er/link99"] {
            let linked = std::fs::metadata(dst.join(name)).unwrap();
            assert_eq!(linked.ino(), big.ino(), "copy_layer={layer}: {name}");
        }
        assert_eq!(
            std::fs::read(dst.join("deep/er/link42")).unwrap().len(),
            1 << 20
        );
        let lone = std::fs::metadata(dst.join("lone")).unwrap();
        assert_eq!(lone.nlink(), 1);
        assert_eq!(std::fs::read(dst.join("lone")).unwrap(), b"outside");
        // The source is untouched: a link of the copy is not a link of the source.
        assert_eq!(std::fs::metadata(src.join("big")).unwrap().nlink(), 201);
    }
}
