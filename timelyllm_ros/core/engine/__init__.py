"""LLM engines behind one protocol (base.py): the real vLLM engine, the calibrated simulated
engine (sim/), and the factory that builds either for a policy (factory.py)."""
