"""`reasonrl containers publish`: push the rules' images to a registry and pin them by digest.

Each image is built (or taken, when its inputs are unchanged), tagged
`REGISTRY/reasonrl-NAME:TAG` (TAG: the tag of its ref in the lock), pushed with docker-py,
and the registry's manifest digest (asked of the registry itself) goes into the lock. The
rules then name it `docker://REGISTRY/reasonrl-NAME@sha256:...`, which Apptainer pulls on a
cluster and docker-py pulls on the Docker path.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from reasonrl.containers.build import REPO_ROOT, WHEEL_SETS, build_image
from reasonrl.containers.daemon import docker_client
from reasonrl.containers.lock import ImageLock, StageImage, load_lock, rewrite_image_fields
from reasonrl.errors import ReasonRLError

log = logging.getLogger("reasonrl.containers")

# HOST[:PORT]/NAME[/NAME...]: a registry host (a dot, a port or localhost) and a namespace.
HOST_LABEL = r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?"
REGISTRY_PATTERN = re.compile(
    rf"^(?:{HOST_LABEL}(?:\.{HOST_LABEL})+|localhost)(?::\d+)?(?:/[a-z0-9][a-z0-9._-]*)+$"
)


def check_registry(registry: str) -> str:
    """The registry prefix without a trailing slash, or a one-line error."""
    registry = registry.rstrip("/")
    if not REGISTRY_PATTERN.match(registry):
        raise ReasonRLError(
            f"--registry '{registry}': expected HOST[:PORT]/NAME in lower case "
            "(e.g. ghcr.io/my-org or 127.0.0.1:5000/reasonrl)"
        )
    return registry


def published_ref(registry: str, image: StageImage) -> tuple[str, str]:
    """(repository, tag) the image `image` is pushed as under `registry`."""
    tag = image.ref.rpartition(":")[2] if ":" in image.ref.rpartition("/")[2] else "latest"
    return f"{registry}/reasonrl-{image.name}", tag


def local_image_id(client, name: str, lock: ImageLock, **build_options) -> str:
    """Image `name`, built here (CPU) or, for images built elsewhere (GPU), taken by its ref."""
    import docker

    if name in WHEEL_SETS:
        return build_image(name, lock, **build_options)
    ref = lock.images[name]["ref"]
    try:
        return client.images.get(ref).id
    except docker.errors.ImageNotFound:
        raise ReasonRLError(
            f"image '{name}': no local image {ref}; build it on a CUDA build host first "
            f"(docker build -f {lock.images[name]['dockerfile']} -t {ref} .)"
        ) from None


def push(client, repository: str, tag: str) -> str:
    """Push repository:tag; returns the manifest digest the registry reports for it."""
    import docker

    pushed = None
    try:
        for event in client.api.push(repository, tag=tag, stream=True, decode=True):
            if "error" in event:
                raise ReasonRLError(f"pushing {repository}:{tag} failed: {event['error']}")
            pushed = event.get("aux", {}).get("Digest", pushed)
        descriptor = client.api.inspect_distribution(f"{repository}:{tag}")["Descriptor"]
    except docker.errors.APIError as err:
        raise ReasonRLError(f"pushing {repository}:{tag} failed: {err.explanation}") from None
    registry = descriptor["digest"]
    if pushed != registry:
        raise ReasonRLError(
            f"{repository}:{tag}: the push reported {pushed}, the registry holds {registry}"
        )
    return registry


def publish_image(client, name: str, lock: ImageLock, registry: str, **build_options) -> dict:
    """Build or take image `name`, push it; returns its new lock fields (ref, digest)."""
    if name not in lock.images:
        raise ReasonRLError(f"{lock.path}: no image '{name}' under 'images'")
    repository, tag = published_ref(registry, lock.stage_image(name))
    image_id = local_image_id(client, name, lock, **build_options)
    client.images.get(image_id).tag(repository, tag)
    log.info("pushing %s:%s (%s)", repository, tag, image_id)
    digest = push(client, repository, tag)
    return {"ref": f"{repository}:{tag}", "digest": digest}


def publish_command(args) -> None:
    """CLI: publish the images named by --image and write their digests into --lock."""
    registry = check_registry(args.registry)
    lock = load_lock(args.lock)
    client = docker_client("containers publish")
    for name in args.image or ["cpu"]:
        fields = publish_image(
            client, name, lock, registry, use_local_base=args.local_base, mirror=args.mirror
        )
        rewrite_image_fields(Path(args.lock), name, fields)
        lock = load_lock(args.lock)
        print(f"{name}: docker://{lock.stage_image(name).pinned}")


def add_parser(commands) -> None:
    """`reasonrl containers publish ...` (commands: the sub-parsers of `containers`)."""
    publish = commands.add_parser(
        "publish", help="push images to a registry and pin their manifest digests in the lock"
    )
    publish.add_argument(
        "--registry", required=True, help="HOST[:PORT]/NAME: images go to NAME/reasonrl-IMAGE"
    )
    publish.add_argument("--image", action="append", help="image of the lock (default: cpu)")
    publish.add_argument(
        "--lock",
        default=str(REPO_ROOT / "containers/images.lock.yaml"),
        help="the lock whose ref and digest of each image are rewritten in place",
    )
    publish.add_argument(
        "--local-base",
        action="store_true",
        help="build the CPU image on a Debian base made here (see `containers build`)",
    )
    publish.add_argument("--mirror", help="Debian mirror for --local-base (default: the host's)")
    publish.set_defaults(func=lambda args, config: publish_command(args))
