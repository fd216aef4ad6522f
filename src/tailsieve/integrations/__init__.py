"""Adapters that plug TailSieve into RL frameworks through the frameworks' own extension points (no framework
code is imported at module import). `tailsieve.integrations.slime`: slime's rollout function and data source,
talking to SGLang engines natively. See docs/integrations/."""
