"""The world model's config schema lives in acce/wm_config.py (acce's Config holds it as `wm`, and acce must not
import worldmodel, docs/design.md §2); re-exported here for the world-model code."""
from acce.wm_config import ACTION_LEVELS, CALIBRATE_RULES, WMConfig  # noqa: F401
