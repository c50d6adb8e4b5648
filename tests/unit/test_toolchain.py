import os

from triton_embed_server.host.toolchain import _write_exec


def test_write_exec_leaves_an_identical_file_and_replaces_a_changed_one(tmp_path):
    path = tmp_path / "tool"
    _write_exec(path, "#!/bin/sh\necho one\n")
    inode = path.stat().st_ino
    assert os.access(path, os.X_OK) and path.read_text() == "#!/bin/sh\necho one\n"

    _write_exec(path, b"#!/bin/sh\necho one\n")  # same bytes: untouched
    assert path.stat().st_ino == inode

    running = open(path, "rb")  # a process still holding the old file keeps its copy
    _write_exec(path, "#!/bin/sh\necho two\n")
    assert path.stat().st_ino != inode and path.read_text() == "#!/bin/sh\necho two\n"
    assert running.read() == b"#!/bin/sh\necho one\n"
    running.close()
    assert [p.name for p in tmp_path.iterdir()] == ["tool"]  # no temporary file left
