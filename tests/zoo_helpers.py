"""A local HTTP zoo server and tiny catalogs for the zoo tests (imported as ``tests.zoo_helpers``)."""

from __future__ import annotations

import copy
import functools
import hashlib
import http.server
import io
import threading
from pathlib import Path

import torch
import yaml

from lightning_dprobust.models import create_model

TINY_NAME = "mlp_tanh.tiny_test"
TINY_MODEL = {
    "name": "mlp_tanh",
    "kwargs": {"num_classes": 3, "input_shape": [1, 4, 4], "mean": [0.5], "std": [0.25], "hidden": 4},
}


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves files like ``python -m http.server``, counting requests; ``mode`` breaks the body on purpose."""

    server: ZooServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.server.requests.append(self.path)
        if self.server.mode == "normal":
            super().do_GET()
            return
        body = Path(self.translate_path(self.path)).read_bytes()
        self.send_response(200)
        if self.server.mode == "short_body":  # announces the full length, sends half, then closes
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2])
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        """Keep the test output quiet."""


class ZooServer(http.server.ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 (ephemeral port) serving ``root`` from a daemon thread.

    Attributes:
        requests: paths of every GET received.
        mode: ``"normal"``, ``"short_body"`` (Content-Length of the full file, half the bytes) or ``"no_length"``
            (half the bytes, no Content-Length, then the connection closes).
    """

    daemon_threads = True

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), functools.partial(_Handler, directory=str(root)))
        self.requests: list[str] = []
        self.mode = "normal"
        self._thread = threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=10)


def tiny_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return create_model(TINY_MODEL["name"], **TINY_MODEL["kwargs"]).state_dict()


def torch_bytes(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def write_entry(
    zoo_dir: Path, payload: bytes, *, name: str = TINY_NAME, sha256: str | None = None, suffix: str = ".pth"
) -> dict:
    """Write ``payload`` as the weights of a shipped entry ``name`` (its sha256 unless given) and the entry's YAML."""
    sha = sha256 or hashlib.sha256(payload).hexdigest()
    file = f"{name}-{sha[:8]}{suffix}"
    (zoo_dir / "weights").mkdir(parents=True, exist_ok=True)
    (zoo_dir / "entries").mkdir(parents=True, exist_ok=True)
    (zoo_dir / "weights" / file).write_bytes(payload)
    entry = {
        "name": name,
        "status": "shipped",
        "url": f"weights/{file}",
        "file": file,
        "sha256": sha,
        "model": copy.deepcopy(TINY_MODEL),
        "preprocessing": {
            "input_shape": [1, 4, 4],
            "value_range": [0.0, 1.0],
            "normalization": "model",
            "transform": "none",
        },
        "meta": {
            "dataset": "digits",
            "num_params": 103,
            "method": "DPSGD",
            "paper": None,
            "metrics": {"test_acc": 0.5},
            "smoothing": None,
            "privacy": {
                "epsilon": 3.0,
                "delta": 1e-5,
                "accountant": "rdp",
                "noise_multiplier": 1.0,
                "max_grad_norm": 1.0,
                "sample_rate": 0.1,
                "steps": 10,
            },
            "recipe": {"config": "configs/dpsgd/digits.yaml", "commit": None},
        },
    }
    (zoo_dir / "entries" / f"{name}.yaml").write_text(yaml.safe_dump(entry, sort_keys=False))
    return entry


def files_under(directory: Path) -> list[Path]:
    """Every file below ``directory``, hidden and temporary ones included (empty if it does not exist)."""
    return sorted(path for path in directory.rglob("*") if path.is_file()) if directory.exists() else []
