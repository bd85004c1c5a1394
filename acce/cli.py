"""The `acce` console script. Subcommands parse their own flags, then load the config (preset + dotted overrides).

    acce tasks
    acce collect --task reach --policy expert --episodes 100 --out data/reach.zarr
    acce bench sim --out bench/sim.json
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from pathlib import Path

from acce.configlib import ConfigError
from acce.data_kind import data_kind
from acce.device import INFERENCE_BACKENDS


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="YAML preset (configs/*.yaml); defaults from acce/config.py")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. env.num_envs=16 learner.lr=3e-4")


def _load(args, extra: list[str] | None = None):
    from acce.config import load
    return load(args.config, list(args.overrides) + list(extra or []))


def cmd_tasks(args) -> int:
    from acce.wiring import task_table
    rows = task_table()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        print(f"{r['task']}  ({r['gym_id']}, id {r['task_id']}, {r['max_steps']} steps at {r['control_hz']:g} Hz)")
        print(f"    {r['doc']}")
        print("    train:    " + " | ".join(r["train_instructions"]))
        print("    val:      " + " | ".join(r["val_instructions"]))
        print("    test:     " + " | ".join(r["heldout_instructions"]) + "  (held out; test seeds only)")
    try:
        from sim.metaworld_env import metaworld_task_names
        names = metaworld_task_names()
        print(f"metaworld/<name> ({len(names)} Meta-World v3 tasks, e.g. {', '.join(names[:4])}, ...)")
    except ImportError:
        pass
    return 0


def cmd_collect(args) -> int:
    from acce.collect import collect, format_summary
    from acce.store.episodes import EpisodeStore
    from acce.store.schema import StoreSchema
    from acce.wiring import make_sim_env, sim_aux_dim

    extra = []
    if args.task:
        extra.append(f"collect.tasks=[{','.join(args.task)}]")
    for flag in ("policy", "episodes", "out", "noise_std", "noisy_fraction", "seeds", "num_envs"):
        value = getattr(args, flag)
        if value is not None:
            extra.append(f"collect.{flag}={value}")
    if args.aux_labels:
        extra.append("collect.aux_labels=true")
    cfg = _load(args, extra)
    c = cfg.collect
    if args.import_lerobot:  # the store takes the dataset's schema, mapped by dataset.* (import_lerobot creates it)
        from acce.store.lerobot_import import import_lerobot
        before = len(EpisodeStore.open(c.out)) if data_kind(c.out) == "zarr" else 0
        store = import_lerobot(args.import_lerobot, c.out, config=cfg.dataset)
        print(f"imported {len(store) - before} episodes from {args.import_lerobot} into {c.out}")
        try:
            spec = store.schema.env_spec
            print(f"env spec: state {spec.state_dim}, action {spec.action_dim} ({spec.action_repr}"
                  f"{', in the data units recorded in the spec' if spec.action_low else ''}), {spec.control_hz:g} Hz, "
                  f"cameras {list(spec.cameras)} at {spec.image_size} px")
        except ValueError as err:  # cameras of several sizes: storable, but no policy can be built for them
            print(f"warning: {err}")
        return 0
    _check_task_names(list(c.tasks))  # before any env or store is made
    probe = make_sim_env(list(c.tasks), 1, image_size=cfg.env.image_size, cameras=cfg.env.cameras)
    try:  # the store's layout is the env spec of the tasks' own envs
        spec = probe.env_spec
    finally:
        probe.close()
    store = EpisodeStore.open_or_create(c.out, **StoreSchema.fields_for(
        spec, aux_dim=sim_aux_dim() if c.aux_labels else 0))
    before = len(store)

    def make_env(tasks, num_envs, **kw):
        return make_sim_env(tasks, num_envs, image_size=cfg.env.image_size, cameras=cfg.env.cameras,
                            task_params={t: p for t, p in cfg.env.task_params.items() if t in tasks},
                            aux_labels=c.aux_labels, **kw)

    with store.removed_if_failed_empty():  # a failed run leaves no empty store to block its corrected retry
        summary = collect(c, make_env, store, seed=cfg.run.seed)
    print(format_summary(summary))
    print(f"{c.out}: {len(store)} episodes ({len(store) - before} new), seeds={c.seeds}, "
          f"instructions={c.instruction_split}")
    if args.export_lerobot:
        from acce.store.lerobot_io import export_lerobot
        print(f"exported LeRobotDataset v3 to {export_lerobot(store, args.export_lerobot)}")
    return 0


def cmd_train(args) -> int:
    from acce.train import train
    extra = [f"dataset.path={json.dumps(args.data)}"] if args.data is not None else []  # quoted: any path is a str
    if args.resume:
        from acce.config import load
        base = Path(args.resume) / "config.yaml"
        if not base.is_file():
            raise FileNotFoundError(f"{args.resume} has no config.yaml; pass the run directory of an acce train run")
        cfg = load(base, list(args.overrides))
        if extra or cfg.dataset.path:
            raise ConfigError("--resume continues a simulator run; a --data run is short: start it again")
    else:
        cfg = _load(args, extra)
    if cfg.dataset.path:  # a robot's dataset, no simulator: cloning and open-loop evaluation (acce/dataset_train.py)
        from acce.dataset_train import train_on_dataset
        summary = train_on_dataset(cfg, progress=not args.quiet)
    else:
        summary = train(cfg, resume=args.resume, progress=not args.quiet)
    if args.quiet:
        print(json.dumps({k: v for k, v in summary.items() if k != "history"}, indent=2, default=str))
    return 0


def cmd_eval(args) -> int:
    from acce.checkpoint import load_checkpoint, policy_from_checkpoint
    from acce.config import Config
    from acce.configlib import load_config
    from acce.runtime.evaluator import format_eval
    from acce.serving.inference import InferenceServer
    from acce.wiring import make_evaluator
    import tempfile
    import yaml

    if args.episodes <= 0:
        raise ConfigError(f"--episodes must be positive, got {args.episodes}")
    _check_task_names(args.task or [])  # before anything heavy is loaded
    data = load_checkpoint(args.checkpoint)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(data["config"], f)
    cfg = load_config(Config, f.name, list(args.overrides))
    Path(f.name).unlink()
    from acce.device import driver_device, place
    # the run's runtime.device (a GPU run's checkpoint on a CPU machine: runtime.device=cpu or auto)
    policy = place(policy_from_checkpoint(data), driver_device(cfg.runtime), cfg.runtime.amp)
    server = InferenceServer(policy, deterministic=True, backend=cfg.runtime.inference_backend)
    server._version = int(data["learner"]["version"])
    tasks = args.task or list(cfg.env.tasks)
    probe = None
    if args.aux_probe:
        from acce.runtime.aux_probe import AuxProbe
        try:
            probe = AuxProbe(server.policy)
        except ValueError as e:
            raise ConfigError(f"--aux-probe: {e}") from None
    ev = make_evaluator(cfg, server, tasks, args.episodes, probe=probe)
    instructions = ("heldout", "train") if args.instructions == "both" else (args.instructions,)
    results = ev.run(args.split, instructions=instructions, video=bool(args.video_dir), progress=True)
    videos = results.pop("videos")
    print(format_eval(results))
    if probe is not None:
        from acce.runtime.aux_probe import format_probe
        results["aux_probe"] = probe.report()
        print(format_probe(results["aux_probe"]))
    for key, cell in results["per_task"].items():  # the layouts to look at first (all of them in --out's JSON)
        if cell["failed_seeds"]:
            more = len(cell["failed_seeds"]) - 8
            print(f"failed seeds {key}: " + " ".join(map(str, cell["failed_seeds"][:8])) + (f" (+{more})" if more > 0 else ""))
    if args.video_dir:
        import imageio
        Path(args.video_dir).mkdir(parents=True, exist_ok=True)
        for task, frames in videos.items():
            imageio.mimsave(Path(args.video_dir) / f"{task}.gif", list(frames), duration=0.1)
        print(f"videos in {args.video_dir}")
    if args.out:
        results["checkpoint_version"] = server._version
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2))
        print(f"wrote {args.out}")
    return 0


def _check_task_names(tasks: list[str]) -> None:
    """Unknown task names fail in one line, before a checkpoint or a simulator is loaded."""
    from acce.config import KNOWN_TASKS
    bad = [t for t in tasks if t not in KNOWN_TASKS and not t.startswith("metaworld/")]
    if bad:
        raise ConfigError(f"unknown task(s) {bad}; known: {list(KNOWN_TASKS)} or metaworld/<name>-v3 (acce tasks)")


def cmd_bench(args) -> int:
    from acce.bench import run_bench
    if args.name == "headline":  # no run: recompute a written bench JSON's headline from its recorded runs
        from acce.bench.headline import recompute
        if not args.in_path or len(args.in_path) != 1:
            raise ValueError("acce bench headline needs one --in bench/F.json (a bench delay, wm, rl or throughput "
                             "result)")
        print(json.dumps(recompute(args.in_path[0], args.out), indent=2))
        return 0
    if args.name == "merge":  # no run: several bench rl results (different tasks) into one file
        from acce.bench.merge import merge_rl
        if not args.out:
            raise ValueError("acce bench merge needs --out bench/rl.json (the merged result)")
        doc = merge_rl(args.in_path or [], args.out, args.plot)
        print(json.dumps(doc["headline"], indent=2))
        print(f"wrote {args.out}")
        return 0
    cfg = _load(args)
    run_bench(args.name, cfg, args, args.out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="acce", description="Asynchronous RL for vision-language-action robot "
                                     "policies (MuJoCo + world model rollouts, delay-aware learner, robot bridge).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("tasks", help="list tasks with their instructions (train, validation and test paraphrases)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(fn=cmd_tasks)

    p = sub.add_parser("collect", help="record scripted-expert episodes into a zarr episode store")
    p.add_argument("--task", action="append", help="task to record (repeat for several); default collect.tasks")
    p.add_argument("--policy", default=None, help="'expert' (scripted, privileged state)")
    p.add_argument("--episodes", type=int, default=None, help="episodes in total")
    p.add_argument("--out", default=None, help="zarr store directory (appended to if it exists)")
    p.add_argument("--noise-std", dest="noise_std", type=float, default=None, help="expert action noise")
    p.add_argument("--noisy-fraction", dest="noisy_fraction", type=float, default=None,
                   help="fraction of episodes recorded with noise")
    p.add_argument("--seeds", choices=("train", "val", "test"), default=None, help="layout seed range")
    p.add_argument("--num-envs", dest="num_envs", type=int, default=None, help="envs stepped together")
    p.add_argument("--aux-labels", dest="aux_labels", action="store_true",
                   help="also record the sim's privileged aux labels (frames/aux): a world model pretrained on the "
                        "store then gets the aux head that policy.critic=privileged needs (collect.aux_labels)")
    p.add_argument("--export-lerobot", dest="export_lerobot", default=None, metavar="DIR",
                   help="after collecting, export the whole store to a LeRobotDataset v3 directory")
    p.add_argument("--import-lerobot", dest="import_lerobot", default=None, metavar="DIR",
                   help="instead of collecting, append a LeRobotDataset v3 directory to the store (keys, image "
                        "size and action units: dataset.* overrides, docs/robot.md)")
    _add_config_args(p)
    p.set_defaults(fn=cmd_collect)

    p = sub.add_parser("train", help="train a policy (the main job: --config configs/default.yaml)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue a run (same versions, same TensorBoard)")
    p.add_argument("--quiet", action="store_true", help="no progress bar; print the summary as JSON")
    p.add_argument("--data", default=None, metavar="DATASET",
                   help="learn from a robot's LeRobotDataset v3 (or acce episode store) instead of a simulator: "
                        "clone it, evaluate open loop on held-out episodes (sets dataset.path; docs/robot.md)")
    _add_config_args(p)
    p.set_defaults(fn=cmd_train)

    p = sub.add_parser("eval", help="evaluate a checkpoint on test (reports) or validation (choices) seeds")
    p.add_argument("--checkpoint", required=True, help="checkpoint file or run directory")
    p.add_argument("--out", default=None, help="JSON result file")
    p.add_argument("--split", choices=("test", "val"), default="test",
                   help="seed range: 'test' for numbers you report, 'val' for every choice (default test)")
    p.add_argument("--instructions", choices=("heldout", "train", "both"), default="both",
                   help="paraphrase set(s): held-out (with --split val the validation paraphrases, with test the "
                        "test ones), train, or both (default both)")
    p.add_argument("--episodes", type=int, default=100, help="episodes per task and paraphrase set (default 100)")
    p.add_argument("--task", action="append", help="task(s) to evaluate; default: the run's tasks")
    p.add_argument("--video-dir", dest="video_dir", default=None, help="save one GIF per task here")
    p.add_argument("--aux-probe", dest="aux_probe", action="store_true",
                   help="also report how well the policy's aux head locates the object and the goal (R², cm) per "
                   "phase of the episode: what a frozen-encoder RL cannot fix (JSON key aux_probe)")
    p.add_argument("overrides", nargs="*", help="dotted overrides of the checkpoint's config (e.g. delay.fixed_steps=4)")
    p.set_defaults(fn=cmd_eval)

    p = sub.add_parser("bench", help="run a benchmark, write JSON (--out) and print a table")
    p.add_argument("name", help="benchmark: sim | experts | throughput | delay | wm | rl | ppo-reference | serve; "
                   "or headline (recompute --in's headline), or merge (several bench rl --in files into --out)")
    p.add_argument("--in", dest="in_path", action="append", default=None,
                   help="[headline] a bench delay / wm / rl / throughput JSON whose headline and seed-level tables "
                   "are recomputed from its runs (written back, or to --out); [merge] a bench rl JSON (repeat: each "
                   "task from one file)")
    p.add_argument("--seeds", type=int, default=3, help="[delay, wm, rl, ppo-reference] training seeds per cell")
    p.add_argument("--workdir", default=None, help="[delay, wm, rl] keep the runs here (default: a temporary folder); "
                   "finished runs found there are reused")
    p.add_argument("--plot", default=None, help="[delay, wm, rl, throughput] write the plot (PNG) here")
    p.add_argument("--cases", default="default,long_tail,long_tail_lockstep",
                   help="[throughput] comma-separated cases: default, long_tail, long_tail_lockstep, and sweep (the "
                   "tail weight at a fixed mean latency)")
    p.add_argument("--episodes", type=int, default=None, help="test-seed episodes per task and split: [experts] "
                   "per task and noise (default 100), [delay] per evaluation (40), [wm] per periodic evaluation (the preset's eval.episodes_per_task)")
    p.add_argument("--budget-steps", dest="budget_steps", type=int, default=None,
                   help="[delay] RL env steps per cell (default 30000); [wm] the largest real env steps per run "
                   "(default 40000); [rl] env steps per run (default 60000); [ppo-reference] env steps per run (default 40000)")
    p.add_argument("--tasks", default=None, help="[delay] comma-separated tasks, the dynamic one first (default "
                   "track,reach); [rl] tasks benchmarked one at a time (default: the preset's env.tasks); [ppo-reference] "
                   "state-only tasks (default reach)")
    p.add_argument("--task-overrides", dest="task_overrides", action="append", default=None,
                   help="[rl] TASK:KEY=VALUE[,KEY=VALUE...] for one task's warm start and runs, e.g. "
                   "push:bc.episodes=400,bc.steps=1200 (repeat for several tasks)")
    p.add_argument("--inference-backend", dest="inference_backend", default="auto",
                   choices=INFERENCE_BACKENDS, help="[serve] what runs vision + trunk in the bare path and in acce serve (runtime.inference_backend)")
    p.add_argument("--long-tail", dest="long_tail", action="store_true",
                   help="[rl] also run every seed and mode with bench throughput's long-tail step latency (the "
                   "headline's async_sync_wall_ratio_long_tail)")
    p.add_argument("--random-delay-warm-start", dest="random_delay_warm_start", action="store_true",
                   help="[delay] give the delay-aware arm its own warm start, cloned at random latencies up to the "
                   "largest d (bc.random_delay_steps); the naive arm keeps the d = 0 warm start")
    p.add_argument("--naive-at-latency", dest="naive_at_latency", action="store_true",
                   help="[delay] add the latency-matched naive arm: per d > 0 a delay-naive policy cloned and "
                   "DAgger-run at that one latency (no d input), then naive RL from it (cells <task>/d<d>/naive_matched)")
    p.add_argument("--warm-start-per-seed", dest="warm_start_per_seed", action="store_true",
                   help="[delay] clone every warm start once per seed (run.seed = seed) instead of sharing one, so the "
                   "seed-level intervals include the spread between warm starts of one recipe")
    p.add_argument("--random-delay-max", dest="random_delay_max", type=int, default=None,
                   help="[delay] with --random-delay-warm-start: clone the aware warm start at random d up to this "
                   "(default: the largest of --delays), e.g. 8 to add d = 2 cells with the 0..8 grid's recipe")
    p.add_argument("--delays", default=None, help="[delay] comma-separated latencies in control steps (default 0,2,4,6)")
    p.add_argument("--target", type=float, default=0.8, help="[wm] held-out success whose env steps are measured")
    p.add_argument("--offline-episodes", dest="offline_episodes", type=int, default=1000,
                   help="[wm] expert + noisy trajectories recorded for the pretrained world model")
    p.add_argument("--pretrain-steps", dest="pretrain_steps", type=int, default=1500,
                   help="[wm] acce wm-pretrain optimizer steps for the pretrained world model")
    p.add_argument("--arms", default=None, help="[wm] comma-separated arms to run (default model_free,online,"
                   "pretrained; finished runs in --workdir are reused)")
    p.add_argument("--budgets", default=None, help="[wm] comma-separated real env step budgets at which each arm's "
                   "validation success is read off (default 5000,10000,20000,40000; the run budget defaults to the "
                   "largest)")
    p.add_argument("--warm-start", dest="warm_start", default=None,
                   help="[wm] behavior-cloning checkpoint shared by every arm (default: trained once in --workdir)")
    p.add_argument("--out", default=None, help="JSON result file")
    p.add_argument("--workers", type=int, default=2, help="[sim] largest number of env processes to measure")
    p.add_argument("--chunk", type=int, default=8, help="[sim] control steps per rendered observation")
    p.add_argument("--duration-s", dest="duration_s", type=float, default=3.0,
                   help="[sim] seconds per measurement; [throughput] seconds per mode and case (the simulator limit "
                   "it also measures, before the cases, is timed for 10 s)")
    p.add_argument("--checkpoint", default=None, help="[serve] checkpoint to serve and rehearse")
    _add_config_args(p)
    p.set_defaults(fn=cmd_bench)
    __import__("robot_bridge.cli", fromlist=["add_parsers"]).add_parsers(sub)  # acce serve / acce robot (lazy)
    __import__("worldmodel.cli", fromlist=["add_parsers"]).add_parsers(sub)  # acce wm-pretrain / wm-eval (lazy)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # dotted overrides may also follow the flags (`acce bench throughput --out f.json env.num_envs=16`): argparse
    # stops filling a positional list at the first flag, and intermixed parsing does not support subcommands
    stray = [a for a in extra if a.startswith("-") or "=" not in a or not hasattr(args, "overrides")]
    if stray:
        parser.parse_args(argv)  # argparse's own one-line usage error for what is really unknown
    if extra:
        args.overrides = list(args.overrides) + extra
    try:
        return int(args.fn(args) or 0)
    except ConfigError as exc:
        print(f"acce {args.command}: config error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        # user-facing input errors (bad store, bad file, bad value) are one line; ACCE_DEBUG=1 shows the trace
        if os.environ.get("ACCE_DEBUG"):
            raise
        print(f"acce {args.command}: error: {str(exc).splitlines()[0] if str(exc) else repr(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno != errno.ENOSPC or os.environ.get("ACCE_DEBUG"):
            raise
        print(f"acce {args.command}: error: {exc.strerror or exc}", file=sys.stderr)  # disk full: one line
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
