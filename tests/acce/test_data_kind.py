"""acce/data_kind.py: the format of a folder, from its marker files only."""
import subprocess
import sys

from acce.data_kind import data_kind


def test_an_episode_store_is_zarr(tmp_path):
    (tmp_path / "zarr.json").write_text("{}")
    assert data_kind(tmp_path) == "zarr" and data_kind(str(tmp_path)) == "zarr"


def test_a_lerobot_dataset_is_lerobot(tmp_path):
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "info.json").write_text("{}")
    assert data_kind(tmp_path) == "lerobot"


def test_a_store_wins_over_a_lerobot_marker(tmp_path):
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "info.json").write_text("{}")
    (tmp_path / "zarr.json").write_text("{}")
    assert data_kind(tmp_path) == "zarr"


def test_anything_else_is_missing(tmp_path):
    assert data_kind(tmp_path / "absent") == "missing"
    assert data_kind(tmp_path) == "missing"  # an empty folder
    (tmp_path / "zarr.json").mkdir()  # markers must be files
    (tmp_path / "meta" / "info.json").mkdir(parents=True)
    assert data_kind(tmp_path) == "missing"
    (tmp_path / "info.json").write_text("{}")  # info.json belongs under meta/
    assert data_kind(tmp_path) == "missing"


def test_importing_it_loads_no_zarr():
    code = "import sys, acce.data_kind; assert 'zarr' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
