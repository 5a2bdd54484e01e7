"""The engine image: the TensorFold source at a pinned ref plus patch series (``patches``), an
external series by reference (``external``), the reference recipe's label and published images
(``published``)."""
