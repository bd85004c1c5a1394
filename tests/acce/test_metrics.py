import re
from pathlib import Path

import numpy as np
import pytest

from acce.metrics import PREFIXES, Metrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_every_metric_group_is_documented():
    text = DOC.read_text()
    for prefix in PREFIXES:
        assert f"`{prefix}" in text, f"docs/metrics.md does not document {prefix}*"


def test_source_keys_are_documented():
    """Every literal metric key in acce/ appears in docs/metrics.md (placeholders like <task> normalized)."""
    root = Path(__file__).resolve().parents[2] / "acce"
    text = DOC.read_text()
    keys = set()
    for path in root.rglob("*.py"):
        keys |= set(re.findall(r'"((?:%s)[a-z_/]+)"' % "|".join(re.escape(p) for p in PREFIXES),
                               path.read_text()))
    missing = [k for k in sorted(keys) if k not in text and not k.endswith("/")]
    assert not missing, f"undocumented metric keys: {missing}"


def test_writer_rejects_undocumented_groups(tmp_path):
    m = Metrics(tmp_path, enabled=False)
    m.scalars({"loss/policy": 1.0, "eval/success/reach/train": float("nan")}, 0)
    assert m.last == {"loss/policy": 1.0}
    with pytest.raises(ValueError, match="documented group"):
        m.scalars({"misc/thing": 1.0}, 0)


def test_video_is_written_as_gif_summary(tmp_path):
    m = Metrics(tmp_path)
    m.video("eval/video/reach", np.zeros((3, 8, 8, 3), np.uint8), 0)
    m.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(tmp_path))
    ea.Reload()
    assert "eval/video/reach" in ea.Tags()["images"]
    assert ea.Images("eval/video/reach")[0].encoded_image_string[:3] == b"GIF"


def test_inference_metrics_from_server_counters():
    from acce.serving.inference import ServerStats
    from acce.train import inference_metrics
    m = inference_metrics(ServerStats(batches=4, rows=10, forward_s=0.02, swaps=1))
    assert m == pytest.approx({"inference/rows_per_batch": 2.5, "inference/forward_ms_per_row": 2.0})
    assert inference_metrics(ServerStats()) == {}
