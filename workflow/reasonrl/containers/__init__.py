"""Pinned images per rule: the image lock, the Docker runner and the image build."""

from reasonrl.containers.lock import ImageLock, StageImage, load_lock

__all__ = ["ImageLock", "StageImage", "load_lock"]
