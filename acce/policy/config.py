"""Schema of the vision-language-action policy (docs/design.md §3, §5).

Imported by `acce.config`, so it must stay light: no torch, no transformers. The network itself is built from
these values in `acce.policy.vla`.
"""
from __future__ import annotations

from dataclasses import dataclass

from acce.configlib import ConfigError

VISION_KINDS = ("resnet", "vit", "siglip")
"""vision encoders: a transformers ResNetModel, ViTModel or SiglipVisionModel built from a config (or loaded from a
local dir)"""
VISION_NORMS = ("auto", "group", "frozen_batch")
"""values of policy.vision_norm"""
LANGUAGE_KINDS = ("minilm", "hash")
"""instruction encoders: frozen all-MiniLM-L6-v2 (default) or deterministic hash vectors (tests, fallback)"""
LANG_DIM = 384
"""width of an instruction embedding (all-MiniLM-L6-v2's sentence embedding; hash vectors match it)"""


@dataclass(frozen=True)
class PolicyConfig:
    chunk_len: int = 8
    """H: actions per chunk returned by one policy call"""
    max_delay_steps: int = 4
    """length of the committed-prefix input: the largest inference delay d (control steps) the policy accepts"""
    vision: str = "resnet"
    """vision encoder: 'resnet' (transformers ResNetModel), 'vit' (transformers ViTModel) or 'siglip' (the vision
    tower of a transformers SiglipVisionModel, as VLAs such as openpi's use; no CLS token, no pooling head)"""
    vision_pretrained_dir: str = ""
    """local folder with a saved ResNetModel/ViTModel/SiglipVisionModel (save_pretrained layout) to start from; '' =
    build the encoder described below from its config with random weights (never downloads). A pretrained ResNet
    keeps its own BatchNorm (see vision_norm)"""
    freeze_vision: bool = False
    """keep the vision encoder's weights fixed (useful with a pretrained encoder); they are then not published"""
    resnet_hidden_sizes: tuple[int, ...] = (16, 32, 64)
    """channels of the ResNet stages (each stage after the first halves the resolution); the stem has the first"""
    resnet_depths: tuple[int, ...] = (1, 1, 1)
    """basic residual blocks per ResNet stage, one entry per stage"""
    vit_width: int = 64
    """ViT hidden size (vision='vit' or 'siglip')"""
    vit_layers: int = 2
    """ViT transformer layers (vision='vit' or 'siglip')"""
    vit_heads: int = 4
    """ViT attention heads (vision='vit' or 'siglip'); must divide vit_width"""
    vit_patch_size: int = 16
    """ViT patch side in pixels (vision='vit' or 'siglip'); 64x64 images give a 4x4 patch grid"""
    image_grid: int = 4
    """each camera contributes image_grid x image_grid tokens: the encoder's feature map is average-pooled to it"""
    vision_norm: str = "auto"
    """normalization inside the ResNet: 'group' (its BatchNorms become GroupNorms, per-sample statistics: right for
    an encoder trained from scratch), 'frozen_batch' (BatchNorm with fixed statistics: right for pretrained weights,
    whose statistics mean something) or 'auto' (the rule: frozen_batch when vision_pretrained_dir is set, else
    group). 'group' with a pretrained dir is refused: it would throw away the encoder's trained normalization.
    Never batch statistics: they would make a log-prob depend on the rest of its batch. ViT/SigLIP: LayerNorm,
    unaffected"""
    keypoints: int = 0
    """spatial-softmax keypoints per camera (0 = off): a 1x1 conv turns the feature map of ResNet stage
    `keypoint_stage` into this many heatmaps, each reduced to its expected (x, y) image position and fed to the
    trunk as one extra token. Sub-cell object positions from few demos (Levine et al. 2016); resnet only"""
    keypoint_language: bool = True
    """FiLM the keypoint stage's features by the instruction before the heatmaps, so a keypoint can be "the object
    the instruction names" rather than a fixed feature"""
    keypoint_stage: int = 0
    """which ResNet stage's output the keypoints read (0 = first stage, the highest resolution: 16x16 at 64 px)"""
    trunk_width: int = 64
    """width of the fusion transformer (a transformers BertModel used as an encoder over the token sequence)"""
    trunk_layers: int = 2
    """transformer layers of the fusion trunk"""
    trunk_heads: int = 4
    """attention heads of the fusion trunk; must divide trunk_width"""
    trunk_mlp_ratio: int = 2
    """feed-forward width of the trunk as a multiple of trunk_width"""
    mean_hidden: int = 0
    """hidden width of an MLP action-mean head on the action query's trunk output (0 = one linear layer)"""
    aux_from: str = "trunk"
    """what the perception auxiliary head reads: 'trunk' (the action query's output at trunk layer aux_layer) or
    'keypoints' (the spatial-softmax keypoints, needs keypoints > 0: positions then come from an explicit, translation-
    equivariant image-coordinate bottleneck, and reach the trunk as keypoint tokens)"""
    aux_input: bool = False
    """also feed the aux head's prediction (the predicted, standardized object/goal positions) into the state token
    beside the proprioception, the way the oracle diagnostic fed true positions; needs aux_from=keypoints (the
    prediction is then a function of the image and instruction alone, computed before the trunk)"""
    aux_layer: int = -1
    """which trunk layer's output (at the action query) the perception auxiliary head reads when the policy has
    aux targets (bc.aux_loss_coef > 0); -1 = the last layer. An earlier layer leaves the later ones to turn the
    predicted positions into actions"""
    value_stop_gradient: bool = True
    """the value head reads the trunk through a stop-gradient, so critic regression cannot rewrite the features the
    actor uses. Measured with a shared trunk: the critic's gradient (norm ~25 vs a clip of 1) dominated every RL
    step and RL fine-tuning lowered a BC policy's reach success from 38 % to 14 %"""
    value_hidden: int = 128
    """hidden width of the value head's MLP (on the value query's trunk output)"""
    residual_hidden: int = 0
    """RL residual on the cloned action head (0 = off): the chunk mean is the cloned head's plus an MLP of this
    hidden width on the action query's trunk output (read through a stop-gradient) and the normalized
    proprioception; zero-initialised, so version 0 acts exactly as the warm start. With learner.train_scope=residual
    RL trains only it, log_std and the critic (residual RL on a frozen warm start)"""
    residual_reads_aux: bool = True
    """the RL residual also reads the aux head's estimate of the named object's and goal's table xy (policies with
    policy.aux_input): the correction sees where the target is, not only the trunk's summary of it"""
    residual_reads_lang: bool = False
    """the RL residual also reads the instruction embedding itself (lang_dim inputs), so its correction can differ
    between tasks whose frozen features look alike (push and pick_place share a scene)"""
    critic: str = "trunk"
    """value head input: 'trunk' (the value query's trunk output) or 'privileged' (asymmetric: an MLP on the sim's
    privileged object/goal positions obs["aux"], proprioception, instruction and committed prefix; a critic input
    only, so the actor, evaluation, `acce serve` and robots never need privileged state)"""
    language: str = "minilm"
    """instruction encoder: 'minilm' (frozen all-MiniLM-L6-v2, default) or 'hash' (deterministic random vectors:
    fast tests, and a fallback when the MiniLM package is missing; carries no meaning across paraphrases)"""
    init_log_std: float = -0.5
    """initial log standard deviation of the Gaussian over each action dimension and chunk position"""
    min_log_std: float = -5.0
    """lower clamp of the learned log-std (keeps log-probs finite)"""
    max_log_std: float = 1.0
    """upper clamp of the learned log-std (actions live in [-1, 1]; wider noise is wasted)"""

    def __post_init__(self) -> None:
        # YAML and checkpoints give lists; the dataclass is frozen and hashable only with tuples.
        for name in ("resnet_hidden_sizes", "resnet_depths"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
        if self.chunk_len <= 0:
            raise ConfigError(f"policy.chunk_len must be positive, got {self.chunk_len}")
        if not 0 <= self.max_delay_steps <= self.chunk_len:
            raise ConfigError(f"policy.max_delay_steps must be in [0, policy.chunk_len={self.chunk_len}] (a delay of a "
                              f"whole chunk executes none of it), got {self.max_delay_steps}")
        if self.vision not in VISION_KINDS:
            raise ConfigError(f"policy.vision must be one of {list(VISION_KINDS)}, got {self.vision!r}")
        if self.language not in LANGUAGE_KINDS:
            raise ConfigError(f"policy.language must be one of {list(LANGUAGE_KINDS)}, got {self.language!r}")
        if not self.resnet_hidden_sizes or len(self.resnet_hidden_sizes) != len(self.resnet_depths):
            raise ConfigError("policy.resnet_hidden_sizes and policy.resnet_depths need one entry per stage each, got "
                              f"{list(self.resnet_hidden_sizes)} and {list(self.resnet_depths)}")
        if min(self.resnet_hidden_sizes) <= 0 or min(self.resnet_depths) <= 0:
            raise ConfigError("policy.resnet_hidden_sizes and policy.resnet_depths must be positive")
        for name in ("trunk", "vit"):
            width, heads = getattr(self, f"{name}_width"), getattr(self, f"{name}_heads")
            if width <= 0:
                raise ConfigError(f"policy.{name}_width must be positive, got {width}")
            if heads <= 0 or width % heads:
                fit = max(h for h in range(1, max(heads, 1) + 1) if width % h == 0)
                raise ConfigError(f"policy.{name}_heads={heads} must be positive and divide policy.{name}_width="
                                  f"{width}; e.g. policy.{name}_heads={fit}")
        if min(self.trunk_layers, self.vit_layers, self.vit_patch_size, self.image_grid, self.trunk_mlp_ratio) <= 0:
            raise ConfigError("policy.trunk_layers, vit_layers, vit_patch_size, image_grid and trunk_mlp_ratio must "
                              "be positive")
        if not -self.trunk_layers <= self.aux_layer < self.trunk_layers:
            raise ConfigError(f"policy.aux_layer must index a trunk layer, {-self.trunk_layers}..{self.trunk_layers - 1}"
                              f", got {self.aux_layer}")
        if self.aux_from not in ("trunk", "keypoints"):
            raise ConfigError(f"policy.aux_from must be 'trunk' or 'keypoints', got {self.aux_from!r}")
        if self.aux_from == "keypoints" and self.keypoints == 0:
            raise ConfigError("policy.aux_from=keypoints needs policy.keypoints > 0 (e.g. policy.keypoints=4)")
        if self.aux_input and self.aux_from != "keypoints":
            raise ConfigError("policy.aux_input needs policy.aux_from=keypoints (the trunk cannot feed its own input)")
        if self.mean_hidden < 0:
            raise ConfigError(f"policy.mean_hidden must be >= 0 (0 = linear head), got {self.mean_hidden}")
        if self.residual_hidden < 0:
            raise ConfigError(f"policy.residual_hidden must be >= 0 (0 = off), got {self.residual_hidden}")
        if self.critic not in ("trunk", "privileged"):
            raise ConfigError(f"policy.critic must be 'trunk' or 'privileged', got {self.critic!r}")
        if self.value_hidden <= 0:
            raise ConfigError(f"policy.value_hidden must be positive, got {self.value_hidden}")
        if self.vision_norm not in VISION_NORMS:
            raise ConfigError(f"policy.vision_norm must be one of {list(VISION_NORMS)}, got {self.vision_norm!r}")
        if self.vision_norm == "group" and self.vision_pretrained_dir and self.vision == "resnet":
            raise ConfigError("policy.vision_norm=group would replace the pretrained ResNet's BatchNorms (in "
                              f"{self.vision_pretrained_dir}) by untrained GroupNorms; use policy.vision_norm=auto "
                              "(frozen_batch for a pretrained dir) or frozen_batch")
        if self.keypoints < 0:
            raise ConfigError(f"policy.keypoints must be >= 0, got {self.keypoints}")
        if self.keypoints and self.vision != "resnet":
            raise ConfigError("policy.keypoints needs policy.vision=resnet (they read a ResNet stage's feature map)")
        if self.keypoints and not 0 <= self.keypoint_stage < len(self.resnet_hidden_sizes):
            raise ConfigError(f"policy.keypoint_stage must index a ResNet stage, 0..{len(self.resnet_hidden_sizes) - 1},"
                              f" got {self.keypoint_stage}")
        if not self.min_log_std < self.max_log_std:
            raise ConfigError(f"policy.min_log_std={self.min_log_std} must be below policy.max_log_std="
                              f"{self.max_log_std}")
        if not self.min_log_std <= self.init_log_std <= self.max_log_std:
            raise ConfigError(f"policy.init_log_std={self.init_log_std} must lie in [min_log_std, max_log_std] = "
                              f"[{self.min_log_std}, {self.max_log_std}]")

    @property
    def resnet_norm(self) -> str:
        """vision_norm with 'auto' resolved: 'frozen_batch' for a pretrained encoder, 'group' for one from scratch"""
        if self.vision_norm != "auto":
            return self.vision_norm
        return "frozen_batch" if self.vision_pretrained_dir else "group"

    @property
    def lang_dim(self) -> int:
        """width of the instruction embedding the policy expects in batch['lang']"""
        return LANG_DIM

    @property
    def image_tokens_per_camera(self) -> int:
        """G*G pooled feature tokens, then one token per keypoint"""
        return self.image_grid * self.image_grid + self.keypoints

    @property
    def trunk_head_dim(self) -> int:
        return self.trunk_width // self.trunk_heads

    def num_tokens(self, num_cameras: int) -> int:
        """Trunk sequence length: image tokens, language, state, two queries, then (when max_delay_steps > 0) the
        delay token and max_delay_steps prefix tokens."""
        delay_tokens = 1 + self.max_delay_steps if self.max_delay_steps > 0 else 0
        return num_cameras * self.image_tokens_per_camera + 4 + delay_tokens
