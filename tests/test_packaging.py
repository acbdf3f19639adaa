"""The Debian package (`cargo deb`): what it installs, installed with dpkg -i
into a scratch root (no change to the machine), and that the binary runs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, cistern_bin, run

pytestmark = pytest.mark.skipif(
    shutil.which("dpkg") is None or shutil.which("cargo") is None, reason="needs dpkg and cargo"
)


def _cargo_deb() -> bool:
    return subprocess.run(["cargo", "deb", "--version"], capture_output=True).returncode == 0


def test_deb_installs_binary_unit_and_config(tmp_path):
    if not _cargo_deb():
        pytest.skip("cargo-deb is not installed (scripts/test.sh installs it)")
    built = Path(cistern_bin())
    release = REPO / "target" / "release" / "cistern"
    if built.resolve() != release.resolve():
        pytest.skip(f"cargo deb packages {release}, the suite runs {built}")
    out = tmp_path / "out"
    # --no-build: the release binary scripts/test.sh built is what gets
    # packaged (stripped); --fast: light compression, the deb is not shipped.
    run(["cargo", "deb", "-p", "cistern", "--no-build", "--fast", "-o", out], cwd=REPO, timeout=300)
    (deb,) = out.glob("cistern_*.deb")
    info = run(["dpkg-deb", "--info", deb]).stdout
    assert "Package: cistern" in info and "Depends:" in info, info
    listing = run(["dpkg-deb", "--contents", deb]).stdout
    for f in ("./usr/bin/cistern", "./lib/systemd/system/cistern.service", "./etc/cistern/cistern.toml"):
        assert f in listing, (f, listing)
    run(["dpkg-deb", "-e", deb, tmp_path / "control"])
    assert (tmp_path / "control" / "conffiles").read_text().split() == ["/etc/cistern/cistern.toml"]
    # dpkg -i into an empty root with its own database.
    root = tmp_path / "root"
    admin = root / "var" / "lib" / "dpkg"
    for d in (admin / "info", admin / "updates", admin / "triggers"):
        d.mkdir(parents=True)
    (admin / "status").write_text("")
    run(["dpkg", f"--root={root}", "--force-depends", "--force-not-root", "--force-script-chrootless",
         "--no-triggers", "-i", deb], timeout=120)
    status = run(["dpkg", f"--root={root}", "-s", "cistern"]).stdout
    assert "Status: install ok installed" in status, status
    assert "/etc/cistern/cistern.toml" in run(["dpkg", f"--root={root}", "-L", "cistern"]).stdout
    unit = (root / "lib/systemd/system/cistern.service").read_text()
    assert "ExecStart=/usr/bin/cistern serve" in unit and "Type=notify" in unit and "LimitNOFILE=" in unit
    assert (root / "etc/cistern/cistern.toml").read_text() == (REPO / "packaging/cistern.toml").read_text()
    v = run([root / "usr/bin/cistern", "--version"]).stdout
    assert v.startswith("cistern "), v
    run(["dpkg", f"--root={root}", "--force-not-root", "--force-script-chrootless", "--no-triggers",
         "--purge", "cistern"], timeout=120)
    assert not (root / "usr/bin/cistern").exists()
