"""Crash-safe writes (atomic_file, atomic_dir; a full disk; dead writers' temps) and the
process-independent stable_hash."""

import errno
import os
import socket
import subprocess
import sys

import pytest

from kiln.errors import KilnError
from kiln.io import atomic_dir, atomic_file, read_json, remove_dead_temps, sha256_file, stable_hash, write_json


class Boom(RuntimeError):
    pass


def _entries(folder):
    return sorted(p.name for p in folder.iterdir())


def test_atomic_file_writes_on_success(tmp_path):
    target = tmp_path / "sub" / "out.txt"
    with atomic_file(target) as tmp:
        assert tmp != target and tmp.parent == target.parent
        tmp.write_text("hello")
        assert not target.exists()  # nothing visible until the body finishes
    assert target.read_text() == "hello"
    assert _entries(target.parent) == ["out.txt"]


def test_atomic_file_replaces_existing(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with atomic_file(target) as tmp:
        tmp.write_text("new")
        assert target.read_text() == "old"
    assert target.read_text() == "new"
    assert _entries(tmp_path) == ["out.txt"]


def test_atomic_file_leaves_nothing_when_body_raises(tmp_path):
    target = tmp_path / "out.txt"
    with pytest.raises(Boom):
        with atomic_file(target) as tmp:
            tmp.write_text("partial")
            raise Boom
    assert not target.exists()
    assert _entries(tmp_path) == []


def test_atomic_file_keeps_old_content_when_body_raises(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(Boom):
        with atomic_file(target) as tmp:
            tmp.write_text("partial")
            raise Boom
    assert target.read_text() == "old"
    assert _entries(tmp_path) == ["out.txt"]


def test_atomic_dir_writes_on_success(tmp_path):
    target = tmp_path / "out"
    with atomic_dir(target) as tmp:
        assert tmp.is_dir() and _entries(tmp) == []
        (tmp / "a.txt").write_text("a")
        assert not target.exists()
    assert _entries(target) == ["a.txt"]
    assert _entries(tmp_path) == ["out"]


def test_atomic_dir_replaces_existing_whole(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "stale.txt").write_text("stale")
    with atomic_dir(target) as tmp:
        (tmp / "fresh.txt").write_text("fresh")
        assert (target / "stale.txt").exists()
    assert _entries(target) == ["fresh.txt"]
    assert _entries(tmp_path) == ["out"]


def test_atomic_dir_leaves_nothing_when_body_raises(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(Boom):
        with atomic_dir(target) as tmp:
            (tmp / "half.txt").write_text("half")
            raise Boom
    assert not target.exists()
    assert _entries(tmp_path) == []


def test_atomic_dir_keeps_old_dir_when_body_raises(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(Boom):
        with atomic_dir(target) as tmp:
            (tmp / "half.txt").write_text("half")
            raise Boom
    assert _entries(target) == ["old.txt"]
    assert _entries(tmp_path) == ["out"]


def test_atomic_dir_clears_a_stale_temp_from_a_killed_run(tmp_path):
    target = tmp_path / "out"
    stale = tmp_path / f".out.tmp-{socket.gethostname()}-{os.getpid()}"
    stale.mkdir()
    (stale / "leftover").write_text("x")
    with atomic_dir(target) as tmp:
        assert _entries(tmp) == []
        (tmp / "a").write_text("a")
    assert _entries(target) == ["a"]
    assert _entries(tmp_path) == ["out"]


def test_atomic_dir_removes_a_dead_writers_temp_of_the_same_folder_only(tmp_path):
    """A stage SIGKILLed mid-output left .out.tmp-HOST-PID (another pid than this one's, dead): the
    next write of `out` removes it; a dead temp of another output is not its business."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid, host = int(dead.stdout), socket.gethostname()
    for name in ("out", "other"):
        (tmp_path / f".{name}.tmp-{host}-{dead_pid}").mkdir()
        (tmp_path / f".{name}.tmp-{host}-{dead_pid}" / "half-written").write_text("x")
    with atomic_dir(tmp_path / "out") as tmp:
        (tmp / "a").write_text("a")
    assert _entries(tmp_path) == [f".other.tmp-{host}-{dead_pid}", "out"]


@pytest.mark.parametrize("durable", [False, True])
def test_a_full_disk_is_a_clear_error_with_the_old_output_kept_and_no_temp(tmp_path, durable):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    # What a writer sees when the device fills up half-way through its output.
    with pytest.raises(KilnError, match=r"out: no space left on the device \(.* MiB free\).*nothing was replaced"):
        with atomic_dir(target, durable=durable) as tmp:
            (tmp / "half.txt").write_text("half")
            raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(KilnError, match="old.txt: no space left"):
        with atomic_file(target / "old.txt", durable=durable) as tmp:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
    assert _entries(tmp_path) == ["out"] and _entries(target) == ["old.txt"]
    assert (target / "old.txt").read_text() == "old"
    with pytest.raises(OSError, match="Permission"):  # other OS errors stay what they are
        with atomic_file(target / "x", durable=durable):
            raise PermissionError("Permission denied")


def test_durable_writes_land_like_plain_ones(tmp_path):
    with atomic_dir(tmp_path / "d", durable=True) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "a").write_text("a")
    with atomic_file(tmp_path / "f", durable=True) as tmp:
        tmp.write_text("f")
    assert (tmp_path / "d" / "sub" / "a").read_text() == "a" and (tmp_path / "f").read_text() == "f"
    assert _entries(tmp_path) == ["d", "f"]


def test_remove_dead_temps_removes_only_dead_writers_temps_on_this_host(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead_pid, host = int(dead.stdout), socket.gethostname()
    names = {
        f".state.tmp-{host}-{dead_pid}": "dead writer, this host",  # removed
        f".step-0000005.tmp-{dead_pid}": "dead writer, the older name without a host",  # removed
        f".LATEST.tmp-{host}-{os.getpid()}": "this process: still writing",
        f".x.tmp-{host}-1": "pid 1 is alive",
        f".x.tmp-other-node-{dead_pid}": "another host's pid means nothing here",
        "step-0000005": "not a temp",
        ".hidden": "not a temp",
    }
    for name in names:
        (tmp_path / name).mkdir() if name.startswith(".step") else (tmp_path / name).write_text("x")
    removed = remove_dead_temps(tmp_path)
    assert sorted(p.name for p in removed) == sorted([f".state.tmp-{host}-{dead_pid}", f".step-0000005.tmp-{dead_pid}"])
    assert _entries(tmp_path) == sorted(set(names) - {p.name for p in removed})
    assert remove_dead_temps(tmp_path / "missing") == []


def test_write_json_roundtrip_and_sha256(tmp_path):
    path = tmp_path / "x.json"
    write_json(path, {"a": [1, 2], "b": "é"})
    assert read_json(path) == {"a": [1, 2], "b": "é"}
    (tmp_path / "abc").write_bytes(b"abc")
    assert sha256_file(tmp_path / "abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_stable_hash_pinned_value():
    assert stable_hash("kiln", 1, 2.5) == 15430070864035087754
    assert stable_hash("a") == 14608863320967583690


def test_stable_hash_is_64_bit_and_differs_across_inputs():
    values = [
        stable_hash("a"),
        stable_hash("b"),
        stable_hash("ab"),
        stable_hash("a", "b"),
        stable_hash("b", "a"),
        stable_hash(1),
        stable_hash("kiln", 1, 2.5),
    ]
    assert len(set(values)) == len(values)
    assert all(0 <= v < 2**64 for v in values)
    assert stable_hash("a", "b") == stable_hash("a", "b")


def test_stable_hash_same_in_another_process_with_other_hash_seed():
    code = "from kiln.io import stable_hash; print(stable_hash('kiln', 1, 2.5))"
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout) == stable_hash("kiln", 1, 2.5)
