"""containers/images.lock.yaml: which image (ref@digest) each rule runs in."""

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
    ref: str  # registry/name:tag
    digest: str | None  # sha256:..., None while the image was never built
    network: bool  # the rule may fetch from a hub

    @property
    def pinned(self) -> str:
        """ref@digest (the tag kept for people, the digest decides), or the bare ref if unbuilt."""
        return f"{self.ref}@{self.digest}" if self.digest else self.ref

    @property
    def uri(self) -> str:
        """What Snakemake's container: directive (Apptainer) pulls."""
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
        name = entry["image"] if gpu_images else CPU_IMAGE
        image = self.images[name]
        return StageImage(name, image["ref"], image["digest"], entry["network"])

    def with_digest(self, name: str, digest: str) -> ImageLock:
        images = {**self.images, name: {**self.images[name], "digest": digest}}
        return ImageLock(self.path, images, self.stages)

    def write(self, path: str | os.PathLike | None = None) -> None:
        """Rewrite the lock (comments are lost: only a copy should be rewritten by hand)."""
        data = {"images": self.images, "stages": self.stages}
        write_text(path or self.path, yaml.safe_dump(data, sort_keys=False))


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
