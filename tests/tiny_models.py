"""A model repository of tiny Python-backend models (no engine): servers that start in seconds.

For tests of the supervisor and the launcher that need real tritonserver processes, real
stubs and real ``/dev/shm`` regions, but not the embedding models: ``identity`` models echo
their input; a ``stall`` model logs the end of its ``initialize`` and then blocks in it for
ever without using CPU, a real stalled load (issue 20 item 15).
"""

from __future__ import annotations

from pathlib import Path

MODEL_PY = """\
import threading

import triton_python_backend_utils as pb_utils

STALL = {stall}


class TritonPythonModel:
    def initialize(self, args):
        print(f"tiny model: initialize of {{args['model_instance_name']}} done", flush=True)
        if STALL:
            threading.Event().wait()  # blocked for ever, idle: the load never completes

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]
"""

CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "X", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "Y", data_type: TYPE_FP32, dims: [ 1 ] }} ]
instance_group [ {{ count: {count}, kind: KIND_CPU }} ]
"""


def tiny_repository(folder: Path, models: dict[str, int], stall: set[str] = frozenset()) -> Path:
    """A model repository in ``folder``: ``{name: instance count}``; ``stall`` ones block.

    Returns:
        The repository's path.
    """
    for name, count in models.items():
        (folder / name / "1").mkdir(parents=True)
        (folder / name / "config.pbtxt").write_text(CONFIG.format(name=name, count=count))
        (folder / name / "1" / "model.py").write_text(MODEL_PY.format(stall=name in stall))
    return folder
