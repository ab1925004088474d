"""OpenVINO on CPU: the classifier converted to IR, int8 through NNCF (classify.py); a language model
exported by optimum-intel (ir_export.py) and run by OpenVINO GenAI's LLMPipeline (generate.py)."""
