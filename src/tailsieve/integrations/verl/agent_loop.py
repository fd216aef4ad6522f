"""`tailsieve_single_turn`: verl's single-turn agent loop, sending each member under its TailSieve route.

verl's `AgentLoopWorkerTQ` runs one agent loop per member (`session_id` in [0, n)) with every prompt field as a
keyword argument, so the group's route (`session.ROUTE_FIELD`, set by the trainer) arrives here; the loop runs
verl's own `SingleTurnAgentLoop.run` inside `session.routed(...)`, which makes `TailSieveLLMServerClient` send the
request to the planned replica under the member's stable request id. Prompts without a route run unchanged.
Multi-turn agent loops can do the same: wrap `run` in `routed(member_route(route, session_id))`.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from tailsieve.integrations.verl.session import ROUTE_FIELD, member_route, routed

AGENT_NAME = "tailsieve_single_turn"


@register(AGENT_NAME)
class TailSieveSingleTurnAgentLoop(SingleTurnAgentLoop):  # type: ignore[misc]  # verl ships no type information
    """`SingleTurnAgentLoop` with TailSieve routing (see the module docstring)."""

    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any) -> Any:
        route = kwargs.get(ROUTE_FIELD)
        if not route:
            return await super().run(sampling_params, priority=priority, **kwargs)
        with routed(member_route(str(route), int(kwargs["session_id"]))):
            return await super().run(sampling_params, priority=priority, **kwargs)
