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

from .encoders import ENCODERS, EncoderError, build_cnn_trunk, resolve_encoder

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "silu": nn.SiLU}
#: In-place forms of the activations, for the no-grad inference path.
_INPLACE = {
    "tanh": torch.tanh_,
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
    #: encoders scale uint8 pixels by 1/255 instead (pixel statistics would only add a per-pixel affine map).
    normalize_obs: bool = True
    #: Normalised observations are clipped to [-obs_clip, obs_clip].
    obs_clip: float = 10.0
    #: Orthogonal-init gain of the actor's output layer (CleanRL: 0.01, so the initial policy is near-uniform).
    actor_out_gain: float = 0.01
    #: Orthogonal-init gain of the critic's output layer (CleanRL: 1.0).
    critic_out_gain: float = 1.0

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
        return encoder


#: PolicyConfig fields of the Gaussian policy (continuous actions only).
_GAUSSIAN_FIELDS = ("init_log_std", "min_log_std", "max_log_std", "squash_mean")


def _mlp(in_dim: int, hidden: list[int], out_dim: int, activation: str, out_gain: float) -> nn.Sequential:
    """MLP with CleanRL's orthogonal init: gain sqrt(2) on hidden layers, ``out_gain`` on the last, zero biases."""
    layers: list[nn.Module] = []
    prev = in_dim
    for width in hidden:
        linear = nn.Linear(prev, int(width))
        nn.init.orthogonal_(linear.weight, math.sqrt(2.0))
        nn.init.zeros_(linear.bias)
        layers += [linear, _ACTIVATIONS[activation]()]
        prev = int(width)
    out = nn.Linear(prev, out_dim)
    nn.init.orthogonal_(out.weight, out_gain)
    nn.init.zeros_(out.bias)
    layers.append(out)
    return nn.Sequential(*layers)


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
        x = x.to(torch.float64)
        n = x.shape[0]
        if n == 0:
            return
        batch_mean = x.mean(dim=0)
        batch_var = x.var(dim=0, unbiased=False)
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
        #: The shared CNN trunk (None for the MLP encoder): uint8 [N, C, H, W] -> float32 [N, hidden_sizes[-1]].
        self.trunk: nn.Module | None = None
        if self.encoder == "mlp":
            self.actor = _mlp(self.obs_dim, hidden, out_dim, cfg.activation, cfg.actor_out_gain)
            self.critic = _mlp(self.obs_dim, hidden, 1, cfg.activation, cfg.critic_out_gain)
        else:
            self.trunk = build_cnn_trunk(self.encoder, self.obs_shape, hidden, _ACTIVATIONS[cfg.activation],
                                         [int(c) for c in cfg.impala_channels])  # fmt: skip
            # Linear heads on the trunk's features (``_mlp`` without hidden layers: the same init gains).
            self.actor = _mlp(hidden[-1], [], out_dim, cfg.activation, cfg.actor_out_gain)
            self.critic = _mlp(hidden[-1], [], 1, cfg.activation, cfg.critic_out_gain)
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
        use_normalizer = cfg.normalize_obs and self.trunk is None  # pixels are scaled by 1/255 in the trunk instead
        self.normalizer = RunningNormalizer(self.obs_dim, cfg.obs_clip) if use_normalizer else None
        # Linear layers of each MLP, for the inference path (modules, not tensors: .to(), load_state_dict and deepcopy
        # stay safe).
        self._actor_linears = [layer for layer in self.actor if isinstance(layer, nn.Linear)]
        self._critic_linears = [layer for layer in self.critic if isinstance(layer, nn.Linear)]

    # ----- helpers ------------------------------------------------------------------------------------------------
    def _features(self, obs: Tensor) -> Tensor:
        if self.trunk is not None:
            return self.trunk(obs)
        x = obs.reshape(obs.shape[0], self.obs_dim)
        if not x.is_floating_point():  # uint8 observations are stored as uint8 and converted only here
            x = x.float()
        return self.normalizer(x) if self.normalizer is not None else x

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
            return torch.addcmul(self.action_center, self.action_half_range, torch.tanh(out))
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
        x = self._features(obs)
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
            return out.reshape(obs.shape[0], *self.act_shape), (-log_norm).expand(out.shape[0]).clone(), values
        noise = torch.randn_like(out)
        actions = torch.addcmul(out, noise, log_std.exp())
        logp = noise.square().sum(dim=-1).mul_(-0.5).sub_(log_norm)
        return actions.reshape(obs.shape[0], *self.act_shape), logp, values

    def evaluate(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Differentiable ``(target_logp [N], entropy [N], values [N])`` (float32) of ``actions`` at ``obs``."""
        x = self._features(obs)
        out = self.actor(x).float()
        values = self.critic(x).float().squeeze(-1)
        if self.is_discrete:
            logp_all = torch.log_softmax(out, dim=-1)
            logp = logp_all.gather(-1, actions.long().reshape(-1, 1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(dim=-1)
            return logp, entropy, values
        out = self.action_mean(out)
        log_std = self._log_std()
        logp = self._gaussian_logp(out, log_std, actions.reshape(out.shape).float())
        # Entropy of a diagonal Gaussian: sum_i (log sigma_i + 0.5 * log(2 pi e)).
        entropy = (log_std + 0.5 + _LOG_SQRT_2PI).sum().expand(out.shape[0])
        return logp, entropy, values

    def value(self, obs: Tensor) -> Tensor:
        """Critic value ``[N]`` float32 of raw ``obs`` ``[N, *obs_shape]`` (differentiable; wrap in no_grad)."""
        return self.critic(self._features(obs)).float().squeeze(-1)

    @torch.no_grad()
    def update_normalizer(self, obs: Tensor, merge: Any = None) -> None:
        """Merge raw ``obs`` ``[..., *obs_shape]`` into the running statistics (no-op without normalisation);
        ``merge``: see ``RunningNormalizer.update``."""
        if self.normalizer is not None:
            self.normalizer.update(obs.reshape(-1, self.obs_dim), merge=merge)
