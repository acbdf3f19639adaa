//! `cistern pool plan` run as a user would: no daemon needed.

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_cistern");

fn plan(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["pool", "plan"])
        .args(args)
        // Nothing listens here: the planner must not need the daemon.
        .env("CISTERN_API", "http://127.0.0.1:9")
        .output()
        .expect("run cistern")
}

fn ok(args: &[&str]) -> String {
    let out = plan(args);
    assert!(
        out.status.success(),
        "pool plan {args:?}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn fails(args: &[&str], code: i32) -> String {
    let out = plan(args);
    assert_eq!(out.status.code(), Some(code), "pool plan {args:?}");
    assert!(out.stdout.is_empty());
    String::from_utf8(out.stderr).unwrap()
}

const TWELVE: &[&str] = &["-n", "12", "--size", "8T", "--iops", "180", "--mbps", "250"];

fn with(extra: &[&'static str]) -> Vec<&'static str> {
    TWELVE.iter().chain(extra).copied().collect()
}

#[test]
fn table() {
    let out = ok(TWELVE);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "LAYOUT        USABLE   EFF  LOSE  LOSE-MAX  R-IOPS  W-IOPS  R-MB/S  W-MB/S  NOTE"
    );
    assert_eq!(
        lines[1],
        "12x stripe     105TB  100%     0         0    2160    2160    3000    3000  no redundancy"
    );
    let row = |name: &str| {
        *lines
            .iter()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} missing:\n{out}"))
    };
    assert_eq!(
        row("6x mirror2"),
        "6x mirror2    52.7TB   50%     1         6    2160    1080    3000    1500  -"
    );
    assert_eq!(
        row("2x raidz2-6"),
        "2x raidz2-6   70.3TB   67%     2         4     360     360    2000    2000  -"
    );
    assert!(row("1x raidz3-12").ends_with("padding: a 16K block takes 48K"));
    // 12 layouts, a blank line, then how to read them.
    assert_eq!(lines[13], "");
    assert!(lines[14]
        .starts_with("12 drives of 8.80TB (8TiB), no spares; one drive: 180 random reads/s"));
    assert!(
        out.contains("metadata (4G) and intent-log (512M) regions"),
        "{out}"
    );
}

#[test]
fn scripted_and_sorted() {
    let out = ok(&with(&[
        "-H",
        "-p",
        "--layouts",
        "mirror,raidz2",
        "--max-width",
        "6",
        "--sort",
        "wiops",
        "-o",
        "layout,groups,width,usable,avail,lose,riops,wiops,rmbps,wmbps",
    ]));
    // One drive's data region: 8T less 4G metadata, 512M log, 2x256K labels.
    let d: u64 = (8 << 40) - (4 << 30) - (512 << 20) - (512 << 10);
    let expected = format!(
        "6x mirror2\t6\t2\t{m}\t{ma}\t1\t2160\t1080\t3000\t1500\n\
         3x raidz2-4\t3\t4\t{m}\t{ma}\t2\t540\t540\t1500\t1500\n\
         2x raidz2-6\t2\t6\t{z}\t{za}\t2\t360\t360\t2000\t2000\n",
        m = 6 * d,
        ma = 6 * d - 6 * d / 32,
        z = 8 * d,
        za = 8 * d - 8 * d / 32,
    );
    assert_eq!(out, expected);
}

#[test]
fn json() {
    let out = ok(&with(&["--json", "--read-iops", "200", "--spares", "2"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["drives"], 12);
    assert_eq!(v["spares"], 2);
    assert_eq!(v["drive"]["read_iops"], 200.0);
    assert_eq!(v["drive"]["write_iops"], 180.0);
    assert_eq!(v["sources"]["read_iops"], "given");
    assert_eq!(v["regions"]["metadata"], 4u64 << 30);
    assert!(v["measured"].is_null());
    let layouts = v["layouts"].as_array().unwrap();
    let m = layouts
        .iter()
        .find(|l| l["name"] == "5x mirror2")
        .expect("10 drives in 5 mirrors");
    assert_eq!(m["random_read_iops"], 2000.0);
    assert_eq!(m["random_write_iops"], 900.0);
    assert_eq!(m["lose_any"], 1);
    assert_eq!(m["lose_max"], 5);
    assert_eq!(m["family"], "mirror2");
    // 10 drives: no 3-way mirror; the JSON says why.
    let skipped = v["skipped"].as_array().unwrap();
    assert!(
        skipped
            .iter()
            .any(|s| s.as_str().unwrap().starts_with("mirror3: 10 drives")),
        "{skipped:?}"
    );
}

#[test]
fn bad_arguments() {
    let e = fails(
        &["-n", "0", "--size", "8T", "--iops", "1", "--mbps", "1"],
        1,
    );
    assert_eq!(e, "cistern: -n/--drives must be at least 1 (got 0)\n");
    let e = fails(&with(&["--layouts", "mirror,raid5"]), 1);
    assert_eq!(
        e,
        "cistern: unknown layout 'raid5' (valid: stripe, mirror2 (or mirror), mirror3, \
         raidz1 (or raidz), raidz2, raidz3)\n"
    );
    let e = fails(&["-n", "4", "--size", "8T", "--mbps", "1"], 1);
    assert!(e.contains("give the random IOPS of one drive"), "{e}");
    let e = fails(&["-n", "4", "--iops", "1", "--mbps", "1"], 1);
    assert!(e.contains("--size is needed"), "{e}");
    let e = fails(&with(&["--sort", "speed"]), 1);
    assert!(e.contains("unknown sort key 'speed'"), "{e}");
    let e = fails(&with(&["-o", "layout,bogus"]), 1);
    assert!(e.contains("unknown column 'bogus'"), "{e}");
    let e = fails(&with(&["--spares", "12"]), 1);
    assert!(e.contains("leaves no drive"), "{e}");
    let e = fails(&with(&["--iops", "-5"]), 2);
    assert!(e.contains("-5"), "{e}");
    let e = fails(&with(&["--block-size", "6000"]), 1);
    assert!(e.contains("--block-size"), "{e}");
    let e = fails(
        &[
            "-n",
            "3",
            "--size",
            "8T",
            "--iops",
            "1",
            "--mbps",
            "1",
            "--layouts",
            "raidz2",
        ],
        1,
    );
    assert_eq!(
        e,
        "cistern: no layout fits: raidz2: a group needs at least 4 drives, there are 3\n"
    );
    // Writing is only for a measurement.
    let e = fails(&with(&["--force"]), 2);
    assert!(e.contains("--measure"), "{e}");
}

#[test]
fn measures_a_file_without_writing_it() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("drive.img");
    let data: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 253) as u8 | 1).collect();
    std::fs::write(&f, &data).unwrap();
    let fs = f.to_str().unwrap();
    let out = plan(&[
        "-n",
        "6",
        "--size",
        "4T",
        "--measure",
        fs,
        "--duration",
        "1s",
        "--workers",
        "2",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("measured "), "{stderr}");
    assert!(stderr.contains("writes not measured"), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let m = &v["measured"];
    let rr = m["random_read_iops"].as_f64().unwrap();
    let sr = m["seq_read_mbps"].as_f64().unwrap();
    assert!(rr > 0.0 && sr > 0.0, "{m}");
    assert!(m.get("random_write_iops").is_none(), "{m}");
    assert_eq!(v["drive"]["read_iops"], rr);
    assert_eq!(
        v["drive"]["write_iops"], rr,
        "writes assumed equal to reads"
    );
    assert_eq!(v["sources"]["read_iops"], "measured");
    assert_eq!(v["sources"]["write_iops"], "assumed = read");
    assert_eq!(v["sources"]["size"], "given");
    let stripe = &v["layouts"][0];
    assert_eq!(stripe["name"], "6x stripe");
    assert!((stripe["random_read_iops"].as_f64().unwrap() - 6.0 * rr).abs() < 1e-6);
    assert_eq!(std::fs::read(&f).unwrap(), data, "the file is unchanged");

    // Without --size the drive is the file: too small for a pool.
    let e = fails(&["-n", "2", "--measure", fs, "--duration", "1s"], 1);
    assert!(
        e.contains("below the smallest device a pool takes (64M): give the drive size with --size"),
        "{e}"
    );
    // A missing file is not created.
    let missing = dir.path().join("nope");
    let e = fails(
        &[
            "-n",
            "2",
            "--size",
            "1T",
            "--measure",
            missing.to_str().unwrap(),
        ],
        1,
    );
    assert!(e.contains("give an existing drive or file"), "{e}");
    assert!(!missing.exists());
}
