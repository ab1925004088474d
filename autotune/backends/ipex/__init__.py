"""Intel Extension for PyTorch, which imports only with torch 2.8 and so runs in the IPEX runtime
(.venv-ipex): ipex.optimize run eagerly, traced or compiled, and static int8 (classify.py);
ipex.llm.optimize's fused kernels and weight-only int8/int4 (generate.py)."""
