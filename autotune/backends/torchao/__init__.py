"""torchao's PT2E int8 for a classifier, compiled with inductor and freezing (classify.py). Text
generation's torchao precisions are shared by eager and inductor: backends/generation/quantization.py."""
