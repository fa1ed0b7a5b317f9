"""The chaos suite's library: hosts in network namespaces, a cluster on them, the
workload, faults, the scenarios and the checker (docs/chaos.md)."""
