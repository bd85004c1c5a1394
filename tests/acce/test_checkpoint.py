"""Checkpoint files under fault injection: a truncated .pt, and the temp files of saves that were killed."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from acce.checkpoint import load_checkpoint, save_checkpoint
from acce.cli import main

PAYLOAD = {"config": {}, "learner": {"policy": {"norm": {"state_mean": [0.0]}}, "version": 0},
           "weights": torch.arange(20_000, dtype=torch.float32)}


def test_truncated_checkpoint_is_refused_in_one_line(tmp_path, capsys):
    path = save_checkpoint(tmp_path / "checkpoints" / "latest.pt", PAYLOAD)
    assert load_checkpoint(tmp_path)["learner"]["version"] == 0
    data = path.read_bytes()
    for size in (len(data) // 2, 0):
        path.write_bytes(data[:size])
        with pytest.raises(ValueError, match=f"{path} cannot be read as a checkpoint.*truncated or damaged"):
            load_checkpoint(tmp_path)
    path.write_bytes(data[:len(data) // 2])
    for argv in (["eval", "--checkpoint", str(path), "--episodes", "1"], ["serve", "--checkpoint", str(path)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{path} cannot be read as a checkpoint" in err, err


def _leftover_of_a_dead_writer(folder) -> str:
    """A 0-byte `.latest.pt.tmp-<pid>` as a save killed before torch.save wrote anything leaves it; the pid ends."""
    code = "import os, sys; open(os.path.join(sys.argv[1], f'.latest.pt.tmp-{os.getpid()}'), 'wb').close()"
    before = set(os.listdir(folder))
    subprocess.run([sys.executable, "-c", code, str(folder)], check=True)
    (name,) = set(os.listdir(folder)) - before
    return name


def test_saves_and_loads_remove_temp_files_of_killed_saves(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live_tmp = folder / f".latest.pt.tmp-{live.pid}"  # a save in progress in another process: never touched
        live_tmp.write_bytes(b"")
        dead = _leftover_of_a_dead_writer(folder)
        save_checkpoint(folder / "latest.pt", PAYLOAD)
        assert not (folder / dead).exists() and live_tmp.exists()

        dead = _leftover_of_a_dead_writer(folder)
        load_checkpoint(tmp_path)  # resume loads first: a fresh leftover may be another machine's live save
        assert (folder / dead).exists()
        old = time.time() - 3600
        os.utime(folder / dead, (old, old))
        os.utime(live_tmp, (old, old))
        assert load_checkpoint(tmp_path)["learner"]["version"] == 0
        assert not (folder / dead).exists() and live_tmp.exists()
        assert sorted(p.name for p in folder.iterdir()) == [live_tmp.name, "latest.pt"]
    finally:
        live.kill()
        live.wait()


def test_disk_full_during_a_save_keeps_the_previous_checkpoint_and_leaves_no_partial_file(tmp_path, monkeypatch,
                                                                                           capsys):
    """ENOSPC injected into the writer (no small filesystem to fill here): the old latest.pt is byte-identical, no
    temp file is left, and the CLI says it in one line."""
    import errno

    from acce import cli
    path = save_checkpoint(tmp_path / "latest.pt", PAYLOAD)
    before = path.read_bytes()

    def full_disk(obj, f, *a, **k):
        f.write(b"x" * 1000)  # part of it got written before the device filled up
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match="no space left on the device while saving .*intact"):
        save_checkpoint(path, {**PAYLOAD, "learner": {"version": 9}})
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["latest.pt"]

    def command(args):
        save_checkpoint(path, PAYLOAD)
    monkeypatch.setattr(cli, "cmd_tasks", command)
    assert cli.main(["tasks"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("acce tasks: error: no space left on the device")
