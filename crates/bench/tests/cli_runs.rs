//! End-to-end runs of the bench subcommands against temporary files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bench::cli::{self, BenchCommand, ChartArgs, IopsArgs, ProvisionArgs};
use bench::iops::{Format, RunRecord, Rw};

/// Balanced tags, one <svg> root; returns the tag names in order.
fn svg_tags(s: &str) -> Vec<String> {
    assert!(s.contains("<svg") && s.trim_end().ends_with("</svg>"));
    let mut stack = Vec::new();
    let mut names = Vec::new();
    let mut rest = s;
    while let Some(i) = rest.find('<') {
        rest = &rest[i + 1..];
        let end = rest.find('>').expect("unclosed tag");
        let tag = &rest[..end];
        rest = &rest[end + 1..];
        if tag.starts_with('?') {
            continue;
        }
        if let Some(n) = tag.strip_prefix('/') {
            assert_eq!(stack.pop().as_deref(), Some(n), "mismatched </{n}>");
        } else {
            let n: String = tag
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != '/')
                .collect();
            if !tag.ends_with('/') {
                stack.push(n.clone());
            }
            names.push(n);
        }
    }
    assert!(stack.is_empty(), "unclosed {stack:?}");
    assert_eq!(names[0], "svg");
    names
}

fn files_with_ext(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

fn iops_args(target: &Path, out: &Path, secs: u64, format: Format, name: &str) -> IopsArgs {
    IopsArgs {
        target: target.display().to_string(),
        workers: 2,
        duration: Duration::from_secs(secs),
        rw: Rw::Randwrite,
        read_percent: 50,
        block_size: 4096,
        size: Some(8 << 20),
        out: Some(out.to_path_buf()),
        name: Some(name.into()),
        force: false,
        format,
        direct: false,
        no_progress: true,
        objects: None,
        create_bucket: false,
        s3: Default::default(),
    }
}

#[test]
fn s3_options_are_for_s3_targets() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("scratch.img");
    let a = IopsArgs {
        objects: Some(10),
        ..iops_args(&target, tmp.path(), 1, Format::Json, "x")
    };
    let e = cli::run(BenchCommand::Iops(a)).unwrap_err();
    assert!(e.to_string().contains("--objects is for s3://"), "{e}");
    let a = IopsArgs {
        create_bucket: true,
        ..iops_args(&target, tmp.path(), 1, Format::Json, "x")
    };
    let e = cli::run(BenchCommand::Iops(a)).unwrap_err();
    assert!(
        e.to_string().contains("--create-bucket is for s3://"),
        "{e}"
    );
    assert!(!target.exists(), "nothing created");
}

#[test]
fn iops_on_a_temp_file_then_chart_and_provision() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let target = tmp.path().join("scratch.img");

    // 2 s of synchronous random writes to a file the bench creates.
    cli::run(BenchCommand::Iops(iops_args(
        &target,
        &out,
        2,
        Format::Json,
        "disk-a",
    )))
    .unwrap();
    assert!(!target.exists(), "the file the bench created is removed");
    let jsons = files_with_ext(&out, "json");
    assert_eq!(jsons.len(), 1);
    let rec: RunRecord =
        serde_json::from_str(&std::fs::read_to_string(&jsons[0]).unwrap()).unwrap();
    assert_eq!(rec.format, "cistern-bench-iops/1");
    assert_eq!(rec.name, "disk-a");
    assert_eq!(rec.per_second_iops.len(), 2);
    assert!(rec.total_ops > 0);
    assert_eq!(rec.total_ops, rec.per_second_iops.iter().sum::<u64>());
    assert_eq!(rec.latency.count, rec.total_ops);
    assert!(rec.latency.p50_ns > 0 && rec.latency.p50_ns <= rec.latency.p99_ns);
    assert!(rec.iops.mean > 0.0);
    let svgs = files_with_ext(&out, "svg");
    assert_eq!(svgs.len(), 1);
    let tags = svg_tags(&std::fs::read_to_string(&svgs[0]).unwrap());
    assert_eq!(tags.iter().filter(|t| *t == "polyline").count(), 1);

    // CSV format.
    let out_csv = tmp.path().join("csv");
    cli::run(BenchCommand::Iops(iops_args(
        &target,
        &out_csv,
        1,
        Format::Csv,
        "disk-b",
    )))
    .unwrap();
    let csvs = files_with_ext(&out_csv, "csv");
    assert_eq!(csvs.len(), 1);
    let text = std::fs::read_to_string(&csvs[0]).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("second,iops"));
    let rows: Vec<(u64, u64)> = lines
        .map(|l| {
            let (a, b) = l.split_once(',').unwrap();
            (a.parse().unwrap(), b.parse().unwrap())
        })
        .collect();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].0, 0);

    // Several runs on one chart.
    let chart = tmp.path().join("charts/both.svg");
    cli::run(BenchCommand::Chart(ChartArgs {
        runs: vec![jsons[0].clone(), csvs[0].clone()],
        out: Some(chart.clone()),
        title: "two runs".into(),
    }))
    .unwrap();
    let tags = svg_tags(&std::fs::read_to_string(&chart).unwrap());
    assert_eq!(tags.iter().filter(|t| *t == "polyline").count(), 2);

    // Provisioning from the saved runs.
    cli::run(BenchCommand::Provision(ProvisionArgs {
        target_iops: 10.0 * rec.iops.mean,
        confidence: 0.99,
        seed: 1,
        trials: 2000,
        buckets: 50,
        json: false,
        samples: vec![jsons[0].clone(), csvs[0].clone()],
    }))
    .unwrap();
}

#[test]
fn refuses_a_file_with_data_and_keeps_it() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("precious.img");
    std::fs::write(&target, vec![0xAB; 1 << 20]).unwrap();
    let err = cli::run(BenchCommand::Iops(iops_args(
        &target,
        tmp.path(),
        1,
        Format::Json,
        "x",
    )))
    .unwrap_err();
    assert!(format!("{err:#}").contains("--force"), "{err:#}");
    assert_eq!(std::fs::read(&target).unwrap(), vec![0xAB; 1 << 20]);
    assert!(files_with_ext(tmp.path(), "json").is_empty());
}
