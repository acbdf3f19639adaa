//! `cistern create|list|get|set|destroy`: zfs-style dataset commands.

use crate::cmd::props::{self, canonical, parse_assignment};
use crate::cmd::OutputFlags;
use crate::cmd::{size_arg, split_list};
use crate::format::Table;
use crate::output::{json, out, outln};
use anyhow::{bail, Result};
use clap::Args;
use dataset::{DatasetInfo, DatasetKind};
use serde::Serialize;

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Volume size (e.g. 10G); creates a volume.
    #[arg(short = 'V', value_name = "SIZE", value_parser = size_arg, required = true)]
    pub volsize: u64,
    /// Property for the new dataset (repeatable): -o compression=lz4 -o volblocksize=16K.
    #[arg(short = 'o', value_name = "PROP=VALUE")]
    pub props: Vec<String>,
    /// POOL/VOL
    pub name: String,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub format: OutputFlags,
    /// Columns: name, type, or any property (default name,used,avail,refer).
    #[arg(short = 'o', value_name = "COLS")]
    pub columns: Option<String>,
    /// Types to list: volume, filesystem, snapshot or all (comma-separated;
    /// default: volumes and filesystems).
    #[arg(short = 't', value_name = "TYPE")]
    pub types: Option<String>,
    /// Also list the children of the named datasets.
    #[arg(short = 'r')]
    pub recursive: bool,
    /// Datasets to list (default: all).
    pub datasets: Vec<String>,
}

#[derive(Debug, Args)]
pub struct GetArgs {
    #[command(flatten)]
    pub format: OutputFlags,
    /// Fields: name,property,value,source.
    #[arg(short = 'o', value_name = "FIELDS")]
    pub fields: Option<String>,
    /// `all`, or properties separated by commas.
    #[arg(value_name = "all|PROP[,PROP...]")]
    pub props: String,
    /// Datasets (default: all).
    pub datasets: Vec<String>,
}

#[derive(Debug, Args)]
pub struct SetArgs {
    /// PROP=VALUE
    #[arg(value_name = "PROP=VALUE")]
    pub assignment: String,
    #[arg(value_name = "DATASET", required = true, num_args = 1..)]
    pub datasets: Vec<String>,
}

#[derive(Debug, Args)]
pub struct DestroyArgs {
    /// Also destroy children and snapshots (for DS@SNAP: that snapshot of every child).
    #[arg(short = 'r')]
    pub recursive: bool,
    /// Dry run: change nothing (use with -v to see what would go).
    #[arg(short = 'n')]
    pub dry_run: bool,
    /// Print what is destroyed and how much space is reclaimed.
    #[arg(short = 'v')]
    pub verbose: bool,
    /// Exact byte counts with -v.
    #[arg(short = 'p')]
    pub parsable: bool,
    /// POOL/DS, or snapshots: POOL/DS@SNAP, POOL/DS@FIRST%LAST, POOL/DS@A,B.
    pub dataset: String,
}

pub fn create(client: &api::Client, a: CreateArgs) -> Result<()> {
    if !a.name.contains('/') {
        bail!(
            "'{}' is not POOL/VOL (volumes live in a pool: e.g. tank/vol0)",
            a.name
        );
    }
    let props = a
        .props
        .iter()
        .map(|p| parse_assignment(p))
        .collect::<Result<Vec<_>>>()?;
    client.create_volume(&a.name, a.volsize, &props)?;
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeFilter {
    pub volume: bool,
    pub filesystem: bool,
    pub snapshot: bool,
}

impl TypeFilter {
    fn wants(&self, k: DatasetKind) -> bool {
        match k {
            DatasetKind::Volume => self.volume,
            DatasetKind::Filesystem => self.filesystem,
            DatasetKind::Snapshot => self.snapshot,
        }
    }
}

pub fn parse_types(s: Option<&str>) -> Result<TypeFilter> {
    let Some(s) = s else {
        // As zfs with listsnapshots=off: snapshots only when asked for.
        return Ok(TypeFilter {
            volume: true,
            filesystem: true,
            snapshot: false,
        });
    };
    let mut f = TypeFilter {
        volume: false,
        filesystem: false,
        snapshot: false,
    };
    for t in split_list(s) {
        match t.to_ascii_lowercase().as_str() {
            "volume" | "vol" => f.volume = true,
            "filesystem" | "fs" => f.filesystem = true,
            "snapshot" | "snap" => f.snapshot = true,
            "all" => {
                f.volume = true;
                f.filesystem = true;
                f.snapshot = true;
            }
            other => bail!("invalid type '{other}' (valid: volume, filesystem, snapshot, all)"),
        }
    }
    if !f.volume && !f.filesystem && !f.snapshot {
        bail!("no type given to -t");
    }
    Ok(f)
}

fn kind_name(k: DatasetKind) -> &'static str {
    match k {
        DatasetKind::Filesystem => "filesystem",
        DatasetKind::Volume => "volume",
        DatasetKind::Snapshot => "snapshot",
    }
}

/// The value of a column/property of a dataset; `name` and `type` are
/// synthesized when the engine does not list them.
pub fn value_of(ds: &DatasetInfo, prop: &str, parsable: bool) -> Option<String> {
    let p = canonical(prop);
    if let Some(found) = ds.property(&p) {
        return Some(if parsable {
            found.parsable.clone()
        } else {
            found.value.clone()
        });
    }
    match p.as_str() {
        "name" => Some(ds.name.clone()),
        "type" => Some(kind_name(ds.kind).to_string()),
        _ => None,
    }
}

/// The `list` table.
pub fn dataset_table(datasets: &[DatasetInfo], columns: &[String], parsable: bool) -> Table {
    let headers: Vec<String> = columns.iter().map(|c| props::header(c)).collect();
    let mut t = Table::new(&headers);
    for (i, c) in columns.iter().enumerate() {
        if props::is_numeric(c) {
            t.align_right(i);
        }
    }
    for ds in datasets {
        t.push(
            columns
                .iter()
                .map(|c| value_of(ds, c, parsable).unwrap_or_else(|| "-".into()))
                .collect(),
        );
    }
    t
}

/// The named datasets (with `recursive`, their children; with
/// `snapshots`, their snapshots too), or every dataset.
fn collect(
    client: &api::Client,
    names: &[String],
    recursive: bool,
    snapshots: bool,
) -> Result<Vec<DatasetInfo>> {
    if names.is_empty() {
        return Ok(client.list_datasets(None)?);
    }
    let mut out: Vec<DatasetInfo> = Vec::new();
    for n in names {
        let found = if recursive {
            client.list_datasets(Some(n))?
        } else if snapshots && !n.contains('@') {
            let prefix = format!("{n}@");
            client
                .list_datasets(Some(n))?
                .into_iter()
                .filter(|d| d.name == *n || d.name.starts_with(&prefix))
                .collect()
        } else {
            vec![client.dataset(n)?]
        };
        if found.is_empty() {
            bail!("{n} does not exist");
        }
        for d in found {
            if !out.iter().any(|o| o.name == d.name) {
                out.push(d);
            }
        }
    }
    Ok(out)
}

pub fn list(client: &api::Client, a: ListArgs) -> Result<()> {
    let types = parse_types(a.types.as_deref())?;
    let columns = match &a.columns {
        Some(c) => split_list(c),
        None => ["name", "used", "avail", "refer"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
    };
    if columns.is_empty() {
        bail!("no columns given to -o");
    }
    let mut datasets = collect(client, &a.datasets, a.recursive, types.snapshot)?;
    // A name given explicitly is listed whatever its type (as zfs).
    datasets.retain(|d| types.wants(d.kind) || a.datasets.contains(&d.name));
    if a.format.json {
        return json(&datasets);
    }
    if datasets.is_empty() {
        if !a.format.scripted {
            outln("no datasets available");
        }
        return Ok(());
    }
    check_columns(&datasets, &columns)?;
    out(&dataset_table(&datasets, &columns, a.format.parsable).render(a.format.scripted));
    Ok(())
}

/// A property no dataset has is a typo; one that only some lack shows as `-`.
fn check_columns(datasets: &[DatasetInfo], columns: &[String]) -> Result<()> {
    for c in columns {
        if !datasets.iter().any(|d| value_of(d, c, false).is_some()) {
            bail!("invalid property '{c}'");
        }
    }
    Ok(())
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct GetRow {
    pub name: String,
    pub property: String,
    pub value: String,
    pub parsable: String,
    pub source: String,
}

/// The rows of `get`: every requested property of every dataset.
pub fn get_rows(datasets: &[DatasetInfo], props: &str) -> Result<Vec<GetRow>> {
    let wanted: Option<Vec<String>> = if props.trim() == "all" {
        None
    } else {
        Some(split_list(props).iter().map(|p| canonical(p)).collect())
    };
    if let Some(w) = &wanted {
        if w.is_empty() {
            bail!("no property given");
        }
        check_columns(datasets, w)?;
    }
    let mut rows = Vec::new();
    for ds in datasets {
        match &wanted {
            None => {
                if ds.property("type").is_none() {
                    rows.push(GetRow {
                        name: ds.name.clone(),
                        property: "type".into(),
                        value: kind_name(ds.kind).into(),
                        parsable: kind_name(ds.kind).into(),
                        source: "-".into(),
                    });
                }
                for p in &ds.properties {
                    rows.push(GetRow {
                        name: ds.name.clone(),
                        property: p.name.clone(),
                        value: p.value.clone(),
                        parsable: p.parsable.clone(),
                        source: p.source.clone(),
                    });
                }
            }
            Some(w) => {
                for prop in w {
                    let row = match ds.property(prop) {
                        Some(p) => GetRow {
                            name: ds.name.clone(),
                            property: p.name.clone(),
                            value: p.value.clone(),
                            parsable: p.parsable.clone(),
                            source: p.source.clone(),
                        },
                        None => {
                            let v = value_of(ds, prop, false).unwrap_or_else(|| "-".into());
                            GetRow {
                                name: ds.name.clone(),
                                property: prop.clone(),
                                parsable: v.clone(),
                                value: v,
                                source: "-".into(),
                            }
                        }
                    };
                    rows.push(row);
                }
            }
        }
    }
    Ok(rows)
}

const GET_FIELDS: &[&str] = &["name", "property", "value", "source"];

pub fn get_table(rows: &[GetRow], fields: &[String], parsable: bool) -> Table {
    let mut t = Table::new(fields);
    for r in rows {
        t.push(
            fields
                .iter()
                .map(|f| match f.as_str() {
                    "name" => r.name.clone(),
                    "property" => r.property.clone(),
                    "value" if parsable => r.parsable.clone(),
                    "value" => r.value.clone(),
                    _ => r.source.clone(),
                })
                .collect(),
        );
    }
    t
}

/// The `-o` fields of `get` and `pool get` (default: all four).
pub fn get_fields(fields: &Option<String>) -> Result<Vec<String>> {
    Ok(match fields {
        Some(f) => {
            let v: Vec<String> = split_list(f)
                .iter()
                .map(|s| s.to_ascii_lowercase())
                .collect();
            for f in &v {
                if !GET_FIELDS.contains(&f.as_str()) {
                    bail!("invalid field '{f}' (valid: {})", GET_FIELDS.join(", "));
                }
            }
            if v.is_empty() {
                bail!("no fields given to -o");
            }
            v
        }
        None => GET_FIELDS.iter().map(|s| s.to_string()).collect(),
    })
}

pub fn get(client: &api::Client, a: GetArgs) -> Result<()> {
    let fields = get_fields(&a.fields)?;
    let datasets = collect(client, &a.datasets, false, false)?;
    let rows = get_rows(&datasets, &a.props)?;
    if a.format.json {
        return json(&rows);
    }
    out(&get_table(&rows, &fields, a.format.parsable).render(a.format.scripted));
    Ok(())
}

pub fn set(client: &api::Client, a: SetArgs) -> Result<()> {
    let (prop, value) = parse_assignment(&a.assignment)?;
    for ds in &a.datasets {
        client.set_property(ds, &prop, &value)?;
    }
    Ok(())
}

pub fn destroy(client: &api::Client, a: DestroyArgs) -> Result<()> {
    let opts = dataset::DestroyOptions {
        recursive: a.recursive,
        dry_run: a.dry_run,
    };
    let report = client.destroy(&a.dataset, &opts)?;
    if a.verbose {
        let verb = if report.dry_run { "would" } else { "will" };
        for name in &report.destroyed {
            outln(&format!("{verb} destroy {name}"));
        }
        outln(&format!(
            "{verb} reclaim {}",
            crate::format::size_cell(report.freed, a.parsable)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataset::Property;

    fn prop(name: &str, value: &str, parsable: &str, source: &str) -> Property {
        Property {
            name: name.into(),
            value: value.into(),
            parsable: parsable.into(),
            source: source.into(),
        }
    }

    fn vol() -> DatasetInfo {
        DatasetInfo {
            name: "tank/vol0".into(),
            kind: DatasetKind::Volume,
            properties: vec![
                prop("used", "1.50G", "1610612736", "-"),
                prop("available", "6G", "6442450944", "-"),
                prop("referenced", "1G", "1073741824", "-"),
                prop("volsize", "4G", "4294967296", "local"),
                prop("compression", "lz4", "lz4", "local"),
            ],
        }
    }

    fn root() -> DatasetInfo {
        DatasetInfo {
            name: "tank".into(),
            kind: DatasetKind::Filesystem,
            properties: vec![
                prop("used", "2G", "2147483648", "-"),
                prop("available", "6G", "6442450944", "-"),
                prop("referenced", "96K", "98304", "-"),
                prop("compression", "off", "off", "default"),
            ],
        }
    }

    fn cols(s: &str) -> Vec<String> {
        split_list(s)
    }

    #[test]
    fn list_table_default_columns() {
        let t = dataset_table(&[root(), vol()], &cols("name,used,avail,refer"), false);
        assert_eq!(
            t.render(false),
            "NAME        USED  AVAIL  REFER\ntank          2G     6G    96K\ntank/vol0  1.50G     6G     1G\n"
        );
        let t = dataset_table(&[vol()], &cols("name,volsize,type"), true);
        assert_eq!(t.render(true), "tank/vol0\t4294967296\tvolume\n");
        // A property only some datasets have shows as '-'.
        let t = dataset_table(&[root(), vol()], &cols("name,volsize"), false);
        assert!(t.render(true).starts_with("tank\t-\n"));
    }

    #[test]
    fn unknown_column_is_an_error() {
        assert!(check_columns(&[vol()], &cols("name,bogus"))
            .unwrap_err()
            .to_string()
            .contains("'bogus'"));
        assert!(check_columns(&[vol()], &cols("name,type,compress")).is_ok());
    }

    #[test]
    fn types() {
        let f = |volume, filesystem, snapshot| TypeFilter {
            volume,
            filesystem,
            snapshot,
        };
        assert_eq!(parse_types(None).unwrap(), f(true, true, false));
        assert_eq!(parse_types(Some("volume")).unwrap(), f(true, false, false));
        assert_eq!(parse_types(Some("fs")).unwrap(), f(false, true, false));
        assert_eq!(
            parse_types(Some("snapshot")).unwrap(),
            f(false, false, true)
        );
        assert_eq!(parse_types(Some("all")).unwrap(), f(true, true, true));
        assert!(parse_types(Some("bookmark")).is_err());
    }

    #[test]
    fn get_rows_and_table() {
        let rows = get_rows(&[vol()], "volsize,compress,type").unwrap();
        let t = get_table(&rows, &cols("name,property,value,source"), false);
        assert_eq!(
            t.render(false),
            "NAME       PROPERTY     VALUE   SOURCE\n\
             tank/vol0  volsize      4G      local\n\
             tank/vol0  compression  lz4     local\n\
             tank/vol0  type         volume  -\n"
        );
        assert_eq!(
            get_table(&rows, &cols("value"), true).render(true),
            "4294967296\nlz4\nvolume\n"
        );
        let all = get_rows(&[vol()], "all").unwrap();
        assert_eq!(all.len(), 6);
        assert_eq!(all[0].property, "type");
        assert!(get_rows(&[vol()], "nope").is_err());
        // volsize is missing on the root but present on the volume: '-'.
        let rows = get_rows(&[root(), vol()], "volsize").unwrap();
        assert_eq!(rows[0].value, "-");
        assert_eq!(rows[1].value, "4G");
    }
}
