"""Sticky actions for Sample Factory's Atari example, so that it races on the same Pong as ``env=pong``.

``sf_examples.atari`` makes ``<Game>NoFrameskip-v4`` (ALE's repeat_action_probability 0: no sticky actions), while
``env=pong`` plays Pong-v5 with the published default of 0.25 (Machado et al. 2018). setup_venv.sh copies this file
into .venv-sf's site-packages and imports it from a .pth, so it runs in every process of that venv (SF's spawned
workers call gym.make themselves). With ``SAMPLE_FAST_SF_STICKY=<p>`` in the environment it wraps ``gymnasium.make``
so that every ``*NoFrameskip-v4`` id gets ``repeat_action_probability=p`` (an explicit argument still wins); without
the variable it does nothing and imports nothing. ``check()`` reports what a PongNoFrameskip-v4 made now uses.
"""

from __future__ import annotations

import os

ENV_VAR = "SAMPLE_FAST_SF_STICKY"


def _install(p: float) -> None:
    import gymnasium  # noqa: PLC0415 (only when asked for)

    if getattr(gymnasium.make, "_sample_fast_sticky", None) is not None:
        return
    make = gymnasium.make

    def sticky_make(env_id, *args, **kwargs):  # noqa: ANN001, ANN202 (gymnasium.make's signature)
        if isinstance(env_id, str) and env_id.endswith("NoFrameskip-v4"):
            kwargs.setdefault("repeat_action_probability", p)
        return make(env_id, *args, **kwargs)

    sticky_make._sample_fast_sticky = p
    gymnasium.make = sticky_make


def check(env_id: str = "PongNoFrameskip-v4") -> float:
    """The repeat_action_probability of ``env_id`` made through ``gymnasium.make`` now."""
    import gymnasium  # noqa: PLC0415

    try:
        import ale_py  # noqa: PLC0415

        if hasattr(gymnasium, "register_envs"):  # gymnasium >= 1.0 needs ale_py's ids registered explicitly
            gymnasium.register_envs(ale_py)
    except ImportError:
        pass
    env = gymnasium.make(env_id)
    try:
        return float(env.unwrapped.ale.getFloat("repeat_action_probability"))
    finally:
        env.close()


_value = os.environ.get(ENV_VAR)
if _value:
    _install(float(_value))
