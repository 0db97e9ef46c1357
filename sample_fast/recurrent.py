"""The recurrent core of a policy (GRU or LSTM after the encoder) and the per-row inputs of a recurrent sequence.

Owns one rule used identically by the sampler (one step over all envs of a split) and the learner (a sequence of
``[T + 1, B]`` rows re-run from the state stored at the slot start): before a row is processed, the state of every
env whose ``reset`` flag is set is zeroed, and with RL² inputs (``memory=trial``) the previous action, reward and
done flag are zeroed there too. The sampler sets ``reset`` where the previous step ended an episode (terminated or
truncated; ``memory=episode``) or a trial (``memory=trial``). It never touches an env, a slot or an optimizer;
``sample_fast.policy.ActorCritic`` builds it. See docs/recurrent.md.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

#: ``PolicyConfig.rnn`` values and ``PolicyConfig.memory`` values.
RNN_KINDS = ("none", "gru", "lstm")
MEMORY_KINDS = ("episode", "trial")

#: Slot keys of a recurrent policy (docs/recurrent.md): the state at the slot start and the per-row reset flags;
#: with RL² inputs also the previous action / reward / done flag at the slot start (rows 1..T follow from the slot).
RNN_KEYS = ("rnn_state", "rnn_reset")
RL2_KEYS = ("prev_action", "prev_reward", "prev_done")


class RecurrentCore(nn.Module):
    """``nn.GRUCell`` or ``nn.LSTMCell`` of ``size`` units on ``in_dim`` features; state ``[N, *state_shape]`` with
    ``state_shape = (1, size)`` (GRU: h) or ``(2, size)`` (LSTM: h, c). Output: h ``[N, size]``."""

    def __init__(self, kind: str, in_dim: int, size: int):
        super().__init__()
        if kind not in ("gru", "lstm"):
            raise ValueError(f"rnn kind {kind!r} unknown; use gru or lstm")
        self.kind, self.size = kind, size
        self.cell = nn.GRUCell(in_dim, size) if kind == "gru" else nn.LSTMCell(in_dim, size)
        for name, param in self.cell.named_parameters():  # orthogonal recurrent weights, zero biases (SF, CleanRL)
            if "bias" in name:
                nn.init.zeros_(param)
            else:
                nn.init.orthogonal_(param)

    @property
    def state_shape(self) -> tuple[int, int]:
        return (1 if self.kind == "gru" else 2, self.size)

    def step(self, x: Tensor, state: Tensor, reset: Tensor) -> tuple[Tensor, Tensor]:
        """One row: ``x`` ``[N, in_dim]``, ``state`` ``[N, *state_shape]``, ``reset`` ``[N]`` bool (zero the state
        first). Returns ``(h [N, size], new_state [N, *state_shape])``."""
        # torch.where, not a multiply: a NaN in a stale state must not survive its reset.
        state = torch.where(reset.view(-1, 1, 1), torch.zeros((), dtype=state.dtype, device=state.device), state)
        if self.kind == "gru":
            h = self.cell(x, state[:, 0])
            return h, h.unsqueeze(1)
        h, c = self.cell(x, (state[:, 0], state[:, 1]))
        return h, torch.stack([h, c], dim=1)


class SequenceInputs(NamedTuple):
    """What the learner needs, besides ``obs`` and ``actions``, to re-run a recurrent policy over ``[S, B]`` rows.

    state0: ``[B, *state_shape]`` the state stored at the slot start (before row 0's reset).
    reset: ``[S, B]`` bool, zero the state before row s.
    prev_action, prev_reward, prev_done: RL² inputs per row (``[S, B, ...]``, ``[S, B]`` float, ``[S, B]`` bool),
        or None without them: row s sees action, raw reward and done flag of step s - 1.
    """

    state0: Tensor
    reset: Tensor
    prev_action: Tensor | None = None
    prev_reward: Tensor | None = None
    prev_done: Tensor | None = None

    def columns(self, cols: Tensor) -> SequenceInputs:
        """The inputs of env columns ``cols`` ``[b]`` (a minibatch over envs)."""
        pick = [None if x is None else x[:, cols] for x in self[2:]]
        return SequenceInputs(self.state0[cols], self.reset[:, cols], *pick)


def sequence_inputs(batch: Any, rl2: bool) -> SequenceInputs:
    """The ``SequenceInputs`` of a slot batch (``obs [T + 1, B]``, the per-step keys, ``rnn_state``, ``rnn_reset``
    ``[T + 1, B]`` and with ``rl2`` the slot-start ``prev_*`` keys): row 0's RL² inputs are the stored ones, row
    s >= 1's are step s - 1's action, raw reward and ``terminated | truncated``."""
    state0, reset = batch["rnn_state"], batch["rnn_reset"]
    if not rl2:
        return SequenceInputs(state0, reset)
    actions, rewards = batch["actions"], batch["rewards"]
    done = batch["terminated"] | batch["truncated"]
    prev_action = torch.cat([batch["prev_action"].unsqueeze(0).to(actions.dtype), actions], dim=0)
    prev_reward = torch.cat([batch["prev_reward"].unsqueeze(0).to(rewards.dtype), rewards], dim=0)
    prev_done = torch.cat([batch["prev_done"].unsqueeze(0), done], dim=0)
    return SequenceInputs(state0, reset, prev_action, prev_reward, prev_done)


class StatefulActor:
    """Acts with any ``ActorCritic`` over successive steps of ``num_envs`` envs, carrying a recurrent policy's state
    (and RL² inputs) from step to step with the sampler's reset rule; a feed-forward policy is called as is. For
    evaluation and videos: ``actions = actor.act(obs)``, step the env, ``actor.observe(reward, terminated,
    truncated, info)``."""

    def __init__(self, policy: Any, num_envs: int):
        self.policy = policy
        self.recurrent = bool(getattr(policy, "is_recurrent", False))
        self.rl2 = self.recurrent and bool(getattr(policy, "rl2", False))
        if self.recurrent:
            self.state = policy.initial_state(num_envs)
            device = self.state.device
            self.reset = torch.ones(num_envs, dtype=torch.bool, device=device)
            self.prev: tuple[Any, Any, Any] = (None, None, None)
            if self.rl2:
                act_dtype = torch.int64 if policy.is_discrete else torch.float32
                prev_action = torch.zeros(num_envs, *policy.act_shape, dtype=act_dtype, device=device)
                no_done = torch.zeros(num_envs, dtype=torch.bool, device=device)
                self.prev = (prev_action, torch.zeros(num_envs, device=device), no_done)

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        if not self.recurrent:
            return self.policy.act(obs, deterministic=deterministic)[0]
        actions, _, _, self.state = self.policy.act_recurrent(obs, self.state, self.reset, *self.prev,
                                                              deterministic=deterministic)  # fmt: skip
        if self.rl2:
            self.prev = (actions, self.prev[1], self.prev[2])
        return actions

    def observe(self, reward: Tensor, terminated: Tensor, truncated: Tensor, info: dict[str, Any]) -> None:
        if not self.recurrent:
            return
        device = self.state.device
        done = (terminated | truncated).to(device)
        if self.rl2:
            self.reset = info["trial_end"].to(device)
            self.prev = (self.prev[0], reward.to(device), done)
        else:
            self.reset = done
