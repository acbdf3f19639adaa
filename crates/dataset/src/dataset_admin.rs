//! `rename` and `inherit`: commands that change dataset records' names and
//! locally set properties, with zfs's checks and messages.

use crate::engine::{check_new_dataset, split_dataset};
use crate::names::{check_property_name, is_user_property};
use crate::props::INHERITABLE;
use crate::snapshot::Action;
use crate::snapshot_admin::subtree;
use crate::*;

impl Engine {
    /// `cistern rename [-r] FROM TO`: a dataset (with its children and
    /// snapshots), or a snapshot (`TO` is `DS@new` or `@new`; with `-r` the
    /// same snapshot of every dataset below). Record ids stay, so open
    /// volumes and NBD connections keep working under the new name.
    pub fn rename(&self, from: &str, to: &str, recursive: bool) -> Result<Vec<String>> {
        let (pool, _) = split_dataset(from)?;
        let to = match (from.split_once('@'), to.strip_prefix('@')) {
            (Some((ds, _)), Some(snap)) => format!("{ds}@{snap}"),
            _ => to.to_string(),
        };
        let cannot = |why: &str| Error::InvalidArgument(format!("cannot rename to '{to}': {why}"));
        let (to_pool, to_rest) = split_dataset(&to)?;
        let p = self.pool(pool)?;
        let list: Vec<(u64, String)> = {
            let datasets = p.datasets.read();
            let rec = datasets
                .get(from)
                .ok_or_else(|| Error::NotFound(format!("cannot rename '{from}': dataset")))?;
            if datasets.contains_key(&to) {
                return Err(Error::AlreadyExists(format!(
                    "cannot rename to '{to}': dataset"
                )));
            }
            if let Some((ds, old)) = from.split_once('@') {
                let Some((to_ds, new)) = to.split_once('@').filter(|(d, _)| *d == ds) else {
                    return Err(cannot("snapshots must be part of same dataset"));
                };
                let _ = to_ds;
                let targets = if recursive {
                    subtree(&datasets, ds)
                } else {
                    vec![ds.to_string()]
                };
                let mut list = Vec::new();
                for t in targets {
                    let Some(s) = datasets.get(&format!("{t}@{old}")) else {
                        continue; // -r: children without that snapshot are skipped (as zfs)
                    };
                    let target = format!("{t}@{new}");
                    if datasets.contains_key(&target) {
                        return Err(Error::AlreadyExists(format!(
                            "cannot rename to '{target}': dataset"
                        )));
                    }
                    list.push((s.id, target));
                }
                list
            } else {
                if recursive {
                    return Err(Error::InvalidArgument(format!(
                        "cannot rename '{from}': source dataset for recursive rename must be a snapshot"
                    )));
                }
                if to.contains('@') {
                    return Err(cannot("snapshot delimiter '@' is not expected here"));
                }
                if !from.contains('/') || to_rest.is_none() {
                    return Err(Error::InvalidArgument(format!(
                        "cannot rename '{from}' to '{to}': a pool's root dataset cannot be renamed"
                    )));
                }
                if to_pool != pool {
                    return Err(cannot("datasets must be within same pool"));
                }
                if to.starts_with(&format!("{from}/")) {
                    return Err(cannot(
                        "New dataset name cannot be a descendant of current dataset name",
                    ));
                }
                match check_new_dataset(&datasets, &to) {
                    Err(Error::NotFound(_)) => {
                        return Err(Error::NotFound(format!("cannot rename to '{to}': parent")))
                    }
                    Err(Error::InvalidArgument(_)) => {
                        return Err(cannot("parent is not a filesystem"))
                    }
                    other => other?,
                }
                let _ = rec;
                // The dataset, everything below it and all their snapshots.
                let (dir, at) = (format!("{from}/"), format!("{from}@"));
                datasets
                    .values()
                    .filter(|d| d.name.starts_with(&dir) || d.name.starts_with(&at))
                    .map(|d| (d.id, format!("{to}{}", &d.name[from.len()..])))
                    .chain(std::iter::once((rec.id, to.clone())))
                    .collect()
            }
        };
        if list.is_empty() {
            return Err(Error::NotFound(format!("cannot rename '{from}': dataset")));
        }
        if let Some((_, long)) = list.iter().find(|(_, n)| n.len() > names::MAX_NAME_LEN) {
            return Err(Error::InvalidArgument(format!(
                "cannot rename to '{long}': name is too long"
            )));
        }
        let renamed: Vec<String> = list.iter().map(|(_, n)| n.clone()).collect();
        let moves: Vec<(String, String)> = {
            let datasets = p.datasets.read();
            list.iter()
                .filter_map(|(id, new)| {
                    let old = datasets.values().find(|d| d.id == *id)?;
                    Some((old.name.clone(), new.clone()))
                })
                .collect()
        };
        p.commit_txg(Some(Action::Rename(list)))?;
        // Open handles follow, so a busy check on the new name sees them.
        self.inner.holders.rename(&moves);
        tracing::info!(from, to = %to, renamed = renamed.len(), "renamed");
        Ok(renamed)
    }

    /// `cistern inherit [-r] PROP DS`: the property is no longer set
    /// locally, so it is inherited (or the default) again; a user property
    /// set here disappears unless a parent has it. `-r`: every dataset below too
    /// (not snapshots, as zfs).
    pub fn inherit_property(&self, name: &str, prop: &str, recursive: bool) -> Result<()> {
        check_property_name(prop)?;
        let user = is_user_property(prop);
        if !user && !INHERITABLE.contains(&prop) {
            return Err(Error::InvalidArgument(format!(
                "cannot inherit {prop} for '{name}': '{prop}' property cannot be inherited"
            )));
        }
        let (pool, _) = split_dataset(name)?;
        let p = self.pool(pool)?;
        let targets: Vec<props::DatasetRecord> = {
            let datasets = p.datasets.read();
            let rec = datasets
                .get(name)
                .ok_or_else(|| Error::NotFound(format!("dataset '{name}'")))?;
            if rec.is_snapshot() && !user {
                return Err(Error::InvalidArgument(format!(
                    "cannot inherit {prop} for '{name}': this property can not be modified for snapshots"
                )));
            }
            let names = if recursive && !rec.is_snapshot() {
                subtree(&datasets, name)
            } else {
                vec![name.to_string()]
            };
            names
                .iter()
                .filter_map(|n| datasets.get(n))
                .filter(|r| r.local.contains_key(prop))
                .cloned()
                .collect()
        };
        for mut rec in targets {
            rec.local.remove(prop);
            p.store_dataset(&rec)?;
            tracing::info!(dataset = %rec.name, prop, "property inherited");
        }
        Ok(())
    }
}
