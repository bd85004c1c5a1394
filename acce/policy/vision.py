"""Vision encoder: uint8 camera images -> a grid of feature tokens, via a transformers backbone.

The backbone is a `ResNetModel`, `ViTModel` or `SiglipVisionModel` built from a config (small on CPU, bigger in
configs/gpu.yaml) or loaded from a local save_pretrained folder. Nothing is ever downloaded.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from acce.policy.config import PolicyConfig

# Pixel statistics the respective pretrained families were trained with; random-init encoders use the same so that
# swapping in pretrained weights changes nothing else.
_PIXEL_STATS = {"resnet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), "vit": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
                "siglip": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))}


def _build_backbone(cfg: PolicyConfig, backbone_config: dict[str, Any] | None) -> nn.Module:
    """From a checkpoint's stored backbone config (exact architecture, weights come later), a local pretrained
    folder, or the small config in PolicyConfig, in that order."""
    from transformers import ResNetConfig, ResNetModel, SiglipVisionConfig, SiglipVisionModel, ViTConfig, ViTModel

    # Dropout would make the same (observation, action) get different log-probs in the actor and the learner.
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    if cfg.vision == "resnet":
        if backbone_config is not None:
            return ResNetModel(ResNetConfig.from_dict(backbone_config))
        if cfg.vision_pretrained_dir:
            return ResNetModel.from_pretrained(cfg.vision_pretrained_dir, local_files_only=True)
        return ResNetModel(ResNetConfig(
            num_channels=3, embedding_size=cfg.resnet_hidden_sizes[0], hidden_sizes=list(cfg.resnet_hidden_sizes),
            depths=list(cfg.resnet_depths), layer_type="basic", hidden_act="relu", downsample_in_first_stage=False))
    if cfg.vision == "siglip":  # no pooling head: the policy reads the patch tokens
        no_head = {"vision_use_head": False, "attention_dropout": 0.0}
        if backbone_config is not None:
            return SiglipVisionModel(SiglipVisionConfig.from_dict({**backbone_config, **no_head}))
        if cfg.vision_pretrained_dir:
            return SiglipVisionModel.from_pretrained(cfg.vision_pretrained_dir, local_files_only=True, **no_head)
        return SiglipVisionModel(SiglipVisionConfig(
            hidden_size=cfg.vit_width, num_hidden_layers=cfg.vit_layers, num_attention_heads=cfg.vit_heads,
            intermediate_size=4 * cfg.vit_width, image_size=64, patch_size=cfg.vit_patch_size, **no_head))
    if backbone_config is not None:
        return ViTModel(ViTConfig.from_dict({**backbone_config, **no_dropout}), add_pooling_layer=False)
    if cfg.vision_pretrained_dir:
        return ViTModel.from_pretrained(cfg.vision_pretrained_dir, local_files_only=True, add_pooling_layer=False,
                                        **no_dropout)
    return ViTModel(ViTConfig(
        hidden_size=cfg.vit_width, num_hidden_layers=cfg.vit_layers, num_attention_heads=cfg.vit_heads,
        intermediate_size=2 * cfg.vit_width, image_size=64, patch_size=cfg.vit_patch_size, **no_dropout),
        add_pooling_layer=False)


def _batchnorm_to_groupnorm(module: nn.Module) -> None:
    """Replace every BatchNorm2d by a GroupNorm over the same channels (in place, recursively)."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            c = child.num_features
            setattr(module, name, nn.GroupNorm(math.gcd(8, c), c))
        else:
            _batchnorm_to_groupnorm(child)


class SpatialSoftmax(nn.Module):
    """(N, C, h, w) feature map -> (N, K, 2) expected (x, y) in [-1, 1] of K learned heatmaps (a 1x1 conv), with a
    learned temperature: the differentiable keypoints of Levine et al. 2016."""

    def __init__(self, in_channels: int, keypoints: int) -> None:
        super().__init__()
        self.heat = nn.Conv2d(in_channels, keypoints, kernel_size=1)
        self.log_temperature = nn.Parameter(torch.zeros(()))

    def forward(self, fmap: torch.Tensor) -> torch.Tensor:
        n, _, h, w = fmap.shape
        heat = self.heat(fmap).flatten(2) * torch.exp(-self.log_temperature)  # (N, K, h*w)
        prob = torch.softmax(heat, dim=-1)
        ys = torch.linspace(-1.0, 1.0, h, device=fmap.device, dtype=fmap.dtype)
        xs = torch.linspace(-1.0, 1.0, w, device=fmap.device, dtype=fmap.dtype)
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
        coords = torch.stack([grid_x.reshape(-1), grid_y.reshape(-1)], dim=-1)  # (h*w, 2)
        return prob @ coords  # (N, K, 2)


class VisionEncoder(nn.Module):
    """(N, H, W, 3) uint8 -> (N, G*G, C) float tokens, row-major over a G x G grid (G = config.image_grid), and,
    when config.keypoints > 0, (N, K, 2) spatial-softmax keypoints (else None)."""

    def __init__(self, cfg: PolicyConfig, backbone_config: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.kind = cfg.vision
        self.grid = cfg.image_grid
        self.backbone = _build_backbone(cfg, backbone_config)
        if self.kind == "resnet" and cfg.resnet_norm == "group":
            # A from-scratch ResNet with frozen BatchNorm has no working normalization at all (its statistics are
            # the init's 0/1); GroupNorm normalizes each sample on its own, so batches stay independent. A
            # pretrained one keeps its BatchNorm (PolicyConfig.vision_norm's rule): its statistics are trained.
            _batchnorm_to_groupnorm(self.backbone)
        bcfg = self.backbone.config
        self.out_channels = int(bcfg.hidden_sizes[-1] if self.kind == "resnet" else bcfg.hidden_size)
        mean, std = _PIXEL_STATS[self.kind]
        # Constants of the encoder family, not learned: kept out of the state dict.
        self.register_buffer("pixel_mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)
        self.keypoint_stage = cfg.keypoint_stage
        self.keypoints = (SpatialSoftmax(int(bcfg.hidden_sizes[cfg.keypoint_stage]), cfg.keypoints)
                          if cfg.keypoints > 0 else None)
        if cfg.freeze_vision:
            self.backbone.requires_grad_(False)
        self.train()  # a fresh module is in training mode: freeze BatchNorm statistics from the start (see train)

    def backbone_config(self) -> dict[str, Any]:
        """The transformers config of the backbone, stored in checkpoints so loading needs no pretrained folder."""
        return self.backbone.config.to_dict()

    def train(self, mode: bool = True) -> "VisionEncoder":
        # BatchNorm stays in inference mode (frozen statistics, FrozenBatchNorm-style): batch statistics would make
        # an action's log-prob depend on which other samples share its batch, so the actor's and the learner's
        # log-probs of the same decision would differ and importance ratios would be noise. The affine weights
        # still learn.
        super().train(mode)
        for module in self.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()
        return self

    @property
    def keypoint_channels(self) -> int:
        """channels of the feature map the keypoints read (what a keypoint FiLM modulates)"""
        return int(self.keypoints.heat.in_channels) if self.keypoints is not None else 0

    def forward(self, images: torch.Tensor, keypoint_film: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """keypoint_film: (gamma, beta), each (N, keypoint_channels), modulate the keypoint stage's features per
        image before the heatmaps (instruction-conditioned keypoints: "where is the red cube")."""
        x = images.permute(0, 3, 1, 2).float().div_(255.0)  # (N, 3, H, W) in [0, 1]
        x = (x - self.pixel_mean) / self.pixel_std
        points = None
        if self.kind == "resnet":
            out = self.backbone(pixel_values=x, output_hidden_states=self.keypoints is not None)
            fmap = out.last_hidden_state  # (N, C, h, w)
            if self.keypoints is not None:  # hidden_states = (stem output, stage 0, stage 1, ...)
                kmap = out.hidden_states[self.keypoint_stage + 1]
                if keypoint_film is not None:
                    gamma, beta = keypoint_film
                    kmap = kmap * (1.0 + gamma[:, :, None, None]) + beta[:, :, None, None]
                points = self.keypoints(kmap)
        else:
            size = self.backbone.config.image_size
            interpolate = tuple(x.shape[-2:]) != (size, size)  # other resolutions: resample position embeddings
            hidden = self.backbone(pixel_values=x, interpolate_pos_encoding=interpolate).last_hidden_state
            patch = self.backbone.config.patch_size
            h, w = x.shape[-2] // patch, x.shape[-1] // patch
            patches = hidden[:, 1:] if self.kind == "vit" else hidden  # ViT has a CLS token first, SigLIP none
            fmap = patches.transpose(1, 2).reshape(x.shape[0], -1, h, w)  # (N, C, h, w)
        if fmap.shape[-2:] != (self.grid, self.grid):
            h, w = int(fmap.shape[-2]), int(fmap.shape[-1])
            if torch.onnx.is_in_onnx_export() and (h % self.grid or w % self.grid):
                # ONNX cannot export uneven adaptive bins (e.g. 96 x 96 images: 12 x 12 -> 8 x 8); the same averages
                # as two matrix products, so the exported graph serves any image size (torch's op otherwise)
                fmap = pool_matrix(h, self.grid) @ fmap @ pool_matrix(w, self.grid).T
            else:
                fmap = F.adaptive_avg_pool2d(fmap, self.grid)
        return fmap.flatten(2).transpose(1, 2), points  # (N, G*G, C), (N, K, 2) or None


def pool_matrix(size_in: int, size_out: int) -> torch.Tensor:
    """(size_out, size_in) weights of adaptive average pooling along one axis, with torch's bins: output i averages
    inputs floor(i * in / out) .. ceil((i + 1) * in / out) - 1 (bins overlap where the sizes do not divide)."""
    m = torch.zeros(size_out, size_in)
    for i in range(size_out):
        lo, hi = (i * size_in) // size_out, -(-((i + 1) * size_in) // size_out)
        m[i, lo:hi] = 1.0 / (hi - lo)
    return m
