"""Starting and keeping a tritonserver.

The launcher and the supervisor.
"""
