"""Several nodes: two torchrun "nodes" on 127.0.0.1 (one CPU process each, gloo), the batch rule counting every
node, and the Slurm script checked with bash -n and a fake srun/scontrol.

    pytest tests/test_multinode.py -m "not slow"    # seconds: batch rule, bash -n, the script's commands and errors
    pytest tests/test_multinode.py                  # + the loopback runs, ~2 min on 2 cores

Each loopback node is its own `torchrun --nnodes 2 --node_rank R --nproc_per_node 1 --master_addr 127.0.0.1`, as on
two machines, sharing one OUTPUT_DIR as nodes share a network file system. Real GPUs, NCCL and Slurm are not
exercised here (docs/multinode.md says what was and was not tested).
"""

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest
from conftest import REPO, train

from grpo import cli


def test_the_slurm_script_reads_the_default_model_from_help():
    # slurm/train.slurm --vllm-server serves grpotrainer's default MODEL_NAME when none is given: its sed must read
    # the --help line as the help prints it
    import grpotrainer

    help_text = cli.help_text(REPO / "grpotrainer.py", cli.constants(grpotrainer))
    script = (REPO / "slurm" / "train.slurm").read_text()
    sed = script.split("grpotrainer.py --help | sed -n '")[1].split("'")[0]
    out = subprocess.run(["sed", "-n", sed], input=help_text, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == grpotrainer.MODEL_NAME


SLURM_SCRIPTS = sorted((REPO / "slurm").glob("*.slurm"))


DDP_TIMEOUT = 30  # seconds; short so that a stalled node ends the test quickly


MARGIN = 60  # seconds on top of DDP_TIMEOUT for the failing node to report and exit, on 2 busy cores


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(rank, port, output_dir, logs, *overrides, umask=0o022):
    """One loopback node: its own torchrun agent in its own session, output to logs/node{rank}.{out,err}."""
    torchrun = ["-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(rank), "--nproc_per_node", "1"]
    torchrun += ["--master_addr", "127.0.0.1", "--master_port", str(port)]
    out, err = open(logs / f"node{rank}.out", "w"), open(logs / f"node{rank}.err", "w")  # noqa: SIM115
    return train(
        output_dir,
        *overrides,
        launcher=torchrun,
        background=True,
        stdout=out,
        stderr=err,
        start_new_session=True,
        preexec_fn=lambda: os.umask(umask),
    )


def process_groups(node):
    """The process groups of a node: its torchrun agent's, and each worker's (torchrun starts them in new sessions)."""
    import psutil

    try:
        workers = psutil.Process(node.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        workers = []
    return {node.pid} | {os.getpgid(w.pid) for w in workers if w.is_running()}


def kill_all(*nodes):
    for node in nodes:
        for group in process_groups(node):
            with contextlib.suppress(ProcessLookupError):  # already gone
                os.killpg(group, signal.SIGKILL)
        node.wait(timeout=30)


@pytest.fixture
def nodes():
    """Start loopback nodes with `nodes(rank, ...)`; whatever is left running is killed after the test."""
    started = []

    def start(*args, **kwargs):
        started.append(start_node(*args, **kwargs))
        return started[-1]

    yield start
    kill_all(*started)


# ---------------------------------------------------------------------------------------------------------------
# The Slurm script: syntax, and the commands it builds under a fake srun/scontrol


def test_there_is_a_slurm_script():
    assert [p.name for p in SLURM_SCRIPTS] == ["train.slurm"]  # a new script is then checked by bash -n below


@pytest.mark.parametrize("script", SLURM_SCRIPTS, ids=lambda p: p.name)
def test_slurm_script_parses(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def fake_cluster(tmp_path, nodes):
    """A submit folder, a venv whose accelerate/trl print their arguments, and srun/scontrol that run locally."""
    bin_dir, venv = tmp_path / "bin", tmp_path / "venv" / "bin"
    bin_dir.mkdir()
    venv.mkdir(parents=True)
    (tmp_path / "logs").mkdir()
    (tmp_path / "grpotrainer.py").touch()
    scripts = {
        bin_dir / "scontrol": f"printf '%s\\n' {' '.join(nodes)}",
        bin_dir / "srun": 'while [[ "$1" == --* ]]; do shift; done; SLURM_PROCID=0 exec "$@"',  # drop srun's options
        venv / "accelerate": 'printf "%s\\n" accelerate "$@"',
        # the server: print the command, then answer GET /health from a folder holding a file "health"
        venv / "trl": 'printf "%s\\n" trl "$@"; mkdir -p h; touch h/health; '
        'exec python -m http.server "$VLLM_PORT" --bind 127.0.0.1 --directory h',
    }
    for path, body in scripts.items():
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    (venv / "python").symlink_to(sys.executable)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        **{"SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "grpo", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_GPUS_ON_NODE": "8"},
        **{"SLURM_SUBMIT_DIR": str(tmp_path), "VENV": str(venv.parent), "VLLM_PORT": str(free_port())},
        "ACCELERATE_CONFIG": str(REPO / "configs" / "accelerate" / "ddp.yaml"),
    }
    return env


def run_slurm(tmp_path, env, *args):
    script = REPO / "slurm" / "train.slurm"
    return subprocess.run(
        ["bash", str(script), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )


def test_slurm_every_node_trains(tmp_path):
    env = fake_cluster(tmp_path, ["n1", "n2"])
    result = run_slurm(tmp_path, env, "--MAX_STEPS=5", "--top_p=0.9")
    assert result.returncode == 0, result.stderr
    # one accelerate launch per node: 2 nodes x 8 GPUs, rendezvous at the first node; our arguments follow unchanged
    assert result.stdout.splitlines()[1:] == [
        "accelerate", "launch", "--config_file", env["ACCELERATE_CONFIG"],
        "--num_machines", "2", "--num_processes", "16", "--machine_rank", "0",
        "--main_process_ip", "n1", "--main_process_port", "29500", "--rdzv_backend", "c10d",
        "grpotrainer.py", "--MAX_STEPS=5", "--top_p=0.9",
    ]  # fmt: skip


@pytest.mark.slow  # waits for the fake server's /health (~5 s)
def test_slurm_vllm_server_on_the_last_node(tmp_path):
    env = fake_cluster(tmp_path, ["n1", "n2", "127.0.0.1"])  # the server node must answer on this machine
    result = run_slurm(tmp_path, env, "--vllm-server", "--MODEL_NAME=Qwen/Qwen3-0.6B")
    assert result.returncode == 0, result.stderr
    server = (tmp_path / "logs" / "grpo-7-vllm.out").read_text().splitlines()
    assert server[:8] == ["trl", "vllm-serve", "--model", "Qwen/Qwen3-0.6B", "--port", env["VLLM_PORT"]] + [
        "--tensor_parallel_size",
        "8",  # one server over the node's 8 GPUs
    ]
    train = result.stdout.splitlines()
    # two training nodes (16 processes) that generate on the third
    assert train[train.index("--num_machines") + 1 : train.index("--num_processes") + 2] == [
        "2",
        "--num_processes",
        "16",
    ]
    assert train[train.index("grpotrainer.py") :] == [
        "grpotrainer.py", "--MODEL_NAME=Qwen/Qwen3-0.6B", "--USE_VLLM=true", "--VLLM_MODE=server",
        f"--VLLM_SERVER_BASE_URL=http://127.0.0.1:{env['VLLM_PORT']}",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("nodes", "args", "env_change", "message"),
    [
        (["n1"], ["--vllm-server"], {}, "--vllm-server needs 2 nodes or more (one serves, the others train); got 1."),
        (["n1", "n2"], [], {"SLURM_JOB_ID": ""}, "submit this with sbatch"),
        (["n1", "n2"], [], {"VENV": "/no/such/venv"}, "VENV=/no/such/venv has no bin/accelerate"),
        (["n1", "n2"], [], {"SLURM_GPUS_ON_NODE": "0"}, "#SBATCH --gpus-per-node=N"),
    ],
)
def test_slurm_says_what_must_be_set(tmp_path, nodes, args, env_change, message):
    env = {**fake_cluster(tmp_path, nodes), **env_change}
    result = run_slurm(tmp_path, env, *args)
    assert result.returncode == 1  # before srun starts anything
    assert message in result.stderr
    assert "accelerate" not in result.stdout


# ---------------------------------------------------------------------------------------------------------------
# Two nodes on loopback


@pytest.mark.slow
def test_two_nodes_train_as_one_world(tmp_path, nodes):
    out = tmp_path / "out"
    port = free_port()
    # node 1 creates files with group write (umask 002), node 0 without: the mode says which node wrote a file
    node0, node1 = nodes(0, port, out, tmp_path), nodes(1, port, out, tmp_path, umask=0o002)
    assert node0.wait(timeout=600) == 0, (tmp_path / "node0.err").read_text()[-3000:]
    assert node1.wait(timeout=60) == 0, (tmp_path / "node1.err").read_text()[-3000:]
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    # 2 processes x 4 completions = 2 of the fixture's 32 prompts per step: 4 steps = 0.25 epoch (one process: 0.125)
    assert (state["global_step"], state["epoch"]) == (4, 0.25)
    assert [h["epoch"] for h in state["log_history"] if "loss" in h] == [0.0625, 0.125, 0.1875, 0.25]
    # written once: the two checkpoints SAVE_STEPS=2 asks for, no half-written or temporary folder beside them
    assert sorted(p.name for p in out.iterdir() if "checkpoint" in p.name) == ["checkpoint-2", "checkpoint-4"]
    assert not [p for p in out.rglob("*") if "tmp" in p.name]
    for step in (2, 4):
        names = {p.name for p in (out / f"checkpoint-{step}").iterdir()}
        assert {"adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"} <= names
        assert {n for n in names if n.startswith("rng_state")} == {"rng_state_0.pth", "rng_state_1.pth"}
    # rank 1 wrote its own RNG state (the Trainer saves one per process, for an exact resume) and no other file; it
    # may create a checkpoint folder to put it in when it gets there before rank 0. The tiny model folder is built
    # by whichever node renames it into place first.
    written = [p for p in out.rglob("*") if p.is_file() and p.stat().st_mode & stat.S_IWGRP]
    by_node1 = {p.relative_to(out).as_posix() for p in written}
    assert {p for p in by_node1 if not p.startswith("smoke-model")} == {
        "checkpoint-2/rng_state_1.pth",
        "checkpoint-4/rng_state_1.pth",
    }
    assert (out / "smoke-model" / "config.json").is_file() and (out / "smoke-model" / "model.safetensors").is_file()


@pytest.mark.slow
def test_batch_rule_counts_both_nodes(tmp_path, nodes):
    port = free_port()
    overrides = ("--PER_DEVICE_TRAIN_BATCH_SIZE=1", "--GRADIENT_ACCUMULATION_STEPS=1")
    started = [nodes(rank, port, tmp_path / "out", tmp_path, *overrides) for rank in (0, 1)]
    for rank, node in enumerate(started):
        assert node.wait(timeout=300) == 1  # torchrun's status for a failed worker (the worker's own is 2)
        stderr = (tmp_path / f"node{rank}.err").read_text()
        # WORLD_SIZE=2 across the nodes: 1 x 2 x 1 = 2 completions per round, not a multiple of NUM_GENERATIONS=4
        assert "= 1 x 2 x 1 = 2 completions" in stderr
        assert "exitcode  : 2" in stderr  # torchrun's failure summary quotes the worker's own status
    assert not (tmp_path / "out" / "smoke-model").exists()  # stopped before the model folder was built


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("kill", "remote worker"),  # node 1 dies: gloo sees its socket close or reset, and says to check the peer
        ("stall", f"Timed out waiting {DDP_TIMEOUT * 1000}ms"),  # node 1 hangs: gloo gives up after DDP_TIMEOUT
    ],
)
def test_a_lost_node_stops_the_run(tmp_path, nodes, how, says):
    out, port = tmp_path / "out", free_port()
    overrides = ("--MAX_STEPS=1000", "--SAVE_STEPS=1000", f"--DDP_TIMEOUT={DDP_TIMEOUT}")  # still training when hit
    node0, node1 = (nodes(rank, port, out, tmp_path, *overrides) for rank in (0, 1))
    err0 = tmp_path / "node0.err"
    deadline = time.monotonic() + 300
    while "2/1000" not in err0.read_text():  # node 0's progress bar: both nodes are past their first steps
        assert node0.poll() is None and time.monotonic() < deadline, err0.read_text()[-3000:]
        time.sleep(0.5)
    groups = process_groups(node1)
    for group in groups if how == "kill" else groups - {node1.pid}:  # stall: the worker stops, its agent lives on
        os.killpg(group, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    start = time.monotonic()
    try:
        status = node0.wait(timeout=DDP_TIMEOUT + MARGIN)
    except subprocess.TimeoutExpired:
        status = None
    elapsed = time.monotonic() - start
    assert status not in (0, None), f"node 0 still running {elapsed:.0f} s after node 1 was lost ({how})"
    assert elapsed < DDP_TIMEOUT + MARGIN
    stderr = err0.read_text()
    assert "grpotrainer.py FAILED" in stderr  # torchrun's summary: the job ends with a report, not silence
    assert says in stderr  # the cause as gloo words it ...
    # ... and our message (process.stall_error) naming the setting and what to check, from a worker that printed
    # no traceback (torchrun's own report of the failed worker, after "failed (exitcode: 2)", prints one)
    ours = stderr.split("failed (exitcode")[0]
    assert f"DDP_TIMEOUT={DDP_TIMEOUT} s" in ours and "Check every rank's log" in ours and "Traceback" not in ours
