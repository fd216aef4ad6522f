"""The cost model and the exact oracle (§2.1–2.2, App. A, D): TPOT curves τ(b), all-admit makespans, the two-lane
Pareto DP and top-k, the known-length group-level baselines, the tail-strength transform and the speculative
decoding cost model (§3.4). Pure functions of lengths and curves: no I/O beyond loading a curve file."""
