"""``toy``: a tiny pure-torch batched env with a known optimal return, for fast learning tests.

It owns only its own state tensors (targets, step counters, a torch generator) on the requested device and is
fully vectorised, so it runs anywhere torch runs and costs next to nothing next to a policy forward pass.

Three kinds (option ``kind``):

* ``"continuous"`` (default): obs ``[target (dim), t / max_episode_steps]``, target uniform in ``[-1, 1]^dim`` and
  redrawn every step; action in ``[-1, 1]^dim`` (clipped to that box); reward ``1 - mean((action - target)^2)``.
  The optimal policy is ``action = target`` (reward 1 per step).
* ``"discrete"``: obs ``[one_hot(state, num_states), t / max_episode_steps]``, state uniform in ``[0, num_states)``
  and redrawn every step; ``num_actions`` actions; reward 1 if ``action == state % num_actions`` else 0.
* ``"image"``: obs a uint8 frame ``[1, image_size, image_size]``, black but for one pixel of 255 at a uniformly
  random row and column, redrawn every step; ``num_actions`` actions; reward 1 if the action is the pixel's column
  band ``column * num_actions // image_size`` else 0. A pixel env for CNN policies (the trainer's CNN test).

Every episode is truncated after ``max_episode_steps`` steps. With ``terminate_on_miss`` an episode terminates on a
"miss" (discrete: wrong action; continuous: ``mean((action - target)^2) > miss_threshold``), so both the terminated
and the truncated paths get exercised. Either way ``optimal_return == max_episode_steps``.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import BatchedEnv, EnvError, EpisodeTracker, Spec, StepResult, UnknownOptionError

#: Every option with its default; ``kind``-specific ones are listed in ``_KIND_OPTIONS``.
DEFAULT_OPTIONS: dict[str, Any] = {
    "kind": "continuous",
    "dim": 2,
    "num_states": 8,
    "num_actions": 4,
    "max_episode_steps": 16,
    "terminate_on_miss": False,
    "miss_threshold": 0.25,
    "image_size": 12,
}

_KIND_OPTIONS: dict[str, tuple[str, ...]] = {
    "continuous": ("kind", "dim", "max_episode_steps", "terminate_on_miss", "miss_threshold"),
    "discrete": ("kind", "num_states", "num_actions", "max_episode_steps", "terminate_on_miss"),
    "image": ("kind", "image_size", "num_actions", "max_episode_steps", "terminate_on_miss"),
}


def _positive_int(opts: dict[str, Any], key: str) -> int:
    value = opts[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise EnvError(f"toy option {key} must be a positive int, got {value!r}")
    return value


def check_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options of ``kind`` (defaults filled in) checked; raises ``EnvError``. ``ToyEnv`` calls it first, and so
    does the trainer's config check (``sample_fast.envs.check_options``)."""
    kind = options.get("kind", DEFAULT_OPTIONS["kind"])
    if kind not in _KIND_OPTIONS:
        raise EnvError(f"toy option kind must be one of {sorted(_KIND_OPTIONS)}, got {kind!r}")
    valid = _KIND_OPTIONS[kind]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        other = [k for k in unknown if k in DEFAULT_OPTIONS]
        hint = f"{', '.join(other)} only apply to another kind" if other else ""
        raise UnknownOptionError(
            f"unknown option(s) {unknown} for toy kind={kind!r}{f' ({hint})' if hint else ''}; "
            f"valid options: {', '.join(valid)}",
            unknown,
            list(valid),
            hint=hint,
        )
    opts = {k: options.get(k, DEFAULT_OPTIONS[k]) for k in valid}
    for key in ("max_episode_steps", "dim", "num_states", "num_actions", "image_size"):
        if key in opts:
            _positive_int(opts, key)
    if kind == "image" and opts["image_size"] < opts["num_actions"]:
        raise EnvError(f"toy option image_size ({opts['image_size']}) must be >= num_actions ({opts['num_actions']}): "
                       "each action needs a column band of at least one pixel")  # fmt: skip
    if kind == "continuous" and not (
        isinstance(opts["miss_threshold"], (int, float)) and not isinstance(opts["miss_threshold"], bool)
        and opts["miss_threshold"] > 0
    ):  # fmt: skip
        raise EnvError(f"toy option miss_threshold must be > 0, got {opts['miss_threshold']!r}")
    return opts


class ToyEnv(BatchedEnv):
    """The ``toy`` env (see the module docstring). Built by ``make("toy", num_envs, **options)``.

    Attributes:
        optimal_return: the largest possible episode return (``max_episode_steps``: reward 1 on every step).
        random_return: the expected episode return of a uniformly random policy, when it has a closed form
            (None for ``kind="continuous"`` with ``terminate_on_miss``). Learning tests pick thresholds between
            the two.
    """

    backend = "toy"

    def __init__(self, name: str, num_envs: int, *, device: str | torch.device = "cpu", seed: int = 0, **options: Any):
        if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
            raise EnvError(f"num_envs must be a positive int, got {num_envs!r}")
        self.options = opts = check_options(name, options)
        kind = opts["kind"]
        self.kind = kind
        self.name = name
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.max_episode_steps = opts["max_episode_steps"]
        self.terminate_on_miss = bool(opts["terminate_on_miss"])
        horizon = self.max_episode_steps
        self.optimal_return = float(horizon)

        if kind == "continuous":
            self.dim = opts["dim"]
            self.miss_threshold = float(opts["miss_threshold"])
            bound = torch.ones(self.dim, device=self.device)
            self.action_spec = Spec(shape=(self.dim,), dtype=torch.float32, low=-bound, high=bound)
            obs_dim = self.dim + 1
            # E[(a - x)^2] = Var(a) + Var(x) = 1/3 + 1/3 for a, x independent uniform on [-1, 1].
            self.random_return = None if self.terminate_on_miss else horizon * (1.0 - 2.0 / 3.0)
        else:
            self.num_actions = opts["num_actions"]
            self.action_spec = Spec(shape=(), dtype=torch.int64, num_actions=self.num_actions)
            p = 1.0 / self.num_actions  # a uniform random action hits whatever the state's distribution
            # With termination the k-th reward needs k hits in a row: sum_k p^k; without, p per step.
            self.random_return = sum(p**k for k in range(1, horizon + 1)) if self.terminate_on_miss else horizon * p
        if kind == "image":
            self.image_size = size = opts["image_size"]
            shape = (1, size, size)
            self.observation_spec = Spec(shape=shape, dtype=torch.uint8, low=torch.zeros(shape, dtype=torch.uint8),
                                         high=torch.full(shape, 255, dtype=torch.uint8))  # fmt: skip
        else:
            if kind == "discrete":
                self.num_states = opts["num_states"]
                obs_dim = self.num_states + 1
            self.observation_spec = Spec(shape=(obs_dim,), dtype=torch.float32)

        self._seed = seed
        self._gen = torch.Generator(device=self.device)
        self._gen.manual_seed(seed)
        self._t = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self._state = self._draw_state()  # target [N, dim] (continuous) or state [N] (discrete)
        self._gen.manual_seed(seed)  # so that reset() and reset(seed=seed) start the same stream
        # Partial resets (reset(env_mask=...)) draw from their own stream, so the other envs' states (drawn from
        # ``_gen`` every step for the whole batch) continue bit for bit.
        self._mask_gen = torch.Generator(device=self.device)
        self._mask_gen.manual_seed(_mask_seed(seed))
        self._tracker = EpisodeTracker(num_envs, self.device)

    # ----- helpers --------------------------------------------------------------------------------------------
    def _draw_state(self, gen: torch.Generator | None = None) -> torch.Tensor:
        n, gen = self.num_envs, self._gen if gen is None else gen
        if self.kind == "continuous":
            return torch.rand(n, self.dim, generator=gen, device=self.device) * 2.0 - 1.0
        if self.kind == "image":  # [N, 2]: the bright pixel's (row, column)
            return torch.randint(0, self.image_size, (n, 2), generator=gen, device=self.device)
        return torch.randint(0, self.num_states, (n,), generator=gen, device=self.device)

    def _observe(self, state: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if self.kind == "image":
            frames = torch.zeros(self.num_envs, 1, self.image_size, self.image_size, dtype=torch.uint8,
                                 device=self.device)  # fmt: skip
            frames[torch.arange(self.num_envs, device=self.device), 0, state[:, 0], state[:, 1]] = 255
            return frames
        frac = (t.to(torch.float32) / self.max_episode_steps).unsqueeze(-1)
        if self.kind == "continuous":
            return torch.cat([state, frac], dim=-1)
        one_hot = torch.nn.functional.one_hot(state, self.num_states).to(torch.float32)
        return torch.cat([one_hot, frac], dim=-1)

    # ----- backend hooks --------------------------------------------------------------------------------------
    def _reset(self, seed: int | None) -> tuple[torch.Tensor, dict[str, Any]]:
        if seed is not None:
            self._gen.manual_seed(seed)
            self._mask_gen.manual_seed(_mask_seed(seed))
        self._t.zero_()
        self._state = self._draw_state()
        self._tracker.reset()
        return self._observe(self._state, self._t), {}

    def _reset_envs(self, env_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        fresh = self._draw_state(self._mask_gen)
        mask = env_mask.unsqueeze(-1) if self._state.ndim == 2 else env_mask
        self._state = torch.where(mask, fresh, self._state)
        self._t.masked_fill_(env_mask, 0)
        self._tracker.reset(env_mask)
        return self._observe(self._state, self._t), {}

    def _step(self, actions: torch.Tensor) -> StepResult:
        # PERF: a handful of [N]-sized torch ops, no host syncs.
        if self.kind == "continuous":
            err = (actions.clamp(-1.0, 1.0) - self._state).square().mean(dim=-1)
            reward = 1.0 - err
            miss = err > self.miss_threshold
        else:
            if self.kind == "image":
                correct = self._state[:, 1] * self.num_actions // self.image_size
            else:
                correct = self._state % self.num_actions
            hit = actions == correct
            reward = hit.to(torch.float32)
            miss = ~hit
        self._t += 1
        terminated = miss & self.terminate_on_miss
        truncated = self._t >= self.max_episode_steps
        done = terminated | truncated

        next_state = self._draw_state()
        final_obs = self._observe(next_state, self._t)
        # Done envs start a new episode in this same call: a fresh state and t = 0.
        reset_state = self._draw_state()
        mask = done.unsqueeze(-1) if self._state.ndim == 2 else done
        self._state = torch.where(mask, reset_state, next_state)
        self._t.masked_fill_(done, 0)
        obs = self._observe(self._state, self._t)

        info: dict[str, Any] = {
            "final_obs": final_obs,
            "physics_reset": torch.zeros(self.num_envs, dtype=torch.bool, device=self.device),
        }
        self._tracker.update(reward, done, info)
        return StepResult(obs, reward, terminated, truncated, info)


def _mask_seed(seed: int) -> int:
    """The seed of the partial-reset stream, apart from the step stream's ``seed``."""
    return (int(seed) * 1_000_003 + 0x5EED) % (2**63)
