"""Framework integrations: adapters that put TailSieve's pure step loop (`tailsieve.loop`) behind another RL
framework's extension points. Each lives in its own subpackage and imports its framework there only, so
`import tailsieve` never needs one installed: `tailsieve.integrations.verl` (verl v1: trainer, client, replay
buffer; from a clone `pip install -e '.[verl]'`) and `tailsieve.integrations.slime` (slime's rollout function and data
source, talking to SGLang natively). See docs/integrations/."""
