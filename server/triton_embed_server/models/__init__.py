"""The model folder (reader, spec, instance groups) and the model repository.

Repository add/list/remove, the templates, config copies.
"""
