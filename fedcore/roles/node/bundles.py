"""A run's app bundle on the node: downloaded once, checked, unpacked into the cache.

The cache holds one directory per bundle hash (:func:`~fedcore.apps.bundle.unpack_bundle`
names it so and renames it into place only when complete), so runs of the same code
share one copy and a bundle already unpacked is not downloaded again. A download is
refused before it is buffered when the link announces a different digest than the
run's or a size past :data:`MAX_DOWNLOAD`; the bytes are hashed again on unpacking,
so a bundle altered on its way is refused whatever the transport checked.
"""

from __future__ import annotations

from pathlib import Path

import anyio.to_thread

from fedcore.apps.bundle import MAX_BUNDLE_BYTES, bundle_dir, unpack_bundle
from fedcore.apps.project import read_project
from fedcore.domain.fleet import Digest
from fedcore.errors import BundleError
from fedcore.transport.fleet import FleetService

MAX_DOWNLOAD = 2 * MAX_BUNDLE_BYTES
"""The largest bundle a node downloads. Packing caps the files' total size at
``MAX_BUNDLE_BYTES``; the zip's headers add to that, so twice as much leaves room
for any bundle fedcore packs while keeping a misbehaving link from filling memory."""


async def fetch_bundle(
    fleet: FleetService, node_id: int, run_id: int, digest: Digest, cache_dir: Path
) -> Path:
    """The app directory of ``run_id``'s bundle (of ``digest``), downloaded if not cached.

    Raises :class:`BundleError` for a bundle refused, and whatever the fleet raises.
    """
    sha256 = digest.sha256.hex()
    unpacked = bundle_dir(sha256, cache_dir)
    if await anyio.to_thread.run_sync(unpacked.is_dir):
        return unpacked
    if digest.size > MAX_DOWNLOAD:
        raise BundleError(f"the bundle is {digest.size} bytes, over the cap of {MAX_DOWNLOAD}")
    async with fleet.get_bundle(node_id, run_id) as transfer:
        if transfer.digest != digest:
            raise BundleError(
                f"bundle hash mismatch: the run's bundle is {sha256}, "
                f"the link sent {transfer.digest.sha256.hex()}"
            )
        chunks = [chunk async for chunk in transfer.chunks]
    data = b"".join(chunks)
    del chunks
    return await anyio.to_thread.run_sync(unpack_bundle, data, sha256, cache_dir)


def client_reference(app_dir: Path) -> str:
    """The ``module:attr`` of the ClientApp that the app directory's pyproject names
    (fedcore's table or a Flower app's).

    Blocks on file I/O; raises :class:`~fedcore.errors.AppLoadError`.
    """
    return read_project(app_dir).client
