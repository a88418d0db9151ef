"""The Python reference of the ActiveKV engine and its vLLM connector (engine/offload/SPEC.md).

It is the oracle the parity and served-path gates compare the C++ engine against, byte for byte
and event for event. It is never shipped: no wheel holds it, and the payload gate refuses any
Python file a wheel holds that the manifest does not declare as a shim.
"""
