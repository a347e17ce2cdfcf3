"""shm: /dev/shm is at least the row's size, and a DataLoader with 4 workers moves batches that need more than
Docker's 64 MB default."""
import pytest

from torchimages.model import parse_size
from torchimages.reporting import human_size

pytestmark = pytest.mark.check("shm")

FIX = "run containers of this image with --shm-size={size} (or --ipc=host); Docker's default is 64 MB"


def test_dev_shm_is_at_least_the_rows_size(main, spec, expect):
    found = main["shm"]["size_bytes"]
    needed = parse_size(spec.shm_size)
    assert found is not None, ("the container has no /dev/shm: DataLoader workers cannot pass batches; "
                               + FIX.format(size=spec.shm_size))
    assert found >= needed, (
        f"/dev/shm is {human_size(found)}, but row {spec.tag} needs {spec.shm_size} (this check ran with "
        f"--shm-size {expect['shm_size']}): " + FIX.format(size=spec.shm_size))


def test_dataloader_workers_move_large_batches(main, torch_facts, spec):
    result = main["shm"]["dataloader"]
    size = main["shm"]["size_bytes"]
    assert result.get("ok"), (
        f"a DataLoader with {result.get('workers')} workers failed to move {result.get('items')} batches of "
        f"{human_size(result.get('item_bytes') or 0)} with /dev/shm at {human_size(size or 0)}: "
        f"{result.get('error')}. Workers hand batches over through /dev/shm: " + FIX.format(size=spec.shm_size))
