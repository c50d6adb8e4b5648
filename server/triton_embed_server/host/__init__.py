"""The serving host.

Topology parsers, doctor, NUMA placement, shared memory, admin key, toolchain, per-node launch,
node memory.
"""
