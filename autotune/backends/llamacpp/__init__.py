"""llama.cpp through llama-cpp-python: the language model converted to GGUF by llama.cpp's own
converter and quantizer (gguf_export.py), decoded through its C API (generate.py)."""
