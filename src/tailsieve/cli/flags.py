"""Flags that several commands share, each defined once: its name, type, meaning and help (`add(p, name, …)`).

A command passes only what differs (a default, `required`, a sentence of help naming its own use); the meaning
stays the one written here. The router's flags (`--rho`, `--dispatch`, `--max-redraws`, `--ranking`) are derived from
`RouterKnobs`' fields (`router_flag_spec`: default and help from the field). The policy flags (`--policy`, `--q`,
`--m`, `--ranking`, `--max-redraws`, `--dispatch`) are checked once, by `PolicySpec` and `RouterConfig`
(`tailsieve.policy.spec`), not by argparse: a plugin ranking
(`pkg.module:function`) or an entry point is as valid as a built-in one.

The controller's flags are derived, one per `ControllerConfig` field (`add_controller_flags`: `--q0`, `--m0`,
`--history-steps`, `--z`, …; type, default and help from the field), so a new constant is a flag of `simulate`,
`plan` and `rollout` with no edit here. Each value is checked by `ControllerConfig` as it is parsed (a bad one is
argparse's one-line error, exit 2); `controller_config(args)` builds the config from the flags given.

One name, one meaning: `--served-model-name` is the name a server serves (launch, profile, rollout), `--model`
only a model folder or hub id (`launch`). Every command's parser refuses abbreviations (`allow_abbrev=False`), so
`--m` can never be read as `--model`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from tailsieve.errors import ConfigError
from tailsieve.policy.control_state import ControllerConfig
from tailsieve.policy.controller_knobs import Knob, controller_from_mapping, knobs, renamed, with_knobs
from tailsieve.policy.router_knobs import router_knobs

__all__ = ["FLAGS", "add", "add_controller_flags", "add_served_model_name", "controller_config", "controller_flag",
           "controller_help", "policy_names_given", "router_flag", "router_flag_spec"]

def router_flag(name: str) -> str:
    """The flag of a router knob (`RouterKnobs` field `name`): `max_redraws` → `--max-redraws`."""
    return "--" + name.replace("_", "-")


def router_flag_spec(k: Knob) -> dict[str, Any]:
    """A router knob's flag: its default and help line from the field; a number parsed as its kind, text (a
    ranking, a dispatch) kept for `RouterConfig` to check (a plugin ranking is as valid as a built-in one)."""
    return ({"type": k.kind} if k.kind in (int, float) else {}) | {"default": k.default, "help": k.help}


FLAGS: dict[str, dict[str, Any]] = {
    # the step shape and the prompt order
    "--replicas": {"type": int, "default": 8, "help": "R replicas (default: %(default)s)"},
    "--groups": {"type": int, "default": 64, "help": "N prompt groups per step (default: %(default)s)"},
    "--group-size": {"type": int, "default": 8, "help": "G responses per group (default: %(default)s)"},
    "--steps": {"type": int, "default": 30, "help": "rollout steps per policy (default: %(default)s)"},
    "--seed": {"type": int, "default": 0, "help": "seed of resampled draws, --shuffle and per-request seeds "
                                                   "(default: %(default)s)"},
    "--shuffle": {"action": "store_true", "help": "shuffle the prompt order each epoch (seeded)"},
    # the policy (checked by PolicySpec / RouterConfig)
    "--q": {"type": int, "help": "static policy: isolated groups q"},
    "--m": {"type": int, "help": "static policy: tail replicas m (0 = uniform)"},
    **{router_flag(k.name): router_flag_spec(k) for k in router_knobs()},  # --rho, --dispatch, --max-redraws, --ranking
    # the cost model
    "--curve": {"default": "h100-llama3-8b",
                "help": "the cost model: a built-in curve, a curve file, or the model file `tailsieve profile` "
                        "fitted (τ(b) and its kv and prefill terms; docs/profile.md) (default: %(default)s)"},
    "--kv-ms-per-1k": {"type": float, "default": None,
                       "help": "KV-traffic ms per 1k context tokens per iteration (default: the --curve model "
                               "file's, else 0; the flag overrides the file)"},
    "--prefill-ms-per-token": {"type": float, "default": None,
                               "help": "prefill stall per prompt token, ms (default: the --curve model file's, else "
                                       "0; the flag overrides the file)"},
    "--max-num-seqs": {"type": int, "help": "replica admission cap (FCFS queue); default: all admitted"},
    # the engine the simulation runs (truth), apart from what the controller believes (--curve; docs/simulator.md)
    "--truth": {"metavar": "FILE",
                "help": "the engine the simulation runs: a model file (the --curve format plus kv_tokens, "
                        "block_size, max_num_batched_tokens, prefix_caching, speed_factors or speed_spread, "
                        "speed_drift); every policy, the static grid and verl-lif run on it while the controller "
                        "keeps --curve (default: the truth is --curve)"},
    "--kv-tokens": {"type": int, "metavar": "N",
                    "help": "truth: KV capacity per replica in tokens (paged, preemption by recompute; default: the "
                            "--truth file's, else unbounded)"},
    "--block-size": {"type": int, "metavar": "N", "help": "truth: KV block size in tokens (default: the file's, "
                                                           "else 16)"},
    "--max-num-batched-tokens": {"type": int, "metavar": "N",
                                 "help": "truth: token budget per iteration, chunked prefill mixed into decode "
                                         "(default: the file's, else prefill stalls the replica)"},
    "--prefix-caching": {"action": "store_true",
                         "help": "truth: a group's prompt is prefilled once per replica while its blocks stay "
                                 "cached (LRU eviction under KV pressure)"},
    "--speed-spread": {"type": float, "metavar": "F",
                       "help": "truth: replicas' speeds spread evenly over [1-F, 1] in a seeded order (default: "
                               "the file's, else 0)"},
    "--speed-drift": {"type": float, "metavar": "S",
                      "help": "truth: each replica's speed × exp(S·z) every step, z seeded normal (default: the "
                              "file's, else 0)"},
    "--tail-spec": {"metavar": "SPEC",
                    "help": "tail pool speculation NAME[:BRACKET][:TOKENS][,key=value…]: mtp and dflash are the "
                            "published range's central profile, mtp:low / mtp:high its brackets (docs/speculative.md)"},
    "--bulk-spec": {"metavar": "SPEC", "help": "bulk pool speculation, same form as --tail-spec"},
    "--bias-correction": {"action": "store_true",
                          "help": "per-group weights that undo the routing's length bias (beyond the paper; "
                                  "docs/simulate.md): adds bias.weighted_mean_ratio and bias.ess_ratio"},
    # the transport to a server (profile, rollout)
    "--kind": {"default": "vllm", "help": "server kind: a registered engine backend (openai, vllm, sglang, "
                                          "sglang-native), a plugin pkg.module:Class or an entry point of "
                                          "tailsieve.backends (default: %(default)s)"},
    "--api-key-env": {"default": None, "metavar": "NAME",
                      "help": "env var holding the API key (never printed); an unset NAME is an error (default: "
                              "TAILSIEVE_API_KEY when set, else no key)"},
    "--stall-timeout": {"type": float, "default": 60.0,
                        "help": "seconds without a new token that mark a request stalled and its replica down "
                                "(keep-alive bytes do not count; default: %(default)s)"},
    "--deadline": {"type": float, "default": None,
                   "help": "total seconds one request may take before its replica is marked down (default: none)"},
    "--retries": {"type": int, "default": 4, "help": "re-sends of one request before giving up (default: %(default)s)"},
    "--no-stream": {"action": "store_true", "help": "non-streaming requests"},
    "--json": {"action": "store_true", "help": "machine-readable output"},
}


def add(p: argparse.ArgumentParser, name: str, **override: Any) -> None:
    """Add the shared flag `name` to `p`; `override` replaces what differs in this command (a default, help)."""
    p.add_argument(name, **{**FLAGS[name], **override})


def policy_names_given(values: str | list[str] | None, default: str) -> list[str]:
    """The policy names of one `--policy` value or several (each comma-separated), stripped, empties dropped,
    first occurrence kept; `default` when the flag was not given."""
    given = [default] if values is None else [values] if isinstance(values, str) else values
    return list(dict.fromkeys(n.strip() for v in given for n in v.split(",") if n.strip()))


def add_served_model_name(p: argparse.ArgumentParser) -> None:
    """`--served-model-name` (the name /v1/models lists; default: its first)."""
    p.add_argument("--served-model-name", dest="model", metavar="NAME",
                   help="served model name (default: the first one /v1/models lists)")


def controller_flag(name: str) -> str:
    """The flag of `ControllerConfig` field `name`: `history_steps` → `--history-steps`."""
    return "--" + name.replace("_", "-")


def _parse(knob: Knob) -> Callable[[str], Any]:
    """The argparse type of a field: its kind, and `none` for None where the field allows it."""
    def parse(text: str) -> Any:
        if knob.optional and text.strip().lower() == "none":
            return None
        return knob.kind(text)

    parse.__name__ = knob.kind.__name__ + (" or none" if knob.optional else "")  # argparse's "invalid int value"
    return parse


CONTROLLER_GROUP = "controller constants (ControllerConfig, docs/controller.md)"


class _Knob(argparse.Action):
    """Stores a controller flag's value once `ControllerConfig` accepts it (else argparse's one-line error)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        try:
            with_knobs(ControllerConfig(), {self.dest: values})
        except ConfigError as exc:
            parser.error(renamed(str(exc), controller_flag))
        setattr(namespace, self.dest, values)


def add_controller_flags(p: argparse.ArgumentParser) -> None:
    """One flag per `ControllerConfig` field (`--history-steps` for `history_steps`), in its own group: its type
    from the field (`int | None` takes `none`), its help the field's help line and default. An unset flag leaves no
    attribute on the parsed namespace, so `controller_config` keeps the field's default."""
    taken = {a.dest for a in p._actions}
    group = p.add_argument_group(CONTROLLER_GROUP)
    for k in knobs():
        if k.name in taken:
            raise ValueError(f"{p.prog}: the controller field {k.name} clashes with another flag's destination")
        group.add_argument(controller_flag(k.name), dest=k.name, type=_parse(k), action=_Knob,
                           default=argparse.SUPPRESS, metavar=k.name.upper(), help=controller_help(k))


def controller_help(k: Knob) -> str:
    """A controller flag's help: the field's help line and its default (`none` spells None)."""
    default = "none" if k.default is None else k.default
    return f"{k.help} (default: {default}{'; none for None' if k.optional else ''})".replace("%", "%%")


def controller_config(args: argparse.Namespace, base: ControllerConfig | None = None) -> ControllerConfig:
    """`base` (default: the defaults) with the controller flags that were given (`add_controller_flags`); a
    one-line ConfigError naming the flag when the values do not go together."""
    given = {k.name: getattr(args, k.name) for k in knobs() if hasattr(args, k.name)}
    return controller_from_mapping(given, "controller flags", base, spell=controller_flag)
