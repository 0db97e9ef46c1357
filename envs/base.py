"""The batched-environment contract every backend implements.

A ``BatchedEnv`` owns simulation state only: N copies of one task, stepped together, with torch tensors
``[num_envs, ...]`` on the env's device in and out. It knows nothing about policies, buffers or learning.

Auto-reset convention (the same for every backend; adapters convert theirs to it):

* ``step(actions)`` returns ``StepResult(obs, reward, terminated, truncated, info)``.
* ``reward[i]``, ``terminated[i]`` and ``truncated[i]`` describe the transition that ``actions[i]`` caused.
* When that transition ended env i's episode (``terminated[i] or truncated[i]``), env i is reset *in the same
  call*: ``obs[i]`` is already the first observation of the next episode. No action is ever discarded and no
  transition spans two episodes (EnvPool's "reset on the next step" is converted in its adapter).
* ``info["final_obs"]`` ``[N, *obs_shape]`` is always the observation each transition actually reached: the last
  observation of the ended episode where ``done[i]``, and equal to ``obs[i]`` elsewhere. So ``final_obs`` is the
  true ``next_obs`` of every transition, which is what bootstrapping needs.
* ``terminated`` means the MDP reached a terminal state (value 0, do not bootstrap). ``truncated`` means the
  episode was cut by a time limit (bootstrap from ``V(info["final_obs"])``). A step can be both only if the
  time limit and the terminal state coincide; then ``terminated`` wins for bootstrapping.
* ``info["episode_return"][i]`` and ``info["episode_length"][i]`` hold the finished episode's undiscounted return
  and length where ``done[i]``, and 0 elsewhere.
* ``info["physics_reset"][i]`` is True when env i's physics produced a non-finite state; that env is reset, the
  step is reported as ``terminated`` and its ``final_obs`` row is zeros (observations never carry NaN).

Per-env reset on demand: ``reset(env_mask=mask)`` (``mask`` a bool tensor ``[N]``) resets only the chosen envs
(curricula, evaluation, TorchRL's ``StepCounter``, gymnasium's ``reset_mask``) and returns the full obs ``[N, ...]``:
the chosen rows are their new episodes' first observations, the other rows the observations the last step (or
reset) returned, and the other envs continue bit for bit as if nothing had happened (their physics, random streams,
step counters and episode statistics are untouched). The chosen envs' time limit and episode statistics restart.
A backend implements it in ``_reset_envs``; one that cannot raises ``EnvError`` saying so (never a full reset).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch


class EnvError(ValueError):
    """A bad argument to ``make`` or to a ``BatchedEnv`` method. The message says what to change."""


class OptionError(EnvError):
    """One option a backend rejects, worded for both callers: ``str()`` in ``make()``'s terms (``option k=v``,
    ``backend='mujoco'``) and ``config_message()`` in the training config's (``env.options.k=v``,
    ``env.backend=mujoco``), so the trainer's ``resolve()`` reports exactly what ``make()`` would reject.

    Args:
        key, value: the option and its value.
        problem: why it is rejected, read after ``<key>=<value>`` ("is not supported by the envpool backend ...").
        backends: backends that do take this value, offered as the fix.
        hint: another fix ("drop contacts", "set JAX_ENABLE_X64=1 ..."), offered after the backends.
    """

    def __init__(self, key: str, value: Any, problem: str, *, backends: tuple[str, ...] = (), hint: str = ""):
        self.key, self.value, self.problem, self.backends, self.hint = key, value, problem, tuple(backends), hint
        super().__init__(self._message(f"option {key}={value!r}", [f"backend={b!r}" for b in self.backends]))

    def config_message(self) -> str:
        """The message in config terms: ``env.options.<key>=...``, fixes as ``env.backend=<name>``."""
        return self._message(f"env.options.{self.key}={self.value!r}", [f"env.backend={b}" for b in self.backends])

    def _message(self, subject: str, alternatives: list[str]) -> str:
        fixes = (["use " + " or ".join(alternatives)] if alternatives else []) + ([self.hint] if self.hint else [])
        return f"{subject} {self.problem}" + (f"; {', or '.join(fixes)}" if fixes else "")


class UnknownOptionError(EnvError):
    """Option names a backend does not know (``unknown``, sorted), the ones it takes (``valid``) and, for unknown ones
    another backend takes, which backends (``owners``; filled in by ``sample_fast.envs.make`` and ``check_options``);
    ``hint`` is any other explanation already in the message ("only apply to another kind")."""

    def __init__(
        self,
        message: str,
        unknown: list[str],
        valid: list[str],
        owners: dict[str, list[str]] | None = None,
        hint: str = "",
    ) -> None:
        super().__init__(message)
        self.unknown, self.valid, self.owners, self.hint = unknown, valid, owners or {}, hint


@dataclass(frozen=True)
class Spec:
    """Per-env spec of an observation or action tensor.

    Attributes:
        shape: shape of one env's tensor (the batched tensor is ``[num_envs, *shape]``).
        dtype: torch dtype.
        low, high: bounds, tensors of ``shape`` (continuous) or None when unbounded.
        num_actions: number of discrete actions for a discrete action space, else None.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    low: torch.Tensor | None = None
    high: torch.Tensor | None = None
    num_actions: int | None = None

    @property
    def is_discrete(self) -> bool:
        return self.num_actions is not None

    def describe(self, num_envs: int, device: torch.device) -> str:
        extra = f", values in [0, {self.num_actions})" if self.is_discrete else ""
        return f"shape {(num_envs, *self.shape)}, dtype {self.dtype}, device {device}{extra}"


class StepResult(NamedTuple):
    """What ``step``/``recv`` return. Shapes: obs ``[N, *obs_shape]`` of ``observation_spec.dtype`` (float32; uint8
    for Atari frames), reward ``[N]`` float32,
    terminated/truncated ``[N]`` bool, info: dict of tensors ``[N, ...]`` (see the module docstring)."""

    obs: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    info: dict[str, Any]


@dataclass
class EpisodeTracker:
    """Running undiscounted return and length per env, and the ``info`` fields derived from them."""

    num_envs: int
    device: torch.device
    returns: torch.Tensor = field(init=False)
    lengths: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.returns = torch.zeros(self.num_envs, dtype=torch.float32, device=self.device)
        self.lengths = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)

    def reset(self, env_mask: torch.Tensor | None = None) -> None:
        """Restart every env's statistics, or only those of the envs where ``env_mask`` (bool ``[N]``) is True."""
        if env_mask is None:
            self.returns.zero_()
            self.lengths.zero_()
        else:
            self.returns.masked_fill_(env_mask, 0.0)
            self.lengths.masked_fill_(env_mask, 0)

    def update(self, reward: torch.Tensor, done: torch.Tensor, info: dict[str, Any]) -> None:
        """Accumulate one step; write ``episode_return``/``episode_length`` into ``info`` and restart done envs."""
        self.returns += reward
        self.lengths += 1
        info["episode_return"] = torch.where(done, self.returns, torch.zeros_like(self.returns))
        info["episode_length"] = torch.where(done, self.lengths, torch.zeros_like(self.lengths))
        self.returns.masked_fill_(done, 0.0)
        self.lengths.masked_fill_(done, 0)


class _LazySpec:
    """Formats ``Spec.describe`` only when an error message needs it."""

    __slots__ = ("spec", "num_envs", "device")

    def __init__(self, spec: Spec, num_envs: int, device: torch.device) -> None:
        self.spec, self.num_envs, self.device = spec, num_envs, device

    def __str__(self) -> str:
        return self.spec.describe(self.num_envs, self.device)


class BatchedEnv(abc.ABC):
    """N environments of one task stepped together. See the module docstring for the episode convention.

    Subclasses set ``num_envs``, ``device``, ``observation_spec``, ``action_spec``, ``backend``, ``name`` and
    ``max_episode_steps`` in their constructor, and implement ``_reset`` and ``_step`` (or override ``send``/``recv``
    when they can overlap simulation with the caller's work).
    """

    num_envs: int
    device: torch.device
    observation_spec: Spec
    action_spec: Spec
    backend: str
    name: str
    max_episode_steps: int | None = None
    #: Whether ``truncated`` comes only from the time limit, so an env truncates at most once every
    #: ``max_episode_steps`` steps (the trajectory store sizes its final-observation table on it: ``truncation_limit``).
    #: False where the env itself may truncate for other reasons (any gymnasium env).
    truncates_only_at_time_limit: bool = True
    #: Seconds of simulated time per env step (``timestep * frame_skip``), where the backend knows it.
    dt: float | None = None
    #: Physics steps per env step.
    frame_skip: int = 1
    check_actions: bool = True

    _pending: torch.Tensor | None = None
    _closed: bool = False
    _was_reset: bool = False  # reset() ran at least once (a partial reset needs a running batch)

    @property
    def truncation_limit(self) -> int | None:
        """The fewest env steps between two truncations of one env: ``max_episode_steps`` where the time limit is the
        only cause of truncation, else None (no bound: a truncation could come at any step)."""
        return self.max_episode_steps if self.truncates_only_at_time_limit else None

    # ----- public API -------------------------------------------------------------------------------------
    def reset(
        self, seed: int | None = None, *, env_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Reset every env, or with ``env_mask`` only the chosen ones. Returns obs ``[N, *obs_shape]`` and an info dict.

        Args:
            seed: reseeds the whole batch (only without ``env_mask``).
            env_mask: bool tensor ``[N]`` on any device: reset only the envs where it is True; the others continue
                bit for bit and their rows of the returned obs are the ones the last step (or reset) returned.
                Raises ``EnvError`` on a backend that cannot reset chosen envs (never a silent full reset).
        """
        self._check_open()
        if env_mask is None:
            self._pending = None
            obs_info = self._reset(seed)
            self._was_reset = True
            return obs_info
        mask = self._check_env_mask(env_mask)
        if seed is not None:
            raise EnvError(
                "reset(seed=..., env_mask=...): a seed reseeds the whole batch; reset the chosen envs without a seed "
                "(each continues its own random stream), or call reset(seed=...) without env_mask"
            )
        if self._pending is not None:
            raise EnvError("reset(env_mask=...) called between send() and recv(); call recv() first")
        if not self._was_reset:
            raise EnvError("reset(env_mask=...) before the first reset(); call reset() once first")
        return self._reset_envs(mask)

    def _check_env_mask(self, env_mask: Any) -> torch.Tensor:
        if not isinstance(env_mask, torch.Tensor):
            raise EnvError(
                f"env_mask must be a bool torch.Tensor of shape ({self.num_envs},), got {type(env_mask).__name__}"
                " (use torch.as_tensor(mask, dtype=torch.bool))"
            )
        if env_mask.dtype != torch.bool or tuple(env_mask.shape) != (self.num_envs,):
            raise EnvError(
                f"env_mask must be a bool tensor of shape ({self.num_envs},); got dtype {env_mask.dtype}, shape "
                f"{tuple(env_mask.shape)} (one True per env to reset)"
            )
        return env_mask.to(self.device)

    def step(self, actions: torch.Tensor) -> StepResult:
        """Step every env with ``actions`` ``[N, *action_shape]`` (see ``action_spec``)."""
        self.send(actions)
        return self.recv()

    def send(self, actions: torch.Tensor) -> None:
        """Start stepping with ``actions``; ``recv()`` returns the result. Backends that can overlap simulation
        with the caller's work (threads, EnvPool async, JAX async dispatch) return before the step finishes."""
        self._check_open()
        if self._pending is not None:
            raise EnvError("send() called twice without recv(); call recv() to collect the previous step first")
        if self.check_actions:
            self.validate_actions(actions)
        self._pending = actions
        self._send(actions)

    def recv(self) -> StepResult:
        """Wait for the step started by ``send`` and return its ``StepResult``."""
        self._check_open()
        if self._pending is None:
            raise EnvError("recv() called without a pending send(actions)")
        actions, self._pending = self._pending, None
        return self._recv(actions)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> BatchedEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; close() is the contract
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, backend={self.backend!r}, num_envs={self.num_envs}, "
            f"device={self.device}, obs={tuple(self.observation_spec.shape)}, act={tuple(self.action_spec.shape)})"
        )

    # ----- validation ---------------------------------------------------------------------------------------
    def validate_actions(self, actions: torch.Tensor) -> None:
        """Raise ``EnvError`` naming the expected spec if ``actions`` has the wrong type, shape, dtype or device,
        or holds non-finite values."""
        spec = self.action_spec
        # PERF: the message is built only when raising (describe() cost ~50 µs per step in a profile).
        expected = _LazySpec(spec, self.num_envs, self.device)
        if not isinstance(actions, torch.Tensor):
            raise EnvError(f"actions must be a torch.Tensor with {expected}; got {type(actions).__name__}")
        if tuple(actions.shape) != (self.num_envs, *spec.shape):
            raise EnvError(f"actions have shape {tuple(actions.shape)}; expected {expected}")
        if actions.dtype != spec.dtype:
            raise EnvError(f"actions have dtype {actions.dtype}; expected {expected} (use actions.to({spec.dtype}))")
        if actions.device != self.device:
            raise EnvError(f"actions are on {actions.device}; expected {expected} (use actions.to('{self.device}'))")
        if not spec.is_discrete and not bool(torch.isfinite(actions).all()):  # SYNC: one host read per step
            bad = (~torch.isfinite(actions)).any(dim=tuple(range(1, actions.ndim))).nonzero().flatten().tolist()
            raise EnvError(f"actions contain NaN or inf for envs {bad[:10]}; check the policy output")
        if spec.is_discrete and actions.numel() and (actions.min() < 0 or actions.max() >= spec.num_actions):
            lo, hi = int(actions.min()), int(actions.max())
            raise EnvError(
                f"discrete actions must be in [0, {spec.num_actions}); got values in [{lo}, {hi}]; expected {expected}"
            )

    def _check_open(self) -> None:
        if self._closed:
            raise EnvError(f"{self!r} is closed; make a new env with sample_fast.envs.make(...)")

    # ----- backend hooks ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def _reset(self, seed: int | None) -> tuple[torch.Tensor, dict[str, Any]]: ...

    def _reset_envs(self, env_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        """Reset the envs where ``env_mask`` (bool ``[N]`` on the env's device, checked) is True, leaving the others
        bit for bit as they are; return the full obs ``[N, *obs_shape]`` and an info dict. Backends that can
        override this; the default refuses (a full reset instead would silently restart every episode)."""
        raise EnvError(
            f"backend {self.backend!r} ({type(self).__name__}) cannot reset chosen envs (reset(env_mask=...)); "
            "reset the whole batch with reset(), or use a backend that can "
            "(mujoco, mjx, warp, toy, gymnasium, envpool, ale)"
        )

    def _send(self, actions: torch.Tensor) -> None:  # noqa: B027 (optional hook, default no-op)
        """Default: nothing happens until ``_recv``."""

    def _recv(self, actions: torch.Tensor) -> StepResult:
        return self._step(actions)

    def _step(self, actions: torch.Tensor) -> StepResult:
        raise NotImplementedError(f"{type(self).__name__} implements neither _step nor _send/_recv")

    def _close(self) -> None:  # noqa: B027 (optional hook, default no-op)
        """Release threads, processes and devices. Called once."""
