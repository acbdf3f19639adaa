"""Real NBD clients against a volume: nbdcopy, qemu-img/qemu-io, fio."""

from __future__ import annotations

import json
import os

import pytest

from conftest import run
from helpers import MiB, KiB, pattern, sha256_file


def _random_file(path, size: int) -> str:
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 8 * MiB)
            f.write(os.urandom(n))
            left -= n
    return sha256_file(path)


def test_nbdcopy_256mib_round_trip(make_volume, tmp_path):
    size = 256 * MiB
    vol = make_volume("vol0", "256M")
    src, back = tmp_path / "src.bin", tmp_path / "back.bin"
    want = _random_file(src, size)
    # nbdcopy uses several connections (multi-conn) and many requests in flight.
    run(["nbdcopy", "--flush", src, vol.uri], timeout=300)
    run(["nbdcopy", vol.uri, back], timeout=300)
    assert back.stat().st_size == size
    assert sha256_file(back) == want, "data read back differs from data written"
    src.unlink()
    # nbdcopy --flush ended with a FLUSH: everything must survive kill -9
    # (and be read from disk, not from caches).
    vol.daemon.kill9()
    vol.daemon.start()
    back.unlink()
    run(["nbdcopy", vol.uri, back], timeout=300)
    assert sha256_file(back) == want, "data acknowledged by nbdcopy's FLUSH differs after kill -9"


def test_qemu_img_convert_qcow2_onto_volume_and_back(make_volume, tmp_path):
    img, back = tmp_path / "img.qcow2", tmp_path / "back.qcow2"
    run(["qemu-img", "create", "-q", "-f", "qcow2", img, "64M"])
    run(["qemu-io", "-f", "qcow2",
         "-c", "write -P 0xab 0 1M",
         "-c", "write -P 0x5c 10M 3M",
         "-c", "write -P 0x01 33M 4k",
         "-c", "write -P 0xee 63M 1M",
         "-c", "write -z 11M 512k",
         img])
    vol = make_volume("vm", "64M")
    run(["qemu-img", "convert", "-p", "-n", "-f", "qcow2", "-O", "raw", img, vol.uri], timeout=300)
    cmp = run(["qemu-img", "compare", "-f", "qcow2", "-F", "raw", img, vol.uri], check=False)
    assert cmp.returncode == 0, f"volume differs from the qcow2 image: {cmp.stdout}{cmp.stderr}"
    run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", vol.uri, back], timeout=300)
    cmp = run(["qemu-img", "compare", img, back], check=False)
    assert cmp.returncode == 0, f"image read back differs: {cmp.stdout}{cmp.stderr}"
    # The unwritten parts of the volume are holes, so the copy back stays sparse.
    info = json.loads(run(["qemu-img", "map", "--output=json", "-f", "raw", vol.uri]).stdout)
    data = sum(e["length"] for e in info if e["data"])
    assert data <= 16 * MiB, f"{data} bytes reported as data for ~5 MiB written: {info}"


def test_fio_verify_8_connections(make_volume, tmp_path):
    jobs, per_job = 8, 32 * MiB
    vol = make_volume("fio", "256M")
    out = tmp_path / "fio.json"
    run(["fio", "--name=verify", "--ioengine=nbd", f"--uri={vol.uri}",
         "--rw=randwrite", "--bs=4k", "--iodepth=16",
         f"--numjobs={jobs}", f"--size={per_job}", f"--offset_increment={per_job}",
         "--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--verify_state_save=0",
         "--group_reporting=0", "--output-format=json", f"--output={out}"],
        timeout=600, cwd=tmp_path)
    res = json.loads(out.read_text())
    assert len(res["jobs"]) == jobs
    for j in res["jobs"]:
        assert j["error"] == 0, f"fio job error {j['error']}"
        assert j["write"]["io_bytes"] == per_job
        assert j["read"]["io_bytes"] == per_job, "verify phase did not read everything back"
    # Mixed sizes including ones that straddle 16K blocks, verified too.
    run(["fio", "--name=mixed", "--ioengine=nbd", f"--uri={vol.uri}",
         "--rw=randwrite", "--bsrange=512-128k", "--bs_unaligned=1", "--iodepth=8", "--numjobs=4",
         "--size=16M", "--offset_increment=64M", "--verify=crc32c", "--verify_fatal=1",
         "--verify_state_save=0", "--output-format=json", f"--output={tmp_path / 'mixed.json'}"],
        timeout=600, cwd=tmp_path)
    for j in json.loads((tmp_path / "mixed.json").read_text())["jobs"]:
        assert j["error"] == 0


@pytest.mark.parametrize("stop", ["sigterm", "sigkill_after_flush"])
def test_persistence_across_restart(make_volume, stop):
    vol = make_volume("vol0", "512M", compression="lz4")
    d = vol.daemon
    blocks = {off: pattern(off, 100 * KiB) for off in range(0, 512 * MiB, 37 * MiB)}
    with vol.connected() as h:
        for off, data in blocks.items():
            h.pwrite(data, off)
        h.trim(1 * MiB, 37 * MiB + 16 * KiB)  # keeps the first 16K of the block at 37M
        if stop == "sigkill_after_flush":
            h.flush()
    blocks[37 * MiB] = blocks[37 * MiB][:16 * KiB] + bytes(100 * KiB - 16 * KiB)
    if stop == "sigterm":
        rc = d.stop()
        assert rc == 0, f"daemon exited with {rc} on SIGTERM"
    else:
        d.kill9()
    d.start()
    with vol.connected() as h:
        for off, data in blocks.items():
            assert h.pread(len(data), off) == data, f"data at {off} lost after {stop}"
    # Properties and the pool survive as well.
    assert vol.prop("compression") == "lz4"
    assert int(vol.prop("volsize")) == 512 * MiB
