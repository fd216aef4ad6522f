"""Analysis and reports: pure statistics over runs (length bias, KS, wasted share), App. B workload statistics,
and the one report (summary rows, JSON) that `simulate` and `rollout` print, with the verdict against verl's request
balancer (`balancer`) that `plan`, `simulate` and `rollout` end with."""
