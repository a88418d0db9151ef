"""Programs run in child interpreters, never imported by the pipeline for their work: the casters
scan, the parity replay, the CUPTI warm-up run, the served-path driver and the index server.

Each runs under an interpreter the pipeline does not control (another Python version, vLLM's, a
GPU runner's), so each imports the standard library and what its child interpreter has (vLLM,
torch, numpy, pypiserver), never ``release``. The pipeline reaches them by path
(``release.util.paths.script``); a gate may import their constants (e.g. the hook names), a
bench their functions (tests/test_architecture.py checks both).
"""
