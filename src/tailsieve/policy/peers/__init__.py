"""What RL frameworks run today, as registered peer policies (issue 16, issue 24): one module per peer, each a
`PeerPolicy` subclass registered with `@register_peer("name")` (`peer_policy.py` holds the contract, the registry
and the token ledger). They plan `StepPlan`s for the same executors as TailSieve (every replica bulk: no tail pool)
and read the same `StepResult`s. What was taken from each source and what was simplified: docs/peers.md.

Adding a peer: one module here with a `@register_peer` subclass (override `lineup`, `carry`, `long_round` or
`dispatch`), imported below (the import order is the order of `simulate --policy all`), plus its test.
"""

from tailsieve.policy.peers.peer_policy import (
    PEERS,
    Carry,
    Lineup,
    PeerConfig,
    PeerPolicy,
    PeerState,
    PeerStep,
    Waiting,
    make_peer,
    register_peer,
)

# isort: off
# the registration order is the order of `simulate --policy all` and of the tables (docs/peers.md)
from tailsieve.policy.peers import april_partial  # noqa: F401
from tailsieve.policy.peers import april_drop  # noqa: F401
from tailsieve.policy.peers import verl_lif  # noqa: F401
from tailsieve.policy.peers import rollpacker  # noqa: F401
from tailsieve.policy.peers import openrlhf_group  # noqa: F401
# isort: on

__all__ = ["PEERS", "Carry", "Lineup", "PeerConfig", "PeerPolicy", "PeerState", "PeerStep", "Waiting", "make_peer",
           "register_peer"]
