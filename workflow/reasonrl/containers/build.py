"""`reasonrl containers build`: build the rules' images with docker-py.

The build needs no network inside Docker: the Python packages of the lock (envs/) are
collected first into a wheel folder of the build context by the host's pip, and the image
installs them with `--no-index`. Where no registry is reachable, `--local-base` makes the
base image here instead of pulling the pinned one: a Debian root filesystem by debootstrap
(from the host's own apt mirror), imported with the Docker API (`docker import`).

An image is rebuilt only when its inputs change: their hash is a label of the image. A
rebuild removes the image it takes the tag from, so rebuilding does not fill the disk.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from reasonrl.containers.daemon import docker_client
from reasonrl.containers.lock import ImageLock, load_lock
from reasonrl.errors import ReasonRLError

log = logging.getLogger("reasonrl.containers")

REPO_ROOT = Path(__file__).resolve().parents[3]
# Files every image's context holds besides its Dockerfile and the wheels.
CONTEXT_FILES = (
    "envs/constraints.txt",
    "envs/lock-cpu.txt",
    "envs/requirements-nodeps.txt",
    "envs/requirements-gpu.txt",
    "envs/lock-gpu.txt",
    "pyproject.toml",
    "README.md",
)
# The package, schemas included (installed editable, as in the venv).
PACKAGE_DIRS = ("workflow/reasonrl",)
# The wheels each image installs: requirement files and the pip options they go with.
WHEEL_SETS = {
    "cpu": [
        ["-c", "envs/constraints.txt", "-r", "envs/lock-cpu.txt"],
        ["-r", "envs/requirements-nodeps.txt"],
    ],
}
INPUTS_LABEL = "org.reasonrl.inputs"
BASE_LABEL = "org.reasonrl.base"
LOCAL_BASE_REPOSITORY = "reasonrl-base"
# What the image needs from Debian: Python with venv, the sandbox, certificates.
BASE_PACKAGES = ("python3", "python3-venv", "bubblewrap", "ca-certificates")


def debian_mirror(suite: str, sources: Path = Path("/etc/apt")) -> str:
    """The host's apt mirror for `suite` (deb822 .sources files or one-line .list files)."""
    candidates = sorted(sources.glob("sources.list.d/*.sources"))
    for path in candidates:
        for stanza in path.read_text().split("\n\n"):
            fields = dict(
                line.split(":", 1) for line in stanza.splitlines() if ":" in line and line[0] != "#"
            )
            suites = fields.get("Suites", "").split()
            if suite in suites and "main" in fields.get("Components", "").split():
                return fields["URIs"].split()[0]
    for path in [sources / "sources.list", *sorted(sources.glob("sources.list.d/*.list"))]:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            words = line.split()
            if len(words) >= 4 and words[0] == "deb" and words[2] == suite and "main" in words:
                return words[1]
    raise ReasonRLError(f"no apt source for Debian '{suite}' under {sources}: pass --mirror")


def inputs_hash(paths: list[Path]) -> str:
    """sha256 over the names and contents of every file under `paths`."""
    digest = hashlib.sha256()
    for root in paths:
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for file in files:
            if "__pycache__" in file.parts:
                continue
            digest.update(str(file.relative_to(REPO_ROOT)).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


def collect_wheels(image: str, wheel_dir: Path) -> None:
    """Every pinned package of `image` as a wheel in `wheel_dir`; redone only when the
    requirement files change (rewritten wheels would defeat Docker's layer cache)."""
    requirement_files = [REPO_ROOT / o for opts in WHEEL_SETS[image] for o in opts if "/" in o]
    stamp = wheel_dir / ".requirements.sha256"
    fingerprint = inputs_hash(requirement_files)
    if stamp.exists() and stamp.read_text() == fingerprint:
        return
    wheel_dir.mkdir(parents=True, exist_ok=True)
    for options in WHEEL_SETS[image]:
        command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheel_dir)]
        result = subprocess.run([*command, *options], cwd=REPO_ROOT, capture_output=True, text=True)
        if result.returncode != 0:
            raise ReasonRLError(f"pip wheel {' '.join(options)} failed:\n{result.stderr[-2000:]}")
    stamp.write_text(fingerprint)


def make_context(image: str, dockerfile: Path, context: Path, wheel_cache: Path) -> None:
    """The build context: Dockerfile, env files, the package source and the wheel folder."""
    shutil.copy2(dockerfile, context / dockerfile.name)
    for name in CONTEXT_FILES:
        if (REPO_ROOT / name).exists():
            (context / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, context / name)
    for folder in PACKAGE_DIRS:
        shutil.copytree(
            REPO_ROOT / folder, context / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    collect_wheels(image, wheel_cache)
    shutil.copytree(
        wheel_cache,
        context / "wheels",
        copy_function=_link_or_copy,
        ignore=shutil.ignore_patterns(".*"),
    )


def _link_or_copy(source: str, target: str) -> None:
    try:
        Path(target).hardlink_to(source)
    except OSError:
        shutil.copy2(source, target)


def local_base(client, suite: str, mirror: str | None, cache_dir: Path) -> str:
    """A Debian `suite` base image made here (debootstrap + import); returns its tag.

    Made once per machine: the tag is reused while it exists in the Docker daemon.
    """
    import docker

    tag = f"{LOCAL_BASE_REPOSITORY}:{suite}"
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    if shutil.which("debootstrap") is None:
        raise ReasonRLError("debootstrap not found: install it (apt-get install debootstrap)")
    mirror = mirror or debian_mirror(suite)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as work:
        rootfs = Path(work) / "rootfs"
        log.info("debootstrap %s from %s (a few minutes)", suite, mirror)
        command = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(BASE_PACKAGES)}",
            suite,
            str(rootfs),
            mirror,
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise ReasonRLError(f"debootstrap failed:\n{result.stdout[-2000:]}{result.stderr}")
        shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
        archive = Path(work) / "rootfs.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(rootfs, arcname=".")
        client.api.import_image_from_file(
            str(archive), repository=LOCAL_BASE_REPOSITORY, tag=suite, changes=["CMD bash"]
        )
    return tag


def build_image(
    name: str,
    lock: ImageLock,
    use_local_base: bool = False,
    mirror: str | None = None,
    cache_dir: Path | None = None,
) -> str:
    """Build image `name` of the lock (tagged with its ref); returns the image id (sha256:...)."""
    import docker

    if name not in lock.images:
        raise ReasonRLError(f"{lock.path}: no image '{name}' under 'images'")
    if name not in WHEEL_SETS:
        raise ReasonRLError(
            f"image '{name}' is built on a CUDA build host (see containers/README.md), not here"
        )
    entry = lock.images[name]
    dockerfile = REPO_ROOT / entry["dockerfile"]
    cache_dir = cache_dir or Path.home() / ".cache/reasonrl/containers"
    client = docker_client(f"building image '{name}'")
    buildargs = {"SOURCE_COMMIT": _source_commit()}
    if use_local_base:
        base = local_base(client, "bookworm", mirror, cache_dir)
        buildargs["BASE_IMAGE"] = base
        base_id = client.images.get(base).id
    else:
        base_id = "pinned"
    inputs = [dockerfile, *(REPO_ROOT / f for f in (*CONTEXT_FILES, *PACKAGE_DIRS))]
    fingerprint = inputs_hash([p for p in inputs if p.exists()]) + ":" + base_id
    try:
        existing = client.images.get(entry["ref"])
    except docker.errors.ImageNotFound:
        existing = None
    if existing is not None and existing.labels.get(INPUTS_LABEL) == fingerprint:
        log.info("%s is up to date (%s)", entry["ref"], existing.id)
        return existing.id
    with tempfile.TemporaryDirectory(dir=_mkdir(cache_dir)) as work:
        context = Path(work)
        make_context(name, dockerfile, context, cache_dir / f"wheels-{name}")
        log.info("building %s from %s", entry["ref"], entry["dockerfile"])
        try:
            image, _ = client.images.build(
                path=str(context),
                dockerfile=dockerfile.name,
                tag=entry["ref"],
                buildargs=buildargs,
                labels={INPUTS_LABEL: fingerprint, BASE_LABEL: base_id},
                network_mode="none",
                pull=False,
                rm=True,
                forcerm=True,
            )
        except docker.errors.BuildError as err:
            tail = "".join(str(line.get("stream", line.get("error", ""))) for line in err.build_log)
            raise ReasonRLError(
                f"building {entry['ref']} failed: {err.msg}\n{tail[-3000:]}"
            ) from None
    if existing is not None:
        remove_replaced_image(client, existing.id, image.id)
    return image.id


def remove_replaced_image(client, old_id: str, new_id: str) -> None:
    """Remove the image a rebuild took the tag from; keep it (with a warning) while in use.

    Docker leaves the old image behind untagged: a few GB per rebuild otherwise.
    """
    import docker

    if old_id == new_id:
        return
    try:
        client.images.remove(old_id)
    except docker.errors.APIError as err:
        log.warning("kept the replaced image %s: %s", old_id, err.explanation or err)
        return
    log.info("removed the replaced image %s", old_id)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _source_commit() -> str:
    result = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return result.stdout.strip() or "unknown"


def build_command(args) -> None:
    """CLI: build the images named by --image; --write-lock writes a lock with their ids."""
    lock = load_lock(args.lock)
    for name in args.image:
        image_id = build_image(name, lock, args.local_base, args.mirror)
        lock = lock.with_image(name, image_id=image_id)
        print(f"{name}: {lock.images[name]['ref']} {image_id}")
    if args.write_lock:
        lock.write(args.write_lock)


def add_parser(sub):
    """`reasonrl containers build ...` (sub: the CLI's sub-parsers); returns the parsers of
    `containers`' own sub-commands."""
    containers = sub.add_parser("containers", help="build the rules' container images")
    commands = containers.add_subparsers(dest="containers_command", required=True)
    build = commands.add_parser("build", help="build images with the Docker API")
    build.add_argument("--image", action="append", default=None, help="image of the lock (cpu)")
    build.add_argument("--lock", default=str(REPO_ROOT / "containers/images.lock.yaml"))
    build.add_argument(
        "--write-lock",
        help="write the lock with the built image ids (image_id: the Docker path on this "
        "machine) to this file",
    )
    build.add_argument(
        "--local-base",
        action="store_true",
        help="make the Debian base here (debootstrap + docker import) instead of pulling it",
    )
    build.add_argument("--mirror", help="Debian mirror for --local-base (default: the host's)")
    build.set_defaults(func=lambda args, config: build_command(_default_images(args)))
    return commands


def _default_images(args):
    args.image = args.image or ["cpu"]
    return args
