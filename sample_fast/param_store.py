"""ParamStore: the learner's published policy weights (parameters AND buffers) and their version, in shared memory.

The learner ``publish``es after each update; the sampler calls ``load_if_newer`` between rollouts and never blocks.
Observation-normalisation statistics are module buffers, so they travel with the weights and carry the same version.
A seqlock (an int64 sequence number, odd while a write is in progress) guarantees a reader never loads a torn copy:
it copies into a private staging area, re-reads the sequence number, and only then loads the module.
"""

from __future__ import annotations

import torch

NOT_PUBLISHED = -1


class ParamStore:
    """Shared-memory copy of ``module.state_dict()`` plus an int64 version.

    Args:
        module: the module whose state_dict shapes the store (only shapes and dtypes are read here).

    One writer (the learner process) and any number of readers. Tensors live on the CPU in shared memory; a CUDA
    module is copied through the host.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        state = module.state_dict()
        if not state:
            raise ValueError("ParamStore needs a module with parameters or buffers; got an empty state_dict")
        self.keys = list(state)
        self.tensors = {k: torch.zeros_like(v, device="cpu").share_memory_() for k, v in state.items()}
        # meta[0]: seqlock sequence (odd while publishing); meta[1]: version of the weights in ``tensors``.
        self.meta = torch.tensor([0, NOT_PUBLISHED], dtype=torch.int64).share_memory_()
        self._staging: dict[str, torch.Tensor] | None = None  # reader-side, created lazily in the reader's process

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_staging"] = None
        return state

    @property
    def version(self) -> int:
        """Version of the last completed publish (NOT_PUBLISHED = -1 before the first)."""
        return int(self.meta[1])

    def publish(self, module: torch.nn.Module, version: int | None = None) -> int:
        """Copy ``module``'s state_dict in and set the version (default: previous + 1). Returns the version.

        Pass ``version=learner.policy_version`` so the store's versions and the learner's count agree.
        """
        state = module.state_dict()
        if list(state) != self.keys:
            raise ValueError(
                f"module state_dict keys differ from the ParamStore's: {sorted(set(state) ^ set(self.keys))}; "
                "publish the same architecture the store was built from"
            )
        new_version = self.version + 1 if version is None else int(version)
        # INVARIANT: single writer. seq odd => readers skip; the version changes inside the odd window.
        self.meta[0] += 1
        for key, value in state.items():
            self.tensors[key].copy_(value.detach())  # SYNC: device->host for a CUDA module
        self.meta[1] = new_version
        self.meta[0] += 1
        return new_version

    def load_if_newer(self, module: torch.nn.Module, current_version: int, max_tries: int = 3) -> int:
        """Load the published weights into ``module`` if their version is newer than ``current_version``.

        Never blocks: if a publish is in progress (or keeps overlapping the copy ``max_tries`` times), the module is
        left untouched and ``current_version`` returned. Returns the version now in ``module``.
        """
        for _ in range(max_tries):
            seq_before = int(self.meta[0])
            if seq_before % 2 == 1:
                return current_version  # writer mid-publish: take the new weights next time
            version = int(self.meta[1])
            if version <= current_version or version == NOT_PUBLISHED:
                return current_version
            staging = self._staging_tensors()
            for key, value in self.tensors.items():
                staging[key].copy_(value)
            if int(self.meta[0]) != seq_before:
                continue  # torn: a publish overlapped the copy
            module.load_state_dict(staging, strict=True)
            return version
        return current_version

    def _staging_tensors(self) -> dict[str, torch.Tensor]:
        if self._staging is None:
            self._staging = {k: torch.empty_like(v) for k, v in self.tensors.items()}
        return self._staging
