"""TailSieve for verl v1 (docs/integrations/verl.md); install with the optional extra `verl`.

- `session`: framework-independent: one step of the step loop as per-group pools, replicas and stable request ids,
  its completions and cutoff, and the `StepResult` (no verl import).
- `http_server`: a verl-style server handle (`generate.remote`, `abort_request.remote`) for a plain vLLM OpenAI
  server, used by the CPU tests and for external servers.
- `vllm_replica`: `TailSieveVLLMHttpServer(vLLMHttpServer)`, verl's vLLM server whose `abort_request` stops the
  request in the engine (verl's misses vLLM's internal ids), and the replica that builds it (imports vLLM).
- `client`: `TailSieveLLMServerClient(LLMServerClient)`: acquires the server the router planned for a request.
- `agent_loop`: `tailsieve_single_turn`, verl's single-turn agent loop with TailSieve request ids.
- `buffer`: `TailSieveReplayBuffer(ReplayBuffer)`: returns exactly N complete groups, the rest are carried.
- `trainer`: `TailSieveTrainer(PPOTrainerSync)`, registered as trainer mode `tailsieve`.
- `loop_thread`: `LoopThread`, runs the trainer's aborts from a synchronous hook, event loop running or not.
- `plugin`: the `verl.plugins` entry point that registers the last three in every verl process.

Only `session` is imported here; the verl-facing modules import verl when imported themselves.
"""

from tailsieve.integrations.verl.session import (
    ROUTE_FIELD,
    Assignment,
    StepSession,
    TailSieveSettings,
    parse_request_id,
    request_id,
)

__all__ = ["ROUTE_FIELD", "Assignment", "StepSession", "TailSieveSettings", "parse_request_id", "request_id"]
