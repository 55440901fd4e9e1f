"""Training-time checkpoints: written so that a killed or signalled run loses nothing
(:mod:`~gwdet.checkpoint.resilient`, :mod:`~gwdet.checkpoint.signal_hook`), every tensor with a
checksum (:mod:`~gwdet.checkpoint.integrity`), loaded without unsafe unpickling
(:mod:`~gwdet.checkpoint.safe_load`) and only into a model they fit
(:mod:`~gwdet.checkpoint.compatibility`). Converting ImageNet weights is :mod:`gwdet.convert`.
"""
