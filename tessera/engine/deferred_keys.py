"""A file version's first load: its layers packed at once, their pack-cache keys found behind the load.

The packed-weight cache keys a layer by a SHA-256 of its bytes (engine.pack_cache.layer_digest), remembered per file
version (engine.source_digest). A version seen for the first time had to be hashed before anything was packed: for
the 8-layer BF16 file 8.0 of a 14.9 s make_backend (hashing reads 9.7 GB at ~1.2 GB/s a core here), where packing
takes 2.2 s (docs/BENCHMARKS.md, session 23). The hash only names what the load stores; the load does not need it.

So when a session's load (make_backend's `store_in_background`) meets a file version with no recorded digest for any
of its layers, every layer is packed straight away and one job on the pack-store thread (engine.pack_store) hashes
them afterwards, records the digests, makes room in the cache and writes the packs under their keys, waiting while
a request generates like every write there. The cost: packs of the same content already cached under another file
version (a file copied or moved) are made again instead of read (2.2 s against the 8 s the hash takes; `store`
then finds them present and skips the write). Layers that are not views of the file's map (an HF checkpoint's
stacked copies), a version whose record has some of them, and a file changed just before it was opened (whose
digests are not recorded) keep the order hash-then-look-up: those are the loads whose packs the cache may hold.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tessera.engine.expert_pages import release_experts
from tessera.engine.experts import LayerExperts
from tessera.engine.pack_cache import PackCache, layer_digest, layer_key
from tessera.engine.pack_store import PackStores
from tessera.engine.source_digest import DigestRecord, SourceFile


def new_file_version(layers: Sequence[LayerExperts], digests: DigestRecord) -> bool:
    """True when every layer is a view of the file's map, none has a recorded digest, and the digests will be
    recorded once computed: a file version seen for the first time. (A file changed just before it was opened is
    not recorded, source_digest.DigestRecord.recordable: each of its loads hashes first and finds its packs.)"""
    return (bool(layers) and digests.recordable()
            and all(digests.can_record(e) and digests.known(e) is None for e in layers))


def source_nbytes(experts: LayerExperts) -> int:
    return sum(t.nbytes for t in (experts.gate_proj, experts.up_proj, experts.down_proj))


class KeyThenStore:
    """The job: for each (layer experts, pack) in load order, hash the experts (gated), then record the digests, make
    room in the cache for the keys, store the packs and record the model's keys. A job given up (Skipped) stops
    where it is: digests not saved, packs not written; the next load hashes (or packs) again."""

    def __init__(self, cache: PackCache, digests: DigestRecord, identity: dict, sources: Sequence[SourceFile],
                 layers: list[tuple[LayerExperts, np.ndarray, bool]], model_id: str, backend: str, workers: int):
        self.cache, self.digests, self.identity, self.sources = cache, digests, identity, tuple(sources)
        self.layers = layers  # (experts, packed blob, whether the blob may be stored under the key)
        self.model_id, self.backend, self.workers = model_id, backend, workers

    def hash_bytes(self) -> int:
        """The bytes it hashes (first)."""
        return sum(source_nbytes(e) for e, _, _ in self.layers)

    def nbytes(self) -> int:
        """The work it stands for: the bytes it hashes and the bytes it writes."""
        return self.hash_bytes() + sum(blob.nbytes for _, blob, _ in self.layers)

    def __call__(self, stores: PackStores) -> None:
        keys = []
        for experts, _, _ in self.layers:
            stores.gate()  # no layer is begun (nor its hashing threads) while a request generates
            digest = self.digests.digest(experts, lambda e=experts: layer_digest(e, self.workers, stores.gate),
                                         stores.gate)  # another load hashing it: waited for
            release_experts(experts, self.sources)  # read through the map once more: its pages go back
            keys.append(layer_key(self.identity, experts, digest))
            stores.advance(source_nbytes(experts))
        self.digests.save()
        self.cache.make_room(keys, [blob.nbytes for _, blob, _ in self.layers], self.model_id, self.backend)
        for key, (_, blob, storable) in zip(keys, self.layers):
            if storable and not self.cache.layer_path(key).is_file():
                stores.write(key, blob)
            else:
                stores.advance(blob.nbytes)
        self.cache.record(self.model_id, self.backend, keys)
