"""Eager PyTorch: the model's own forward, the baseline every speedup is measured against (classify.py),
and the decoder's own forward with a KV cache at a torchao precision (generate.py)."""
