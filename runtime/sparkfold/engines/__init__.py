"""Engine implementations behind the engine protocol.

``server`` is the HTTP side shared by our own engines; an engine implementation (a
:class:`~sparkfold.engines.generator.Generator`) only turns prompt token ids into reply token ids.
Engines never import ``sparkfold.node``: fabric facts arrive as values in their settings.
"""
