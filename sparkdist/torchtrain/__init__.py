"""PyTorch-only code behind :class:`sparkdist.models.TorchEstimator`: the typed contract between
driver and ranks (``spec``), the driver's launch of the training stage (``launch``), the
network, loss and optimizer both sides share (``network``), the training loop (``loop``) and
what it measures (``clock``), its checkpoints (``resume``), the executor-side data feed
(``feed``) and data checks (``datacheck``), the strategies (``strategies``) and communication
backends (``backends``), scoring (``inference``) and the built-in networks (``nets``)."""
