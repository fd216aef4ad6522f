"""Framework integrations: adapters that put TailSieve's pure step loop (`tailsieve.loop`) behind another RL
framework's extension points. Each lives in its own subpackage and imports its framework there only, so
`import tailsieve` never needs one installed (`tailsieve.integrations.verl`: pip install 'tailsieve[verl]')."""
