"""Triton Python-backend adapters of the two steps (``model.py`` of each step imports one).

They decode tensors, call the plain-Python step logic of this package, and encode tensors.
"""
