"""The command line of ``python -m sample_fast.train``: Hydra, bad input, signals' first seconds and exit statuses.

Owns what happens between the shell and ``train.train``: the stop-signal handlers are installed first, the overrides
are composed once before Hydra's own ``main`` (so a typo, an unknown ``+key``, a value of the wrong type or an
unknown group option exits with status 2 and one line naming the key and the nearest valid one, instead of Hydra's
multi-line report and status 1), then Hydra runs the job, and its outcome becomes the exit status:

    0 done (run.total_env_steps or run.time_limit_s reached)     2 bad config (nothing was started or written)
    1 a real failure (a crash, a sampler that died, too many failed saves or rollbacks)
    130 / 143 / 129 stopped by SIGINT / SIGTERM / SIGHUP (128 + the signal number, as a shell reports it)
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import signal
import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf

from .config import ConfigError, TrainConfig

EXIT_DONE, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2
#: float32's largest finite value: the learner and the policy compute in float32
FLOAT32_MAX = 3.4028234663852886e38


def exit_status_for_signal(name: str) -> int:
    return 128 + int(signal.Signals[name])


def say(text: str) -> None:
    """One message on stderr; never raises (the terminal may be gone: SIGHUP, a closed pipe)."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


# ----- the schema -------------------------------------------------------------------------------------------------
def schema_keys(cls: type = TrainConfig, prefix: str = "") -> list[str]:
    """Every key of the schema, dotted (``learner.lr``), sections included (``learner``)."""
    out = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        out.append(key)
        sub = _dataclass_of(f)
        if sub is not None:
            out += schema_keys(sub, key + ".")
    return out


def _dataclass_of(f: dataclasses.Field) -> type | None:
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return type(default) if dataclasses.is_dataclass(default) else None


def nearest_key(full_key: str) -> str | None:
    """The valid key nearest to ``full_key`` (difflib on the last part of the name): in the same section when one
    is close (``learner.num_minibatchs`` -> ``learner.num_minibatches``), else the same or a close name in another
    section (``learner.rollout_len`` -> ``sampler.rollout_len``), or the section's key a flat name spells
    (``learner.replay_ratio`` -> ``replay.ratio``); None when nothing is close."""
    section, _, name = full_key.rpartition(".")
    best, best_score = None, 0.7
    for key in schema_keys():
        key_section, _, key_name = key.rpartition(".")
        score = difflib.SequenceMatcher(None, name, key_name).ratio() + (0.1 if key_section == section else 0.0)
        if key_section:  # a flat old spelling of a sectioned key: learner.replay_ratio -> replay.ratio
            flat = f"{key_section.replace('.', '_')}_{key_name}"
            score = max(score, difflib.SequenceMatcher(None, name, flat).ratio())
        if score > best_score:
            best, best_score = key, score
    return best


def unknown_key_message(full_key: str, override: str | None = None) -> str:
    section = full_key.rpartition(".")[0]
    what = f"{full_key!s} is not a key of {section}" if section else f"{full_key} is not a top-level key"
    given = f" (from {override})" if override else ""
    near = nearest_key(full_key)
    if near is not None:
        return f"{what}{given}; did you mean {near}?"
    valid = [k.rpartition(".")[2] for k in schema_keys() if k.rpartition(".")[0] == section]
    return f"{what}{given}; its keys: {', '.join(valid)}"


def check_known_keys(cfg: DictConfig, overrides: list[str] | None = None) -> None:
    """Raise ConfigError for a key the schema does not have. Hydra's ``+key=value`` adds one without a word (the
    hint Hydra itself gives for a typo); ``env.options`` is an open dict, checked by the env backend instead."""
    for full_key in _unknown_keys(cfg, TrainConfig, ""):
        raise ConfigError(unknown_key_message(full_key, _override_for(full_key, overrides or [])))


def _unknown_keys(node: DictConfig, cls: type, prefix: str) -> list[str]:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    out = []
    for key in node.keys():
        if prefix == "" and key == "hydra":
            continue
        if key not in fields:
            out.append(f"{prefix}{key}")
            continue
        sub = _dataclass_of(fields[key])
        child = node._get_node(key)
        if sub is not None and isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            out += _unknown_keys(child, sub, f"{prefix}{key}.")
    return out


def _override_for(full_key: str, overrides: list[str]) -> str | None:
    for o in overrides:
        if o.split("=", 1)[0].lstrip("+~") == full_key:
            return o
    return None


def check_ranges(cfg: TrainConfig) -> None:
    """A NaN anywhere, or a learner/policy number float32 cannot hold (``learner.lr=1e39``: today an overflow
    traceback deep in the optimizer), is a ConfigError naming the key and the preset's value."""
    for section in ("learner", "policy", "replay", "run", "sampler", "runner", "logging"):
        obj = getattr(cfg, section)
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if isinstance(v, bool) or not isinstance(v, float):
                continue
            key = f"{section}.{f.name}"
            if math.isnan(v):
                raise ConfigError(f"{key}=nan is not a number; {_preset_hint(cfg, key)}")
            if section in ("learner", "policy") and math.isfinite(v) and abs(v) > FLOAT32_MAX:
                raise ConfigError(
                    f"{key}={v:g} is out of range: the learner computes in float32 (|x| <= 3.4e38); "
                    f"{_preset_hint(cfg, key)}"
                )


def _preset_hint(cfg: TrainConfig, key: str) -> str:
    """``the appo preset sets learner.lr=0.003`` (or the schema default), for a message."""
    from importlib import resources

    section, name = key.split(".", 1)
    try:
        preset = OmegaConf.create(resources.files("sample_fast.configs").joinpath(f"algo/{cfg.algo}.yaml").read_text())
        value = OmegaConf.select(preset, key)
    except (OSError, ValueError):
        value = None
    if value is not None:
        return f"the {cfg.algo} preset sets {key}={value}"
    default = getattr(type(getattr(cfg, section))(), name, None)
    return f"the default is {key}={default}"


# ----- Hydra's errors as one line ---------------------------------------------------------------------------------
def hydra_error_message(e: BaseException, overrides: list[str]) -> str:
    """One line for an exception Hydra raised while composing ``overrides``: the key, and the nearest valid one."""
    cause = e.__cause__
    full_key = getattr(cause, "full_key", None)
    text = str(e)
    if full_key and type(cause).__name__ in ("ConfigAttributeError", "ConfigKeyError"):
        return unknown_key_message(full_key, _override_for(full_key, overrides))
    if full_key and type(cause).__name__ == "ValidationError":
        why = str(getattr(cause, "msg", cause)).splitlines()[0]
        given = _override_for(full_key, overrides) or full_key
        current = _current_value(full_key, [o for o in overrides if o != given])
        hint = f"; the value without this override is {full_key}={current}" if current is not None else ""
        return f"{given}: {why}{hint}"
    m = re.search(r"Could not find '([^']+)/([^']+)'", text)
    if m:
        group, option = m.groups()
        options = re.findall(r"^\t(\S+)$", text.split("Config search path")[0], re.M)
        near = difflib.get_close_matches(option, options, n=1, cutoff=0.4)
        hint = f"did you mean {group}={near[0]}? " if near else ""
        return f"{group}={option} is not an option of the {group} group; {hint}options: {', '.join(options)}"
    lines = [line.strip() for line in text.split("Config search path")[0].splitlines() if line.strip()]
    if cause is not None and not lines:
        lines = [line.strip() for line in str(cause).splitlines()[:1]]
    return " ".join(lines) or type(e).__name__


def _current_value(full_key: str, overrides: list[str]) -> Any:
    try:
        return OmegaConf.select(compose_overrides(overrides), full_key)
    except Exception:
        return None


def compose_overrides(overrides: list[str], config_name: str = "train") -> DictConfig:
    from hydra import compose, initialize_config_module

    from . import config  # noqa: F401 -- registers the schema with Hydra's ConfigStore

    with initialize_config_module("sample_fast.configs", version_base="1.3"):
        return compose(config_name, overrides=overrides)


def preflight(argv: list[str]) -> None:
    """Compose ``argv``'s overrides as Hydra's main will, and check them against the schema; ConfigError on any
    problem (one line). Skipped where Hydra composes otherwise: multirun sweeps, shell completion, another config
    path (their errors still exit 2, through ``main``'s mapping of Hydra's status)."""
    from hydra._internal.utils import get_args_parser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    args = get_args_parser().parse_args(argv)  # argparse exits 2 itself on a malformed flag
    if args.multirun or args.shell_completion or args.config_path or args.config_dir or args.experimental_rerun:
        return
    overrides = list(args.overrides)
    try:
        cfg = compose_overrides(overrides, args.config_name or "train")
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(hydra_error_message(e, overrides)) from None
    check_known_keys(cfg, overrides)


# ----- main -------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    """``python -m sample_fast.train``: exits with the status in the module docstring."""
    import logging

    from . import train as train_mod

    argv = sys.argv[1:] if argv is None else argv
    stopper = train_mod.StopOnSignals().install()  # from now on a signal is a stop request, never a traceback
    early = getattr(sys.modules.get("__main__"), "EARLY_SIGNALS", None)  # noted while train.py imported torch
    if early and not stopper.received:
        stopper.received.append(signal.Signals(early[0]).name)
    try:
        _main(argv, stopper, train_mod, logging)
    except KeyboardInterrupt:  # a second Ctrl-C before the run started (in the run, run_job answers it)
        say("interrupted (second Ctrl-C) before training started: nothing was started or written")
        sys.exit(exit_status_for_signal("SIGINT"))
    finally:
        stopper.uninstall()


def _main(argv: list[str], stopper: Any, train_mod: Any, logging: Any) -> None:
    """Preflight, then Hydra's main with the job (``main``'s body; it maps the outcome to an exit status)."""
    try:
        preflight(argv)
    except ConfigError as e:
        say(f"config error: {e}")
        sys.exit(EXIT_CONFIG)
    if stopper.received:
        _stopped_before_start(stopper)
    started = []

    import hydra

    @hydra.main(version_base="1.3", config_path=train_mod.CONFIG_PATH, config_name=train_mod.CONFIG_NAME)
    def _job(cfg: DictConfig) -> None:
        started.append(True)
        # Hydra's logging config is disabled (configs/train.yaml); warnings (a skipped corrupt checkpoint, a
        # failed save) go to stderr in this plain format, one line each.
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        status = run_job(cfg, stopper, train_mod)
        if status != EXIT_DONE:  # a clean job returns: a multirun sweep goes on to the next one
            sys.exit(status)

    try:
        _job()
    except SystemExit as e:
        if e.code == 1 and not started:  # Hydra's own report of a composition error (multirun, --cfg ...)
            sys.exit(EXIT_CONFIG)
        raise


def run_job(cfg: DictConfig, stopper: Any, train_mod: Any) -> int:
    """Train ``cfg``; returns the exit status (the messages are printed here or by ``train``)."""
    try:
        summary = train_mod.train(cfg, stopper=stopper)
    except ConfigError as e:
        say(f"config error: {e}")
        return EXIT_CONFIG
    except train_mod.RunFailed as e:
        say(f"error: {e}")
        return EXIT_FAILED
    except KeyboardInterrupt as e:  # a second Ctrl-C: the runner has stopped its processes on the way out
        say(getattr(e, "message", None) or _INTERRUPTED)
        return exit_status_for_signal("SIGINT")
    if summary.get("reason") == "stop_requested" and summary.get("stop_signal"):
        return exit_status_for_signal(summary["stop_signal"])
    return EXIT_DONE


_INTERRUPTED = (
    "interrupted (second Ctrl-C): stopped at once; the checkpoints already saved are kept, and the same command "
    "resumes from the newest"
)


def _stopped_before_start(stopper: Any) -> None:
    name = stopper.received[0]
    status = exit_status_for_signal(name)
    say(f"{name} received before training started: nothing was started or written (exit status {status})")
    sys.exit(status)
