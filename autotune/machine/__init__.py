"""What this machine offers: the probe (CPU, ISA, cores and SMT siblings, NUMA, pinning, THP,
allocators), the runtimes (Python environments) and the backends each imports, the text-generation
precisions and engines each runs (generation_probe), the fingerprint a study records, and the probe's
report and printout.

May import backends (to ask a runtime which ones import) and common.
"""
