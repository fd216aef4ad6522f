"""Policy (§3.1–3.2, App. C): the router (step plans), the controller (q, m), its predictor, candidate ranking and
the prompt stream. Pure: frozen observations in, a plan or decision out; no clocks, no I/O. Imports only
`tailsieve.model`, never the simulator, the engines or the CLI."""
