"""The vision-language-action policy: observations (+ committed prefix, delay) -> Gaussian action chunk and value.

Token sequence fed to the fusion trunk (a transformers BertModel over `inputs_embeds`), T = C*G*G + 4 (+ 1 + M):

    [ image: C cameras x G x G, camera-major | lang | state | q_action | q_value | delay | prefix_0 … prefix_{M-1} ]

Image tokens are the vision encoder's pooled feature map projected to the trunk width plus a factorized 2-D grid
embedding; BERT's absolute position embedding gives every slot (and so every camera) its own identity. The trunk
outputs at the two query slots feed the action-mean head (H*A) and the value head.

Delay-aware input (docs/design.md §5): the committed prefix (actions the robot executes while this call is in flight)
enters as one token per action, only the first d valid, plus a learned delay token; the attention mask hides
everything else. At d = 0 every one of these tokens is masked, so the outputs are bit-identical to the plain case
(prefix=None is exactly "zeros, d = 0"). The tokens sit after the queries so masking never shifts a position.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from acce.policy import gaussian
from acce.policy.config import PolicyConfig
from acce.policy.critic import PrivilegedCritic
from acce.policy.inputs import DELAY_KEY, LANG_KEY, PREFIX_KEY, policy_inputs  # noqa: F401 (re-exported)
from acce.policy.language import LanguageEncoder, make_language_encoder
from acce.policy.norm import NormStats
from acce.policy.state_check import state_dict_mismatch
from acce.policy.vision import VisionEncoder
from acce.types import AUX_KEY, IMAGE_PREFIX, STATE_KEY, EnvSpec


def derived_env_spec(state: Mapping[str, Any], image_size: int | None) -> EnvSpec | None:
    """The env spec of a policy state saved before specs travelled with policies: widths and cameras from the
    state, representation, rate and action scale from its normalization's action_repr (every checkpoint
    `acce train` wrote has them), image size from the run's config. None when the state does not say enough (a
    policy built by hand, without a control rate): such a policy still loads and acts, it just has no spec."""
    repr_ = dict(state["norm"].get("action_repr") or {})
    if image_size is None or not repr_.get("control_hz"):
        return None
    return EnvSpec(int(state["state_dim"]), int(state["action_dim"]), str(repr_.get("type") or "normalized"),
                   float(repr_["control_hz"]), tuple(state.get("cameras", ("front",))), int(image_size),
                   float(repr_.get("max_step_m", 0.0)))


class VLAPolicy(nn.Module):
    """Images + instruction embedding + proprioception (+ committed prefix, delay) -> chunk mean, log-std, value."""

    def __init__(self, config: PolicyConfig, state_dim: int, action_dim: int, norm: NormStats | None,
                 cameras: Sequence[str] = ("front",), *, vision_config: dict[str, Any] | None = None,
                 aux_dim: int = 0, privileged_dim: int = 0, env_spec: EnvSpec | None = None) -> None:
        """`cameras`: names of the image/<camera> keys the policy reads. `vision_config`: the backbone's stored
        transformers config (checkpoints pass it so no pretrained folder is needed to rebuild the network).
        `aux_dim`: width of the perception auxiliary head (privileged object/goal positions, BC only; 0 = none).
        `privileged_dim`: width of obs["aux"] the privileged critic reads (policy.critic=privileged).
        `env_spec`: the env the policy is for (widths and cameras must agree); it travels with the policy_state."""
        super().__init__()
        if not isinstance(config, PolicyConfig):
            raise ValueError(f"VLAPolicy needs a PolicyConfig, got {type(config).__name__}")
        if not isinstance(norm, NormStats):
            raise ValueError("VLAPolicy needs normalization statistics (NormStats); compute them with "
                             "NormStats.from_states(states) from the demonstration/episode store")
        if aux_dim < 0:
            raise ValueError(f"aux_dim must be >= 0, got {aux_dim}")
        if state_dim <= 0 or action_dim <= 0:
            raise ValueError(f"state_dim and action_dim must be positive, got {state_dim} and {action_dim}")
        if norm.state_dim != state_dim:
            raise ValueError(f"normalization statistics are for state_dim={norm.state_dim}, the policy has "
                             f"state_dim={state_dim}; recompute them on this env's states")
        if "dim" in norm.action_repr and int(norm.action_repr["dim"]) != action_dim:
            raise ValueError(f"norm.action_repr says dim={norm.action_repr['dim']}, the policy has "
                             f"action_dim={action_dim}")
        if [float(v) for v in norm.action_repr.get("range", (-1.0, 1.0))] != [-1.0, 1.0]:
            raise ValueError(f"norm.action_repr range is {norm.action_repr['range']}; policy actions are normalized to "
                             "[-1, 1] (docs/design.md §3): map physical ranges in the env, not in the policy")
        if not cameras or len(set(cameras)) != len(cameras):
            raise ValueError(f"cameras must be a non-empty list of distinct names, got {list(cameras)}")
        if env_spec is not None and (env_spec.state_dim, env_spec.action_dim, env_spec.cameras) != (
                state_dim, action_dim, tuple(sorted(cameras))):
            raise ValueError(f"the env spec has state {env_spec.state_dim} / action {env_spec.action_dim} / cameras "
                             f"{list(env_spec.cameras)}, the policy {state_dim} / {action_dim} / {sorted(cameras)}")
        self.env_spec = env_spec
        self.config = config
        self.state_dim, self.action_dim, self.norm = int(state_dim), int(action_dim), norm
        self.aux_dim, self.privileged_dim = int(aux_dim), int(privileged_dim)
        self.aux_norm: tuple[np.ndarray, np.ndarray] | None = None
        """(mean, std) (P,) the aux head's targets were standardized with in cloning (set_aux_norm; saved)"""
        self._residual_aux = bool(config.residual_hidden and config.residual_reads_aux and config.aux_input
                                  and self.aux_dim and config.aux_from == "keypoints")
        self.cameras = tuple(sorted(cameras))  # same order as acce.types.image_keys
        self.image_keys = tuple(IMAGE_PREFIX + c for c in self.cameras)
        self._language: LanguageEncoder | None = None
        self.amp = False
        """bf16 autocast of the encoder and trunk (CUDA only; set by acce.device.place, not saved with the policy)"""
        self.frozen_backend = None
        """serving only: a callable inputs -> frozen outputs run instead of vision + trunk (acce.policy.onnx_frozen)"""

        width, grid, horizon, m = config.trunk_width, config.image_grid, config.chunk_len, config.max_delay_steps
        self.num_image_tokens = len(self.cameras) * config.image_tokens_per_camera
        self.num_tokens = config.num_tokens(len(self.cameras))
        self.vision = VisionEncoder(config, vision_config)
        self.image_proj = nn.Linear(self.vision.out_channels, width)
        self.grid_row = nn.Parameter(torch.randn(grid, 1, width) * 0.02)  # factorized 2-D position: row + column
        self.grid_col = nn.Parameter(torch.randn(1, grid, width) * 0.02)
        if config.keypoints > 0:  # keypoint token = its (x, y) projected + which keypoint it is
            self.keypoint_proj = nn.Linear(2, width)
            self.keypoint_embed = nn.Parameter(torch.randn(config.keypoints, width) * 0.02)
        self.lang_proj = nn.Linear(config.lang_dim, width)
        if config.keypoints > 0 and config.keypoint_language:
            self.keypoint_film = nn.Sequential(nn.LayerNorm(config.lang_dim),
                                               nn.Linear(config.lang_dim, 2 * self.vision.keypoint_channels))
            nn.init.normal_(self.keypoint_film[1].weight, std=1e-3)
            nn.init.zeros_(self.keypoint_film[1].bias)
        # FiLM of every image token by the instruction (as RT-1 does): without it the trunk ignored the language
        # token (docs/decisions.md, "Language conditioning by FiLM")
        self.lang_film = nn.Sequential(nn.LayerNorm(config.lang_dim), nn.Linear(config.lang_dim, 2 * width))
        # near-identity start (small, not zero: a zero matrix would stop every gradient to the LayerNorm)
        nn.init.normal_(self.lang_film[1].weight, std=1e-3)
        nn.init.zeros_(self.lang_film[1].bias)
        if config.aux_input and not self.aux_dim:
            raise ValueError("policy.aux_input needs a policy with aux targets (aux_dim > 0; set bc.aux_loss_coef > 0)")
        self.state_proj = nn.Linear(state_dim + (self.aux_dim if config.aux_input else 0), width)
        self.queries = nn.Parameter(torch.randn(2, width) * 0.02)  # (action, value)
        if m > 0:
            self.delay_embed = nn.Embedding(m, width)  # row d-1 for delay d >= 1; d = 0 is masked out anyway
            self.prefix_proj = nn.Linear(action_dim, width)
        self.trunk = self._build_trunk(config, self.num_tokens)
        out = horizon * action_dim
        self.mean_head = (nn.Sequential(nn.LayerNorm(width), nn.Linear(width, config.mean_hidden), nn.GELU(),
                                        nn.Linear(config.mean_hidden, out)) if config.mean_hidden else nn.Linear(width, out))
        if self.aux_dim:  # predicts the standardized aux targets; trained by BC only (never an input)
            self.aux_head = (nn.Linear(width, self.aux_dim) if config.aux_from == "trunk" else nn.Sequential(
                nn.Linear(2 * config.keypoints * len(self.cameras), config.value_hidden), nn.GELU(),
                nn.Linear(config.value_hidden, self.aux_dim)))
        self.value_head = PrivilegedCritic(self.privileged_dim, state_dim, config.lang_dim, m * action_dim,
                                           config.value_hidden) if config.critic == "privileged" else nn.Sequential(
            nn.LayerNorm(width), nn.Linear(width, config.value_hidden), nn.GELU(), nn.Linear(config.value_hidden, 1))
        # Near-zero initial mean: the first policy explores around "do nothing" instead of a random bias.
        last = self.mean_head[-1] if config.mean_hidden else self.mean_head
        nn.init.normal_(last.weight, std=0.01)
        nn.init.zeros_(last.bias)
        if config.residual_hidden:  # zero output at start: version 0 acts exactly as the warm start
            extra = (self.aux_dim if self._residual_aux else 0) + (config.lang_dim if config.residual_reads_lang else 0)
            self.residual = nn.Sequential(nn.Linear(width + state_dim + extra, config.residual_hidden), nn.GELU(),
                                          nn.Linear(config.residual_hidden, out))
            nn.init.zeros_(self.residual[-1].weight)
            nn.init.zeros_(self.residual[-1].bias)
        self.log_std = nn.Parameter(torch.full((horizon, action_dim), float(config.init_log_std)))
        # Derived from `norm`, which policy_state() stores on its own: one source of truth, so not persistent.
        self.register_buffer("state_mean", torch.from_numpy(norm.state_mean.copy()), persistent=False)
        self.register_buffer("state_std", torch.from_numpy(norm.state_std.copy()), persistent=False)

    @staticmethod
    def _build_trunk(config: PolicyConfig, num_tokens: int) -> nn.Module:
        from transformers import BertConfig, BertModel

        trunk = BertModel(BertConfig(
            vocab_size=1, hidden_size=config.trunk_width, num_hidden_layers=config.trunk_layers,
            num_attention_heads=config.trunk_heads, intermediate_size=config.trunk_mlp_ratio * config.trunk_width,
            max_position_embeddings=num_tokens, type_vocab_size=1,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),  # no dropout: actor and learner agree
            add_pooling_layer=False)
        # Only inputs_embeds are used; the (1-row) word embedding never sees a gradient, so it is not trained.
        trunk.embeddings.word_embeddings.requires_grad_(False)
        return trunk

    # --- inputs ---------------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.log_std.device

    @property
    def language_encoder(self) -> LanguageEncoder:
        if self._language is None:
            self._language = make_language_encoder(self.config.language)
        return self._language

    def embed(self, instructions: Sequence[str]) -> np.ndarray:
        """Instruction strings -> (N, 384) float32, cached per instruction (MiniLM loads once per process)."""
        return self.language_encoder.encode(list(instructions))

    def with_lang(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        """An env batch {"image/*", "state", "instruction": list[str]} plus batch["lang"] (its embeddings)."""
        if "instruction" not in obs:
            raise ValueError("observation batch has no 'instruction' to embed")
        return {**obs, LANG_KEY: self.embed(list(obs["instruction"]))}

    def _inputs(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Validate a batch and return its tensors on the policy's device (acce.policy.inputs)."""
        return policy_inputs(self, batch)

    # --- network --------------------------------------------------------------------------------------------
    def forward(self, batch: Mapping[str, Any], return_aux: bool = False) -> tuple[torch.Tensor, ...]:
        """batch -> (mean (B, H, A), log_std (H, A) clamped, value (B,)), plus the aux head's prediction (B, P) when
        return_aux (the policy must have been built with aux_dim > 0)."""
        feats = self.features(batch, return_aux)
        mean, log_std, value = self.heads(feats)
        return (mean, log_std, value, feats["aux"]) if return_aux else (mean, log_std, value)

    def features(self, batch: Mapping[str, Any], return_aux: bool = False) -> dict[str, Any]:
        """The expensive part (vision + trunk): what the heads read, per row. With learner.train_scope=residual the
        learner computes it once per update and every minibatch reuses it (`heads`). With `amp` it runs under bf16
        autocast and hands float32 on: the heads, log-probs and importance ratios stay float32."""
        if not self.amp:
            return self._features(batch, return_aux)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            feats = self._features(batch, return_aux)
        return {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in feats.items()}

    def _features(self, batch: Mapping[str, Any], return_aux: bool) -> dict[str, Any]:
        x = self._inputs(batch)
        if self.frozen_backend is not None and not return_aux and not torch.is_grad_enabled():  # serving only
            return self._with_inputs(x, self.frozen_backend(x))
        return self._with_inputs(x, self.frozen_outputs(x, return_aux))

    def frozen_outputs(self, x: Mapping[str, torch.Tensor], return_aux: bool = False) -> dict[str, Any]:
        """Vision + trunk on validated inputs (`_inputs`): the FROZEN_KEYS entries of `features`."""
        if return_aux and not self.aux_dim:
            raise ValueError("this policy has no aux head (aux_dim=0); build it with aux_dim > 0 to predict aux targets")
        b, cams, grid = x[STATE_KEY].shape[0], len(self.image_keys), self.config.image_grid
        images = torch.cat([x[k] for k in self.image_keys]) if cams > 1 else x[self.image_keys[0]]  # (C*B, H, W, 3)
        film = None
        if self.config.keypoints > 0 and self.config.keypoint_language:  # one (gamma, beta) per image, camera-major
            film = self.keypoint_film(x[LANG_KEY]).repeat(cams, 1).chunk(2, dim=-1)
        grid_feats, points = self.vision(images, film)
        feats = self.image_proj(grid_feats) + (self.grid_row + self.grid_col).reshape(grid * grid, -1)  # (C*B, G*G, W)
        if points is not None:  # (C*B, K, 2) -> K more tokens per camera
            feats = torch.cat([feats, self.keypoint_proj(points) + self.keypoint_embed], 1)
        per_cam = self.config.image_tokens_per_camera
        image_tokens = feats.reshape(cams, b, per_cam, -1).transpose(0, 1).reshape(b, self.num_image_tokens, -1)
        state = (x[STATE_KEY] - self.state_mean) / self.state_std  # (B, S) normalized
        aux = None
        if self.aux_dim and self.config.aux_from == "keypoints" and (return_aux or self.config.aux_input
                                                                     or self._residual_aux):
            aux = self.aux_head(points.reshape(cams, b, -1).transpose(0, 1).reshape(b, -1))  # (B, P) standardized
            if self.config.aux_input:
                state = torch.cat([state, aux], dim=-1)
        gamma, beta = self.lang_film(x[LANG_KEY]).chunk(2, dim=-1)  # (B, W) each
        image_tokens = image_tokens * (1.0 + gamma[:, None]) + beta[:, None]
        parts = [image_tokens, self.lang_proj(x[LANG_KEY])[:, None], self.state_proj(state)[:, None],
                 self.queries.expand(b, -1, -1)]
        mask = torch.ones(b, self.num_tokens, dtype=torch.long, device=self.device)
        if self.config.max_delay_steps > 0:
            delay = x[DELAY_KEY]  # (B,)
            parts += [self.delay_embed((delay - 1).clamp(min=0))[:, None], self.prefix_proj(x[PREFIX_KEY])]
            m = self.config.max_delay_steps
            mask[:, -m - 1] = (delay > 0).long()  # the delay token
            mask[:, -m:] = (torch.arange(m, device=self.device)[None] < delay[:, None]).long()  # first d prefix rows
        layers = self.config.aux_layer  # hidden_states = (embeddings, layer 0, layer 1, ...)
        trunk_out = self.trunk(inputs_embeds=torch.cat(parts, 1), attention_mask=mask,
                               output_hidden_states=return_aux and layers != -1 and self.config.aux_from == "trunk")
        hidden = trunk_out.last_hidden_state  # (B, T, W)
        query = self.num_image_tokens + 2
        if return_aux and aux is None:  # aux_from == "trunk"
            aux = self.aux_head((hidden if layers == -1 else trunk_out.hidden_states[
                layers + 1 if layers >= 0 else layers])[:, query])
        return {"h_action": hidden[:, query], "h_value": hidden[:, query + 1], "aux": aux}

    def _with_inputs(self, x: Mapping[str, Any], frozen: Mapping[str, Any]) -> dict[str, Any]:
        return {**frozen, "state": (x[STATE_KEY] - self.state_mean) / self.state_std, "lang": x[LANG_KEY],
                "privileged": x.get(AUX_KEY), "prefix": x.get(PREFIX_KEY), "delay": x.get(DELAY_KEY)}

    def features_from(self, batch: Mapping[str, Any], frozen: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """features(batch) with the trunk outputs (acce.policy.frozen.FROZEN_KEYS) given instead of computed: what
        a learner does with the features the inference server shipped (no vision, no trunk)."""
        return self._with_inputs(self._inputs(batch), {"aux": None, **frozen})

    def heads(self, f: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """features(batch) (or rows of it) -> (mean (B, H, A), log_std (H, A) clamped, value (B,))."""
        shape = (-1, self.config.chunk_len, self.action_dim)
        mean = self.mean_head(f["h_action"]).view(shape)  # (B, H, A)
        if self.config.residual_hidden:  # RL's correction on the cloned head, from frozen features
            parts = [f["h_action"].detach(), f["state"]] + ([f["aux"].detach()] if self._residual_aux else []) + (
                [f["lang"]] if self.config.residual_reads_lang else [])
            mean = mean + self.residual(torch.cat(parts, -1)).view(shape)
        value = self.value(f)
        log_std = self.log_std.clamp(self.config.min_log_std, self.config.max_log_std)  # (H, A)
        return mean, log_std, value

    def value(self, f: Mapping[str, Any]) -> torch.Tensor:
        """(B,) the critic on features(batch); the privileged one reads no trunk output: features_from(batch, {})."""
        if self.config.critic == "privileged":
            return self.value_head(f["privileged"], f["state"], f["lang"], f["prefix"], f["delay"],
                                   self.config.max_delay_steps)
        return self.value_head(f["h_value"].detach() if self.config.value_stop_gradient else f["h_value"]).squeeze(-1)

    @torch.no_grad()
    def act(self, batch: Mapping[str, Any], deterministic: bool = False,
            generator: torch.Generator | None = None, return_features: bool = False) -> dict[str, Any]:
        """Sample a chunk. Returns chunk (B, H, A) raw Gaussian sample (clip to [-1, 1] only when executing), mean,
        value (B,), log_std (H, A) and logp_steps (B, H): per-position log-density, so the actor can sum exactly the
        executed span once it is known. return_features: also "features", the features(batch) the heads read."""
        feats = self.features(batch)
        mean, log_std, value = self.heads(feats)
        if deterministic:
            chunk = mean.clone()
        else:
            noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
            chunk = mean + log_std.exp() * noise
        return {"chunk": chunk, "mean": mean, "value": value, "log_std": log_std,
                "logp_steps": self.log_prob_steps(mean, log_std, chunk), **({"features": feats} if return_features
                                                                            else {})}

    def evaluate(self, batch: Mapping[str, Any], chunk: torch.Tensor, mask: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Learner view (with gradients): (log_prob (B,), entropy (B,), value (B,)) over positions where mask."""
        mean, log_std, value = self(batch)
        chunk = torch.as_tensor(chunk, device=self.device)
        mask = torch.as_tensor(mask, device=self.device)
        return self.log_prob(mean, log_std, chunk, mask), self.entropy(log_std, mask), value

    # --- Gaussian math (static: the learner can use it on stored means; acce.policy.gaussian) -----------------
    log_prob_steps = staticmethod(gaussian.log_prob_steps)
    log_prob = staticmethod(gaussian.log_prob)
    entropy = staticmethod(gaussian.entropy)

    # --- state: checkpoints and weight publishing ------------------------------------------------------------
    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """A snapshot (cloned tensors) of what training changes: parameters with requires_grad plus persistent
        buffers (e.g. frozen BatchNorm statistics), i.e. what weight publishing must send."""
        names = {n for n, p in self.named_parameters() if p.requires_grad} | {n for n, _ in self.named_buffers()}
        return {k: v.detach().clone() for k, v in self.state_dict().items() if k in names}

    def load_trainable(self, state: Mapping[str, Any], allow_subset: bool = False) -> None:
        """Load a trainable_state_dict() snapshot; all keys and shapes are checked before anything is written.
        allow_subset: missing keys are fine (an inference server: a learner that froze part of the policy,
        learner.train_scope, publishes only the rest, and every actor holds the same version-0 frozen weights)."""
        expected = self.trainable_state_dict()
        if allow_subset:
            expected = {k: v for k, v in expected.items() if k in state}
        problem = state_dict_mismatch(expected, state)
        if problem:
            raise ValueError(f"trainable weights do not match this policy ({problem}); were they published by a "
                             "policy with the same config, state_dim, action_dim and cameras?")
        self.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()}, strict=False)

    def set_aux_norm(self, mean: Any, std: Any) -> None:
        """Keep the aux targets' standardization (cloning's), so RL's aux loss (learner.aux_coef) uses the same."""
        mean, std = (np.asarray(v, np.float32).reshape(-1) for v in (mean, std))
        if mean.shape != (self.aux_dim,) or std.shape != mean.shape or not np.all(std > 0):
            raise ValueError(f"aux statistics must be ({self.aux_dim},) with std > 0, got {mean.shape} / {std.shape}")
        self.aux_norm = (mean, std)

    def policy_state(self) -> dict[str, Any]:
        """Everything needed to rebuild this policy offline: plain dict for torch.save / checkpoints."""
        return {"config": dataclasses.asdict(self.config), "state_dim": self.state_dim, "action_dim": self.action_dim,
                "aux_dim": self.aux_dim, "privileged_dim": self.privileged_dim,
                "aux_norm": None if self.aux_norm is None else [v.tolist() for v in self.aux_norm],
                "cameras": list(self.cameras), "norm": self.norm.to_dict(),
                "env_spec": self.env_spec.to_dict() if self.env_spec is not None else None,
                "vision_config": self.vision.backbone_config(),
                "state_dict": {k: v.detach().cpu().clone() for k, v in self.state_dict().items()}}

    @classmethod
    def from_state(cls, state: Mapping[str, Any], image_size: int | None = None) -> "VLAPolicy":
        """Rebuild a policy from policy_state(); ValueError when norm stats are missing/malformed or shapes differ.
        image_size: the run's env.image_size, from which the env spec of a state saved without one is derived."""
        if not isinstance(state, Mapping):
            raise ValueError(f"policy state must be a dict from VLAPolicy.policy_state(), got {type(state).__name__}")
        if state.get("norm") is None:
            raise ValueError("checkpoint has no normalization statistics; it cannot be used (actions would be "
                             "computed on unnormalized states). Save it with VLAPolicy.policy_state(), which "
                             "includes them, or rebuild the policy with NormStats.from_states(states)")
        norm = NormStats.from_dict(state["norm"])
        missing = [k for k in ("config", "state_dim", "action_dim", "state_dict") if k not in state]
        if missing:
            raise ValueError(f"policy state lacks {missing}; save it with VLAPolicy.policy_state()")
        known = {f.name for f in dataclasses.fields(PolicyConfig)}
        unknown = sorted(set(state["config"]) - known)
        if unknown:
            raise ValueError(f"policy state's config has unknown fields {unknown}; was it saved by a newer acce?")
        # policies saved before policy.residual_reads_aux existed have a residual that reads no aux estimate
        saved = {"residual_reads_aux": False, **state["config"]}
        if saved.get("vision_norm") == "group" and saved.get("vision_pretrained_dir"):
            saved["vision_pretrained_dir"] = ""  # saved before vision_norm's rule: rebuilt as it ran (GroupNorm)
        config = PolicyConfig(**saved)
        with torch.random.fork_rng(devices=[]):  # building draws init weights; do not disturb the caller's RNG
            policy = cls(config, int(state["state_dim"]), int(state["action_dim"]), norm,
                         tuple(state.get("cameras", ("front",))), vision_config=state.get("vision_config"),
                         aux_dim=int(state.get("aux_dim", 0)), privileged_dim=int(state.get("privileged_dim", 0)),
                         env_spec=EnvSpec.from_dict(state["env_spec"]) if state.get("env_spec") is not None
                         else derived_env_spec(state, image_size))
        problem = state_dict_mismatch(policy.state_dict(), state["state_dict"])
        if problem:
            raise ValueError(f"checkpoint weights do not match the policy its config describes ({problem})")
        policy.load_state_dict({k: torch.as_tensor(v) for k, v in state["state_dict"].items()})
        if state.get("aux_norm") is not None:
            policy.set_aux_norm(*state["aux_norm"])
        return policy

    def num_parameters(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)
