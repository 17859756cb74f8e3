"""Pinned images per rule: the lock, `container:` of every rule, the Docker path.

The CPU image is built here the way a machine without a registry builds it
(`reasonrl containers build --local-base`: debootstrap + docker import, wheels from the lock),
published to a local registry and pulled back by digest (the fixtures of
tests/container_fixtures.py). config/test.yaml's whole DAG runs with every rule in that pulled
image on SLURM, as an ordinary account, in tests/test_slurm.py (its results must equal the
native run's); here are the lock, the runner, the registry and one rule run by root.
`make test-deps` installs docker.io, debootstrap, docker-registry and skopeo (as root); the
session starts dockerd when none answers and stops it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from local_registry import LocalRegistry
from run_results import comparable
from slurm_cluster import _free_port

from reasonrl.containers.build import LOCAL_BASE_REPOSITORY, remove_replaced_image
from reasonrl.containers.daemon import REQUEST_TIMEOUT_S, docker_client
from reasonrl.containers.lock import StageImage, load_lock, rewrite_image_fields
from reasonrl.containers.publish import check_registry, publish_image
from reasonrl.containers.runner import ContainerSpec, host_config
from reasonrl.errors import ReasonRLError

REPO = Path(__file__).resolve().parents[1]
# Building the image or running the workflow on SLURM (the session fixtures) can take longer
# than pytest's per-test timeout on a loaded 2-core machine.
HEAVY_TIMEOUT = 3600
VENV_BIN = Path(sys.executable).parent
LOCK = REPO / "containers/images.lock.yaml"


# --- the lock and the rules, without Docker -----------------------------------------------------


def test_shipped_lock_covers_every_rule_and_pins_no_unpublished_image(snakemake):
    """A digest in the shipped lock is a registry's (`containers publish`): it comes with a
    registry ref; a local build's image id never ships."""
    lock = load_lock(LOCK)
    for name, image in lock.images.items():
        assert "image_id" not in image, name
        if image["digest"] is not None:
            assert re.match(r"^[a-z0-9.-]+(:\d+)?/", image["ref"]), name
    rules = set(snakemake("--list-rules").stdout.split()) - {"all"}
    assert rules <= set(lock.stages), rules - set(lock.stages)


def test_every_rule_with_a_command_names_its_own_image():
    """Each `rule NAME:` with a shell command has `container: rule_container("NAME")`."""
    for path in sorted((REPO / "workflow/rules").glob("*.smk")):
        blocks = re.split(r"^\s*rule (\w+):\n", path.read_text(), flags=re.M)
        for name, body in zip(blocks[1::2], blocks[2::2], strict=True):
            if "shell:" in body:
                directive = rf'container:\s*rule_container\("{name}"\)'
                assert re.search(directive, body), f"{path.name}: rule {name}"


PUBLISHED_DIGEST = "sha256:" + "ab" * 32


def published_lock(tmp_path: Path, ref: str = "127.0.0.1:5000/ns/reasonrl-cpu:0.1.0") -> Path:
    """The shipped lock with the CPU image published as `ref`."""
    path = tmp_path / "images.lock.yaml"
    shutil.copy(LOCK, path)
    rewrite_image_fields(path, "cpu", {"ref": ref, "digest": PUBLISHED_DIGEST})
    return path


def test_rule_container_is_docker_repository_at_digest(tmp_path):
    lock = load_lock(published_lock(tmp_path))
    image = lock.stage("sft", gpu_images=False)
    assert image.uri == f"docker://127.0.0.1:5000/ns/reasonrl-cpu@{PUBLISHED_DIGEST}"
    assert image.pinned == f"127.0.0.1:5000/ns/reasonrl-cpu@{PUBLISHED_DIGEST}"
    assert lock.stage("sft", gpu_images=True).name == "gpu"
    assert lock.stage("report", gpu_images=True).name == "cpu"


@pytest.mark.parametrize(
    ("ref", "repository"),
    [
        ("reasonrl-cpu:0.1.0", "reasonrl-cpu"),
        ("reasonrl-cpu", "reasonrl-cpu"),
        ("localhost:5000/reasonrl-cpu", "localhost:5000/reasonrl-cpu"),
        (
            "registry.example.org:443/a/b/reasonrl-gpu:1.2",
            "registry.example.org:443/a/b/reasonrl-gpu",
        ),
    ],
)
def test_repository_drops_the_tag_and_keeps_the_port(ref, repository):
    assert StageImage("cpu", ref, None, False).repository == repository


def test_unpublished_image_has_no_uri_and_says_how_to_publish():
    image = load_lock(LOCK).stage("sft", gpu_images=False)
    assert image.pinned == image.ref  # the Docker path runs a local build by its tag
    with pytest.raises(ReasonRLError, match="not published.*reasonrl containers publish"):
        _ = image.uri


def test_apptainer_run_of_an_unpublished_image_stops_naming_the_fix(snakemake, tmp_path):
    shutil.copytree(REPO / "config", tmp_path / "config")
    args = ["-n", "--configfile", "config/test.yaml", "--software-deployment-method", "apptainer"]
    result = snakemake(*args, cwd=tmp_path, check=False)
    assert result.returncode != 0
    assert "image 'cpu' (reasonrl-cpu:0.1.0) is not published" in result.stderr
    assert "reasonrl containers publish --registry" in result.stderr


def test_docker_path_runs_a_published_image_by_the_same_reference(snakemake, tmp_path):
    lock = published_lock(tmp_path)
    containers = f"containers={{'engine': 'docker', 'lock': '{lock}'}}"
    shells = docker_shells(snakemake, tmp_path / "run", containers)
    pinned = f"127.0.0.1:5000/ns/reasonrl-cpu@{PUBLISHED_DIGEST}"
    for script in shells.values():
        assert f"--image {pinned} --workdir" in script
        assert f"--digest {PUBLISHED_DIGEST}" in script


def test_publish_rewrites_ref_and_digest_and_keeps_the_locks_comments(tmp_path):
    path = published_lock(tmp_path)
    text = path.read_text()
    assert text.splitlines()[:20] == LOCK.read_text().splitlines()[:20]  # comments kept
    assert "    ref: 127.0.0.1:5000/ns/reasonrl-cpu:0.1.0\n" in text
    rewrite_image_fields(path, "gpu", {"image_id": PUBLISHED_DIGEST})
    lock = load_lock(path)
    assert lock.images["cpu"]["digest"] == PUBLISHED_DIGEST
    assert lock.images["gpu"] == {**load_lock(LOCK).images["gpu"], "image_id": PUBLISHED_DIGEST}
    assert lock.stages == load_lock(LOCK).stages


@pytest.mark.parametrize("registry", ["127.0.0.1:5000", "Ghcr.io/Org", "ghcr/org", "-x.io/a"])
def test_publish_refuses_a_registry_without_host_and_name(registry):
    with pytest.raises(ReasonRLError, match=f"--registry '{re.escape(registry)}'"):
        check_registry(registry)
    assert check_registry("ghcr.io/my-org/") == "ghcr.io/my-org"
    assert check_registry("127.0.0.1:5000/reasonrl") == "127.0.0.1:5000/reasonrl"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("images: {}\nstages: {}\n", "key 'images'"),
        (
            "images: {cpu: {ref: a/b:1, digest: sha256:12, dockerfile: D}}\nstages: {}\n",
            "key 'images.cpu.digest'",
        ),
        (
            "images: {cpu: {ref: a/b:1, digest: null, dockerfile: D}}\n"
            "stages: {sft: {image: gpu, network: false}}\n",
            "key 'stages.sft.image'",
        ),
    ],
)
def test_bad_lock_is_one_line_naming_the_key(tmp_path, text, message):
    path = tmp_path / "lock.yaml"
    path.write_text(text)
    with pytest.raises(ReasonRLError, match=message) as err:
        load_lock(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_rule_missing_from_the_lock_stops_the_workflow_naming_it(snakemake, tmp_path):
    data = yaml.safe_load(LOCK.read_text())
    del data["stages"]["report"]
    lock = tmp_path / "lock.yaml"
    lock.write_text(yaml.safe_dump(data))
    result = snakemake("-n", "--config", f"containers={{'lock': '{lock}'}}", check=False)
    assert result.returncode != 0
    assert f"{lock}: rule 'report' has no entry under 'stages'" in result.stderr


def docker_shells(snakemake, workdir: Path, *config: str) -> dict[str, str]:
    """rule -> the shell script the Docker path gives it (written by a dry-run in workdir)."""
    shutil.copytree(REPO / "config", workdir / "config", dirs_exist_ok=True)
    args = ["-n", "--configfile", "config/test.yaml", "--config", "containers={'engine': 'docker'}"]
    snakemake(*args, *config, cwd=workdir)
    folder = workdir / ".snakemake/reasonrl-docker"
    return {path.name: (path / "bash").read_text() for path in folder.iterdir()}


def test_docker_path_gives_the_network_only_to_rules_that_fetch_from_a_hub(snakemake, tmp_path):
    local = docker_shells(snakemake, tmp_path / "local")
    assert {"make_task_data", "build_tiny_policy", "sft", "evaluate", "report"} <= local.keys()
    assert not any("--network" in script for script in local.values())
    hub = docker_shells(snakemake, tmp_path / "hub", "policy={'base': 'org/model'}")
    lock = yaml.safe_load((REPO / "containers/images.lock.yaml").read_text())["stages"]
    fetching = {rule for rule in hub if lock[rule]["network"]}
    assert {"make_task_data", "sft", "evaluate"} <= fetching
    assert {rule for rule, script in hub.items() if "--network" in script} == fetching


def test_docker_path_passes_gpus_a_rule_asks_for(snakemake, tmp_path):
    shells = docker_shells(snakemake, tmp_path, "--set-resources", "sft:gpu=2")
    assert "--gpus 2" in shells["sft"] and "--gpus 0" in shells["evaluate"]


def test_host_config_mounts_workdir_and_passes_gpus_network_and_sandbox_needs():
    class FakeAPI:
        def create_host_config(self, **options):
            return options

    client = type("Client", (), {"api": FakeAPI()})()
    spec = ContainerSpec("img", None, "/work", network=False, gpus=2, user="1000:1000")
    config = host_config(client, spec)
    assert config["network_mode"] == "none"
    assert config["binds"] == {"/work": {"bind": "/work", "mode": "rw"}}
    (request,) = config["device_requests"]
    assert request["Count"] == 2 and request["Capabilities"] == [["gpu"]]
    assert config["cap_add"] is None  # a user's sandbox gets its namespaces unprivileged
    root = host_config(client, ContainerSpec("img", None, "/work", network=True, user="0:0"))
    assert root["device_requests"] is None and root["network_mode"] == "default"
    assert root["cap_add"] == ["SYS_ADMIN", "NET_ADMIN"]  # what root's bwrap needs


def test_the_container_sees_the_scheduler_job_and_threads_but_not_the_rest_of_the_host():
    host = {"SLURM_JOB_ID": "41", "SLURM_JOB_NODELIST": "node1", "OMP_NUM_THREADS": "8",
            "OMP_WAIT_POLICY": "PASSIVE"}  # fmt: skip
    env = ContainerSpec("img", "sha256:d", "/work").environment({**host, "AWS_SECRET": "x"})
    assert {k: env[k] for k in host} == host  # the manifest records the SLURM job
    assert "AWS_SECRET" not in env and env["REASONRL_IMAGE_DIGEST"] == "sha256:d"


class FakeImages:
    """docker-py's image collection: records removals, refuses ids in `in_use`."""

    def __init__(self, in_use: tuple[str, ...] = ()):
        self.in_use = in_use
        self.removed: list[str] = []

    def remove(self, image: str) -> None:
        import docker

        if image in self.in_use:
            raise docker.errors.APIError("409", explanation=f"conflict: {image} is in use")
        self.removed.append(image)


def test_rebuild_removes_the_image_it_took_the_tag_from():
    images = FakeImages()
    client = type("Client", (), {"images": images})()
    remove_replaced_image(client, "sha256:old", "sha256:new")
    remove_replaced_image(client, "sha256:new", "sha256:new")
    assert images.removed == ["sha256:old"]


def test_rebuild_keeps_a_replaced_image_a_container_still_uses(caplog):
    images = FakeImages(in_use=("sha256:old",))
    client = type("Client", (), {"images": images})()
    remove_replaced_image(client, "sha256:old", "sha256:new")
    assert images.removed == []
    assert "kept the replaced image sha256:old: conflict" in caplog.text


# --- the GPU image's lock --------------------------------------------------------------------


def pinned_requirements(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name (PEP 503) -> (version, hashes) of each `name==version` entry of a requirement file
    (continuation lines joined; comments and options skipped)."""
    text = re.sub(r"\s*\\\n\s*", " ", path.read_text())
    pins = {}
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if not words or words[0].startswith("-"):
            continue
        name, _, version = words[0].partition("==")
        assert version, f"{path.name}: '{words[0]}' is not pinned"
        hashes = [w.removeprefix("--hash=") for w in words[1:] if w.startswith("--hash=")]
        pins[re.sub(r"[-_.]+", "-", name).lower()] = (version, hashes)
    return pins


def test_gpu_lock_pins_what_the_gpu_requirements_pin_and_hashes_every_package():
    requirements = pinned_requirements(REPO / "envs/requirements-gpu.txt")
    lock = pinned_requirements(REPO / "envs/lock-gpu.txt")
    assert {"torch", "vllm", "deepspeed", "transformers", "peft"} <= requirements.keys()
    for name, (version, _) in requirements.items():
        assert lock.get(name, (None,))[0] == version, f"envs/lock-gpu.txt: {name}"
    for name, (_, hashes) in lock.items():
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), name
    assert any(name.startswith("nvidia-") for name in lock)  # the CUDA build of torch
    assert lock.keys() > requirements.keys()  # resolved: dependencies too


def test_gpu_lock_is_generated_by_its_make_target_for_linux_x86_64_python_311():
    header = (REPO / "envs/lock-gpu.txt").read_text().splitlines()[1]
    assert header == "#    make envs/lock-gpu.txt"
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("envs/lock-gpu.txt: envs/requirements-gpu.txt\n", 1)[1]
    for option in ("--python-platform x86_64-manylinux_2_28", "--python-version 3.11"):
        assert option in recipe.split("\n\n")[0]
    assert "--generate-hashes" in recipe.split("\n\n")[0]


def test_gpu_requirements_hold_every_package_of_the_cpu_set():
    """The rules run the same code in both images; only the SLURM executor (host side) is out."""
    cpu = set(pinned_requirements(REPO / "envs/requirements-cpu.txt"))
    gpu = set(pinned_requirements(REPO / "envs/requirements-gpu.txt"))
    assert cpu - gpu == {"snakemake-executor-plugin-slurm"}


def test_gpu_dockerfile_installs_the_lock_by_hash():
    dockerfile = (REPO / "containers/Dockerfile.gpu").read_text()
    assert "COPY envs/lock-gpu.txt" in dockerfile
    assert "pip install --no-cache-dir --require-hashes -r /opt/reasonrl/envs/lock-gpu.txt" in (
        dockerfile
    )
    assert "requirements-gpu.txt" not in dockerfile.split("FROM", 1)[1]


# --- Docker -------------------------------------------------------------------------------------


@pytest.mark.timeout(HEAVY_TIMEOUT)
def test_runner_runs_as_the_callers_uid_without_network(cpu_image, tmp_path):
    digest = load_lock(cpu_image).images["cpu"]["image_id"]
    tmp_path.chmod(0o777)
    script = "id -u > owner.txt; ls /sys/class/net > nets.txt; echo $REASONRL_IMAGE_DIGEST"
    argv = [sys.executable, "-m", "reasonrl.containers.runner", "--image", digest]
    argv += ["--digest", digest, "--workdir", str(tmp_path), "--user", "1234:1234"]
    result = subprocess.run(
        [*argv, "--", "/bin/sh", "-c", script], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == digest
    assert (tmp_path / "owner.txt").read_text().strip() == "1234"
    assert (tmp_path / "owner.txt").stat().st_uid == 1234  # written through the mount
    assert (tmp_path / "nets.txt").read_text().split() == ["lo"]


@pytest.mark.timeout(HEAVY_TIMEOUT)
def test_runner_returns_the_commands_exit_status(cpu_image, tmp_path):
    digest = load_lock(cpu_image).images["cpu"]["image_id"]
    argv = [sys.executable, "-m", "reasonrl.containers.runner", "--image", digest]
    result = subprocess.run([*argv, "--workdir", str(tmp_path), "--", "/bin/sh", "-c", "exit 3"])
    assert result.returncode == 3


# --- publishing to a real local registry -------------------------------------------------------


BASE_IMAGE = f"{LOCAL_BASE_REPOSITORY}:bookworm"


@pytest.mark.timeout(HEAVY_TIMEOUT)
def test_stopping_the_registry_removes_its_references_and_keeps_the_images(cpu_image, tmp_path):

    client = docker_client("test")
    base = client.images.get(BASE_IMAGE)  # small: the base the session's CPU image built on
    registry = LocalRegistry(tmp_path).start()
    repository = f"{registry.host}/reasonrl/probe"
    base.tag(repository, "1")
    client.images.push(repository, tag="1")
    digest = client.images.get_registry_data(f"{repository}:1").id
    client.images.remove(f"{repository}:1")
    client.images.pull(f"{repository}@{digest}")  # by digest: a reference that is not a tag
    assert any(r.startswith(registry.host) for r in client.images.get(base.id).attrs["RepoDigests"])
    registry.stop()
    image = client.images.get(base.id)
    assert [
        r for r in [*image.tags, *image.attrs["RepoDigests"]] if r.startswith(registry.host)
    ] == []
    assert BASE_IMAGE in image.tags


def test_docker_clients_wait_longer_than_docker_pys_default(monkeypatch):
    """An image's removal took over docker-py's 60 s beside the learning tests (CI,
    2026-11-29): every client is opened through docker_client, with its longer timeout."""
    import docker

    opened = []
    monkeypatch.setattr(docker, "from_env", lambda **kwargs: opened.append(kwargs) or FakeDaemon())
    docker_client("test")
    assert opened == [{"timeout": REQUEST_TIMEOUT_S}] and REQUEST_TIMEOUT_S > 60
    elsewhere = [
        path
        for root in (REPO / "workflow", REPO / "tests")
        for path in root.rglob("*.py")
        if "docker.from_env(" in path.read_text()
        and path.name not in ("daemon.py", Path(__file__).name)
    ]
    assert elsewhere == []


class FakeDaemon:
    def ping(self) -> bool:
        return True


def test_an_unreachable_docker_daemon_is_one_line_naming_who_needed_it(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/docker.sock")
    with pytest.raises(ReasonRLError, match=r"^containers publish: cannot reach the Docker daemon"):
        docker_client("containers publish")


def test_publish_of_a_gpu_image_not_built_here_says_how_to_build_it():
    import docker

    class NoImages:
        def get(self, ref):
            raise docker.errors.ImageNotFound(ref)

    client = type("Client", (), {"images": NoImages()})()
    with pytest.raises(ReasonRLError, match=r"no local image reasonrl-gpu:0\.1\.0.*docker build"):
        publish_image(client, "gpu", load_lock(LOCK), "127.0.0.1:5000/reasonrl")


@pytest.mark.timeout(HEAVY_TIMEOUT)
def test_publish_to_an_unreachable_registry_is_one_line_and_keeps_the_lock(cpu_image, tmp_path):
    lock = tmp_path / "images.lock.yaml"
    shutil.copy(cpu_image, lock)
    port = _free_port()  # nothing listens there
    command = [str(VENV_BIN / "reasonrl"), "containers", "publish", "--local-base"]
    command += ["--registry", f"127.0.0.1:{port}/reasonrl", "--lock", str(lock)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 2
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith(
        f"reasonrl: error: pushing 127.0.0.1:{port}/reasonrl/reasonrl-cpu:0.1.0"
    )
    assert lock.read_text() == cpu_image.read_text()


@pytest.mark.timeout(HEAVY_TIMEOUT)
def test_publish_pins_the_registrys_manifest_digest(published_cpu_image, local_registry):
    lock = load_lock(published_cpu_image)
    image = lock.stage_image("cpu")
    assert image.ref == f"{local_registry.host}/reasonrl/reasonrl-cpu:0.1.0"
    assert image.uri == f"docker://{local_registry.host}/reasonrl/reasonrl-cpu@{image.digest}"
    assert image.digest != image.image_id  # a manifest digest, not the image id
    assert lock.images["gpu"] == load_lock(LOCK).images["gpu"]  # only --image was published


@pytest.mark.timeout(HEAVY_TIMEOUT)
def test_skopeo_reads_the_same_manifest_digest_from_the_registry(pulled_cpu_image):
    reference = f"docker://{pulled_cpu_image.pinned}"
    inspect = ["skopeo", "inspect", "--tls-verify=false"]
    info = json.loads(subprocess.run([*inspect, reference], capture_output=True, check=True).stdout)
    assert info["Digest"] == pulled_cpu_image.digest
    raw = subprocess.run([*inspect, "--raw", reference], capture_output=True, check=True).stdout
    assert f"sha256:{hashlib.sha256(raw).hexdigest()}" == pulled_cpu_image.digest


@pytest.mark.timeout(HEAVY_TIMEOUT)
def test_a_rule_runs_in_the_image_pulled_by_digest(
    pulled_cpu_image, published_cpu_image, snakemake, tmp_path
):
    shutil.copytree(REPO / "config", tmp_path / "config")
    containers = json.dumps({"engine": "docker", "lock": str(published_cpu_image)})
    args = ["--cores", "1", "--configfile", "config/test.yaml", "--config"]
    snakemake(*args, f"containers={containers}", "--until", "make_task_data", cwd=tmp_path)
    manifests = sorted((tmp_path / "results/data").glob("*/manifest.json"))
    assert manifests
    for path in manifests:
        container = json.loads(path.read_text())["container"]
        assert container["runtime"] == "docker" and container["image"] == "cpu", path
        assert container["ref"] == pulled_cpu_image.pinned
        assert container["digest"] == pulled_cpu_image.digest


@pytest.mark.skipif(
    shutil.which("apptainer") is None,
    reason="Apptainer cannot be installed on this machine kind: Debian bookworm has no "
    "apptainer package and its release builds come from outside the package registries "
    "this machine reaches",
)
def test_apptainer_runs_a_stage_in_the_cpu_image(cpu_image, tmp_path):
    sif = tmp_path / "cpu.sif"
    ref = load_lock(cpu_image).images["cpu"]["ref"]
    subprocess.run(["apptainer", "build", str(sif), f"docker-daemon://{ref}"], check=True)
    out = tmp_path / "arith"
    config = json.dumps({"seed": 0, "tasks": {"arith": {"kind": "arith", "train_size": 5}}})
    stage = ["reasonrl", "make-data", "--config-json", config, "--task", "arith"]
    subprocess.run(["apptainer", "exec", str(sif), *stage, "--out-dir", str(out)], check=True)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["container"]["runtime"] == "apptainer"


def test_apptainer_definition_takes_the_published_image_as_a_build_argument():
    definition = (REPO / "containers/reasonrl.def").read_text()
    assert re.search(r"^Bootstrap: docker$", definition, flags=re.M)
    assert re.search(r"^From: \{\{ IMAGE \}\}$", definition, flags=re.M)
    assert "--build-arg IMAGE=HOST/NAME/reasonrl-cpu@sha256:" in definition


@pytest.mark.workflow
@pytest.mark.timeout(HEAVY_TIMEOUT)
def test_a_tool_loop_rule_run_by_root_runs_its_sandbox_in_the_image(
    cpu_image, test_run, snakemake, tmp_path
):
    """The Docker runner runs a rule as the invoking uid: invoked by root, the tool loop's
    evaluation of sft-tool runs in the image as uid 0, its sandbox given the capabilities
    root's namespaces need (runner.ROOT_SANDBOX_CAPABILITIES), with the native run's
    trajectories and verdicts. (An ordinary account's rules, the sandbox through a user
    namespace inside the container, run in the image in tests/test_slurm.py's cluster run.)"""
    if os.geteuid() != 0:
        pytest.skip("needs root: it runs the rule in the image as uid 0")
    workdir = tmp_path / "docker-tool-rule"
    shutil.copytree(test_run, workdir, symlinks=True)  # mtimes kept: only the forced rule runs
    target = "results/eval/sft-tool/arith/trajectories.jsonl"
    containers = json.dumps({"engine": "docker", "lock": str(cpu_image)})
    args = ["--cores", "2", "--configfile", "config/test.yaml", "--rerun-triggers", "mtime"]
    args += ["--config", f"containers={containers}", "--forcerun", "evaluate", "--", target]
    result = snakemake(*args, cwd=workdir, check=False)
    log = (workdir / "logs/eval/sft-tool/arith.log").read_text(errors="replace")
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:] + log[-4000:]
    manifest = json.loads((workdir / "results/eval/sft-tool/arith/manifest.json").read_text())
    assert manifest["container"]["runtime"] == "docker"
    assert manifest["container"]["digest"] == load_lock(cpu_image).images["cpu"]["image_id"]
    for name in ("trajectories.jsonl", "metrics.json"):
        ours = workdir / "results/eval/sft-tool/arith" / name
        assert comparable(ours) == comparable(test_run / "results/eval/sft-tool/arith" / name)
    statuses = [json.loads(line)["tool_status"] for line in (workdir / target).open()]
    assert "refused" not in {status for row in statuses for status in row}
    assert (workdir / target).stat().st_uid == 0  # written as root, through the mount
