"""Simulation (mechanism, virtual time): the event-driven replica model, `SimExecutor`, simulated policy runs with
the known-length oracles, the capture-rate measurement and the matched-budget speculation experiment."""
