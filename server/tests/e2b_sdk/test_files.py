"""files.*: read, write, list, stat, make_dir, rename, remove, watch_dir, bad paths."""

import time

import pytest
from e2b import FileType
from e2b.exceptions import InvalidArgumentException, NotFoundException
from e2b.sandbox.filesystem.filesystem import WriteEntry


def test_write_read_round_trip_text_and_bytes(sandbox):
    info = sandbox.files.write("notes/a.txt", "hello")
    assert info.path == "/home/user/notes/a.txt"
    assert sandbox.files.read("/home/user/notes/a.txt") == "hello"
    blob = bytes(range(256)) * 1000
    sandbox.files.write("bin/blob", blob)
    assert bytes(sandbox.files.read("bin/blob", format="bytes")) == blob


def test_write_files_writes_each(sandbox):
    written = sandbox.files.write_files(
        [WriteEntry(path="m/one.txt", data="1"), WriteEntry(path="/home/user/m/two.txt", data="2")]
    )
    assert sorted(w.path for w in written) == ["/home/user/m/one.txt", "/home/user/m/two.txt"]
    assert sandbox.files.read("m/two.txt") == "2"


def test_list_stat_exists(sandbox):
    sandbox.files.write("d/f.txt", "12345")
    sandbox.files.make_dir("d/sub")
    entries = {e.name: e for e in sandbox.files.list("d")}
    assert set(entries) == {"f.txt", "sub"}
    assert entries["f.txt"].type == FileType.FILE
    assert entries["f.txt"].size == 5
    assert entries["sub"].type == FileType.DIR
    deep = {e.path for e in sandbox.files.list("/home/user", depth=2)}
    assert "/home/user/d/f.txt" in deep
    info = sandbox.files.get_info("d/f.txt")
    assert (info.name, info.size, info.path) == ("f.txt", 5, "/home/user/d/f.txt")
    assert info.permissions.startswith("-")
    assert sandbox.files.exists("d/f.txt")
    assert not sandbox.files.exists("d/missing")


def test_make_dir_says_whether_it_made_one(sandbox):
    assert sandbox.files.make_dir("x/y/z") is True
    assert sandbox.files.make_dir("x/y/z") is False


def test_rename_and_remove(sandbox):
    sandbox.files.write("old.txt", "content")
    moved = sandbox.files.rename("old.txt", "new.txt")
    assert moved.path == "/home/user/new.txt"
    assert sandbox.files.read("new.txt") == "content"
    assert not sandbox.files.exists("old.txt")
    sandbox.files.write("tree/a/b.txt", "b")
    sandbox.files.remove("tree")
    assert not sandbox.files.exists("tree")


def test_watch_dir_reports_changes(sandbox):
    sandbox.files.make_dir("watched")
    handle = sandbox.files.watch_dir("watched")
    try:
        sandbox.files.write("watched/new.txt", "1")
        sandbox.commands.run("rm watched/new.txt")
        seen = []
        deadline = time.time() + 5
        while time.time() < deadline:
            seen += [(e.name, e.type.name) for e in handle.get_new_events()]
            if ("new.txt", "REMOVE") in seen:
                break
            time.sleep(0.1)
        assert ("new.txt", "CREATE") in seen
        assert ("new.txt", "REMOVE") in seen
    finally:
        handle.stop()


def test_watch_dir_recursive(sandbox):
    sandbox.files.make_dir("rec/inner")
    handle = sandbox.files.watch_dir("rec", recursive=True)
    try:
        sandbox.files.write("rec/inner/deep.txt", "1")
        seen = []
        deadline = time.time() + 5
        while time.time() < deadline and not any(n == "inner/deep.txt" for n, _ in seen):
            seen += [(e.name, e.type.name) for e in handle.get_new_events()]
            time.sleep(0.1)
        assert ("inner/deep.txt", "CREATE") in seen
    finally:
        handle.stop()


def test_paths_outside_the_home_are_refused(sandbox):
    with pytest.raises(InvalidArgumentException):
        sandbox.files.read("/etc/passwd")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.write("/tmp/escape.txt", "x")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.list("../..")


def test_missing_paths_are_not_found(sandbox):
    with pytest.raises(NotFoundException):
        sandbox.files.read("nope.txt")
    with pytest.raises(NotFoundException):
        sandbox.files.get_info("nope.txt")
    with pytest.raises(NotFoundException):
        sandbox.files.list("nope")
    with pytest.raises(NotFoundException):
        sandbox.files.watch_dir("nope")
