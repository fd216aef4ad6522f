"""The controllers (§3.2, App. C), pure: a frozen `ControlState` and a `StepObservation` in, a new state out, its
`Decision` (reason as data) attached. Registry `CONTROLLERS` (name → class), its built-in entries declared here in
the order they are listed (`BUILT_IN`); plugins add theirs with `@register` or an entry point:

| name | file | q | m |
|---|---|---|---|
| `uniform` | `uniform.py` | 0 | 0 |
| `static` | `static.py` | fixed | fixed |
| `tailsieve-paper` | `paper.py` | C.1's rate balance | C.2's radius, one replica per move |
| `tailsieve` | `tailsieve_rule.py` | the paired rule over every m at its best q and the uniform boundary ||
| `tailsieve-fixed` | `fixed.py` | the paired rule | R/2, never moves |

Each extends `Controller` (`controller_base.py`) directly, which holds what every adaptive policy shares: learning
from a step (`learn`: the response-work history, the model error, the price of a pool move) and pricing an option on
the predictor (`times`, `best_q`, `feasible`). A policy implements one method, `update`; `tailsieve` and
`tailsieve-fixed` both run the rule of `paired_rule.py`.
"""

from __future__ import annotations

from tailsieve.policy.control_state import ControllerConfig, ControlState, StepObservation
from tailsieve.policy.controller_base import CONTROLLERS, Controller, register
from tailsieve.policy.decision import Decision, Reason
from tailsieve.policy.fixed import TailSieveFixedController
from tailsieve.policy.paper import PaperState, TailSievePaperController
from tailsieve.policy.static import StaticController
from tailsieve.policy.tailsieve_rule import TailSieveController
from tailsieve.policy.uniform import UniformController

__all__ = ["BUILT_IN", "CONTROLLERS", "ControlState", "Controller", "ControllerConfig", "Decision", "PaperState",
           "Reason", "StaticController", "StepObservation", "TailSieveController", "TailSieveFixedController",
           "TailSievePaperController", "UniformController", "register"]

# the built-in controllers by name, in the order the registry lists them
BUILT_IN: tuple[tuple[str, type[Controller]], ...] = (
    ("uniform", UniformController),
    ("static", StaticController),
    ("tailsieve-paper", TailSievePaperController),
    ("tailsieve", TailSieveController),
    ("tailsieve-fixed", TailSieveFixedController),
)
for _name, _cls in BUILT_IN:
    CONTROLLERS.add(_name, _cls)
