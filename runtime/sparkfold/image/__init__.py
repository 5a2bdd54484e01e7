"""The engine image: the TensorFold source at a pinned ref plus our patch series (``patches``)."""
