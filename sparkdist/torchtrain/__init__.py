"""PyTorch-only training code, used by :class:`sparkdist.models.TorchEstimator`: the network
and loss specs both sides share (``loop``), the executor-side data feed (``feed``), the training
loop and its checkpoints (``loop``, ``resume``), the communication backends (``backends``) and
the built-in networks (``nets``)."""
