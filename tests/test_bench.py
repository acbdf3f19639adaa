"""`cistern bench`: iops, chart, provision, latency and compress, each run
briefly against a temporary file, the NBD export of a volume on the test's
daemon, or a small generated directory; checks that the samples are valid
CSV/JSON, the charts well-formed SVG, and that nothing holding data is
overwritten without --force.

`cistern bench` is the binary's `bench` subcommand; CISTERN_BENCH=PATH runs a
stand-alone build instead (`cargo build -p bench --example bench`, then
CISTERN_BENCH=target/debug/examples/bench).
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import cistern_bin, free_ports, run
from helpers import MiB, connected, sha256

SVG_NS = "{http://www.w3.org/2000/svg}"


def bench_cmd() -> list[str]:
    override = os.environ.get("CISTERN_BENCH")
    return [override] if override else [cistern_bin(), "bench"]


def bench(*args, check=True, timeout=60, cwd=None):
    return run([*bench_cmd(), *args], check=check, timeout=timeout, cwd=cwd)


@pytest.fixture(scope="module", autouse=True)
def _bench_available():
    p = run([*bench_cmd(), "--help"], check=False, timeout=30)
    if p.returncode != 0:
        pytest.skip(f"`{' '.join(bench_cmd())}` is not available yet: {(p.stderr or p.stdout).strip()[:200]}")


def no_panic(p):
    assert "panicked" not in p.stdout + p.stderr, p.stdout + p.stderr


def printed_paths(stdout: str) -> list[Path]:
    """The result files a bench command lists after `wrote` (one per line, the
    first prefixed with `wrote`)."""
    lines = stdout.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith("wrote ")), None)
    assert start is not None, f"no 'wrote' line in {stdout!r}"
    out = [Path(lines[start].removeprefix("wrote").strip())]
    for l in lines[start + 1:]:
        if not l.startswith(" ") or not l.strip():
            break
        out.append(Path(l.strip()))
    return out


def check_svg(path: Path) -> ET.Element:
    root = ET.parse(path).getroot()  # raises on malformed XML
    assert root.tag in ("svg", SVG_NS + "svg"), root.tag
    assert root.get("viewBox") or (root.get("width") and root.get("height")), root.attrib
    drawn = [e for e in root.iter() if e.tag.removeprefix(SVG_NS) in ("path", "polyline", "line", "rect", "circle")]
    assert drawn, f"{path}: nothing drawn"
    return root


def check_run_json(path: Path, seconds: int) -> dict:
    r = json.loads(path.read_text())
    assert r["format"] == "cistern-bench-iops/1", r.get("format")
    ps = r["per_second_iops"]
    assert isinstance(ps, list) and len(ps) == seconds, ps
    assert all(isinstance(v, int) and v >= 0 for v in ps), ps
    assert sum(ps) > 0, ps
    assert r["total_ops"] >= sum(ps), (r["total_ops"], ps)
    s = r["iops"]
    for k in ("mean", "median", "p1", "p5", "p95", "p99"):
        assert isinstance(s[k], (int, float)) and s[k] >= 0, (k, s)
    assert min(ps) <= s["median"] <= max(ps), s
    lat = r["latency"]
    assert 0 < lat["p50_ns"] <= lat["p99_ns"] <= lat["max_ns"], lat
    return r


def check_run_csv(path: Path, seconds: int) -> list[int]:
    rows = list(csv.reader(io.StringIO(path.read_text())))
    assert rows[0] == ["second", "iops"], rows[:2]
    body = rows[1:]
    assert len(body) == seconds, body
    assert [int(r[0]) for r in body] == list(range(seconds)), body
    vals = [int(r[1]) for r in body]
    assert all(v >= 0 for v in vals) and sum(vals) > 0, vals
    return vals


def iops(target: str, out: Path, *extra, seconds: int = 2, fmt: str = "json", name: str | None = None):
    args = ["iops", target, "-d", f"{seconds}s", "-w", "2", "--out", out, "--format", fmt, "--no-progress"]
    if name:
        args += ["--name", name]
    p = bench(*args, *extra, timeout=60)
    no_panic(p)
    paths = printed_paths(p.stdout)
    assert len(paths) == 2, paths
    data, svg = paths
    assert data.suffix == f".{fmt}" and svg.suffix == ".svg", paths
    assert data.parent.resolve() == out.resolve(), paths
    assert re.search(r"IOPS\s+mean \d+", p.stdout), p.stdout
    check_svg(svg)
    return p, data, svg


# ------------------------------------------------------------------ iops


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_iops_on_a_temp_file(tmp_path, fmt):
    target = tmp_path / "scratch.img"
    out = tmp_path / "out"
    _, data, _ = iops(str(target), out, "--size", "8M", fmt=fmt, name="tempfile")
    if fmt == "json":
        r = check_run_json(data, 2)
        assert r["name"] == "tempfile" and r["block_size"] == 4096 and r["workers"] == 2
    else:
        check_run_csv(data, 2)
    assert not target.exists(), "the file the bench created was not removed"
    assert sorted(p.suffix for p in out.iterdir()) == sorted([".svg", f".{fmt}"])


def test_iops_on_nbd_export_then_chart_and_provision(volume, tmp_path):
    out = tmp_path / "out"
    _, nbd_json, _ = iops(volume.uri, out, "--size", "16M", name="cistern-nbd")
    r = check_run_json(nbd_json, 2)
    assert r["target"].startswith("nbd://"), r["target"]
    assert r["region_bytes"] == 16 * MiB
    # the volume was really written, inside the region only
    with connected(volume.uri) as h:
        assert h.pread(16 * MiB, 0).count(0) < 16 * MiB
        assert h.pread(MiB, 16 * MiB) == bytes(MiB)

    # a second "provider": the same bench on a file, as CSV
    _, file_csv, _ = iops(str(tmp_path / "f.img"), out, "--size", "8M", fmt="csv")
    check_run_csv(file_csv, 2)

    # both runs on one chart
    chart = tmp_path / "both.svg"
    p = bench("chart", nbd_json, file_csv, "--out", chart)
    assert printed_paths(p.stdout) == [chart]
    root = check_svg(chart)
    text = " ".join(t.text or "" for t in root.iter() if t.tag.removeprefix(SVG_NS) == "text")
    assert "cistern-nbd" in text, text

    # provision: a target well above one node's best second needs several nodes
    best = max(json.loads(nbd_json.read_text())["per_second_iops"] + check_run_csv(file_csv, 2))
    target = best * 7 + 1
    p = bench("provision", "--target-iops", target, "--trials", "20000", nbd_json, file_csv)
    no_panic(p)
    lines = p.stdout.splitlines()
    hi = next(i for i, l in enumerate(lines) if l.startswith("provider") and "|" in l)
    header = [c.strip() for c in lines[hi].split("|")]
    assert header == ["provider", "seconds", "best case", "99% (MC)", "99% (exact)", "all-dip bound", "ratio 99%/best"], header
    assert set(lines[hi + 1]) <= set("-| "), lines[hi + 1]
    rows = []
    for l in lines[hi + 2:]:
        if not l.strip():
            break
        rows.append([c.strip() for c in l.split("|")])
    assert [r[0] for r in rows] == ["cistern-nbd", file_csv.stem], rows
    for row in rows:
        assert len(row) == len(header), row
        nums = [int(c) for c in row[1:6]]  # raises if not integers
        assert all(n >= 1 for n in nums), row
        seconds, best_case, mc, exact, all_dip = nums
        assert seconds == 2 and best_case >= 7, row
        assert best_case <= exact <= all_dip and abs(mc - exact) <= 1, row
        assert float(row[6]) >= 1.0, row
    assert "independent" in p.stdout

    j = json.loads(bench("provision", "--target-iops", target, "--trials", "20000", "--json", nbd_json, file_csv).stdout)
    assert [e["name"] for e in j["estimates"]] == ["cistern-nbd", file_csv.stem]
    assert [e["best_case"] for e in j["estimates"]] == [int(r[2]) for r in rows]


def test_iops_refuses_nbd_export_holding_data(volume, tmp_path):
    data = random.Random(5).randbytes(2 * MiB)
    with connected(volume.uri) as h:
        h.pwrite(data, 0)
        h.flush()
    out = tmp_path / "out"
    p = bench("iops", volume.uri, "-d", "2s", "--size", "4M", "--out", out, "--no-progress", check=False)
    no_panic(p)
    assert p.returncode != 0, p.stdout
    assert re.search(r"holds data", p.stderr) and "--force" in p.stderr, p.stderr
    with connected(volume.uri) as h:
        assert sha256(h.pread(2 * MiB, 0)) == sha256(data), "the refused run changed the export"
        assert h.pread(MiB, 2 * MiB) == bytes(MiB)
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())

    # with --force it writes (the region it was given, and nothing beyond)
    iops(volume.uri, out, "--size", "1M", "--force", seconds=1)
    with connected(volume.uri) as h:
        assert h.pread(MiB, 0) != data[:MiB]
        assert h.pread(MiB, MiB) == data[MiB:]


# ------------------------------------------------------------------ latency


def test_latency_over_nbd(volume):
    p = bench("latency", volume.uri, "-n", "500", "--json")
    no_panic(p)
    r = json.loads(p.stdout)
    assert r["requests"] == 500 and r["request_bytes"] == 512, r
    assert r["requests_per_s"] > 0 and r["elapsed_s"] > 0, r
    assert abs(r["requests_per_s"] * r["elapsed_s"] - 500) < 5, r
    lat = r["latency"]
    assert 0 < lat["min_ns"] <= lat["p50_ns"] <= lat["p99_ns"] <= lat["max_ns"], lat
    p = bench("latency", volume.uri, "-n", "200", "--warmup", "10")
    assert re.search(r"200 in [\d.]+ s: \d+ requests/s", p.stdout), p.stdout


# ------------------------------------------------------------------ s3


def _s3_env(**kw) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(kw)
    return env


def test_s3_target_settings_are_checked(tmp_path):
    """s3:// without an endpoint or keys, with https, a bad bucket name or
    nothing listening: a clear error naming the problem, no panic."""
    closed = free_ports(1)[0]
    keys = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    cases = [
        (["iops", "s3://bench", "-d", "1s"], {}, r"AWS_ENDPOINT_URL"),
        (["latency", "s3://bench"], {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed}"}, r"AWS_ACCESS_KEY_ID"),
        (["list", "s3://bench"], {"AWS_ENDPOINT_URL": "https://127.0.0.1:1", **keys}, r"TLS"),
        (["list", "s3://Bad_Name"], {"AWS_ENDPOINT_URL": "http://127.0.0.1:1", **keys}, r"not a valid bucket name"),
        (["iops", "s3://bench/p", "-d", "1s", "--no-progress", "--out", tmp_path],
         {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed}", **keys}, r"s3://bench"),
        (["list", "/tmp/file"], {}, r"needs an s3://"),
    ]
    for args, env, pat in cases:
        p = run([*bench_cmd(), *args], check=False, timeout=60, env=_s3_env(**env))
        no_panic(p)
        assert p.returncode != 0 and re.search(pat, p.stderr), (args, p.stderr)
    assert not list(tmp_path.iterdir()), "no results written for a failed run"


def test_s3_iops_latency_and_list_against_cistern(make_daemon, disks, tmp_path):
    """The s3:// target against the daemon's own S3 endpoint: PUTs make new
    objects, GETs read them whole, HEAD round trips, full listings, a
    second write run refused without --force, a wrong secret named."""
    if "--s3" not in run([cistern_bin(), "serve", "--help"], check=False).stdout:
        pytest.skip("this build has no S3 endpoint (cistern serve --s3)")
    (port,) = free_ports(1)
    d = make_daemon("s3", config=f'[s3]\nlisten = "127.0.0.1:{port}"\nparent = "tank"\n')
    d.cli("pool", "create", "-s", "2G", "tank", disks / "d0")
    d.cli("create", "-t", "bucket", "tank/bench")
    _, key, secret = d.cli("user", "add", "-H", "-g", "bench=rw", "bench").stdout.strip().split("\t")
    env = _s3_env(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID=key, AWS_SECRET_ACCESS_KEY=secret)
    out = tmp_path / "out"

    def b(*args, check=True):
        p = run([*bench_cmd(), *args], check=check, timeout=120, env=env)
        no_panic(p)
        return p

    p = b("iops", "s3://bench/w", "-w", "4", "-d", "2s", "--no-progress", "--out", out, "--name", "put")
    r = check_run_json(next(x for x in printed_paths(p.stdout) if x.suffix == ".json"), 2)
    assert r["block_size"] == 4096 and r["mb_per_s"] > 0, r
    # Every counted PUT made an object of its own (keys from 0 up).
    lst = json.loads(b("list", "s3://bench/w", "-n", "1", "-r", "1", "--json").stdout)
    assert lst["populated"] == 0 and r["total_ops"] <= lst["objects"] <= r["total_ops"] + 4, (r, lst)
    p = b("iops", "s3://bench/w", "-d", "1s", "--no-progress", "--out", out, check=False)
    assert p.returncode != 0 and "holds objects" in p.stderr, p.stderr

    p = b("iops", "s3://bench/w", "--rw", "randread", "--objects", "50", "-w", "4", "-d", "1s",
          "--no-progress", "--out", out, "--name", "get")
    assert "IOPS" in p.stdout and "MB/s" in p.stdout, p.stdout

    lat = json.loads(b("latency", "s3://bench/lat", "-n", "200", "--json").stdout)
    assert lat["latency"]["count"] == 200 and lat["requests_per_s"] > 0, lat

    lst = json.loads(b("list", "s3://bench/l", "-n", "250", "--page-size", "100", "-r", "2", "--json").stdout)
    assert (lst["objects"], lst["populated"], lst["listings"]) == (250, 250, 2), lst
    assert lst["pages_per_listing"] >= 3 and lst["objects_per_s"] > 0, lst

    env["AWS_SECRET_ACCESS_KEY"] = "x" * 40
    p = b("latency", "s3://bench", "-n", "1", check=False)
    assert p.returncode != 0 and "SignatureDoesNotMatch" in p.stderr, p.stderr


# ------------------------------------------------------------------ compress


def _mail_dir(d: Path) -> Path:
    rng = random.Random(7)
    words = "the backup server snapshot please find attached report meeting thanks drive failed again".split()
    (d / "sub").mkdir(parents=True)
    for i in range(4):
        lines = []
        for m in range(150):
            lines.append(f"From: user{rng.randrange(9)}@example.org\nSubject: {' '.join(rng.choices(words, k=4))}\n")
            lines += [" ".join(rng.choices(words, k=rng.randrange(5, 13))) for _ in range(rng.randrange(3, 12))]
        (d / ("sub" if i % 2 else ".") / f"mbox{i}").write_text("\n".join(lines))
    (d / "sub" / "photo.jpg").write_bytes(rng.randbytes(300_000))  # incompressible
    (d / "empty").write_bytes(b"")
    return d


def test_compress_small_directory(tmp_path):
    corpus = _mail_dir(tmp_path / "mail")
    total = sum(f.stat().st_size for f in corpus.rglob("*") if f.is_file())
    out = tmp_path / "out"
    levels = ["off", "lz4", "zstd-3", "gzip-1", "gzip-9"]
    p = bench("compress", corpus, "--levels", ",".join(levels), "--writers", "1,2", "-r", "2",
              "--out", out, "--no-progress", timeout=120)
    no_panic(p)
    paths = printed_paths(p.stdout)
    assert [x.suffix for x in paths] == [".json", ".svg"], paths
    # only the results are left: the scratch pool (created under --out) is gone
    assert sorted(x.name for x in out.iterdir()) == sorted(x.name for x in paths)

    j = json.loads(paths[0].read_text())
    assert j["corpus_bytes"] == total and j["repeat"] == 2
    rows = {(r["setting"], r["writers"]): r for r in j["rows"]}
    assert set(rows) == {(s, w) for s in levels for w in (1, 2)}
    for r in rows.values():
        assert len(r["times_s"]) == 2 and r["time_s"] > 0, r
        assert r["physical"] > 0 and r["logical"] >= r["physical"], r
        assert r["efficiency"] == pytest.approx(r["ratio"] / r["time_s"]), r
    assert rows[("off", 1)]["compressratio"] == 1.0
    assert rows[("off", 1)]["logical"] >= total
    assert rows[("lz4", 1)]["compressratio"] > 1.2
    assert rows[("gzip-9", 1)]["ratio"] >= rows[("gzip-1", 1)]["ratio"]
    assert rows[("zstd-3", 1)]["ratio"] > rows[("lz4", 1)]["ratio"]
    recs = {r["writers"]: r for r in j["recommendations"]}
    assert set(recs) == {1, 2}
    assert all(r["best_efficiency"] in levels and r["best_efficiency"] != "off" for r in recs.values()), recs

    # the table: a row per setting and writer count, the ratio the JSON has
    table = {}
    for l in p.stdout.splitlines():
        f = l.split()
        if f and f[0] in levels and len(f) >= 5:
            table[(f[0], int(f[1]))] = f
    assert set(table) == set(rows), p.stdout
    assert table[("lz4", 1)][4] == f"{rows[('lz4', 1)]['compressratio']:.2f}x"
    assert re.search(r"1 writer: most efficient .* best ratio within", p.stdout), p.stdout

    root = check_svg(paths[1])
    circles = [e for e in root.iter() if e.tag.removeprefix(SVG_NS) == "circle"]
    assert len(circles) >= len(rows)


def test_compress_rejects_bad_arguments(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "f").write_text("hello " * 1000)
    for args, pat in [
        (["--levels", "brotli"], r"brotli"),
        (["--record-size", "1000"], r"power of two"),
        (["--writers", "0"], r"at least 1"),
    ]:
        p = bench("compress", d, *args, "--out", tmp_path / "out", "--no-progress", check=False)
        no_panic(p)
        assert p.returncode != 0 and re.search(pat, p.stderr), (args, p.stderr)
    p = bench("compress", tmp_path / "missing", "--out", tmp_path / "out", check=False)
    assert p.returncode != 0 and "missing" in p.stderr, p.stderr
    leftovers = list((tmp_path / "out").glob(".cistern-bench-*")) if (tmp_path / "out").exists() else []
    assert not leftovers, leftovers
