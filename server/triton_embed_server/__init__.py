"""What runs on the serving host.

The ensemble steps' request path, placement, topology parsers, the doctor, the supervisor
and the launchers. ``model_repository/*/1/model.py`` are thin Triton adapters over this
package; the client package (``triton_embed``) never imports it.
"""
