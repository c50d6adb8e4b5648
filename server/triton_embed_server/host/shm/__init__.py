"""Shared memory of the Python-backend stubs: sized from the model configs, checked at start.

How the Python backend uses ``/dev/shm`` and how the sizes follow from the model configs is
told in :mod:`triton_embed_server.host.shm.sizing`. The modules:

* :mod:`~triton_embed_server.host.shm.tritonserver_args`: reading tritonserver arguments (the
  ``python`` backend's ``--backend-config=python,<key>=<value>`` settings, the repositories);
* :mod:`~triton_embed_server.host.shm.sizing`: the arithmetic (each model's largest call, its
  region, the ``python`` backend settings, what ``/dev/shm`` must hold), per repository or
  for the repositories of tritonserver arguments;
* :mod:`~triton_embed_server.host.shm.check`: the ``/dev/shm`` free-space check, its error,
  and :func:`server_arguments`, the settings added to tritonserver arguments after the check
  (every start path calls it);
* :mod:`~triton_embed_server.host.shm.cli`: the command line.

    python -m triton_embed_server.host.shm check --model-repository model_repository
    python -m triton_embed_server.host.shm args --model-repository model_repository [...]
"""

from triton_embed_server.host.shm.check import (
    EXIT_TOO_SMALL,
    SHM_DIR,
    SharedMemoryError,
    ShmSpace,
    require_space,
    server_arguments,
    shm_space,
    too_small_message,
)
from triton_embed_server.host.shm.cli import main
from triton_embed_server.host.shm.sizing import (
    BACKEND_DEFAULT_BYTES,
    FLOAT32,
    FRAGMENTATION,
    INT32,
    LENGTH_PREFIX,
    MIB,
    REQUEST_OVERHEAD,
    UTF8_MAX,
    ShmPlan,
    StepSize,
    mib,
    model_config_path,
    plan_arguments,
    plan_repository,
    round_up,
    step_size,
    visible_gpu_count,
)
from triton_embed_server.host.shm.tritonserver_args import (
    BACKEND,
    DEFAULT_KEY,
    DEFAULT_REGION_PREFIX,
    GROWTH_KEY,
    PREFIX_KEY,
    config_name,
    given_default_byte_size,
    option_values,
    python_backend_settings,
    repository_paths,
)

__all__ = [
    "BACKEND",
    "BACKEND_DEFAULT_BYTES",
    "DEFAULT_KEY",
    "DEFAULT_REGION_PREFIX",
    "EXIT_TOO_SMALL",
    "FLOAT32",
    "FRAGMENTATION",
    "GROWTH_KEY",
    "INT32",
    "LENGTH_PREFIX",
    "MIB",
    "PREFIX_KEY",
    "REQUEST_OVERHEAD",
    "SHM_DIR",
    "UTF8_MAX",
    "SharedMemoryError",
    "ShmPlan",
    "ShmSpace",
    "StepSize",
    "config_name",
    "given_default_byte_size",
    "main",
    "mib",
    "model_config_path",
    "option_values",
    "plan_arguments",
    "plan_repository",
    "python_backend_settings",
    "repository_paths",
    "require_space",
    "round_up",
    "server_arguments",
    "shm_space",
    "step_size",
    "too_small_message",
    "visible_gpu_count",
]
