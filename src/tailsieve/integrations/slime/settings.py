"""What a slime job tells TailSieve: slime's own arguments (step shape, sampling, router address, checkpoint
folders) and TailSieve's settings, each read from `args.tailsieve_<name>` when the job's argument parser added it,
else from the environment variable `TAILSIEVE_<NAME>`, else the default. SGLang workers are listed explicitly
(`tailsieve_engines` / `TAILSIEVE_ENGINES`, comma-separated URLs) or discovered from sglang-router
(`GET /workers`, older routers `GET /list_workers`)."""

from __future__ import annotations

import math
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tailsieve.engines.transport.engine_client import Endpoint, SamplingParams
from tailsieve.engines.transport.replies import ReplyError, loads
from tailsieve.engines.transport.reply_bounds import CONTROL_REPLY_BYTES, read_capped_file
from tailsieve.errors import TailSieveError
from tailsieve.inputs import loads_json
from tailsieve.policy.control_state import ControllerConfig
from tailsieve.policy.controller import CONTROLLERS
from tailsieve.policy.controller_knobs import controller_from_mapping
from tailsieve.policy.router import RouterConfig, RouterKnobs
from tailsieve.policy.router_knobs import router_knobs, router_values
from tailsieve.policy.spec import FleetCost, PolicySpec
from tailsieve.redact import clip

__all__ = ["REFUSED", "STANDIN_REFUSED", "SlimeIntegrationError", "SlimeSettings", "check_flags", "discover_workers",
           "flag_name", "sampling_params", "setting"]


class SlimeIntegrationError(TailSieveError):
    """A slime job cannot run TailSieve (no workers, unreachable router, bad settings): one line."""


def _set(value: Any) -> bool:
    return value not in (None, False, "", [], ())


# slime flags TailSieve's rollout function does not honour, with why: refused at start-up (one line), never ignored.
# (attribute of slime's args, when it is set, why)
Rule = tuple[str, Callable[[Any, Any], bool], str]
REFUSED: tuple[Rule, ...] = (
    ("custom_generate_function_path", lambda v, a: _set(v),
     "custom generate functions (multi-turn, tool calls) run per sample in slime's own rollout; TailSieve generates "
     "whole single-turn groups itself"),
    ("dynamic_sampling_filter_path", lambda v, a: _set(v),
     "dynamic sampling filters would drop groups after the step; a TailSieve step returns exactly "
     "rollout_batch_size complete groups"),
    ("partial_rollout", lambda v, a: _set(v),
     "TailSieve regenerates cut groups from scratch (on-policy) and never resumes partial samples"),
    ("mask_offpolicy_in_partial_rollout", lambda v, a: _set(v), "there are no partial rollouts to mask"),
    ("over_sampling_batch_size", lambda v, a: v is not None and v != getattr(a, "rollout_batch_size", None),
     "TailSieve over-provisions by its own rho (TAILSIEVE_RHO)"),
    ("rollout_sample_hook_path", lambda v, a: _set(v), "per-sample hooks of slime's rollout are not called"),
    ("rollout_sample_filter_path", lambda v, a: _set(v), "the step's groups are not filtered"),
    ("rollout_all_samples_process_path", lambda v, a: _set(v), "the step's samples are not post-processed"),
    ("buffer_filter_path", lambda v, a: _set(v), "TailSieve hands no groups back to slime's buffer"),
    ("use_rollout_routing_replay", lambda v, a: _set(v), "routed experts are not requested from SGLang"),
    ("rollout_max_context_len", lambda v, a: v is not None,
     "max_new_tokens is rollout_max_response_len for every prompt (no per-prompt context cap)"),
    ("multimodal_keys", lambda v, a: _set(v), "prompts are sent as text or token ids only"),
    ("rollout_global_dataset", lambda v, a: v is False, "TailSieve draws its prompts from the global dataset"),
)
# honoured by slime's own dataset, not by the stand-in reader used when slime is not importable
STANDIN_REFUSED: tuple[Rule, ...] = (
    ("apply_chat_template", lambda v, a: _set(v), "the stand-in dataset sends prompts as written"),
    ("rollout_shuffle", lambda v, a: _set(v), "the stand-in dataset reads prompts in file order"),
    ("rollout_max_prompt_len", lambda v, a: v is not None, "the stand-in dataset does not filter long prompts"),
)


_NEGATED = {"rollout_global_dataset": "--disable-rollout-global-dataset"}  # store_false flags: their own name


def flag_name(attr: str) -> str:
    """slime's command-line flag for an `args` attribute."""
    return _NEGATED.get(attr, "--" + attr.replace("_", "-"))


def check_flags(args: Any, rules: tuple[Rule, ...] = REFUSED) -> None:
    """One `SlimeIntegrationError` line naming every set flag of `rules` (slime's flag name) and why."""
    bad = [f"{flag_name(name)} ({why})" for name, is_set, why in rules
           if is_set(getattr(args, name, None), args)]
    if bad:
        raise SlimeIntegrationError(f"slime flags TailSieve does not honour: {'; '.join(bad)}")


def setting(args: Any, name: str, default: Any) -> Any:
    """`args.tailsieve_<name>`, else `$TAILSIEVE_<NAME>`, else `default` (the environment's text is returned)."""
    value = getattr(args, f"tailsieve_{name}", None)
    if value is not None:
        return value
    return os.environ.get(f"TAILSIEVE_{name.upper()}", default)


def _required(args: Any, name: str) -> Any:
    value = getattr(args, name, None)
    if value is None:
        raise SlimeIntegrationError(f"slime args lack {name} (--{name.replace('_', '-')})")
    return value


def _opt_int(value: Any) -> int | None:
    return None if value in (None, "") else int(value)


def controller(value: Any) -> ControllerConfig:
    """The `controller` setting: a mapping of `ControllerConfig` field → value (from a parser hook), or its JSON
    object (`TAILSIEVE_CONTROLLER='{"z": 1.5, "m0": 1}'`); unset: the defaults. One-line ConfigError otherwise."""
    where = "tailsieve_controller (TAILSIEVE_CONTROLLER)"
    if value is None or value == "":
        return ControllerConfig()
    table = value if isinstance(value, Mapping) else loads_json(str(value), where, line=False)
    return controller_from_mapping(table, where, spell=lambda k: f"tailsieve_controller.{k}")


def _flag(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() not in ("0", "false", "no", "off", "")


@dataclass(frozen=True, slots=True)
class SlimeSettings(RouterKnobs):
    """One job's step shape (slime's N and G), TailSieve's policy settings and where its state files go; the router's
    knobs (`tailsieve_rho`, `tailsieve_dispatch`, `tailsieve_max_redraws`, `tailsieve_ranking`) are `RouterKnobs`'
    own fields, read by `from_args` as their kinds (`router_knobs`)."""

    groups: int  # N: args.rollout_batch_size
    group_size: int  # G: args.n_samples_per_prompt
    policy: str
    curve: str
    stream: bool
    seed: int | None
    save_dir: str | None  # args.save
    load_dir: str | None  # args.load
    q: int | None = None  # the static policy's isolated groups and tail replicas (None: its defaults)
    m: int | None = None
    # the controller's constants: `tailsieve_controller` / `TAILSIEVE_CONTROLLER`, field name → value (`controller`)
    controller: ControllerConfig = field(default_factory=ControllerConfig)

    @classmethod
    def from_args(cls, args: Any) -> SlimeSettings:
        """Read and check the settings (one-line `SlimeIntegrationError` on a bad value or a flag TailSieve does
        not honour)."""
        try:
            knobs = {k.name: k.kind(setting(args, k.name, k.default)) for k in router_knobs()}
            raw_seed = setting(args, "seed", getattr(args, "rollout_seed", 0))
            out = cls(groups=int(_required(args, "rollout_batch_size")),
                      group_size=int(_required(args, "n_samples_per_prompt")),
                      policy=str(setting(args, "policy", "tailsieve")),
                      curve=str(setting(args, "curve", "h100-llama3-8b")), stream=_flag(setting(args, "stream", True)),
                      seed=None if raw_seed in (None, "", "none") else int(raw_seed),
                      save_dir=getattr(args, "save", None), load_dir=getattr(args, "load", None),
                      q=_opt_int(setting(args, "q", None)), m=_opt_int(setting(args, "m", None)),
                      controller=controller(setting(args, "controller", None)), **knobs)
        except TailSieveError as exc:
            raise SlimeIntegrationError(str(exc)) from None
        except (TypeError, ValueError) as exc:
            raise SlimeIntegrationError(f"bad TailSieve setting: {exc}") from None
        if out.groups < 1 or out.group_size < 1 or not (0.0 <= out.rho <= 1.0) or math.isnan(out.rho):
            raise SlimeIntegrationError(f"need rollout_batch_size >= 1, n_samples_per_prompt >= 1 and 0 <= rho <= 1, "
                                        f"got {out.groups}, {out.group_size}, {out.rho}")
        try:
            CONTROLLERS.check(out.policy)
        except TailSieveError as exc:
            raise SlimeIntegrationError(str(exc)) from None
        check_flags(args)
        return out

    def spec(self, replicas: int) -> PolicySpec:
        """The job's `PolicySpec` on `replicas` SGLang workers (every policy check once; a bad value is a one-line
        `SlimeIntegrationError`)."""
        try:
            rc = RouterConfig(groups=self.groups, group_size=self.group_size, replicas=replicas, **router_values(self))
            return PolicySpec(self.policy, rc, FleetCost.load(self.curve), self.controller, q=self.q, m=self.m)
        except TailSieveError as exc:
            raise SlimeIntegrationError(str(exc)) from None


def sampling_params(args: Any, *, evaluation: bool = False) -> SamplingParams:
    """slime's rollout sampling arguments as `SamplingParams` (SGLang's extras: stop ids, no stop trim, ...)."""
    prefix = "eval" if evaluation and getattr(args, "eval_temperature", None) is not None else "rollout"
    top_k = getattr(args, f"{prefix}_top_k", None)
    extra: list[tuple[str, Any]] = [("no_stop_trim", True), ("spaces_between_special_tokens", False)]
    if getattr(args, "rollout_stop_token_ids", None):
        extra.append(("stop_token_ids", list(args.rollout_stop_token_ids)))
    if getattr(args, "rollout_skip_special_tokens", None) is not None:
        extra.append(("skip_special_tokens", bool(args.rollout_skip_special_tokens)))
    top_p = float(getattr(args, f"{prefix}_top_p", 1.0) or 1.0)
    if top_p != 1.0:  # what slime asks SGLang for, and asserts on every sample (slime/ray/rollout.py)
        extra.append(("custom_params", {"return_top_p_token_ids": True}))
    max_len = getattr(args, "eval_max_response_len", None) if evaluation else None
    try:
        return SamplingParams(
            temperature=float(getattr(args, f"{prefix}_temperature", 1.0) or 0.0),
            top_p=top_p,
            top_k=None if top_k in (None, -1) else int(top_k),
            max_tokens=int(max_len or _required(args, "rollout_max_response_len")),
            stop=tuple(getattr(args, "rollout_stop", None) or ()), extra=tuple(extra))
    except TailSieveError as exc:
        raise SlimeIntegrationError(f"bad slime sampling arguments: {exc}") from None


def _worker_urls(data: Any) -> list[str]:
    """URLs from sglang-router's answer: `{"workers": [{"url": ...}, ...]}`, `{"urls": [...]}` or a list."""
    items = data.get("workers", data.get("urls")) if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ValueError("no 'workers' or 'urls' list")
    return [str(w["url"] if isinstance(w, dict) else w) for w in items]


def _get_json(url: str, timeout_s: float) -> Any:
    """sglang-router's answer at `url`, read within `CONTROL_REPLY_BYTES` before it is parsed (strict JSON)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        declared = resp.headers.get("Content-Length")
        return loads(read_capped_file(resp, CONTROL_REPLY_BYTES, int(declared) if declared else None,
                                      f"a sglang-router {urllib.parse.urlsplit(url).path} reply"))


def discover_workers(args: Any, timeout_s: float = 5.0) -> tuple[Endpoint, ...]:
    """The SGLang workers: the explicit list, else sglang-router's; each a `sglang-native` endpoint."""
    explicit = setting(args, "engines", None)
    if explicit:
        urls = explicit if isinstance(explicit, list | tuple) else str(explicit).split(",")
    else:
        ip, port = getattr(args, "sglang_router_ip", None), getattr(args, "sglang_router_port", None)
        if not ip or not port:
            raise SlimeIntegrationError("no SGLang workers: set sglang_router_ip/port or TAILSIEVE_ENGINES")
        base = f"http://{ip}:{port}"
        urls = _router_urls(base, timeout_s)
    try:
        out = tuple(Endpoint.parse(str(u), "sglang-native") for u in urls if str(u).strip())
    except TailSieveError as exc:
        raise SlimeIntegrationError(f"bad SGLang worker URL: {exc}") from None
    if not out:
        raise SlimeIntegrationError("no SGLang workers (the router lists none)")
    return out


def _router_urls(base: str, timeout_s: float) -> list[str]:
    for path in ("/workers", "/list_workers"):
        try:
            return _worker_urls(_get_json(base + path, timeout_s))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                continue
            raise SlimeIntegrationError(f"sglang-router {base}{path}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SlimeIntegrationError(f"sglang-router {base} unreachable: {reason}") from None
        except ReplyError as exc:
            raise SlimeIntegrationError(f"sglang-router {base}{path}: {exc}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise SlimeIntegrationError(f"sglang-router {base}{path}: unexpected answer ({clip(str(exc))})") from None
    raise SlimeIntegrationError(f"sglang-router {base} has neither /workers nor /list_workers")

