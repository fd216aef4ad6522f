"""`tailsieve.integrations.slime.settings`: every slime flag TailSieve does not honour is one `SlimeIntegrationError`
line at start-up naming the flag and why (never a silent ignore), and slime's sampling arguments as the request
asks for them (top-p < 1: the top-p kept token ids slime asserts on)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tailsieve.errors import TailSieveError
from tailsieve.integrations.slime import SlimeIntegrationError, SlimeSettings
from tailsieve.integrations.slime.data_source import JsonlPromptSource
from tailsieve.integrations.slime.settings import REFUSED, STANDIN_REFUSED, check_flags, sampling_params


def args(**kw: Any) -> SimpleNamespace:
    base: dict[str, Any] = dict(rollout_batch_size=4, n_samples_per_prompt=2, rollout_max_response_len=32,
                                rollout_temperature=1.0, rollout_top_p=1.0, rollout_top_k=-1)
    return SimpleNamespace(**(base | kw))


# a value slime's parser gives each refused flag when a user sets it
SET_VALUES: dict[str, Any] = {
    "custom_generate_function_path": "my.mod.generate", "dynamic_sampling_filter_path": "f.check", "partial_rollout":
    True, "mask_offpolicy_in_partial_rollout": True, "over_sampling_batch_size": 8, "rollout_sample_hook_path":
    ["h.hook"], "rollout_sample_filter_path": "f.g", "rollout_all_samples_process_path": "p.q", "buffer_filter_path":
    "b.f", "use_rollout_routing_replay": True, "rollout_max_context_len": 4096, "multimodal_keys": {"image": "img"},
    "rollout_global_dataset": False}


def test_every_rule_has_a_set_value() -> None:
    assert sorted(SET_VALUES) == sorted(name for name, _, _ in REFUSED)


@pytest.mark.parametrize(("name", "is_set", "why"), REFUSED, ids=[r[0] for r in REFUSED])
def test_each_refused_flag_is_one_line_at_start_up(name: str, is_set: Any, why: str) -> None:
    with pytest.raises(SlimeIntegrationError) as e:
        SlimeSettings.from_args(args(**{name: SET_VALUES[name]}))
    flag = "--disable-rollout-global-dataset" if name == "rollout_global_dataset" else "--" + name.replace("_", "-")
    assert str(e.value) == f"slime flags TailSieve does not honour: {flag} ({why})"
    assert isinstance(e.value, TailSieveError) and "\n" not in str(e.value)


def test_slime_defaults_pass_and_several_flags_are_named_together() -> None:
    defaults = dict(custom_generate_function_path=None, dynamic_sampling_filter_path=None, partial_rollout=False,
                    mask_offpolicy_in_partial_rollout=False, over_sampling_batch_size=None, rollout_sample_hook_path=[],
                    buffer_filter_path=None, rollout_max_context_len=None, multimodal_keys=None,
                    rollout_global_dataset=True)
    assert SlimeSettings.from_args(args(**defaults)).groups == 4
    assert SlimeSettings.from_args(args(over_sampling_batch_size=4)).groups == 4  # slime's default
    with pytest.raises(SlimeIntegrationError) as e:
        check_flags(args(partial_rollout=True, dynamic_sampling_filter_path="f.check"))
    text = str(e.value)
    assert text.startswith("slime flags TailSieve does not honour: --dynamic-sampling-filter-path (")
    assert "; --partial-rollout (TailSieve regenerates cut groups from scratch" in text


@pytest.mark.parametrize(("name", "value"), [("apply_chat_template", True), ("rollout_shuffle", True),
                                             ("rollout_max_prompt_len", 512)])
def test_the_stand_in_dataset_refuses_what_only_slimes_dataset_does(name: str, value: Any) -> None:
    why = dict((n, w) for n, _, w in STANDIN_REFUSED)[name]
    with pytest.raises(SlimeIntegrationError) as e:
        JsonlPromptSource(args(**{name: value}), rows=[{"prompt": "x"}])
    assert str(e.value) == f"slime flags TailSieve does not honour: --{name.replace('_', '-')} ({why})"


def test_top_p_below_one_asks_for_the_kept_token_ids() -> None:
    low = sampling_params(args(rollout_top_p=0.9))
    assert low.top_p == 0.9 and dict(low.extra)["custom_params"] == {"return_top_p_token_ids": True}
    assert "custom_params" not in dict(sampling_params(args()).extra)
    ev = sampling_params(args(rollout_top_p=0.9, eval_temperature=0.0, eval_top_p=1.0), evaluation=True)
    assert ev.top_p == 1.0 and "custom_params" not in dict(ev.extra)
