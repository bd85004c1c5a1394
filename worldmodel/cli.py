"""`acce wm-pretrain` and `acce wm-eval`; acce/cli.py calls `add_parsers(sub)` to register them.

    acce wm-pretrain --data data/reach.zarr --out runs/wm [--steps 2000] [--config configs/x.yaml] [wm.lr=3e-4 ...]
    acce wm-eval --checkpoint runs/wm/worldmodel.pt --data data/reach_test.zarr --out wm_eval.json [--png strip.png]

Overrides are the `wm` section of the config (`wm.latent_dim=64`); a --config preset contributes its `wm:` section
only, so the same preset drives `acce train` and `acce wm-pretrain`. torch loads only when a command runs.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from acce.configlib import ConfigError, load_config
from worldmodel.config import WMConfig

SECTION = "wm"


def load_wm_config(path: str | None, overrides: list[str]) -> WMConfig:
    """The `wm` section of a preset plus `wm.<field>=value` overrides -> WMConfig (errors name the fix)."""
    bad = [o for o in overrides if not o.startswith(f"{SECTION}.")]
    if bad:
        raise ConfigError(f"override(s) {bad} are not world-model fields; use {SECTION}.<field>=value "
                          f"(e.g. {SECTION}.latent_dim=64)")
    tree = {}
    if path is not None:
        if not Path(path).is_file():
            raise ConfigError(f"config file {path} does not exist; presets live in configs/")
        tree = (yaml.safe_load(Path(path).read_text()) or {}).get(SECTION) or {}
    # The preset's section goes in as overrides ahead of the user's (JSON is YAML), so one decoder checks both.
    items = [f"{k}={json.dumps(v)}" for k, v in tree.items()] + [o.removeprefix(f"{SECTION}.") for o in overrides]
    try:
        return load_config(WMConfig, None, items)
    except ConfigError as err:  # name keys by their full dotted path, as `acce train` does
        raise ConfigError(str(err).replace("key '", f"key '{SECTION}.").replace("mean '", f"mean '{SECTION}.")) \
            from None


def cmd_wm_pretrain(args) -> int:
    from worldmodel.pretrain import pretrain
    cfg = load_wm_config(args.config, list(args.overrides))
    summary = pretrain(args.data, args.out, cfg, args.steps, progress=not args.quiet,
                       torch_threads=args.threads or None)
    val0, val1 = summary["val_loss_initial"]["total"], summary["val_loss_final"]["total"]
    print(f"{summary['checkpoint']}: wm_version {summary['wm_version']}, {summary['steps_per_s']:.1f} steps/s, "
          f"validation loss {val0:.3f} -> {val1:.3f} ({summary['episodes']['val']} held-out episodes)")
    print(f"tensorboard --logdir {Path(args.out) / 'tb'}")
    return 0


def cmd_wm_eval(args) -> int:
    from worldmodel.evaluate import format_eval, wm_eval
    results = wm_eval(args.checkpoint, args.data, args.out, args.png, max_episodes=args.max_episodes)
    print(format_eval(results))
    print(f"wrote {args.out}" + (f" and {args.png}" if args.png else ""))
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("wm-pretrain", help="train a world model offline on an episode store or LeRobotDataset")
    p.add_argument("--data", required=True, help="zarr episode store or LeRobotDataset v3 directory")
    p.add_argument("--out", required=True, help="output directory (worldmodel.pt, pretrain.json, tb/)")
    p.add_argument("--steps", type=int, default=2000, help="optimizer steps")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default); 1 is fastest "
                   "on a shared laptop")
    p.add_argument("--config", default=None, help="YAML preset; only its wm: section is read")
    p.add_argument("overrides", nargs="*", help="wm.<field>=value, e.g. wm.latent_dim=64 wm.image_size=32")
    p.set_defaults(fn=cmd_wm_pretrain)

    p = sub.add_parser("wm-eval", help="open-loop prediction error of a world model on held-out episodes")
    p.add_argument("--checkpoint", required=True, help="worldmodel.pt or the wm-pretrain output directory")
    p.add_argument("--data", required=True, help="zarr episode store or LeRobotDataset v3 directory")
    p.add_argument("--out", required=True, help="JSON result file")
    p.add_argument("--png", default=None, help="PNG strip of real (top) vs imagined (bottom) frames")
    p.add_argument("--max-episodes", dest="max_episodes", type=int, default=200, help="held-out episodes to use")
    p.add_argument("--json", action="store_true", help="also print the JSON")
    p.set_defaults(fn=cmd_wm_eval)
