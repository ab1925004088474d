"""torch.compile with inductor: the classifier compiled with freezing as an option (classify.py), and the
decoder's forward compiled under the inductor flags asked for, quantized as eager's (generate.py)."""
