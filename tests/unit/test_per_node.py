"""One server per NUMA node: the commands built from a doctor plan (real 2-node fixtures) and
the dry run on this machine."""

from __future__ import annotations

from pathlib import Path

from triton_embed_server.host import doctor, per_node, topology
from triton_embed_server.run.launcher import REPO_ROOT

CAPTURES = Path(__file__).resolve().parents[1] / "data" / "topology"


def test_embedder_count_of_each_shipped_config():
    repo = REPO_ROOT / "model_repository"
    assert per_node.embedder_count(repo, None) == 2
    assert per_node.embedder_count(repo, "gpu") == 4


def test_two_node_gpu_host_gets_one_bound_server_per_node():
    host = doctor.build_host(
        topo=topology.parse_topo_matrix((CAPTURES / "topo_m_06.txt").read_text()),
        numa=topology.parse_numactl((CAPTURES / "numactl_01.txt").read_text()),
    )
    plan = doctor.plan_placement(host, instances_per_gpu=2).to_dict()
    servers = per_node.node_servers(plan, ["--model-repository", "r", "--model-config-name", "gpu"])
    assert [s.numa_node for s in servers] == [0, 1]
    assert [s.argv[:3] for s in servers] == [
        ["numactl", "--cpunodebind=0", "--membind=0"],
        ["numactl", "--cpunodebind=1", "--membind=1"],
    ]
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in servers] == ["0,1", "2,3"]
    assert [s.ports for s in servers] == [
        {"http": 8000, "grpc": 8001, "metrics": 8002},
        {"http": 8010, "grpc": 8011, "metrics": 8012},
    ]
    one = servers[1].argv
    assert (
        one[one.index("--grpc-port") + 1] == "8011"
        and one[one.index("--grpc-address") + 1] == "127.0.0.1"
    )
    assert "--model-config-name" in one and one[one.index("--") + 1] == "--model-repository"


def test_http_listens_on_loopback_whatever_the_bind_address():
    # Triton 2.51's HTTP frontend dies on a 150 MiB body before any check (docs/operations.md,
    # "Ports"): gRPC and metrics follow --bind-address, HTTP never leaves loopback.
    plan = {"servers": [{}, {}]}
    servers = per_node.node_servers(plan, ["--model-repository", "r"], bind_address="0.0.0.0")
    for server in servers:
        argv = server.argv
        addresses = {
            name: argv[argv.index(f"--{name}-address") + 1] for name in ("http", "grpc", "metrics")
        }
        assert addresses == {"http": "127.0.0.1", "grpc": "0.0.0.0", "metrics": "0.0.0.0"}


def test_single_node_host_runs_one_unbound_server(capsys):
    assert (
        per_node.main(
            [
                "--dry-run",
                "--",
                "--model-repository",
                str(REPO_ROOT / "model_repository"),
                "--grpc-port",
                "9101",
                "--http-port",
                "9100",
                "--metrics-port",
                "9102",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.strip().splitlines()
    if len(doctor.gather_host().numa_nodes) == 1:
        assert len(lines) == 1 and "numactl" not in lines[0]
        assert "grpc 127.0.0.1:9101" in lines[0] and "--metrics-port 9102" in lines[0]
        assert "http 127.0.0.1:9100" in lines[0]


def test_embedder_count_reads_the_config_the_server_loads(tmp_path: Path):
    (tmp_path / "embedder" / "configs").mkdir(parents=True)
    (tmp_path / "embedder" / "config.pbtxt").write_text('name: "embedder"\n')
    (tmp_path / "embedder" / "configs" / "big.pbtxt").write_text(
        'name: "embedder"\ninstance_group [ { count: 6, kind: KIND_CPU } ]\n'
    )
    assert per_node.embedder_count(tmp_path, None) == 1  # no instance_group: Triton's count 1
    assert per_node.embedder_count(tmp_path, "big") == 6


def test_unreadable_config_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "embedder").mkdir()
    (tmp_path / "embedder" / "config.pbtxt").write_text("instance_group [ { count: x } ]\n")
    assert per_node.main(["--dry-run", "--", "--model-repository", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("per_node: error: cannot read the embedder config of ")
    assert "not a Triton model config" in err and "Traceback" not in err


def test_missing_repository_is_a_one_line_error(tmp_path, capsys):
    assert per_node.main(["--dry-run", "--", "--model-repository", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("per_node: error: cannot read the embedder config")
        and "Traceback" not in err
    )


def test_free_ports_are_below_the_ephemeral_range():
    from triton_embed_server.run.launcher import free_port

    assert all(20000 <= free_port() <= 32767 for _ in range(20))
