from __future__ import annotations

from triton_embed_server.supervisor import option_value, server_arguments, stub_model_name


def test_stub_model_name_reads_the_model_folder():
    cmd = [
        "/x/backends/python/triton_python_backend_stub",
        "/repo/model_repository/embedder/1/model.py",
        "triton_python_backend_shm_region_1",
        "1048576",
        "1048576",
        "123",
        "/x",
        "336",
        "embedder_0_1",
        "DEFAULT",
    ]
    assert stub_model_name(cmd) == "embedder"
    assert stub_model_name(["/usr/bin/python", "x.py"]) is None
    assert stub_model_name([]) is None


def test_option_value_last_wins_and_equals_form():
    args = ["--http-port", "1", "--grpc-port=5", "--http-port=9"]
    assert option_value(args, "--http-port", "8000") == "9"
    assert option_value(args, "--grpc-port", "8001") == "5"
    assert option_value(args, "--metrics-port", "8002") == "8002"


def test_server_arguments_adds_explicit_model_control_unless_given():
    assert server_arguments(["--model-repository", "r"]) == [
        "--model-repository",
        "r",
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
    ]
    assert server_arguments(["--model-control-mode=poll"]) == ["--model-control-mode=poll"]
