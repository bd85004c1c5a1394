"""Network pieces of the world model: conv encoder/decoder, MLPs and a batched ensemble of MLPs.

Small on purpose (DreamerV3/TD-MPC2-style, scaled down): a 64x64 model trains at a few steps per second on a laptop
CPU; `wm.channels`, `wm.latent_dim` and `wm.hidden_dim` scale it up on a GPU.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def mlp(dims: list[int], out_act: nn.Module | None = None) -> nn.Sequential:
    """Linear -> LayerNorm -> SiLU between hidden layers (the TD-MPC2 block); plain Linear at the output."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(dims) - 2:
            layers += [nn.LayerNorm(b), nn.SiLU()]
    if out_act is not None:
        layers.append(out_act)
    return nn.Sequential(*layers)


class ConvEncoder(nn.Module):
    """(B, 3C, S, S) float in [0, 1] -> (B, feat) with `num_down` stride-2 convs down to 4x4."""

    def __init__(self, in_channels: int, channels: int, num_down: int):
        super().__init__()
        layers: list[nn.Module] = []
        c_in = in_channels
        self.widths = [channels * min(2 ** i, 8) for i in range(num_down)]
        for c_out in self.widths:
            layers += [nn.Conv2d(c_in, c_out, 4, stride=2, padding=1), nn.GroupNorm(1, c_out), nn.SiLU()]
            c_in = c_out
        self.net = nn.Sequential(*layers, nn.Flatten())
        self.out_dim = c_in * 16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ConvDecoder(nn.Module):
    """(B, latent) -> (B, 3C, S, S) pixels in [0, 1], mirror of the encoder; with a context frame (B, 3C, S, S) the
    output is composited, alpha * generated + (1 - alpha) * context, with a per-pixel alpha per camera.

    Why compositing (SV2P/CDNA-style, Finn et al. 2016): imagined branches are short and start from a real frame,
    and most of a tabletop scene does not move. A small latent learns the gripper long before it learns where every
    small cube is; copying unchanged pixels from the start frame keeps the cubes the policy must look at."""

    ALPHA_BIAS = -2.0
    """initial alpha ~0.12: a fresh decoder mostly copies the context"""

    def __init__(self, latent_dim: int, cameras: int, widths: list[int]):
        super().__init__()
        widths = list(reversed(widths))
        self.start, self.cameras = widths[0], cameras
        self.fc = nn.Linear(latent_dim, widths[0] * 16)
        layers: list[nn.Module] = []
        for c_in, c_out in zip(widths, widths[1:]):
            layers += [nn.ConvTranspose2d(c_in, c_out, 4, stride=2, padding=1), nn.GroupNorm(1, c_out), nn.SiLU()]
        self.net = nn.Sequential(*layers)
        self.out = nn.ConvTranspose2d(widths[-1], 4 * cameras, 4, stride=2, padding=1)  # RGB + alpha per camera
        with torch.no_grad():
            self.out.bias[3 * cameras:] = self.ALPHA_BIAS

    def forward(self, z: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        h = self.out(self.net(self.fc(z).view(z.shape[0], self.start, 4, 4)))
        rgb = torch.sigmoid(h[:, :3 * self.cameras])
        if context is None:
            return rgb
        alpha = torch.sigmoid(h[:, 3 * self.cameras:]).repeat_interleave(3, dim=1)
        return alpha * rgb + (1.0 - alpha) * context


class EnsembleLinear(nn.Module):
    """K independent linear layers applied in one batched matmul: (K, B, in) -> (K, B, out)."""

    def __init__(self, k: int, in_dim: int, out_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(k, in_dim, out_dim))
        self.bias = nn.Parameter(torch.empty(k, 1, out_dim))
        bound = 1.0 / math.sqrt(in_dim)  # nn.Linear's default init, drawn independently per head
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class EnsembleMLP(nn.Module):
    """K MLPs with the same shape and independent weights: (B, in) -> (K, B, out)."""

    def __init__(self, k: int, dims: list[int]):
        super().__init__()
        self.k = k
        self.layers = nn.ModuleList(EnsembleLinear(k, a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.norms = nn.ModuleList(nn.LayerNorm(b) for b in dims[1:-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.unsqueeze(0).expand(self.k, *x.shape) if x.dim() == 2 else x
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = nn.functional.silu(self.norms[i](h))
        return h
