"""The engine core: the model and its engine thread in a process of their own (``[engine] core_process``).

``wire`` is what the two sides send each other, ``main`` the core's process, ``client`` the
server's side of it (a :class:`~sparkfold.engines.generator.Generator`).
"""
