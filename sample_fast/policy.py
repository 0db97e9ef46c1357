"""The actor-critic policy: separate actor and critic MLPs behind a running observation normaliser, or, for image
observations, a Nature-CNN or IMPALA-ResNet trunk shared by a policy head and a value head.

Owns the network weights and the observation statistics (registered buffers, so they travel with ``state_dict()``
and the ParamStore). The sampler calls ``act`` (the inference hot path); the learner calls ``evaluate``, ``value``
and ``update_normalizer``. It never touches an env, an optimizer or a buffer of trajectories.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from sample_fast.envs import Spec

from . import activations
from .encoders import (
    CPU_BF16_SETTINGS,
    ENCODERS,
    EncoderError,
    build_cnn_trunk,
    cpu_bf16_enabled,
    resolve_encoder,
    trunk_layout,
)
from .recurrent import MEMORY_KINDS, RNN_KINDS, RecurrentCore, SequenceInputs

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_ACTIVATIONS = {"tanh": activations.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "silu": nn.SiLU}
#: In-place forms of the activations, for the no-grad inference path.
_INPLACE = {
    "tanh": activations.tanh_,
    "relu": torch.relu_,
    "elu": nn.functional.elu_,
    "silu": lambda x: nn.functional.silu(x, inplace=True),
}


class PolicyConfigError(ValueError):
    """A bad ``PolicyConfig`` value or spec; the message says what to change."""


@dataclass
class PolicyConfig:
    """Architecture of ``ActorCritic``."""

    #: Observation encoder: "mlp" (separate actor and critic MLPs), "nature_cnn" (Mnih et al. 2015),
    #: "impala_cnn" (Espeholt et al. 2018, the 15-layer ResNet) or "auto": a CNN for image observations
    #: ``[C, H, W]`` uint8 (nature_cnn for frames of at least 36x36, impala_cnn for smaller ones), mlp otherwise.
    encoder: str = "auto"
    #: Hidden layer widths. MLP: the actor's and the critic's layers (each has its own weights). CNN: the
    #: fully-connected layers after the convolutions, in the trunk both heads share (Nature: [512], IMPALA: [256]).
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 256])
    #: Hidden activation: tanh, relu, elu or silu (CNN: of its fully-connected layers; its convolutions use ReLU as
    #: in the papers).
    activation: str = "tanh"
    #: impala_cnn: output channels of its three conv + max-pool + 2 residual-block stacks (the paper's [16, 32, 32]).
    impala_channels: list[int] = field(default_factory=lambda: [16, 32, 32])
    #: CNN encoders on the CPU: run the trunk (convolutions and fully-connected layers) under bf16 autocast, its
    #: features cast back to float32 before the heads, in the sampler's act and the learner's update alike: "auto"
    #: where the CPU multiplies bf16 natively (AVX512-BF16 or AMX-BF16 flags), "always", or "never" (float32). On a
    #: Zen 4 host a Nature-CNN Adam step is 1.35-1.89x faster, act 1.17-1.34x, a Pong training run 1.32-1.70x
    #: (benchmarks/results/cnn_cpu_bf16.md, benchmarks/results/cpu_bf16_pong/). The Atari presets set "auto". CUDA
    #: uses the learner's own ``learner.bf16`` autocast instead. An MLP encoder ignores "auto" and rejects "always".
    cpu_bf16: str = "never"
    #: Initial log standard deviation of the Gaussian policy (continuous actions); std = exp(-0.5) ~ 0.61.
    init_log_std: float = -0.5
    #: log-std is clamped to [min_log_std, max_log_std] when used, so a runaway parameter cannot give inf/0 std.
    min_log_std: float = -5.0
    max_log_std: float = 2.0
    #: With finite action bounds, the Gaussian mean is ``center + half_range * tanh(actor(x))`` so it cannot drift
    #: outside the box (where every sample is clipped to the same action, the gradient vanishes, and the mean can run
    #: away: seen on halfcheetah at lr 3e-3, mean |a| ~ 34 and KL ~ 100). Samples stay unsquashed (the env clips).
    squash_mean: bool = True
    #: Normalise observations with running mean/std statistics (updated by the learner). MLP only: the CNN
    #: encoders scale uint8 pixels by 1/255, or normalise each pixel with ``normalize_pixels``.
    normalize_obs: bool = True
    #: Normalised observations are clipped to [-obs_clip, obs_clip].
    obs_clip: float = 10.0
    #: CNN encoders: normalise every input pixel by its own running mean/std (Sample Factory's ``normalize_input``
    #: on Atari; statistics updated by the learner, travelling with the weights) instead of the plain 1/255 scale.
    #: Static background pixels become ~0 and the moving objects stand out (clipped to [-obs_clip, obs_clip]). The
    #: variance floor is Sample Factory's 1e-5 on the [0, 1] scale. Needs uint8 frames. MLP encoders ignore it (they
    #: use ``normalize_obs``), so ``env=pong policy.encoder=mlp`` works with the preset's value.
    normalize_pixels: bool = False
    #: Orthogonal-init gain of the actor's output layer (CleanRL: 0.01, so the initial policy is near-uniform).
    actor_out_gain: float = 0.01
    #: Orthogonal-init gain of the critic's output layer (CleanRL: 1.0).
    critic_out_gain: float = 1.0
    #: Recurrent core after the encoder: "none" (feed-forward), "gru" or "lstm". With a core, actor and critic share
    #: the encoder (MLP: hidden_sizes; CNN: its trunk) and the core, and read it through linear heads
    #: (docs/recurrent.md).
    rnn: str = "none"
    #: Units of the recurrent core.
    rnn_size: int = 128
    #: What the recurrent state spans: "episode" (zeroed where an episode ends, terminated or truncated) or "trial"
    #: (RL², Duan et al. 2016: zeroed only where the env ends a trial of several episodes; the previous action, raw
    #: reward and done flag are inputs of the core too).
    memory: str = "episode"

    def validate(self) -> None:
        if not self.hidden_sizes or any(int(h) < 1 for h in self.hidden_sizes):
            raise PolicyConfigError(f"hidden_sizes must be a non-empty list of positive ints, got {self.hidden_sizes}")
        if self.activation not in _ACTIVATIONS:
            raise PolicyConfigError(f"activation {self.activation!r} unknown; choose one of {sorted(_ACTIVATIONS)}")
        if not self.obs_clip > 0:
            raise PolicyConfigError(f"obs_clip must be > 0, got {self.obs_clip}")
        if not self.min_log_std < self.max_log_std:
            raise PolicyConfigError(f"min_log_std {self.min_log_std} must be < max_log_std {self.max_log_std}")
        if self.encoder not in ("auto", *ENCODERS):
            raise PolicyConfigError(f"encoder {self.encoder!r} unknown; choose one of: auto, {', '.join(ENCODERS)}")
        if not self.impala_channels or any(int(c) < 1 for c in self.impala_channels):
            raise PolicyConfigError(f"impala_channels must be a non-empty list of positive ints, got "
                                    f"{self.impala_channels}")  # fmt: skip
        if self.cpu_bf16 not in CPU_BF16_SETTINGS:
            raise PolicyConfigError(
                f"cpu_bf16 {self.cpu_bf16!r} unknown; choose one of: {', '.join(CPU_BF16_SETTINGS)}"
            )
        if self.rnn not in RNN_KINDS:
            raise PolicyConfigError(f"rnn {self.rnn!r} unknown; choose one of: {', '.join(RNN_KINDS)}")
        if not isinstance(self.rnn_size, int) or isinstance(self.rnn_size, bool) or self.rnn_size < 1:
            raise PolicyConfigError(f"rnn_size must be a positive int, got {self.rnn_size!r}")
        if self.memory not in MEMORY_KINDS:
            raise PolicyConfigError(f"memory {self.memory!r} unknown; choose one of: {', '.join(MEMORY_KINDS)}")
        if self.memory == "trial" and self.rnn == "none":
            raise PolicyConfigError("memory=trial (RL²) needs a recurrent policy: set rnn=gru (or lstm)")

    @property
    def recurrent(self) -> bool:
        return self.rnn != "none"

    def check_specs(self, observation_spec: Spec, action_spec: Spec, prefix: str = "") -> str:
        """The encoder for these specs (``auto`` resolved); raises ``PolicyConfigError`` naming the fix when the
        settings do not fit them. ``ActorCritic`` calls it, and so does the trainer's config check before any
        process starts (with the specs the env will have, and ``prefix="policy."`` for the field names)."""
        self.validate()
        if action_spec.is_discrete:
            # The Gaussian's settings mean nothing for a categorical policy: a changed one is a config mistake.
            defaults = PolicyConfig()
            changed = [f"{prefix}{k}" for k in _GAUSSIAN_FIELDS if getattr(self, k) != getattr(defaults, k)]
            if changed:
                verb = "applies" if len(changed) == 1 else "apply"
                raise PolicyConfigError(
                    f"{', '.join(changed)} only {verb} to continuous (Gaussian) actions, and this env's actions are "
                    f"discrete (a categorical policy); drop {' and '.join(changed)}"
                )
        shape, dtype = tuple(observation_spec.shape), observation_spec.dtype
        try:
            encoder = resolve_encoder(self.encoder, shape, dtype, prefix)
        except EncoderError as e:
            raise PolicyConfigError(str(e)) from None
        if encoder == "mlp" and len(shape) == 3 and dtype == torch.uint8 and not self.normalize_obs:
            # An MLP on frames works only with the normaliser: raw 0-255 pixels would swamp its orthogonal init.
            raise PolicyConfigError(
                f"{prefix}encoder=mlp on uint8 frames {list(shape)} needs {prefix}normalize_obs=true (else it sees "
                f"raw 0-255 pixels); or use {prefix}encoder=auto (a CNN)"
            )
        if self.normalize_pixels and encoder != "mlp" and dtype != torch.uint8:
            raise PolicyConfigError(
                f"{prefix}normalize_pixels needs uint8 frames (its variance floor is on the 0-255 scale); these are "
                f"{dtype}: drop {prefix}normalize_pixels"
            )
        self.check_encoder(encoder, prefix)
        return encoder

    def check_encoder(self, encoder: str, prefix: str = "") -> None:
        """The settings that depend only on the resolved ``encoder`` fit it (``cpu_bf16=always`` needs a CNN)."""
        if encoder == "mlp" and self.cpu_bf16 == "always":
            raise PolicyConfigError(f"{prefix}cpu_bf16=always applies to CNN encoders only, and this policy's encoder "
                                    f"is mlp; drop it (or set {prefix}cpu_bf16=never)")  # fmt: skip


def _at_least_f32(x: Tensor) -> Tensor:
    """bf16 (autocast) outputs as float32; float32 and float64 (a float64 policy in tests) unchanged."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


#: PolicyConfig fields of the Gaussian policy (continuous actions only).
_GAUSSIAN_FIELDS = ("init_log_std", "min_log_std", "max_log_std", "squash_mean")


def _hidden_layers(in_dim: int, hidden: list[int], activation: str) -> list[nn.Module]:
    """Linear + activation per width, CleanRL's orthogonal init (gain sqrt(2), zero biases)."""
    layers: list[nn.Module] = []
    prev = in_dim
    for width in hidden:
        linear = nn.Linear(prev, int(width))
        nn.init.orthogonal_(linear.weight, math.sqrt(2.0))
        nn.init.zeros_(linear.bias)
        layers += [linear, _ACTIVATIONS[activation]()]
        prev = int(width)
    return layers


def _mlp(in_dim: int, hidden: list[int], out_dim: int, activation: str, out_gain: float) -> nn.Sequential:
    """MLP with CleanRL's orthogonal init: gain sqrt(2) on hidden layers, ``out_gain`` on the last, zero biases."""
    layers = _hidden_layers(in_dim, hidden, activation)
    prev = int(hidden[-1]) if hidden else in_dim
    out = nn.Linear(prev, out_dim)
    nn.init.orthogonal_(out.weight, out_gain)
    nn.init.zeros_(out.bias)
    layers.append(out)
    return nn.Sequential(*layers)


def _moments(x: Tensor, chunk_bytes: int = 1 << 25) -> tuple[Tensor, Tensor]:
    """float64 mean and population variance over dim 0 of ``x`` ``[N, dim]``, in row chunks of about
    ``chunk_bytes`` float64 bytes merged exactly (Chan et al.; uint8: exact sums of 256-row chunks): a pixel batch
    (2,048 x 28,224) as float64 would be 460 MB at once."""
    if x.dtype == torch.uint8:
        # Pixels: exact sums from float32 chunks of <= 256 rows (every partial sum is an integer <= 256 * 255^2 <
        # 2^24, so float32 adds it exactly in any order), accumulated in float64. PERF: float32 column sums are
        # vectorised where int32 ones are not: 59 ms against 365-546 ms for a 2,048-frame Pong batch on 2 cores.
        total = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)  # the batch's device (CUDA too)
        total_sq = torch.zeros_like(total)
        for start in range(0, x.shape[0], 256):
            c = x[start : start + 256].to(torch.float32)
            total += c.sum(dim=0)
            total_sq += c.square_().sum(dim=0)
        n = x.shape[0]
        mean = total / n
        return mean, (total_sq / n - mean.square()).clamp_(min=0.0)
    rows = max(1, chunk_bytes // (8 * max(1, x.shape[1])))
    if x.shape[0] <= rows:
        x = x.to(torch.float64)
        return x.mean(dim=0), x.var(dim=0, unbiased=False)
    count, mean, m2 = 0, None, None
    for start in range(0, x.shape[0], rows):
        c = x[start : start + rows].to(torch.float64)
        n = c.shape[0]
        c_mean = c.mean(dim=0)
        c_m2 = (c - c_mean).square_().sum(dim=0)
        if mean is None:
            count, mean, m2 = n, c_mean, c_m2
            continue
        total = count + n
        delta = c_mean - mean
        m2 = m2 + c_m2 + delta.square() * (count * n / total)
        mean = mean + delta * (n / total)
        count = total
    return mean, m2 / count


class RunningNormalizer(nn.Module):
    """Running mean/variance of observations, merged batch by batch (Chan et al. parallel variance).

    Buffers: ``count`` (float64 scalar), ``mean``/``var`` (float64 ``[obs_dim]``) hold the statistics; ``mean32``
    and ``inv_std32`` (float32) are their derived forms used on the hot path, refreshed by ``update``.
    """

    def __init__(self, dim: int, clip: float, eps: float = 1e-8):
        super().__init__()
        self.clip = float(clip)
        self.eps = float(eps)
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("mean32", torch.zeros(dim, dtype=torch.float32))
        self.register_buffer("inv_std32", torch.ones(dim, dtype=torch.float32))

    @torch.no_grad()
    def update(self, x: Tensor, merge: Any = None) -> None:
        """Merge a batch ``x`` ``[N, dim]`` into the statistics (population variance). ``merge(n, mean, var)``
        (distributed) replaces the batch's moments by those of all ranks' batches."""
        n = x.shape[0]
        if n == 0:
            return
        batch_mean, batch_var = _moments(x)
        if merge is not None:
            n, batch_mean, batch_var = merge(n, batch_mean, batch_var)
        total = self.count + n
        delta = batch_mean - self.mean
        # M2_total = M2_a + M2_b + delta^2 * n_a * n_b / n  (Chan, Golub & LeVeque 1979)
        m2 = self.var * self.count + batch_var * n + delta.square() * self.count * n / total
        self.mean.add_(delta * n / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)
        self.mean32.copy_(self.mean)
        self.inv_std32.copy_(torch.rsqrt(self.var + self.eps))

    def forward(self, x: Tensor) -> Tensor:
        # PERF: two fused elementwise ops + clamp on float32; the float64 statistics are never touched here.
        return torch.clamp((x - self.mean32) * self.inv_std32, -self.clip, self.clip)

    def forward_uint8(self, x: Tensor) -> Tensor:
        """``forward`` for uint8 pixels, float32 ``x * inv_std - mean * inv_std`` clipped: ``x`` ``[N, dim]``, or
        ``[N, C, H, W]`` (``C * H * W == dim``) in either memory layout, the output in the same layout.
        PERF: one conversion then three in-place passes over the N x 28,224 floats of an Atari batch; the
        out-of-place ``addcmul`` (or ``forward``'s ``(x - mean) * inv_std``) allocates a second batch-sized
        tensor, 1.4 against 20 ms for 256 Pong frames on 2 cores with glibc's default malloc settings. A
        channels_last batch gets its statistics laid out channels_last too (28,224 values), so every pass runs over
        matching strides and the float batch needs no layout copy before a channels_last convolution."""
        inv_std = self.inv_std32
        bias = torch.mul(self.mean32, inv_std).neg_()  # [dim]: negligible beside the batch
        if x.dim() == 4:
            inv_std, bias = inv_std.view(1, *x.shape[1:]), bias.view(1, *x.shape[1:])
            if x.is_contiguous(memory_format=torch.channels_last):
                inv_std = inv_std.contiguous(memory_format=torch.channels_last)
                bias = bias.contiguous(memory_format=torch.channels_last)
        out = x.to(torch.float32)  # keeps x's memory layout
        return out.mul_(inv_std).add_(bias).clamp_(-self.clip, self.clip)


class ActorCritic(nn.Module):
    """Gaussian (state-independent log-std) or categorical policy, with a value head.

    MLP encoder: separate actor and critic MLPs. CNN encoders (``nature_cnn``, ``impala_cnn``): one trunk (the
    convolutions and ``hidden_sizes`` fully-connected layers) feeds a linear policy head and a linear value head.
    Sharing is the Atari standard (A3C, IMPALA, CleanRL's ppo_atari): the convolutions are nearly all of the
    compute, so a second trunk would double the cost of training and of every ``act`` (which skips the value head
    anyway), and pixels need features both heads can use. The MLPs stay separate because they are cheap and on
    continuous control separate networks train better (Andrychowicz et al. 2021, "What matters in on-policy RL").

    Shapes: ``obs`` ``[N, *obs_shape]`` float32 (raw, un-normalised), or uint8 ``[N, C, H, W]`` frames (scaled by
    1/255 inside; float frames are taken as already in [0, 1]); continuous ``actions`` ``[N, *act_shape]`` float32
    (the unclipped Gaussian sample; the env clips); discrete ``actions`` ``[N]`` int64.
    """

    def __init__(self, observation_spec: Spec, action_spec: Spec, cfg: PolicyConfig | None = None):
        super().__init__()
        cfg = cfg if cfg is not None else PolicyConfig()
        self.encoder = cfg.check_specs(observation_spec, action_spec)
        self.cfg = cfg
        self.obs_shape = tuple(observation_spec.shape)
        self.act_shape = tuple(action_spec.shape)
        self.obs_dim = math.prod(self.obs_shape)
        self.is_discrete = action_spec.is_discrete
        if self.is_discrete:
            if self.act_shape != ():
                raise PolicyConfigError(f"discrete actions must have shape () per env, got {self.act_shape}")
            out_dim = int(action_spec.num_actions)
        else:
            out_dim = math.prod(self.act_shape)
            if out_dim < 1:
                raise PolicyConfigError(f"continuous action spec has empty shape {self.act_shape}")
        self.act_dim = out_dim
        hidden = [int(h) for h in cfg.hidden_sizes]
        #: The shared trunk (None for the feed-forward MLP encoder): CNN uint8 [N, C, H, W], or with a recurrent
        #: core the MLP's hidden layers, -> float32 [N, hidden_sizes[-1]].
        self.trunk: nn.Module | None = None
        #: The recurrent core (None for a feed-forward policy); ``rl2``: it also reads the previous action, reward
        #: and done flag (``memory=trial``).
        self.core: RecurrentCore | None = None
        self.rl2 = cfg.recurrent and cfg.memory == "trial"
        if self.encoder == "mlp" and not cfg.recurrent:
            self.actor = _mlp(self.obs_dim, hidden, out_dim, cfg.activation, cfg.actor_out_gain)
            self.critic = _mlp(self.obs_dim, hidden, 1, cfg.activation, cfg.critic_out_gain)
        else:
            if self.encoder == "mlp":
                self.trunk = nn.Sequential(*_hidden_layers(self.obs_dim, hidden, cfg.activation))
            else:
                self.trunk = build_cnn_trunk(self.encoder, self.obs_shape, hidden, _ACTIVATIONS[cfg.activation],
                                             [int(c) for c in cfg.impala_channels])  # fmt: skip
            head_in = hidden[-1]
            if cfg.recurrent:
                # RL² inputs: one-hot (discrete) or raw (continuous) previous action, raw reward, done flag.
                extra = out_dim + 2 if self.rl2 else 0
                self.core = RecurrentCore(cfg.rnn, hidden[-1] + extra, cfg.rnn_size)
                head_in = cfg.rnn_size
            # Linear heads on the shared features (``_mlp`` without hidden layers: the same init gains).
            self.actor = _mlp(head_in, [], out_dim, cfg.activation, cfg.actor_out_gain)
            self.critic = _mlp(head_in, [], 1, cfg.activation, cfg.critic_out_gain)
        self.squash = False
        if not self.is_discrete:
            self.log_std = nn.Parameter(torch.full((out_dim,), float(cfg.init_log_std)))
            low, high = action_spec.low, action_spec.high
            if cfg.squash_mean and low is not None and high is not None:
                low, high = low.reshape(-1).float(), high.reshape(-1).float()
                if bool(torch.isfinite(low).all() and torch.isfinite(high).all()):
                    self.squash = True
                    self.register_buffer("action_center", (high + low) / 2)
                    self.register_buffer("action_half_range", (high - low) / 2)
        self.normalizer: RunningNormalizer | None = None
        if self.encoder == "mlp" and cfg.normalize_obs:
            self.normalizer = RunningNormalizer(self.obs_dim, cfg.obs_clip)
        elif self.encoder != "mlp" and cfg.normalize_pixels:  # else pixels are scaled by 1/255 in the CNN
            # Statistics of the raw 0-255 values; the floor is SF's 1e-5 on the [0, 1] scale, i.e. 1e-5 * 255^2.
            self.normalizer = RunningNormalizer(self.obs_dim, cfg.obs_clip, eps=1e-5 * 255.0**2)
        # Linear layers of each MLP, for the inference path (modules, not tensors: .to(), load_state_dict and deepcopy
        # stay safe).
        self._actor_linears = [layer for layer in self.actor if isinstance(layer, nn.Linear)]
        mlp_trunk = self.trunk if self.encoder == "mlp" and self.trunk is not None else []
        self._trunk_linears = [layer for layer in mlp_trunk if isinstance(layer, nn.Linear)]
        self._critic_linears = [layer for layer in self.critic if isinstance(layer, nn.Linear)]
        #: The CNN trunk runs under CPU bf16 autocast (``cfg.cpu_bf16`` resolved once, here, for this machine).
        self.cpu_bf16 = self.encoder != "mlp" and cpu_bf16_enabled(cfg.cpu_bf16)

    # ----- helpers ------------------------------------------------------------------------------------------------
    def _features(self, obs: Tensor, inference: bool = False) -> Tensor:
        if self.encoder != "mlp":
            if self.normalizer is not None:  # float32 [N, C, H, W] of normalised pixels (PixelScale passes floats)
                if obs.dtype == torch.uint8:
                    obs = trunk_layout(obs)  # normalised in the convolutions' layout: no float layout copy after
                    flat = obs if obs.dim() == 4 else obs.reshape(obs.shape[0], self.obs_dim)
                    obs = self.normalizer.forward_uint8(flat).reshape(obs.shape)
                else:
                    obs = self.normalizer(obs.reshape(obs.shape[0], self.obs_dim)).reshape(obs.shape)
            if self.cpu_bf16 and obs.device.type == "cpu" and self.critic[-1].weight.dtype == torch.float32:
                with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                    feats = self.trunk(obs)
                return feats.float()  # the heads, their logits and values stay float32
            return self.trunk(obs)
        x = obs.reshape(obs.shape[0], self.obs_dim)
        dtype = self.critic[-1].weight.dtype
        if x.dtype != dtype:  # uint8 observations are stored as uint8 and converted only here (float64 in tests)
            x = x.to(dtype)
        x = self.normalizer(x) if self.normalizer is not None else x
        if self.trunk is None:
            return x
        if inference:  # PERF: the no-grad acting path, as _infer_mlp (every layer of the trunk has an activation)
            act = _INPLACE[self.cfg.activation]
            for linear in self._trunk_linears:
                x = act(torch.addmm(linear.bias, x, linear.weight.t()))
            return x
        return self.trunk(x)

    def _infer_mlp(self, layers: list[nn.Linear], x: Tensor) -> Tensor:
        # PERF: addmm + in-place activation on the layers' own parameters, skipping nn.Module.__call__: ~15% less
        # time than mlp(x) for 2x256 at N=64 (the sampler's per-split batch), where per-call overhead dominates.
        # No-grad only (in-place activations).
        act = _INPLACE[self.cfg.activation]
        for linear in layers[:-1]:
            x = act(torch.addmm(linear.bias, x, linear.weight.t()))
        last = layers[-1]
        return torch.addmm(last.bias, x, last.weight.t())

    def _log_std(self) -> Tensor:
        return self.log_std.clamp(self.cfg.min_log_std, self.cfg.max_log_std)

    def action_mean(self, out: Tensor) -> Tensor:
        """Gaussian mean ``[N, act_dim]`` from the actor's output (tanh-squashed into the bounds if ``squash``)."""
        if self.squash:
            return torch.addcmul(self.action_center, self.action_half_range, activations.tanh(out))
        return out

    def _gaussian_logp(self, mean: Tensor, log_std: Tensor, actions: Tensor) -> Tensor:
        z = (actions - mean) * torch.exp(-log_std)
        return (-0.5 * z.square() - log_std - _LOG_SQRT_2PI).sum(dim=-1)

    # ----- public API ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def act(
        self, obs: Tensor, deterministic: bool = False, *, with_value: bool = True
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Sample actions for raw ``obs`` ``[N, *obs_shape]``.

        Returns ``(actions [N, *act_shape], behavior_logp [N] float32, values [N] float32)``. With
        ``deterministic`` the action is the mode (Gaussian mean / argmax) and ``behavior_logp`` its log-prob.
        ``with_value=False`` skips the critic forward and returns ``values = None`` (the sampler's default: the
        learner recomputes values with its current critic).
        """
        # PERF: the sampler's hot path (~3 us/sample for 2x256 on 2 threads): one normalise, one or two MLPs, a few
        # elementwise ops; no torch.distributions objects, no extra copies.
        if self.core is not None:
            raise RuntimeError(
                "a recurrent policy acts with act_recurrent(obs, state, reset, ...), which carries its state"
            )
        return self._act_heads(self._features(obs), obs.shape[0], deterministic, with_value)

    def _act_heads(self, x: Tensor, n: int, deterministic: bool, with_value: bool):
        out = self._infer_mlp(self._actor_linears, x)
        values = self._infer_mlp(self._critic_linears, x).squeeze(-1) if with_value else None
        if self.is_discrete:
            logp_all = torch.log_softmax(out, dim=-1)
            if deterministic:
                actions = logp_all.argmax(dim=-1)
            else:
                actions = torch.multinomial(logp_all.exp(), 1).squeeze(-1)
            logp = logp_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
            return actions, logp, values
        out = self.action_mean(out)
        log_std = self._log_std()
        # log N(a; mean, std) = -0.5 * sum(z^2) - (sum(log_std) + d * log(sqrt(2 pi))), with z = noise exactly.
        log_norm = log_std.sum() + self.act_dim * _LOG_SQRT_2PI
        if deterministic:
            return out.reshape(n, *self.act_shape), (-log_norm).expand(out.shape[0]).clone(), values
        noise = torch.randn_like(out)
        actions = torch.addcmul(out, noise, log_std.exp())
        logp = noise.square().sum(dim=-1).mul_(-0.5).sub_(log_norm)
        return actions.reshape(n, *self.act_shape), logp, values

    def evaluate(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Differentiable ``(target_logp [N], entropy [N], values [N])`` (float32) of ``actions`` at ``obs``."""
        self._feed_forward_only("evaluate")
        x = self._features(obs)
        logp, entropy = self._logp_entropy(self.actor(x).float(), actions)
        return logp, entropy, self.critic(x).float().squeeze(-1)

    def _feed_forward_only(self, what: str) -> None:
        if self.core is not None:
            raise RuntimeError(f"{what}() of a recurrent policy needs its state: use evaluate_sequence / value_step")

    def _logp_entropy(self, out: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """``(logp [N], entropy [N])`` of ``actions`` under the actor's output ``out`` ``[N, act_dim]``."""
        if self.is_discrete:
            logp_all = torch.log_softmax(out, dim=-1)
            logp = logp_all.gather(-1, actions.long().reshape(-1, 1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(dim=-1)
            return logp, entropy
        out = self.action_mean(out)
        log_std = self._log_std()
        logp = self._gaussian_logp(out, log_std, actions.reshape(out.shape).to(out.dtype))
        # Entropy of a diagonal Gaussian: sum_i (log sigma_i + 0.5 * log(2 pi e)).
        entropy = (log_std + 0.5 + _LOG_SQRT_2PI).sum().expand(out.shape[0])
        return logp, entropy

    def value(self, obs: Tensor) -> Tensor:
        """Critic value ``[N]`` float32 of raw ``obs`` ``[N, *obs_shape]`` (differentiable; wrap in no_grad)."""
        self._feed_forward_only("value")
        return self.critic(self._features(obs)).float().squeeze(-1)

    # ----- recurrent policies (docs/recurrent.md) -----------------------------------------------------------
    @property
    def is_recurrent(self) -> bool:
        return self.core is not None

    @property
    def rnn_state_shape(self) -> tuple[int, int] | None:
        """Per-env state shape ``(1, rnn_size)`` (GRU) or ``(2, rnn_size)`` (LSTM); None for a feed-forward policy."""
        return None if self.core is None else self.core.state_shape

    def initial_state(self, num_envs: int, device: torch.device | str | None = None) -> Tensor:
        """Zero states ``[num_envs, *rnn_state_shape]`` in the policy's dtype."""
        weight = self.critic[-1].weight
        return torch.zeros(num_envs, *self.rnn_state_shape, dtype=weight.dtype, device=device or weight.device)

    def _core_input(self, feats: Tensor, reset: Tensor, prev_action: Tensor | None, prev_reward: Tensor | None,
                    prev_done: Tensor | None) -> Tensor:  # fmt: skip
        """Encoder features ``[N, F]``, with RL² inputs appended (zeroed where ``reset``: a new trial)."""
        if not self.rl2:
            return feats
        n = feats.shape[0]
        if self.is_discrete:
            action = nn.functional.one_hot(prev_action.reshape(n).long(), self.act_dim).to(feats.dtype)
        else:
            action = prev_action.reshape(n, self.act_dim).to(feats.dtype)
        extra = torch.cat([action, prev_reward.reshape(n, 1).to(feats.dtype), prev_done.reshape(n, 1).to(feats.dtype)],
                          dim=-1)  # fmt: skip
        return torch.cat([feats, torch.where(reset.view(n, 1), torch.zeros((), dtype=extra.dtype), extra)], dim=-1)

    @torch.no_grad()
    def act_recurrent(
        self, obs: Tensor, state: Tensor, reset: Tensor, prev_action: Tensor | None = None,
        prev_reward: Tensor | None = None, prev_done: Tensor | None = None, deterministic: bool = False, *,
        with_value: bool = False,
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:  # fmt: skip
        """One step of a recurrent policy for all ``N`` envs at once: ``obs`` ``[N, *obs_shape]``, ``state``
        ``[N, *rnn_state_shape]`` (the state after the previous step), ``reset`` ``[N]`` bool (zero the state
        first: the previous step ended the episode, or the trial), with ``memory=trial`` the previous step's
        action ``[N, *act_shape]``, raw reward ``[N]`` and done flag ``[N]`` bool.

        Returns ``(actions, behavior_logp [N], values [N] or None, new_state [N, *rnn_state_shape])``.
        """
        x = self._core_input(self._features(obs, inference=True), reset, prev_action, prev_reward, prev_done)
        h, new_state = self.core.step(x, state, reset)
        actions, logp, values = self._act_heads(h, obs.shape[0], deterministic, with_value)
        return actions, logp, values, new_state

    def evaluate_sequence(
        self, obs: Tensor, actions: Tensor, seq: SequenceInputs, *, detach_cols: Tensor | None = None,
        detach_at: int = 0,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
        """Re-run the policy over ``S`` rows of ``B`` envs from the stored state (truncated BPTT over the rows).

        Args:
            obs: ``[S, B, *obs_shape]`` raw observations (a slot's ``S = T + 1`` rows, the bootstrap row last).
            actions: ``[T, B, *act_shape]`` (T <= S) the actions taken at rows 0..T-1.
            seq: the stored state, per-row reset flags and RL² inputs (``sample_fast.recurrent.SequenceInputs``).
            detach_cols, detach_at: ``[B]`` bool: for these columns the state entering row ``detach_at`` is
                detached (R2D2 burn-in: the rows before it are run without gradient reaching them).

        Returns differentiable ``(target_logp [T, B], entropy [T, B], values [S, B], states [S, B, *state])``
        (float32 heads, float64 for a float64 policy; ``states[s]``: the state after row s, before any reset).
        """
        num_rows, num_envs = obs.shape[:2]
        num_steps = actions.shape[0]
        # PERF: the encoder runs once over all S * B rows; only the core steps row by row.
        feats = self._features(obs.reshape(num_rows * num_envs, *obs.shape[2:])).reshape(num_rows, num_envs, -1)
        state = seq.state0.to(feats.dtype)
        outs, states = [], []
        for s in range(num_rows):
            if detach_cols is not None and s == detach_at:
                state = torch.where(detach_cols.view(-1, 1, 1), state.detach(), state)
            prev = (None, None, None) if not self.rl2 else (seq.prev_action[s], seq.prev_reward[s], seq.prev_done[s])
            h, state = self.core.step(self._core_input(feats[s], seq.reset[s], *prev), state, seq.reset[s])
            outs.append(h)
            states.append(state)
        h = torch.stack(outs)  # [S, B, H]
        values = _at_least_f32(self.critic(h.reshape(num_rows * num_envs, -1))).reshape(num_rows, num_envs)
        out = _at_least_f32(self.actor(h[:num_steps].reshape(num_steps * num_envs, -1)))
        logp, entropy = self._logp_entropy(out, actions.reshape(num_steps * num_envs, *actions.shape[2:]))
        return (logp.reshape(num_steps, num_envs), entropy.reshape(num_steps, num_envs), values,
                torch.stack(states))  # fmt: skip

    def value_step(self, obs: Tensor, state: Tensor, prev_action: Tensor | None = None,
                   prev_reward: Tensor | None = None) -> Tensor:  # fmt: skip
        """Critic value ``[K]`` float32 of ``obs`` ``[K, *obs_shape]`` one step after ``state`` ``[K, *state]``, no
        reset: the true final observation of a truncated step, from the state that step left (RL²: its action
        and raw reward, done flag 0, as if the time limit had not cut the episode)."""
        n = obs.shape[0]
        no_reset = torch.zeros(n, dtype=torch.bool, device=obs.device)
        prev_done = None if prev_action is None else no_reset
        x = self._core_input(self._features(obs), no_reset, prev_action, prev_reward, prev_done)
        h, _ = self.core.step(x, state.to(x.dtype), no_reset)
        return _at_least_f32(self.critic(h)).squeeze(-1)

    @torch.no_grad()
    def update_normalizer(self, obs: Tensor, merge: Any = None) -> None:
        """Merge raw ``obs`` ``[..., *obs_shape]`` into the running statistics (no-op without normalisation);
        ``merge``: see ``RunningNormalizer.update``."""
        if self.normalizer is not None:
            self.normalizer.update(obs.reshape(-1, self.obs_dim), merge=merge)
