"""Image encoders of the policy: the Nature CNN (Mnih et al. 2015) and the IMPALA ResNet (Espeholt et al. 2018).

Owns the choice of encoder for an observation spec (``resolve_encoder``) and the construction of a CNN trunk:
uint8 frames ``[N, C, H, W]`` -> float32 features ``[N, hidden_sizes[-1]]``, pixels scaled by 1/255 inside. The
heads and the MLP encoder live in ``sample_fast.policy``; nothing here touches an env or an optimizer.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor, nn

#: Encoder names of ``PolicyConfig.encoder`` (besides ``auto``).
ENCODERS = ("mlp", "nature_cnn", "impala_cnn")
CNN_ENCODERS = ("nature_cnn", "impala_cnn")
#: The smallest frame side the Nature CNN takes: 8x8/4, 4x4/2 and 3x3/1 convolutions without padding need
#: ((36 - 8) / 4 + 1 - 4) / 2 + 1 = 3 >= 3 rows before the last one.
NATURE_MIN_SIZE = 36
#: PERF: channels_last (NHWC) frames and conv weights. ``benchmarks/results/cnn_cpu.md`` (2-core Intel host, 4x84x84
#: uint8, 2 interleaved rounds, fresh interpreters): an Adam step on 256 samples is 1.31x faster for nature_cnn at the
#: Atari learner's 2 torch threads (1.64x at 1) and 1.63x for impala_cnn (1.96x at 1); act() on 16 frames is the same
#: for nature_cnn (0.93-1.01x) and 2.3-2.4x faster for impala_cnn. On CUDA it is the layout cuDNN's bf16 tensor-core
#: kernels prefer.
CHANNELS_LAST = True


#: ``PolicyConfig.cpu_bf16`` settings: run a CNN trunk on the CPU under bf16 autocast "auto" (where the CPU multiplies
#: bf16 natively, ``cpu_has_native_bf16``), "always" or "never".
CPU_BF16_SETTINGS = ("auto", "always", "never")
#: x86 CPU flags of native bf16 dot products: AVX512-BF16 (AMD Zen 4+, Intel Cooper Lake+) and AMX-BF16 (Intel
#: Sapphire Rapids+). Without them oneDNN emulates bf16 and it is slower than float32.
_NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_has_native_bf16(cpuinfo: str | Path = "/proc/cpuinfo") -> bool:
    """Whether this CPU has bf16 dot-product instructions (``_NATIVE_BF16_FLAGS`` in the flags of ``cpuinfo``);
    False where the file is missing or unreadable (macOS, Windows: "auto" then keeps float32)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            return any(flag in flags for flag in _NATIVE_BF16_FLAGS)
    return False


def cpu_bf16_enabled(setting: str) -> bool:
    """``PolicyConfig.cpu_bf16`` resolved for this machine."""
    return setting == "always" or (setting == "auto" and cpu_has_native_bf16())


class EncoderError(ValueError):
    """An encoder that does not fit the observations; the message says what to change."""


def resolve_encoder(encoder: str, obs_shape: tuple[int, ...], obs_dtype: torch.dtype, prefix: str = "") -> str:
    """The encoder for observations of ``obs_shape`` (per env) and ``obs_dtype``; ``auto`` picks a CNN for image
    frames ``[C, H, W]`` uint8 (``nature_cnn`` from 36x36 up, ``impala_cnn`` below: it pools, so any size fits) and
    ``mlp`` otherwise. Raises ``EncoderError`` naming the fix when an explicit choice cannot take the observations
    (``prefix`` goes before the field name in the message: the trainer's config passes ``"policy."``).
    """
    key = f"{prefix}encoder"
    image = len(obs_shape) == 3 and min(obs_shape) >= 1
    if encoder == "auto":
        if image and obs_dtype == torch.uint8:
            return "nature_cnn" if min(obs_shape[1:]) >= NATURE_MIN_SIZE else "impala_cnn"
        return "mlp"
    if encoder == "mlp":
        return encoder  # any observation flattens (a uint8 frame too: slow and weak, but a valid choice)
    if encoder not in CNN_ENCODERS:
        raise EncoderError(f"{key}={encoder!r} unknown; choose one of: auto, {', '.join(ENCODERS)}")
    if not image:
        raise EncoderError(
            f"{key}={encoder} needs image observations [C, H, W]; this env's are {tuple(obs_shape)} {obs_dtype}: "
            f"use {key}=mlp (or auto)"
        )
    if encoder == "nature_cnn" and min(obs_shape[1:]) < NATURE_MIN_SIZE:
        raise EncoderError(
            f"{key}=nature_cnn needs frames of at least {NATURE_MIN_SIZE}x{NATURE_MIN_SIZE} (its 8x8/4, 4x4/2 and "
            f"3x3/1 convolutions); these are {obs_shape[1]}x{obs_shape[2]}: use {key}=impala_cnn (or auto)"
        )
    return encoder


def trunk_layout(x: Tensor) -> Tensor:
    """``[N, C, H, W]`` frames in the convolutions' memory layout (channels_last when ``CHANNELS_LAST``). PERF: call it
    on the uint8 frames, before any float conversion: a quarter of the bytes to move."""
    return x.contiguous(memory_format=torch.channels_last) if CHANNELS_LAST and x.dim() == 4 else x


class PixelScale(nn.Module):
    """uint8 pixels -> float32 in [0, 1] (x / 255); floating input is taken as already scaled."""

    def forward(self, x: Tensor) -> Tensor:
        x = trunk_layout(x)
        if x.is_floating_point():
            return x
        return x.to(torch.float32).mul_(1.0 / 255.0)


class ResidualBlock(nn.Module):
    """IMPALA's residual block: ``x + conv(relu(conv(relu(x))))``, 3x3 convolutions keeping the channels."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        # not in place: x is the skip connection
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


def _orthogonal(layer: nn.Module, gain: float) -> nn.Module:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def nature_convs(in_channels: int) -> nn.Sequential:
    """The Nature DQN convolutions: 32 8x8/4, 64 4x4/2, 64 3x3/1, ReLU after each (84x84 -> 64 x 7 x 7), with
    CleanRL's ppo_atari init (orthogonal, gain sqrt(2), zero bias)."""
    g = math.sqrt(2.0)
    return nn.Sequential(
        _orthogonal(nn.Conv2d(in_channels, 32, 8, stride=4), g), nn.ReLU(),
        _orthogonal(nn.Conv2d(32, 64, 4, stride=2), g), nn.ReLU(),
        _orthogonal(nn.Conv2d(64, 64, 3, stride=1), g), nn.ReLU(),
    )  # fmt: skip


def impala_convs(in_channels: int, channels: list[int]) -> nn.Sequential:
    """IMPALA's deep encoder: per stack a 3x3 conv, a 3x3/2 max-pool (padding 1) and two residual blocks, then a
    ReLU (84x84 -> 32 x 11 x 11 with [16, 32, 32]). PyTorch's default init, as CleanRL's ppo_procgen: orthogonal
    gain sqrt(2) on every conv would grow the residual stream block after block."""
    layers: list[nn.Module] = []
    prev = in_channels
    for ch in channels:
        layers += [nn.Conv2d(prev, ch, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                   ResidualBlock(ch), ResidualBlock(ch)]  # fmt: skip
        prev = ch
    layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def build_cnn_trunk(
    encoder: str,
    obs_shape: tuple[int, int, int],
    hidden_sizes: list[int],
    activation: type[nn.Module],
    impala_channels: list[int],
) -> nn.Sequential:
    """``PixelScale`` -> convolutions -> flatten -> ``hidden_sizes`` linear layers (orthogonal gain sqrt(2), each
    followed by ``activation``). Output: float32 ``[N, hidden_sizes[-1]]``."""
    if not hidden_sizes:
        raise EncoderError("a CNN encoder needs at least one hidden size (its fully-connected layer), e.g. [512]")
    in_channels = int(obs_shape[0])
    convs = nature_convs(in_channels) if encoder == "nature_cnn" else impala_convs(in_channels, impala_channels)
    with torch.no_grad():  # the flattened size, from a dummy frame (exact for any frame size)
        flat = convs(torch.zeros(1, *obs_shape)).numel()
    layers: list[nn.Module] = [PixelScale(), convs, nn.Flatten()]
    prev = flat
    for width in hidden_sizes:
        layers += [_orthogonal(nn.Linear(prev, int(width)), math.sqrt(2.0)), activation()]
        prev = int(width)
    trunk = nn.Sequential(*layers)
    if CHANNELS_LAST:
        trunk = trunk.to(memory_format=torch.channels_last)
    return trunk
