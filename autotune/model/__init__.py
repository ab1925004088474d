"""Where the model and its inputs come from: model sources (torchvision names, factories, TorchScript
and exported-program files, weights), input specs and synthetic batches, the user's data sets and
the seeds that keep evaluation, calibration and timing inputs disjoint.

May import common only.
"""
