//! `load-key`, `unload-key`, `change-key` (as zfs), and the key a `create`
//! with keylocation=prompt reads from standard input (decision 0026).
//! Key material goes to the daemon in the request body only: never on the
//! command line (which pool history records), never logged.

use anyhow::{bail, Result};
use clap::Args;
use std::io::{IsTerminal, Read};

use super::props::parse_assignment;

#[derive(Debug, Args)]
pub struct LoadKeyArgs {
    /// Every encryption root whose key is not loaded (keys from their keylocation).
    #[arg(short = 'a')]
    pub all: bool,
    /// Check the key only (a dry run); nothing is loaded.
    #[arg(short = 'n')]
    pub noop: bool,
    /// Where the key is this time: prompt or file:///path (default: keylocation).
    #[arg(short = 'L', value_name = "KEYLOCATION")]
    pub location: Option<String>,
    /// POOL/DS: an encryption root.
    pub dataset: Option<String>,
}

#[derive(Debug, Args)]
pub struct UnloadKeyArgs {
    /// Every encryption root whose key is loaded.
    #[arg(short = 'a')]
    pub all: bool,
    pub dataset: Option<String>,
}

#[derive(Debug, Args)]
pub struct ChangeKeyArgs {
    /// keyformat=passphrase|hex|raw, keylocation=prompt|file:///path, pbkdf2iters=N.
    #[arg(short = 'o', value_name = "PROP=VALUE")]
    pub props: Vec<String>,
    /// Load the key first (from keylocation or the prompt), as zfs change-key -l.
    #[arg(short = 'l')]
    pub load: bool,
    /// Inherit the parent's key: the dataset stops being an encryption root
    /// (its key is then wrapped by the parent's; no data is rewritten).
    #[arg(short = 'i', conflicts_with = "props")]
    pub inherit: bool,
    pub dataset: String,
}

/// The key for `keylocation=prompt`, from standard input: a passphrase or
/// hex key ends at the first newline; a raw key is the 32 bytes read.
pub fn read_prompt(what: &str, format: &str) -> Result<dataset::KeyMaterial> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprint!("Enter {format} for '{what}': ");
    }
    let mut buf = zeroize::Zeroizing::new(Vec::new());
    stdin.lock().take(4096).read_to_end(&mut buf)?;
    let key: &[u8] = if format == "raw" {
        &buf[..]
    } else {
        let end = buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len());
        &buf[..end]
    };
    if key.is_empty() {
        bail!("no key given on standard input for '{what}'");
    }
    Ok(dataset::KeyMaterial::from_bytes(key))
}

/// For `create`: the key of a new encryption root with keylocation=prompt.
pub fn create_key(name: &str, props: &[(String, String)]) -> Result<Option<dataset::KeyMaterial>> {
    let get = |k: &str| props.iter().find(|(p, _)| p == k).map(|(_, v)| v.as_str());
    let format = match get("keyformat") {
        Some(f) => f,
        None => return Ok(None),
    };
    if get("encryption") == Some("off") {
        return Ok(None);
    }
    match get("keylocation") {
        None | Some("prompt") => read_prompt(name, format).map(Some),
        Some(_) => Ok(None),
    }
}

fn key_property(client: &api::Client, ds: &str, prop: &str) -> Result<String> {
    let info = client.dataset(ds)?;
    Ok(info
        .property(prop)
        .map(|p| p.value.clone())
        .unwrap_or_default())
}

pub fn load_key(client: &api::Client, a: LoadKeyArgs) -> Result<()> {
    let mut req = api::LoadKeyRequest {
        name: a.dataset.clone(),
        all: a.all,
        noop: a.noop,
        location: a.location.clone(),
        key: None,
    };
    match (&a.dataset, a.all) {
        (Some(ds), false) => {
            let location = match &a.location {
                Some(l) => l.clone(),
                None => key_property(client, ds, "keylocation")?,
            };
            if location == "prompt" {
                let format = key_property(client, ds, "keyformat")?;
                req.key = Some(read_prompt(ds, &format)?);
            }
        }
        (None, true) => {
            if a.location.is_some() {
                bail!("-L cannot be used with -a");
            }
        }
        _ => bail!("usage: cistern load-key [-n] [-L keylocation] -a | POOL/DS"),
    }
    let r = client.load_key(&req)?;
    for (ds, why) in &r.failed {
        eprintln!("cannot load key for '{ds}': {why}");
    }
    if a.all {
        eprintln!(
            "{} / {} key(s) successfully loaded",
            r.done.len(),
            r.done.len() + r.failed.len()
        );
    }
    if !r.failed.is_empty() {
        bail!("{} key(s) not loaded", r.failed.len());
    }
    Ok(())
}

pub fn unload_key(client: &api::Client, a: UnloadKeyArgs) -> Result<()> {
    if a.all == a.dataset.is_some() {
        bail!("usage: cistern unload-key -a | POOL/DS");
    }
    let r = client.unload_key(&api::UnloadKeyRequest {
        name: a.dataset,
        all: a.all,
    })?;
    for (ds, why) in &r.failed {
        eprintln!("cannot unload key for '{ds}': {why}");
    }
    if !r.failed.is_empty() {
        bail!("{} key(s) not unloaded", r.failed.len());
    }
    Ok(())
}

pub fn change_key(client: &api::Client, a: ChangeKeyArgs) -> Result<()> {
    let props = a
        .props
        .iter()
        .map(|p| parse_assignment(p))
        .collect::<Result<Vec<_>>>()?;
    let get = |k: &str| props.iter().find(|(p, _)| p == k).map(|(_, v)| v.clone());
    if a.load && key_property(client, &a.dataset, "keystatus")? != "available" {
        load_key(
            client,
            LoadKeyArgs {
                all: false,
                noop: false,
                location: None,
                dataset: Some(a.dataset.clone()),
            },
        )?;
    }
    if a.inherit {
        client.change_key(&api::ChangeKeyRequest {
            name: a.dataset,
            inherit: true,
            ..Default::default()
        })?;
        return Ok(());
    }
    let location = match get("keylocation") {
        Some(l) => l,
        None => key_property(client, &a.dataset, "keylocation")?,
    };
    let format = match get("keyformat") {
        Some(f) => f,
        None => key_property(client, &a.dataset, "keyformat")?,
    };
    let key = if location == "prompt" {
        Some(read_prompt(&a.dataset, &format)?)
    } else {
        None
    };
    client.change_key(&api::ChangeKeyRequest {
        name: a.dataset,
        properties: props,
        key,
        inherit: false,
    })?;
    Ok(())
}
