"""verl plugin entry point (`[project.entry-points."verl.plugins"]` in pyproject.toml): verl loads it on
`import verl` in every process (driver, task runner, agent loop workers), which registers the `tailsieve` trainer
and the `tailsieve_single_turn` agent loop there. Without the entry point (a source checkout), set
`VERL_USE_EXTERNAL_MODULES=tailsieve.integrations.verl.plugin` instead.

verl logs a plugin that fails to import only at DEBUG, so a missing module would leave the trainer unregistered
without a word: here the failure is logged at WARNING on the `tailsieve` logger, naming the missing module and the
install line (`integrations.extras`), and re-raised for verl."""

from __future__ import annotations

import logging

from tailsieve.integrations.extras import EXTRAS

LOG = logging.getLogger("tailsieve.integrations.verl")


def not_loaded(error: ImportError) -> str:
    """The WARNING line for a plugin that could not import: the missing module and how to install it."""
    missing = error.name or str(error)
    return (f"tailsieve's verl plugin is not loaded (the tailsieve trainer and agent loop are unregistered): "
            f"module '{missing}' is missing; install it with {EXTRAS['verl'].advice}")


try:
    from tailsieve.integrations.verl import agent_loop, trainer
except ImportError as e:
    LOG.warning(not_loaded(e))
    raise

__all__ = ["agent_loop", "not_loaded", "trainer"]
