"""tritonserver's HTTP endpoint as the supervisor uses it: readiness, model configs, reloads."""

from __future__ import annotations

import json
import urllib.request

from triton_embed_server.host.admin_key import restricted_http_headers
from triton_embed_server.run.supervisor.server_args import option_value


class ServerApi:
    """The KServe v2 HTTP calls the supervisor makes to its tritonserver.

    The URL is the server's ``--http-address`` (``127.0.0.1`` when it listens on every
    address) and ``--http-port``. When the server's ``--http-restricted-api`` flags restrict
    the ``model-config`` or ``model-repository`` protocols, their admin key header is sent.

    Args:
        command: the tritonserver command line.
    """

    def __init__(self, command: list[str]):
        address = option_value(command, "--http-address", "127.0.0.1")
        if address in ("0.0.0.0", "::", ""):
            address = "127.0.0.1"
        self.url = f"http://{address}:{option_value(command, '--http-port', '8000')}"
        # The admin key header the server requires (its --http-restricted-api flags), if any.
        self._config_headers = restricted_http_headers(command, "model-config")
        self._repository_headers = restricted_http_headers(command, "model-repository")

    def status(self, path: str) -> int:
        """The HTTP status of ``GET path`` (e.g. ``/v2/health/ready``); 0 when unreachable."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=2) as r:
                return r.status
        except OSError:
            return 0

    def config(self, model: str) -> dict:
        """The live config of ``model`` (``GET /v2/models/<model>/config``).

        Raises:
            OSError: the server could not be reached or refused.
            ValueError: the answer is not JSON.
        """
        req = urllib.request.Request(
            f"{self.url}/v2/models/{model}/config", headers=self._config_headers
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def load(self, model: str, config: dict) -> bool:
        """Load ``model`` with ``config`` (``POST /v2/repository/models/<model>/load``).

        Returns:
            Whether the server answered 200 (the model is loaded).

        Raises:
            OSError: the server could not be reached, or the load failed.
        """
        body = json.dumps({"parameters": {"config": json.dumps(config)}}).encode()
        req = urllib.request.Request(
            f"{self.url}/v2/repository/models/{model}/load",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", **self._repository_headers},
        )
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status == 200

    def ready_models(self) -> set[str]:
        """Names of the models the server has READY (``POST /v2/repository/index``).

        Raises:
            OSError: the server could not be reached or refused.
            ValueError: the answer is not JSON.
        """
        req = urllib.request.Request(
            f"{self.url}/v2/repository/index",
            data=json.dumps({"ready": True}).encode(),
            method="POST",
            headers={"Content-Type": "application/json", **self._repository_headers},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            index = json.loads(r.read())
        return {str(m["name"]) for m in index if m.get("state", "READY") == "READY"}
