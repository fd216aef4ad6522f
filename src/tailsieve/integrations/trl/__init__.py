"""TailSieve behind TRL's `GRPOTrainer` (docs/integrations/trl.md).

`TrlSession` (no TRL import) runs TailSieve steps over the training dataset on vLLM replicas;
`TailSieveGRPOTrainer` (`tailsieve.integrations.trl.trainer`, imports `trl`) is the trainer that uses it.
"""

from tailsieve.integrations.trl.probe import ProbeResult, ReplicaProbe, greedy_agreement
from tailsieve.integrations.trl.report import TableRow, format_table, table_rows
from tailsieve.integrations.trl.session import PendingStep, PushRecord, StepStats, TrlIntegrationError, TrlSession

__all__ = ["PendingStep", "ProbeResult", "PushRecord", "ReplicaProbe", "StepStats", "TableRow", "TrlIntegrationError",
           "TrlSession", "format_table", "greedy_agreement", "table_rows"]
