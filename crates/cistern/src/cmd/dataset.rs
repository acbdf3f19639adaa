//! `cistern create|list|get|set|destroy`: zfs-style dataset commands.

use crate::cmd::props::{self, canonical, parse_assignment};
use crate::cmd::OutputFlags;
use crate::cmd::{size_arg, split_list};
use crate::format::Table;
use crate::output::{json, out, outln};
use anyhow::{bail, Context, Result};
use clap::Args;
use dataset::{DatasetInfo, DatasetKind};
use serde::Serialize;
use std::cmp::Ordering;

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Volume size (e.g. 10G); creates a volume.
    #[arg(short = 'V', value_name = "SIZE", value_parser = size_arg)]
    pub volsize: Option<u64>,
    /// What to create: volume (needs -V) or bucket (an S3 bucket: the
    /// last component of POOL/NAME is its S3 name).
    #[arg(short = 't', value_name = "TYPE")]
    pub kind: Option<String>,
    /// Sparse volume: no refreservation (space is taken as it is written).
    #[arg(short = 's')]
    pub sparse: bool,
    /// Block size of the volume (as -o volblocksize=SIZE).
    #[arg(short = 'b', value_name = "SIZE", value_parser = size_arg)]
    pub blocksize: Option<u64>,
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
    /// Columns: name, type, any property, a user property (module:name), or
    /// `space` (default name,used,avail,refer).
    #[arg(short = 'o', value_name = "COLS")]
    pub columns: Option<String>,
    /// Types to list: filesystem, volume, snapshot, bookmark or all
    /// (comma-separated; default: filesystems and volumes).
    #[arg(short = 't', value_name = "TYPE")]
    pub types: Option<String>,
    /// Also list the children of the named datasets.
    #[arg(short = 'r')]
    pub recursive: bool,
    /// Recurse at most DEPTH levels (snapshots are one level below their dataset).
    #[arg(short = 'd', value_name = "DEPTH")]
    pub depth: Option<usize>,
    /// Sort by a property, ascending (repeatable; numbers numerically).
    #[arg(short = 's', value_name = "PROP")]
    pub sort_asc: Vec<String>,
    /// Sort by a property, descending (repeatable).
    #[arg(short = 'S', value_name = "PROP")]
    pub sort_desc: Vec<String>,
    /// The -s/-S keys in command-line order (filled in from the parsed arguments).
    #[arg(skip)]
    pub sort_keys: Vec<SortKey>,
    /// Datasets to list (default: all).
    pub datasets: Vec<String>,
}

/// One `-s PROP` (ascending) or `-S PROP` (descending).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortKey {
    pub prop: String,
    pub descending: bool,
}

impl ListArgs {
    /// The sort keys in command-line order (`-s a -S b`): from the argument
    /// indices clap recorded; without them, `-s` keys before `-S` keys.
    pub fn order_sort_keys(&mut self, m: Option<&clap::ArgMatches>) {
        let mut keys: Vec<(usize, SortKey)> = Vec::new();
        for (id, list, descending) in [
            ("sort_asc", &self.sort_asc, false),
            ("sort_desc", &self.sort_desc, true),
        ] {
            let idx: Vec<usize> = m
                .and_then(|m| m.indices_of(id))
                .map(|i| i.collect())
                .unwrap_or_default();
            let unindexed = (1 + usize::from(descending)) << 30;
            for (n, prop) in list.iter().enumerate() {
                let at = idx.get(n).copied().unwrap_or(unindexed + n);
                let prop = canonical(prop);
                keys.push((at, SortKey { prop, descending }));
            }
        }
        keys.sort_by_key(|k| k.0);
        self.sort_keys = keys.into_iter().map(|k| k.1).collect();
    }
}

#[derive(Debug, Args)]
pub struct GetArgs {
    #[command(flatten)]
    pub format: OutputFlags,
    /// Fields: name,property,value,source.
    #[arg(short = 'o', value_name = "FIELDS")]
    pub fields: Option<String>,
    /// Also the children (and their snapshots) of the named datasets.
    #[arg(short = 'r')]
    pub recursive: bool,
    /// Recurse at most DEPTH levels.
    #[arg(short = 'd', value_name = "DEPTH")]
    pub depth: Option<usize>,
    /// Only properties from these sources: local, default, inherited,
    /// temporary, received, none (comma-separated).
    #[arg(short = 's', value_name = "SOURCES")]
    pub sources: Option<String>,
    /// Types: filesystem, volume, snapshot, bookmark, all (default all).
    #[arg(short = 't', value_name = "TYPE")]
    pub types: Option<String>,
    /// `all`, or properties separated by commas.
    #[arg(value_name = "all|PROP[,PROP...]")]
    pub props: String,
    /// Datasets (default: all).
    pub datasets: Vec<String>,
}

#[derive(Debug, Args)]
pub struct SetArgs {
    /// PROP=VALUE... then the datasets (user properties: module:name=value).
    #[arg(value_name = "PROP=VALUE... DATASET", required = true, num_args = 2..)]
    pub args: Vec<String>,
}

#[derive(Debug, Args)]
pub struct InheritArgs {
    /// Also every dataset below (not their snapshots).
    #[arg(short = 'r')]
    pub recursive: bool,
    /// The property (native or user) to stop setting locally.
    pub property: String,
    #[arg(value_name = "DATASET", required = true, num_args = 1..)]
    pub datasets: Vec<String>,
}

#[derive(Debug, Args)]
pub struct RenameArgs {
    /// Snapshots: rename the same snapshot of every dataset below too.
    #[arg(short = 'r')]
    pub recursive: bool,
    /// POOL/DS or POOL/DS@SNAP.
    pub from: String,
    /// POOL/NEW, or for a snapshot POOL/DS@NEW or @NEW.
    pub to: String,
}

#[derive(Debug, Args)]
pub struct DestroyArgs {
    /// Also destroy children and snapshots (for DS@SNAP: that snapshot of every child).
    #[arg(short = 'r')]
    pub recursive: bool,
    /// Also destroy dependents: clones of the snapshots destroyed (and theirs), wherever they are.
    #[arg(short = 'R')]
    pub dependents: bool,
    /// Dry run: change nothing (use with -v to see what would go).
    #[arg(short = 'n')]
    pub dry_run: bool,
    /// Disconnect clients of what is destroyed (they get ESHUTDOWN)
    /// instead of refusing because the dataset is busy.
    #[arg(short = 'f')]
    pub force: bool,
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
    // As zfs: no -V (and no -t) makes a filesystem.
    if let (None | Some("filesystem" | "fs"), None) = (
        a.kind.as_deref().map(str::to_ascii_lowercase).as_deref(),
        a.volsize,
    ) {
        if a.sparse || a.blocksize.is_some() {
            bail!("-s and -b are for volumes; a filesystem takes -o recordsize=SIZE");
        }
        let props = a
            .props
            .iter()
            .map(|p| parse_assignment(p))
            .collect::<Result<Vec<_>>>()?;
        let key = super::key::create_key(&a.name, &props)?;
        client.create_dataset_keyed(&a.name, DatasetKind::Filesystem, &props, key)?;
        return Ok(());
    }
    let bucket = match (
        a.kind.as_deref().map(str::to_ascii_lowercase).as_deref(),
        a.volsize,
    ) {
        (None | Some("volume" | "vol"), Some(_)) => false,
        (None | Some("volume" | "vol"), None) => {
            bail!(
                "missing the volume size: cistern create -V SIZE POOL/VOL (or -t bucket POOL/NAME)"
            )
        }
        (Some("bucket"), None) => true,
        (Some("bucket"), Some(_)) => bail!("-V is for volumes, not buckets"),
        (Some(other), _) => {
            bail!("cannot create a '{other}' (valid -t: volume, bucket, filesystem)")
        }
    };
    let what = if bucket { "BUCKET" } else { "VOL" };
    if !a.name.contains('/') {
        bail!(
            "'{}' is not POOL/{what} ({}s live in a pool: e.g. tank/{}0)",
            a.name,
            what.to_ascii_lowercase(),
            what.to_ascii_lowercase()
        );
    }
    let mut props = a
        .props
        .iter()
        .map(|p| parse_assignment(p))
        .collect::<Result<Vec<_>>>()?;
    if bucket {
        if a.sparse || a.blocksize.is_some() {
            bail!("-s and -b are for volumes; a bucket takes -o recordsize=SIZE");
        }
        let s3_name = a.name.rsplit('/').next().unwrap_or_default();
        s3::access::check_bucket_name(s3_name)
            .with_context(|| format!("cannot create '{}'", a.name))?;
        let key = super::key::create_key(&a.name, &props)?;
        client.create_dataset_keyed(&a.name, DatasetKind::Bucket, &props, key)?;
        return Ok(());
    }
    let volsize = a.volsize.unwrap_or_default();
    if a.sparse {
        props.push(("refreservation".into(), "none".into()));
    }
    if let Some(b) = a.blocksize {
        if props.iter().any(|(k, _)| k == "volblocksize") {
            bail!("give the block size with -b or -o volblocksize, not both");
        }
        props.push(("volblocksize".into(), b.to_string()));
    }
    let key = super::key::create_key(&a.name, &props)?;
    client.create_volume_keyed(&a.name, volsize, &props, key)?;
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeFilter {
    pub volume: bool,
    pub filesystem: bool,
    pub snapshot: bool,
    pub bookmark: bool,
    pub bucket: bool,
}

impl TypeFilter {
    fn wants(&self, k: DatasetKind) -> bool {
        match k {
            DatasetKind::Volume => self.volume,
            DatasetKind::Filesystem => self.filesystem,
            DatasetKind::Snapshot => self.snapshot,
            DatasetKind::Bucket => self.bucket,
        }
    }

    /// Only snapshots/bookmarks: `list -t snapshot DS` lists DS's snapshots.
    fn only_snapshots(&self) -> bool {
        !self.volume && !self.filesystem && !self.bucket
    }

    const ALL: TypeFilter = TypeFilter {
        volume: true,
        filesystem: true,
        snapshot: true,
        bookmark: true,
        bucket: true,
    };
}

/// `-t` as zfs: filesystem, volume, snapshot, bookmark, all; `default` when absent.
pub fn parse_types(s: Option<&str>, default: TypeFilter) -> Result<TypeFilter> {
    let Some(s) = s else {
        return Ok(default);
    };
    let mut f = TypeFilter {
        volume: false,
        filesystem: false,
        snapshot: false,
        bookmark: false,
        bucket: false,
    };
    for t in split_list(s) {
        match t.to_ascii_lowercase().as_str() {
            "volume" | "vol" => f.volume = true,
            "filesystem" | "fs" => f.filesystem = true,
            "snapshot" | "snap" => f.snapshot = true,
            "bookmark" => f.bookmark = true,
            "bucket" => f.bucket = true,
            "all" => f = TypeFilter::ALL,
            other => {
                bail!("invalid type '{other}' (valid: filesystem, snapshot, volume, bucket, bookmark, all)")
            }
        }
    }
    if f == (TypeFilter {
        volume: false,
        filesystem: false,
        snapshot: false,
        bookmark: false,
        bucket: false,
    }) {
        bail!("no type given to -t");
    }
    Ok(f)
}

/// As zfs with listsnapshots=off: snapshots only when asked for.
const LIST_DEFAULT_TYPES: TypeFilter = TypeFilter {
    volume: true,
    filesystem: true,
    snapshot: false,
    bookmark: false,
    bucket: true,
};

fn kind_name(k: DatasetKind) -> &'static str {
    match k {
        DatasetKind::Filesystem => "filesystem",
        DatasetKind::Volume => "volume",
        DatasetKind::Snapshot => "snapshot",
        DatasetKind::Bucket => "bucket",
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

/// Levels below its pool root: a child one per `/`, a snapshot one below its dataset.
fn depth_of(name: &str) -> usize {
    name.matches('/').count() + usize::from(name.contains('@'))
}

/// What `list` and `get` show: the named datasets (with `recursive` or a
/// `depth`, what is below them too), or every dataset; only `types`.
/// `types_given`: -t was on the command line (a named dataset of another
/// type is then an error, as zfs; else a named snapshot is shown).
fn gather(
    client: &api::Client,
    names: &[String],
    recursive: bool,
    depth: Option<usize>,
    types: TypeFilter,
    types_given: bool,
) -> Result<Vec<DatasetInfo>> {
    let mut out: Vec<DatasetInfo> = Vec::new();
    let add = |d: DatasetInfo, out: &mut Vec<DatasetInfo>| {
        if !out.iter().any(|o| o.name == d.name) {
            out.push(d);
        }
    };
    if names.is_empty() {
        for d in client.list_datasets(None)? {
            if types.wants(d.kind) && depth.is_none_or(|max| depth_of(&d.name) <= max) {
                add(d, &mut out);
            }
        }
        return Ok(out);
    }
    for n in names {
        // `list -t snapshot DS` is `-d 1`: DS's own snapshots (as zfs).
        let limit = match (recursive, depth) {
            (_, Some(d)) => Some(Some(d)),
            (true, None) => Some(None),
            (false, None) if types.only_snapshots() && !n.contains('@') => Some(Some(1)),
            (false, None) => None,
        };
        match limit {
            Some(max) => {
                let base = depth_of(n);
                for d in client.list_datasets(Some(n))? {
                    let below = depth_of(&d.name) - base.min(depth_of(&d.name));
                    if types.wants(d.kind) && max.is_none_or(|m| below <= m) {
                        add(d, &mut out);
                    }
                }
            }
            None => {
                let d = client.dataset(n)?;
                if !types.wants(d.kind) && (types_given || d.kind != DatasetKind::Snapshot) {
                    bail!("cannot open '{n}': operation not applicable to datasets of this type");
                }
                add(d, &mut out);
            }
        }
    }
    Ok(out)
}

/// Bookmarks as listing rows (type `bookmark`): those of the named
/// datasets (and below them with `recursive`), or every one.
fn gather_bookmarks(
    client: &api::Client,
    names: &[String],
    recursive: bool,
) -> Result<Vec<DatasetInfo>> {
    let mut found = Vec::new();
    if names.is_empty() {
        found = client.bookmarks(None)?;
    }
    for n in names {
        if let Some((ds, _)) = n.split_once('#') {
            let b = client
                .bookmarks(Some(ds))?
                .into_iter()
                .find(|b| &b.name == n)
                .ok_or_else(|| anyhow::anyhow!("cannot open '{n}': bookmark does not exist"))?;
            found.push(b);
            continue;
        }
        found.extend(
            client
                .bookmarks(Some(n))?
                .into_iter()
                .filter(|b| recursive || b.name.split_once('#').is_some_and(|(d, _)| d == n)),
        );
    }
    let prop = |name: &str, value: String, parsable: String| dataset::Property {
        name: name.into(),
        value,
        parsable,
        source: "-".into(),
    };
    Ok(found
        .into_iter()
        .map(|b| DatasetInfo {
            name: b.name,
            // The listing's rows are datasets; `type` says what this one is.
            kind: DatasetKind::Snapshot,
            properties: vec![
                prop("type", "bookmark".into(), "bookmark".into()),
                prop(
                    "creation",
                    dataset::props::format_time(b.creation),
                    b.creation.to_string(),
                ),
                prop(
                    "createtxg",
                    b.createtxg.to_string(),
                    b.createtxg.to_string(),
                ),
                prop("guid", b.guid.to_string(), b.guid.to_string()),
            ],
        })
        .collect())
}

/// zfs's order: by dataset name, a dataset before its snapshots, snapshots
/// by creation txg.
fn default_order(a: &DatasetInfo, b: &DatasetInfo) -> Ordering {
    let split = |d: &DatasetInfo| -> (String, bool, u64) {
        let (ds, snap) = match d.name.split_once('@') {
            Some((ds, _)) => (ds.to_string(), true),
            None => (d.name.clone(), false),
        };
        let txg = d
            .property("createtxg")
            .and_then(|p| p.parsable.parse().ok())
            .unwrap_or(0);
        (ds, snap, txg)
    };
    split(a).cmp(&split(b)).then_with(|| a.name.cmp(&b.name))
}

/// Orders datasets by the `-s`/`-S` keys, then zfs's default order. Numbers
/// compare as numbers; a dataset without the property sorts after one with it.
pub fn sort_datasets(datasets: &mut [DatasetInfo], keys: &[SortKey]) {
    datasets.sort_by(|a, b| {
        for k in keys {
            let ord = if k.prop == "name" {
                a.name.cmp(&b.name)
            } else {
                // Creation is in seconds: txg order breaks ties the same way round.
                let props: &[&str] = match k.prop.as_str() {
                    "creation" => &["creation", "createtxg"],
                    p => &[p],
                };
                props
                    .iter()
                    .map(|p| compare_values(value_of(a, p, true), value_of(b, p, true)))
                    .find(|o| o.is_ne())
                    .unwrap_or(Ordering::Equal)
            };
            let ord = if k.descending { ord.reverse() } else { ord };
            if ord != Ordering::Equal {
                return ord;
            }
        }
        default_order(a, b)
    });
}

/// Numbers as numbers; a missing value after a present one.
fn compare_values(a: Option<String>, b: Option<String>) -> Ordering {
    match (a, b) {
        (Some(x), Some(y)) => match (x.parse::<f64>(), y.parse::<f64>()) {
            (Ok(x), Ok(y)) => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
            _ => x.cmp(&y),
        },
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

/// `-o` columns: abbreviations resolved, `space` expanded, every one a
/// property zfs knows or a user property (else an error naming it).
pub fn parse_columns(s: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for c in split_list(s) {
        let c = canonical(&c);
        if c == "space" {
            out.extend(
                [
                    "name",
                    "available",
                    "used",
                    "usedbysnapshots",
                    "usedbydataset",
                    "usedbyrefreservation",
                    "usedbychildren",
                ]
                .map(String::from),
            );
            continue;
        }
        check_property(&c)?;
        out.push(c);
    }
    if out.is_empty() {
        bail!("no columns given to -o");
    }
    Ok(out)
}

/// A property name zfs knows, or a user property.
fn check_property(name: &str) -> Result<()> {
    dataset::names::check_property_name(name).map_err(|e| anyhow::anyhow!("bad property list: {e}"))
}

pub fn list(client: &api::Client, a: ListArgs) -> Result<()> {
    let types = parse_types(a.types.as_deref(), LIST_DEFAULT_TYPES)?;
    // A snapshot listing also says which are automatic (the policy that
    // made and prunes each, `-` for manual ones), as `-o cistern:auto` does.
    let default = if types.only_snapshots() {
        "name,used,avail,refer,cistern:auto"
    } else {
        "name,used,avail,refer"
    };
    let columns = parse_columns(a.columns.as_deref().unwrap_or(default))?;
    for k in &a.sort_keys {
        check_property(&k.prop)?;
    }
    let dataset_types = TypeFilter {
        bookmark: false,
        ..types
    };
    let mut datasets = if dataset_types.volume
        || dataset_types.filesystem
        || dataset_types.snapshot
        || dataset_types.bucket
    {
        gather(
            client,
            &a.datasets,
            a.recursive,
            a.depth,
            dataset_types,
            a.types.is_some(),
        )?
    } else {
        Vec::new()
    };
    if types.bookmark {
        datasets.extend(gather_bookmarks(
            client,
            &a.datasets,
            a.recursive || a.depth.is_some(),
        )?);
    }
    sort_datasets(&mut datasets, &a.sort_keys);
    if a.format.json {
        return json(&datasets);
    }
    if datasets.is_empty() {
        // On stderr, as zfs: a script counting lines sees none.
        if !a.format.scripted {
            eprintln!("no datasets available");
        }
        return Ok(());
    }
    out(&dataset_table(&datasets, &columns, a.format.parsable).render(a.format.scripted));
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
        for p in w {
            check_property(p)?;
        }
    }
    let row = |ds: &DatasetInfo, p: &dataset::Property| GetRow {
        name: ds.name.clone(),
        property: p.name.clone(),
        value: p.value.clone(),
        parsable: p.parsable.clone(),
        source: p.source.clone(),
    };
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
                rows.extend(ds.properties.iter().map(|p| row(ds, p)));
            }
            Some(w) => {
                for prop in w {
                    rows.push(match ds.property(prop) {
                        Some(p) => row(ds, p),
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
                    });
                }
            }
        }
    }
    Ok(rows)
}

const GET_FIELDS: &[&str] = &["name", "property", "value", "source"];
const SOURCES: &[&str] = &[
    "local",
    "default",
    "inherited",
    "temporary",
    "received",
    "none",
];

/// The `-s` class of a row's source: `inherited from X` is `inherited`, `-` is `none`.
fn source_class(source: &str) -> &str {
    match source {
        "-" => "none",
        s if s.starts_with("inherited") => "inherited",
        s => s,
    }
}

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
    let sources = match &a.sources {
        Some(s) => {
            let v = split_list(s);
            if let Some(bad) = v.iter().find(|s| !SOURCES.contains(&s.as_str())) {
                bail!("invalid source '{bad}' (valid: {})", SOURCES.join(", "));
            }
            Some(v)
        }
        None => None,
    };
    let types = parse_types(a.types.as_deref(), TypeFilter::ALL)?;
    if split_list(&a.props)
        .iter()
        .any(|p| p == "receive_resume_token")
    {
        // A receive cut a moment ago still saves its state: the token is
        // final once it ended (bounded; a running one shows its current).
        for ds in &a.datasets {
            let _ = client.receive_wait(ds, std::time::Duration::from_secs(5));
        }
    }
    let mut datasets = gather(
        client,
        &a.datasets,
        a.recursive,
        a.depth,
        types,
        a.types.is_some(),
    )?;
    sort_datasets(&mut datasets, &[]);
    let mut rows = get_rows(&datasets, &a.props)?;
    if let Some(s) = &sources {
        rows.retain(|r| s.iter().any(|c| c == source_class(&r.source)));
    }
    if a.format.json {
        return json(&rows);
    }
    out(&get_table(&rows, &fields, a.format.parsable).render(a.format.scripted));
    Ok(())
}

/// `set PROP=VALUE... DATASET...`: the assignments come first (a dataset name has no `=`).
pub fn set(client: &api::Client, a: SetArgs) -> Result<()> {
    let n = a.args.iter().take_while(|s| s.contains('=')).count();
    let (assignments, datasets) = a.args.split_at(n);
    if assignments.is_empty() {
        bail!("'{}' is not PROPERTY=VALUE", a.args[0]);
    }
    if datasets.is_empty() {
        bail!("missing dataset name after {}", assignments.join(" "));
    }
    let assignments = assignments
        .iter()
        .map(|s| parse_assignment(s))
        .collect::<Result<Vec<_>>>()?;
    for ds in datasets {
        for (prop, value) in &assignments {
            client.set_property(ds, prop, value)?;
        }
    }
    Ok(())
}

pub fn inherit(client: &api::Client, a: InheritArgs) -> Result<()> {
    let prop = canonical(&a.property);
    for ds in &a.datasets {
        client.inherit(ds, &prop, a.recursive)?;
    }
    Ok(())
}

pub fn rename(client: &api::Client, a: RenameArgs) -> Result<()> {
    client.rename(&a.from, &a.to, a.recursive)?;
    Ok(())
}

pub fn destroy(client: &api::Client, a: DestroyArgs) -> Result<()> {
    let opts = dataset::DestroyOptions {
        recursive: a.recursive,
        dry_run: a.dry_run,
        force: a.force,
        dependents: a.dependents,
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
    fn columns_are_checked_against_the_property_table() {
        let e = parse_columns("name,bogus").unwrap_err().to_string();
        assert!(e.contains("'bogus'"), "{e}");
        // Known properties a dataset lacks, and user properties, are fine.
        assert_eq!(
            parse_columns("name,origin,avail,com.example:note").unwrap(),
            cols("name,origin,available,com.example:note")
        );
        assert_eq!(
            parse_columns("space").unwrap(),
            cols("name,available,used,usedbysnapshots,usedbydataset,usedbyrefreservation,usedbychildren")
        );
        assert!(parse_columns(",").is_err());
    }

    #[test]
    fn types() {
        let f = |volume, filesystem, snapshot, bookmark, bucket| TypeFilter {
            volume,
            filesystem,
            snapshot,
            bookmark,
            bucket,
        };
        let parse = |s| parse_types(s, LIST_DEFAULT_TYPES);
        assert_eq!(parse(None).unwrap(), f(true, true, false, false, true));
        assert_eq!(
            parse(Some("volume")).unwrap(),
            f(true, false, false, false, false)
        );
        assert_eq!(
            parse(Some("fs")).unwrap(),
            f(false, true, false, false, false)
        );
        assert_eq!(
            parse(Some("snapshot")).unwrap(),
            f(false, false, true, false, false)
        );
        assert_eq!(
            parse(Some("bucket")).unwrap(),
            f(false, false, false, false, true)
        );
        assert!(parse(Some("snapshot")).unwrap().only_snapshots());
        assert_eq!(parse(Some("all")).unwrap(), TypeFilter::ALL);
        assert_eq!(
            parse(Some("bookmark,volume")).unwrap(),
            f(true, false, false, true, false)
        );
        assert!(parse(Some("bogus")).is_err());
        assert_eq!(depth_of("tank"), 0);
        assert_eq!(depth_of("tank/a@s"), 2);
    }

    fn snap(name: &str, txg: u64, creation: u64, used: u64) -> DatasetInfo {
        DatasetInfo {
            name: name.into(),
            kind: DatasetKind::Snapshot,
            properties: vec![
                prop("createtxg", "", &txg.to_string(), "-"),
                prop("creation", "", &creation.to_string(), "-"),
                prop("used", "", &used.to_string(), "-"),
            ],
        }
    }

    fn names(v: &[DatasetInfo]) -> Vec<&str> {
        v.iter().map(|d| d.name.as_str()).collect()
    }

    #[test]
    fn default_order_is_by_dataset_then_snapshot_creation() {
        let mut v = vec![
            snap("tank/vol0@z", 10, 100, 5),
            vol(),
            snap("tank/vol0@a", 12, 100, 900),
            root(),
            snap("tank@x", 3, 50, 1),
            snap("tank/vol0/b@m", 2, 10, 7),
        ];
        sort_datasets(&mut v, &[]);
        assert_eq!(
            names(&v),
            [
                "tank",
                "tank@x",
                "tank/vol0",
                "tank/vol0@z",
                "tank/vol0@a",
                "tank/vol0/b@m"
            ]
        );
    }

    #[test]
    fn sort_keys_numbers_numerically_then_the_default_order() {
        let key = |p: &str, descending| SortKey {
            prop: p.into(),
            descending,
        };
        let mut v = vec![
            snap("t/v@c", 3, 100, 9),
            snap("t/v@a", 1, 100, 10),
            snap("t/v@b", 2, 100, 9),
        ];
        // 9 < 10 as numbers (as text "10" < "9"); ties keep creation order.
        sort_datasets(&mut v, &[key("used", false)]);
        assert_eq!(names(&v), ["t/v@b", "t/v@c", "t/v@a"]);
        sort_datasets(&mut v, &[key("used", true)]);
        assert_eq!(names(&v), ["t/v@a", "t/v@b", "t/v@c"]);
        // Same second: creation ties break by txg, in the key's direction.
        sort_datasets(&mut v, &[key("creation", true)]);
        assert_eq!(names(&v), ["t/v@c", "t/v@b", "t/v@a"]);
        sort_datasets(&mut v, &[key("name", false)]);
        assert_eq!(names(&v), ["t/v@a", "t/v@b", "t/v@c"]);
        // Several keys; a dataset without the property sorts after those with it.
        let mut w = vec![vol(), snap("t/v@x", 1, 1, 10), root()];
        sort_datasets(&mut w, &[key("volsize", false), key("used", true)]);
        assert_eq!(names(&w), ["tank/vol0", "tank", "t/v@x"]);
    }

    #[test]
    fn sort_key_order_follows_the_command_line() {
        use clap::{CommandFactory, FromArgMatches};
        let m = crate::Cli::command()
            .try_get_matches_from([
                "cistern", "list", "-S", "used", "-s", "name", "-S", "creation",
            ])
            .unwrap();
        let mut cli = crate::Cli::from_arg_matches(&m).unwrap();
        let crate::Command::List(a) = &mut cli.command else {
            panic!("not list")
        };
        a.order_sort_keys(m.subcommand_matches("list"));
        let keys: Vec<(&str, bool)> = a
            .sort_keys
            .iter()
            .map(|k| (k.prop.as_str(), k.descending))
            .collect();
        assert_eq!(keys, [("used", true), ("name", false), ("creation", true)]);
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
