"""The config schema: frozen dataclasses, one docstring per field. YAML presets in configs/ only set values.

`acce train --config configs/default.yaml learner.lr=3e-4` -> `load(path, overrides)`; contradictions are rejected
in `__post_init__` with the fix in the message.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

from acce.bc_config import BCConfig
from acce.configlib import ConfigError, load_config
from acce.data_config import DatasetConfig
from acce.device import DEVICES, INFERENCE_BACKENDS, INFERENCE_PLACEMENTS
from acce.learner_config import LearnerConfig
from acce.policy.config import PolicyConfig
from acce.rollout_config import DelayConfig, RolloutConfig
from acce.task_names import KNOWN_TASKS, has_aux_labels, is_known_task
from acce.wm_config import ImaginationConfig, WMConfig, check_imagination


@dataclass(frozen=True)
class RunConfig:
    name: str = "acce"
    """run name; the run directory is <out_dir>/<name>"""
    out_dir: str = "runs"
    """parent folder of run directories"""
    seed: int = 0
    """master seed: env layouts, task sampling, network init"""

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name


@dataclass(frozen=True)
class EnvConfig:
    tasks: tuple[str, ...] = ("reach", "push")
    """tasks trained on (and evaluated on) together"""
    num_envs: int = 8
    """envs per rollout worker (stepped in lockstep, one inference request per chunk per env)"""
    image_size: int = 64
    """square camera resolution in pixels"""
    cameras: tuple[str, ...] = ("front",)
    """camera names; observation keys are image/<camera>. The tabletop sim has `front` (the default view), `top`,
    `overhead` and `wrist` (eye-in-hand: rides with the gripper, the fingers in its top corners)"""
    task_params: dict[str, dict[str, Union[float, str]]] = field(default_factory=dict)
    """per-task overrides of the task's config, e.g. {track: {ball_speed_mps: 0.2}, push: {approach: around}}"""
    privileged_state: bool = False
    """sanity-ladder view: the instruction's object and goal positions appended to the state and the images blank
    (sim.privileged_env), so a task is solvable from state alone; for localizing learner problems, not for robots"""
    step_latency_ms: float = 0.0
    """extra wall-clock latency per env step, median in ms (0: none); models remote simulators / robots"""
    step_latency_sigma: float = 1.0
    """lognormal sigma of that latency (1.0: heavy tail, p99 ~ 10x the median)"""
    step_independent: bool = True
    """with step latency: each env of a worker steps on its own, as separate remote simulators/robots do (a busy
    env does not hold back the others); false: lockstep, every step waits for the slowest env"""

    def __post_init__(self) -> None:
        unknown = [t for t in self.tasks if not is_known_task(t)]
        if unknown:
            raise ConfigError(f"env.tasks: unknown task(s) {unknown}; known: {list(KNOWN_TASKS)} or "
                              "metaworld/<name>-v3 (`acce tasks` lists them)")
        if not self.tasks:
            raise ConfigError("env.tasks is empty; name at least one task, e.g. env.tasks=[reach]")
        if self.num_envs <= 0:
            raise ConfigError(f"env.num_envs must be positive, got {self.num_envs}")
        if not 16 <= self.image_size <= 512:
            raise ConfigError(f"env.image_size must be in [16, 512], got {self.image_size}")
        bad = [t for t in self.task_params if t not in self.tasks]
        if bad:
            raise ConfigError(f"env.task_params names task(s) {bad} that are not in env.tasks {list(self.tasks)}")


def check_task_weights(name: str, weights: dict[str, float], tasks: tuple[str, ...]) -> None:
    """One ConfigError for task weights that name no known task, are negative, or zero every one of `tasks`. A
    known task outside `tasks` is allowed and unused, so a preset's weights survive an env.tasks override."""
    unknown = [t for t in weights if not is_known_task(t)]
    if unknown:
        raise ConfigError(f"{name} names unknown task(s) {unknown}; known: {list(KNOWN_TASKS)} or "
                          "metaworld/<name>-v3 (`acce tasks` lists them)")
    bad = {t: w for t, w in weights.items() if not (isinstance(w, (int, float)) and w >= 0)}
    if bad:
        raise ConfigError(f"{name} must map task names to weights >= 0, got {bad}")
    if weights and not any(weights.get(t, 1.0) > 0 for t in tasks):
        raise ConfigError(f"{name} {weights} leaves every task at weight 0")


@dataclass(frozen=True)
class CollectConfig:
    tasks: tuple[str, ...] = ("reach",)
    """tasks to record, episodes split evenly between them unless task_weights says otherwise"""
    task_weights: dict[str, float] = field(default_factory=dict)
    """relative share of each task's episodes (a task not named weighs 1), e.g. {push: 3}; {} = evenly"""
    policy: str = "expert"
    """who acts: 'expert' (scripted, privileged state)"""
    episodes: int = 100
    """episodes to record in total"""
    noise_std: float = 0.0
    """Gaussian action noise added to the expert (diverse data); 0 for clean demonstrations"""
    noisy_fraction: float = 0.0
    """fraction of episodes recorded with noise_std (the rest clean); 1.0 makes every episode noisy"""
    seeds: str = "train"
    """seed range to draw layouts from: 'train', or 'val' / 'test' (evaluation seeds, e.g. held-out data to score a
    world model on: 'val' for choices, 'test' for reports; never train on them)"""
    instruction_split: str = "train"
    """instruction paraphrases: 'train', 'val' (held out, for choices) or 'heldout' (held out, for reports)"""
    num_envs: int = 8
    """envs stepped together while recording"""
    out: str = "data/episodes.zarr"
    """zarr episode store; appended to when it exists with the same schema"""
    aux_labels: bool = False
    """also record the sim's privileged aux labels (obs["aux"]: the instruction's object and goal xy) as frames/aux.
    A world model pretrained on such a store gets an aux head, which policy.critic=privileged needs to value
    imagined states (acce/wiring.py check_world_model_aux); a store keeps one layout, so appending needs the same"""

    def __post_init__(self) -> None:
        if self.policy != "expert":
            raise ConfigError(f"collect.policy={self.policy!r} is not supported; use 'expert'")
        if self.episodes <= 0:
            raise ConfigError(f"collect.episodes must be positive, got {self.episodes}")
        if self.seeds not in ("train", "val", "test"):
            raise ConfigError(f"collect.seeds must be 'train', 'val' or 'test', got {self.seeds!r}")
        if self.instruction_split not in ("train", "val", "heldout"):
            raise ConfigError("collect.instruction_split must be 'train', 'val' or 'heldout', "
                              f"got {self.instruction_split!r}")
        if not 0.0 <= self.noisy_fraction <= 1.0 or self.noise_std < 0:
            raise ConfigError("collect.noisy_fraction must be in [0, 1] and collect.noise_std >= 0")
        check_task_weights("collect.task_weights", self.task_weights, self.tasks)
        unlabelled = [t for t in self.tasks if not has_aux_labels(t)]
        if self.aux_labels and unlabelled:
            raise ConfigError(f"collect.aux_labels: the sim has no aux labels for {unlabelled}; record them without")


@dataclass(frozen=True)
class RuntimeConfig:
    kind: str = "ray"
    """'ray' (default; embedded one-machine cluster unless address is set) or 'local' (one process, deterministic)"""
    mode: str = "async"
    """'async' or 'sync' (the barrier baseline: collect -> train -> publish, same components)"""
    address: str = ""
    """Ray cluster address to join (e.g. 'auto' or 'ray://host:10001'); '' starts a local cluster"""
    num_cpus: int = 0
    """CPUs for the embedded Ray cluster (0: all of this machine)"""
    worker_cpus: float = 0.5
    """Ray CPU resource per rollout worker"""
    worker_resources: dict[str, float] = field(default_factory=dict)
    """custom Ray resources each rollout worker requests, e.g. {rollout_node: 1} places the workers on the nodes
    started with `ray start --resources='{"rollout_node": 4}'` (launch/README.md); {} = wherever they fit. CPUs are
    runtime.worker_cpus, not an entry here"""
    learner_cpus: float = 1.0
    """Ray CPU resource for the learner"""
    device: str = "auto"
    """where the learner, the inference servers and the evaluator run the policy: 'auto' (CUDA when the driver sees a
    CUDA device, else CPU), 'cpu' or 'cuda' (fails at start-up, in one line, where there is no CUDA device; a driver
    joining a cluster by runtime.address leaves that check to the learner and server actors, which run where the
    GPUs are). Rollout workers and simulators stay on CPU; results come back to them as CPU numpy"""
    amp: bool = True
    """bf16 autocast of the vision encoder and trunk on CUDA (learner updates and inference); heads, log-probs and
    importance ratios stay float32. Ignored on CPU, where numbers are exactly those of float32"""
    learner_gpus: float = 0.5
    """Ray GPU resource (a fraction of one GPU) reserved for the learner actor when runtime.device resolves to cuda;
    nothing is reserved on cpu. The default and server_gpus' share one GPU"""
    server_gpus: float = 0.5
    """Ray GPU resource reserved for the inference server actor when runtime.device resolves to cuda (as
    learner_gpus)"""
    server_cpus: float = 0.5
    """Ray CPU resource per inference server"""
    inference_backend: str = "auto"
    """what runs the policy's vision + trunk in the inference servers (rollouts, evaluation, `acce serve`): 'torch';
    'onnxruntime' (CPU, fp32: an ONNX export of the frozen part, made at the first batch and again whenever the frozen
    weights change; fails at start-up where it cannot apply); 'auto' = ONNX Runtime where it applies (CPU, fp32,
    onnxruntime installed), until the first weight swap that changes the frozen part (learner.train_scope other than
    residual), then torch. Heads, residual, sampling and every learner pass stay in torch (docs/decisions.md)"""
    inference_placement: str = "auto"
    """where rollout inference runs on Ray: 'server' (one InferenceServer actor merges every worker's requests into
    batches: the GPU layout), 'worker' (each rollout worker runs its own in-process server on CPU, with the weights
    the learner pushes to it: no round trip per decision) or 'auto' = worker when runtime.device resolves to CPU,
    else server (docs/decisions.md). The local runtime always has one in-process server"""
    torch_threads: int = 1
    """torch intra-op threads per role process (2-core machines: 1 avoids oversubscription)"""
    producer_nice: int = 0
    """niceness (0-19, Linux) added to every rollout and imagination worker process on Ray, on top of the 15 Ray
    starts its workers at (so at most 4 takes effect): > 0 lets the learner's update take a core first where role
    processes outnumber cores (docs/decisions.md); 0 leaves the scheduler alone"""
    driver_threads: int = 0
    """torch threads of the driver process (BC warm start, evaluation); 0 = torch's default (all cores). On a
    machine shared with other jobs use 1: oversubscribed OpenMP threads ran BC ~30x slower here"""
    max_batch: int = 64
    """inference server: largest merged batch"""
    timeout_ms: float = 2.0
    """inference server: how long to wait for more requests before running a batch"""
    queue_capacity: int = 32
    """rollout queue capacity in segments; producers block when full"""
    timeout_s: float = 120.0
    """any role call or queue wait longer than this fails loudly instead of hanging"""
    startup_timeout_s: float = 600.0
    """allowance for all actors to start (imports, simulators, language model) before timeout_s applies"""

    def __post_init__(self) -> None:
        if self.kind not in ("ray", "local"):
            raise ConfigError(f"runtime.kind must be 'ray' or 'local', got {self.kind!r}")
        if self.mode not in ("async", "sync"):
            raise ConfigError(f"runtime.mode must be 'async' or 'sync', got {self.mode!r}")
        if self.device not in DEVICES:
            raise ConfigError(f"runtime.device must be one of {list(DEVICES)}, got {self.device!r}")
        if self.inference_backend not in INFERENCE_BACKENDS:
            raise ConfigError(f"runtime.inference_backend must be one of {list(INFERENCE_BACKENDS)}, got "
                              f"{self.inference_backend!r}")
        if self.inference_placement not in INFERENCE_PLACEMENTS:
            raise ConfigError(f"runtime.inference_placement must be one of {list(INFERENCE_PLACEMENTS)}, got "
                              f"{self.inference_placement!r}")
        if not 0 <= self.producer_nice <= 19:
            raise ConfigError(f"runtime.producer_nice must be 0-19 (Linux niceness added to rollout workers), got "
                              f"{self.producer_nice!r}")
        if self.learner_gpus < 0 or self.server_gpus < 0:
            raise ConfigError("runtime.learner_gpus and runtime.server_gpus must be >= 0 (fractions of a GPU)")
        for name, amount in self.worker_resources.items():
            if name in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ConfigError(f"runtime.worker_resources: {name!r} is a built-in Ray resource; set CPUs with "
                                  "runtime.worker_cpus and keep worker_resources for custom ones (e.g. rollout_node)")
            if not (isinstance(amount, (int, float)) and 0 < amount < float("inf")):
                raise ConfigError(f"runtime.worker_resources.{name} must be a positive number of units per worker, "
                                  f"got {amount!r}")


@dataclass(frozen=True)
class EvalConfig:
    every_versions: int = 200
    """evaluate on validation seeds every this many learner versions (0: no periodic evaluation); these drive
    train.stop_at_success and every choice, never a reported number"""
    episodes_per_task: int = 20
    """validation-seed episodes per task at each periodic evaluation"""
    test_episodes_per_task: int = 100
    """test-seed episodes per task at the version-0 and the final evaluation: the run's reported numbers"""
    test_at_start: bool = True
    """evaluate version 0 on test seeds too, so the summary shows what RL added beside what the warm start had"""
    train_instructions: bool = False
    """also evaluate with the train paraphrases (cells <task>/<split>/train_instr); reports use held-out ones"""
    num_envs: int = 8
    """envs stepped together during evaluation, per env group"""
    groups: int = 2
    """env groups per evaluation cell, each on its own thread with the cell's seeds dealt round-robin: one group's
    simulator steps while another's batch is in the policy (1 = one group, the previous behaviour)"""
    video: bool = True
    """log one evaluation episode per task as a TensorBoard video"""
    background: bool = False
    """run the periodic validation evaluations on a thread beside the loop, which keeps training meanwhile (one at a
    time: a due evaluation waits while one runs); off, each pauses the loop. Version 0 and the final run in place"""

    def __post_init__(self) -> None:
        if self.every_versions < 0 or min(self.episodes_per_task, self.test_episodes_per_task, self.groups) <= 0:
            raise ConfigError("eval.every_versions must be >= 0 and eval.episodes_per_task / "
                              "eval.test_episodes_per_task / eval.groups positive")

    @property
    def instructions(self) -> tuple[str, ...]:
        """paraphrase sets evaluated: held-out always, train paraphrases when train_instructions"""
        return ("heldout", "train") if self.train_instructions else ("heldout",)


@dataclass(frozen=True)
class TrainConfig:
    max_wall_s: float = 600.0
    """stop after this much wall-clock time (seconds, RL phase)"""
    max_env_steps: int = 0
    """stop after this many simulator env steps (0: no limit)"""
    max_versions: int = 0
    """stop after this many learner versions (0: no limit); the learner itself takes no batch past it, so a run
    overshoots by at most one update's optimizer steps however slowly the driver polls"""
    job_max_wall_s: float = 0.0
    """the whole job's wall-clock budget in seconds, warm start and evaluations included (0 = none): the RL phase
    ends early enough for the final evaluations to fit, their time estimated from version 0's (a resumed run counts
    from its own start). summary.json's `stop_reason` and `phase_wall_s` say what ended RL and where the time went"""
    stop_at_success: float = 0.0
    """stop once a periodic evaluation (eval.every_versions, validation seeds) reaches this held-out success on
    every task (0 = off); `acce bench wm` uses it to measure env steps to a success level"""
    init_from: str = ""
    """start from this checkpoint's policy weights and normalization (e.g. a shared warm start) at version 0;
    '' = build a new policy (and run the bc warm start if configured)"""
    final_eval: bool = True
    """evaluate on test seeds at the end, and version 0 first (eval.test_at_start); benchmarks that only measure
    throughput turn it off"""
    select_on_val: bool = False
    """early stopping on validation seeds: the final test evaluation, summary.json's `test` block and
    checkpoints/selected.pt use the version with the best mean validation success among the periodic evaluations
    (version 0 included, the later one on ties) instead of the last version; test seeds never take part in the
    choice. Needs eval.every_versions > 0. checkpoints/latest.pt stays the last version (resume continues from it)"""
    checkpoint_every_versions: int = 200
    """write an atomic checkpoint this often (and always at the end)"""
    log_every_s: float = 5.0
    """TensorBoard scalar period"""

    def __post_init__(self) -> None:
        for name in ("max_wall_s", "max_env_steps", "max_versions", "job_max_wall_s", "stop_at_success"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name} must be >= 0 (0 = no limit), got {getattr(self, name)}")


@dataclass(frozen=True)
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    """run name, output folder, seed"""
    env: EnvConfig = field(default_factory=EnvConfig)
    """simulated tasks and observation format"""
    collect: CollectConfig = field(default_factory=CollectConfig)
    """`acce collect`: recording scripted-expert episodes to the episode store"""
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    """a LeRobotDataset's keys, image size and action units (`acce collect --import-lerobot`)"""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """the VLA policy network"""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """rollout workers: segments, execution horizon, task sampling"""
    delay: DelayConfig = field(default_factory=DelayConfig)
    """simulated inference latency"""
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    """the off-policy-corrected actor-critic learner"""
    bc: BCConfig = field(default_factory=BCConfig)
    """behavior-cloning warm start from scripted demos"""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """where roles run and in which schedule"""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """periodic evaluation on validation seeds; version-0 and final evaluation on test seeds"""
    train: TrainConfig = field(default_factory=TrainConfig)
    """budgets and checkpoint cadence"""
    wm: WMConfig = field(default_factory=WMConfig)
    """world model: size, ensemble, imagination horizon and gate, training"""
    imagination: ImaginationConfig = field(default_factory=ImaginationConfig)
    """imagination workers, the online world-model trainer, and the imagined share of learner batches"""

    def __post_init__(self) -> None:
        if self.rollout.execution_horizon > self.policy.chunk_len:
            raise ConfigError(f"rollout.execution_horizon={self.rollout.execution_horizon} exceeds policy.chunk_len="
                              f"{self.policy.chunk_len}; a chunk must cover the horizon")
        if self.rollout.execution_horizon + self.policy.max_delay_steps > self.policy.chunk_len:
            raise ConfigError(f"policy.chunk_len={self.policy.chunk_len} must cover rollout.execution_horizon + "
                              f"policy.max_delay_steps = {self.rollout.execution_horizon + self.policy.max_delay_steps}"
                              "; raise policy.chunk_len or lower the execution horizon / max delay")
        if self.bc.random_delay_steps > self.policy.max_delay_steps:
            raise ConfigError(f"bc.random_delay_steps={self.bc.random_delay_steps} exceeds policy.max_delay_steps="
                              f"{self.policy.max_delay_steps}, the longest committed prefix the policy reads")
        if self.learner.batch_segments > self.runtime.queue_capacity:
            raise ConfigError(f"learner.batch_segments={self.learner.batch_segments} can never fill "
                              f"runtime.queue_capacity={self.runtime.queue_capacity}; raise the capacity")
        if self.train.stop_at_success > 0 and not self.eval.every_versions:
            raise ConfigError("train.stop_at_success needs periodic evaluation: set eval.every_versions > 0")
        if self.train.select_on_val and not self.eval.every_versions:
            raise ConfigError("train.select_on_val chooses among periodic validation evaluations: set "
                              "eval.every_versions > 0 (or train.select_on_val=false)")
        if not 0.0 <= self.train.stop_at_success <= 1.0:
            raise ConfigError(f"train.stop_at_success must be in [0, 1], got {self.train.stop_at_success}")
        # tasks without aux labels (none today) get aux_input turned off when training starts (wiring.fit_aux)
        if self.policy.aux_input and not self.bc.aux_loss_coef > 0 and all(map(has_aux_labels, self.env.tasks)):
            raise ConfigError("policy.aux_input feeds the aux head's position estimate to the policy, which only the "
                              "aux loss teaches: set bc.aux_loss_coef > 0 (e.g. 1.0) or policy.aux_input=false")
        rl_log_std = self.learner.rl_log_std
        if rl_log_std is not None and not self.policy.min_log_std <= rl_log_std <= self.policy.max_log_std:
            raise ConfigError(f"learner.rl_log_std={rl_log_std} is outside the policy's clamp [policy.min_log_std, "
                              f"policy.max_log_std] = [{self.policy.min_log_std}, {self.policy.max_log_std}]")
        lo, hi = self.policy.min_log_std, self.policy.max_log_std
        bad = [v for v in self.learner.rl_log_std_per_dim if not lo <= v <= hi]
        if bad:
            raise ConfigError(f"learner.rl_log_std_per_dim has {bad} outside the policy's clamp [policy.min_log_std, "
                              f"policy.max_log_std] = [{self.policy.min_log_std}, {self.policy.max_log_std}]")
        if self.learner.train_scope == "residual" and not self.policy.residual_hidden:
            raise ConfigError("learner.train_scope=residual trains the RL residual head: set policy.residual_hidden > 0 "
                              "(e.g. 256)")
        if self.policy.critic == "privileged" and not self.learner.recompute_values:
            raise ConfigError("policy.critic=privileged needs learner.recompute_values=true: actors stamp no "
                              "privileged value, the learner computes it from the segments' obs['aux']")
        unlabelled = [t for t in self.env.tasks if not has_aux_labels(t)]
        if self.policy.critic == "privileged" and unlabelled:
            raise ConfigError(f"policy.critic=privileged reads the sim's privileged labels (obs['aux']); {unlabelled} "
                              "have none: use policy.critic=trunk")
        check_task_weights("bc.task_weights", self.bc.task_weights, self.env.tasks)
        if [t for t in self.learner.anchor_tasks if not is_known_task(t)]:
            raise ConfigError(f"learner.anchor_tasks names unknown task(s) {list(self.learner.anchor_tasks)}; "
                              f"known: {list(KNOWN_TASKS)} or metaworld/<name>")
        if self.rollout.min_task_share * len(self.env.tasks) > 1.0 + 1e-9:
            raise ConfigError(f"rollout.min_task_share={self.rollout.min_task_share} over {len(self.env.tasks)} tasks "
                              f"exceeds 1; use at most {1.0 / len(self.env.tasks):.3g}")
        check_imagination(self)


def load(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    return load_config(Config, path, overrides)
