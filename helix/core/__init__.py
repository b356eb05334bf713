"""The ground floor: the vocabulary every other package speaks.

The cluster spec and its validation (``spec``, ``spec_errors``, ``yamlio``, ``helix_ini``,
``link_table``), units, the hardware and model catalogs (``hardware``, ``models``, ``gguf``),
the cost model and measured profiles (``costmodel``, ``calibration``, ``profiles``), the plan
and its data objects (``plan``, ``slices``, ``serving``, ``pipelines``), tokens, the cache
folder and the errors. Nothing here imports a package above it (tests/test_layering.py).
"""
