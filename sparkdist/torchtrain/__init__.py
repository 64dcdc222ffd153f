"""PyTorch-only code behind :class:`sparkdist.models.TorchEstimator`: the driver's launch of the
training stage (``launch``), the network and loss specs both sides share and the training loop
(``loop``), its checkpoints (``resume``), the executor-side data feed (``feed``), the
communication backends (``backends``), scoring (``inference``) and the built-in networks
(``nets``)."""
