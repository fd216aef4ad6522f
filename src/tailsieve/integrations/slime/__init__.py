"""TailSieve inside slime (THUDM/slime), talking to SGLang engines natively; see docs/integrations/slime.md.

    --rollout-function-path tailsieve.integrations.slime.generate_rollout
    --data-source-path tailsieve.integrations.slime.TailSieveDataSource

Nothing from slime is imported at module import; slime's classes are used when importable, stand-ins otherwise.
"""

from tailsieve.integrations.slime.data_source import CarryState, JsonlPromptSource, TailSieveDataSource
from tailsieve.integrations.slime.rollout import close_sessions, generate_rollout, session_for
from tailsieve.integrations.slime.sample import SampleStatus, SlimeSample, sample_class
from tailsieve.integrations.slime.session import Session
from tailsieve.integrations.slime.settings import SlimeIntegrationError, SlimeSettings, discover_workers

__all__ = [
    "CarryState",
    "JsonlPromptSource",
    "SampleStatus",
    "Session",
    "SlimeIntegrationError",
    "SlimeSample",
    "SlimeSettings",
    "TailSieveDataSource",
    "close_sessions",
    "discover_workers",
    "generate_rollout",
    "sample_class",
    "session_for",
]
