"""ONNX Runtime on CPU: the model exported to ONNX (onnx_export.py, which OpenVINO's conversion falls
back to), int8 through ONNX Runtime's own quantization (classify.py)."""
