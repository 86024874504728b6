"""Who decodes a run: specbench's own engine (decoding/), vLLM, transformers' `generate`; one module each,
behind one protocol (protocol.py), listed in registry.py."""
