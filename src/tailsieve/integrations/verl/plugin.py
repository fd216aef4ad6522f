"""verl plugin entry point (`[project.entry-points."verl.plugins"]` in pyproject.toml): verl loads it on
`import verl` in every process (driver, task runner, agent loop workers), which registers the `tailsieve` trainer
and the `tailsieve_single_turn` agent loop there. Without the entry point (a source checkout), set
`VERL_USE_EXTERNAL_MODULES=tailsieve.integrations.verl.plugin` instead."""

from __future__ import annotations

from tailsieve.integrations.verl import agent_loop, trainer

__all__ = ["agent_loop", "trainer"]
