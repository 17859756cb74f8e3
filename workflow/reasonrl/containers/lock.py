"""containers/images.lock.yaml: which image (repository@digest) each rule runs in."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import yaml

from reasonrl.errors import ReasonRLError
from reasonrl.io import load_schema, write_text

CPU_IMAGE = "cpu"


@dataclass(frozen=True)
class StageImage:
    """The image one rule runs in."""

    name: str  # key under images: ("cpu", "gpu")
    ref: str  # repository:tag (the tag is for people)
    digest: str | None  # the registry's manifest digest; None until published
    network: bool  # the rule may fetch from a hub
    image_id: str | None = None  # a local build's image id (the Docker path on that machine)

    @property
    def repository(self) -> str:
        """The ref without its tag (a colon after the last slash; a port stays)."""
        head, _, last = self.ref.rpartition("/")
        return f"{head}/{last.split(':')[0]}" if head else last.split(":")[0]

    @property
    def pinned(self) -> str:
        """repository@digest once published (the form Apptainer and docker-py pull), else the
        local ref (an image built on this machine)."""
        return f"{self.repository}@{self.digest}" if self.digest else self.ref

    @property
    def uri(self) -> str:
        """What Snakemake's container: directive (Apptainer) pulls: docker://repository@digest."""
        if not self.digest:
            raise ReasonRLError(
                f"image '{self.name}' ({self.ref}) is not published, so Apptainer cannot pull "
                "it: run `reasonrl containers publish --registry HOST[:PORT]/NAME` "
                "(containers/README.md)"
            )
        return f"docker://{self.pinned}"


@dataclass(frozen=True)
class ImageLock:
    path: Path
    images: dict[str, dict]
    stages: dict[str, dict]

    def stage(self, rule: str, gpu_images: bool) -> StageImage:
        """The image of `rule`: its locked image with GPU images on, else the CPU image."""
        if rule not in self.stages:
            raise ReasonRLError(
                f"{self.path}: rule '{rule}' has no entry under 'stages' "
                "(add `RULE: {image: cpu|gpu, network: true|false}`)"
            )
        entry = self.stages[rule]
        return self.stage_image(entry["image"] if gpu_images else CPU_IMAGE, entry["network"])

    def stage_image(self, name: str, network: bool = False) -> StageImage:
        """Image `name` of the lock as a rule would run in it."""
        image = self.images[name]
        return StageImage(name, image["ref"], image["digest"], network, image.get("image_id"))

    def with_image(self, name: str, **fields: str | None) -> ImageLock:
        """The lock with fields (ref, digest, image_id) of image `name` replaced."""
        images = {**self.images, name: {**self.images[name], **fields}}
        return ImageLock(self.path, images, self.stages)

    def write(self, path: str | os.PathLike | None = None) -> None:
        """Rewrite the lock (comments are lost: only a copy should be rewritten by hand)."""
        data = {"images": self.images, "stages": self.stages}
        write_text(path or self.path, yaml.safe_dump(data, sort_keys=False))


def rewrite_image_fields(path: Path, name: str, fields: dict[str, str]) -> None:
    """Set `images.NAME.KEY: value` for each of `fields` in the lock file in place, keeping
    its comments and layout (a key it lacks is added at the end of the image's block)."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    try:
        start = lines.index("images:\n") + 1
        start = next(i for i in range(start, len(lines)) if lines[i] == f"  {name}:\n") + 1
    except (ValueError, StopIteration):
        raise ReasonRLError(f"{path}: no block '  {name}:' under 'images:' to rewrite") from None
    end = next(
        (i for i in range(start, len(lines)) if lines[i].strip() and lines[i][:4] != "    "),
        len(lines),
    )
    missing = dict(fields)
    for i in range(start, end):
        key = lines[i].strip().split(":", 1)[0]
        if lines[i].startswith("    ") and lines[i][4] != " " and key in missing:
            lines[i] = f"    {key}: {yaml.safe_dump(missing.pop(key)).splitlines()[0]}\n"
    while end > start and not lines[end - 1].strip():
        end -= 1
    lines[end:end] = [f"    {key}: {value}\n" for key, value in missing.items()]
    write_text(path, "".join(lines))


def load_lock(path: str | os.PathLike) -> ImageLock:
    """Read and check an image lock; a bad one raises ReasonRLError naming the file and key."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ReasonRLError(f"{path}: cannot read the image lock: {err.strerror}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ReasonRLError(f"{path}{where}: malformed YAML") from None
    validator = jsonschema.Draft202012Validator(load_schema("images_lock"))
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        key = ".".join(str(p) for p in errors[0].absolute_path) or "<root>"
        raise ReasonRLError(f"{path}: key '{key}': {errors[0].message}")
    for rule, entry in data["stages"].items():
        if entry["image"] not in data["images"]:
            raise ReasonRLError(
                f"{path}: key 'stages.{rule}.image': '{entry['image']}' is not under 'images'"
            )
    if CPU_IMAGE not in data["images"]:
        raise ReasonRLError(f"{path}: key 'images': needs a '{CPU_IMAGE}' image")
    return ImageLock(path, data["images"], data["stages"])
