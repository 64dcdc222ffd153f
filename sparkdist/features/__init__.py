"""The shared data contract: feature assembly and deterministic splits."""

from sparkdist.features.assembly import FeatureAssembler, FeatureAssemblerModel
from sparkdist.features.split import SplitResult, split

__all__ = ["FeatureAssembler", "FeatureAssemblerModel", "SplitResult", "split"]
