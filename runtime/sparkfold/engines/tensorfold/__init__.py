"""The ``tensorfold`` engine: one TensorFold rank in its engine image, launched and watched.

``launch`` renders a rank's command, environment and launcher argv as values, ``process`` runs
and watches it, ``profile`` says which ``[engine.tensorfold]`` settings an image can honour.
"""
