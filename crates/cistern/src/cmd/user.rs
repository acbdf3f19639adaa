//! `cistern user add|list|remove|grant|revoke`: access keys for the S3
//! endpoint and their grants per bucket (kept by the daemon; see
//! `s3::access` and docs/decisions/0019-s3-users.md).

use crate::cmd::{split_list, OutputFlags};
use crate::format::Table;
use crate::output::{json, out, outln};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use s3::access::{Access, Grant, UserInfo};

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Make a user with a new access key; prints the key and its secret, once.
    Add(AddArgs),
    /// List users, their access keys and grants (never secrets).
    List(ListArgs),
    /// Remove a user: its access key stops working at once.
    Remove(NameArgs),
    /// Let a user read (ro) or read and write (rw) a bucket (`*`: every bucket).
    Grant(GrantArgs),
    /// Take a user's grant on a bucket away.
    Revoke(RevokeArgs),
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// BUCKET=ro or BUCKET=rw (repeatable; BUCKET `*` is every bucket).
    #[arg(long = "grant", short = 'g', value_name = "BUCKET=ro|rw")]
    pub grants: Vec<String>,
    /// Scripted: one line, NAME<TAB>ACCESS_KEY<TAB>SECRET.
    #[arg(short = 'H')]
    pub scripted: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// User name: letters, digits, _ - . @
    pub name: String,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub format: OutputFlags,
    /// Columns: name, access_key, created, grants (comma-separated).
    #[arg(short = 'o', value_name = "COLS")]
    pub columns: Option<String>,
}

#[derive(Debug, Args)]
pub struct NameArgs {
    pub name: String,
}

#[derive(Debug, Args)]
pub struct GrantArgs {
    pub name: String,
    /// S3 bucket name, or `*` for every bucket.
    pub bucket: String,
    /// ro (read) or rw (read-write).
    pub access: String,
}

#[derive(Debug, Args)]
pub struct RevokeArgs {
    pub name: String,
    pub bucket: String,
}

pub fn run(client: &api::Client, c: UserCommand) -> Result<()> {
    match c {
        UserCommand::Add(a) => add(client, a),
        UserCommand::List(a) => list(client, a),
        UserCommand::Remove(a) => client
            .remove_user(&a.name)
            .with_context(|| format!("cannot remove user '{}'", a.name)),
        UserCommand::Grant(a) => {
            let access: Access = a
                .access
                .parse()
                .with_context(|| format!("cannot grant '{}' to '{}'", a.bucket, a.name))?;
            client
                .grant(&a.name, &a.bucket, access)
                .with_context(|| format!("cannot grant '{}' to '{}'", a.bucket, a.name))?;
            Ok(())
        }
        UserCommand::Revoke(a) => {
            client
                .revoke(&a.name, &a.bucket)
                .with_context(|| format!("cannot revoke '{}' from '{}'", a.bucket, a.name))?;
            Ok(())
        }
    }
}

fn add(client: &api::Client, a: AddArgs) -> Result<()> {
    let what = || format!("cannot add user '{}'", a.name);
    let grants = a
        .grants
        .iter()
        .flat_map(|g| split_list(g))
        .map(|g| g.parse::<Grant>())
        .collect::<Result<Vec<_>, _>>()
        .with_context(what)?;
    let nu = client.add_user(&a.name, &grants).with_context(what)?;
    if a.json {
        return json(&nu);
    }
    if a.scripted {
        outln(&format!(
            "{}\t{}\t{}",
            nu.name, nu.access_key, nu.secret_key
        ));
    } else {
        outln(&format!("user               {}", nu.name));
        outln(&format!("access key id      {}", nu.access_key));
        outln(&format!("secret access key  {}", nu.secret_key));
        outln(&format!("grants             {}", grants_cell(&nu.grants)));
    }
    eprintln!(
        "The secret is shown this once; the daemon keeps it encrypted and never prints it again."
    );
    Ok(())
}

fn grants_cell(g: &[Grant]) -> String {
    if g.is_empty() {
        return "-".into();
    }
    g.iter().map(Grant::to_string).collect::<Vec<_>>().join(",")
}

const COLUMNS: [&str; 4] = ["name", "access_key", "created", "grants"];

fn cell(u: &UserInfo, col: &str, parsable: bool) -> String {
    match col {
        "name" => u.name.clone(),
        "access_key" => u.access_key.clone(),
        "created" if parsable => u.created.to_string(),
        "created" => dataset::props::format_time(u.created),
        _ => grants_cell(&u.grants),
    }
}

fn list(client: &api::Client, a: ListArgs) -> Result<()> {
    let cols = match &a.columns {
        None => COLUMNS.iter().map(|c| c.to_string()).collect(),
        Some(s) => {
            let cols: Vec<String> = split_list(s)
                .into_iter()
                .map(|c| c.to_ascii_lowercase().replace('-', "_"))
                .collect();
            for c in &cols {
                if !COLUMNS.contains(&c.as_str()) {
                    bail!("invalid column '{c}' (valid: {})", COLUMNS.join(", "));
                }
            }
            if cols.is_empty() {
                bail!("no columns given to -o");
            }
            cols
        }
    };
    let users = client.users()?;
    if a.format.json {
        return json(&users);
    }
    let headers: Vec<String> = cols.iter().map(|c| c.to_ascii_uppercase()).collect();
    let mut t = Table::new(&headers);
    for u in &users {
        t.push(cols.iter().map(|c| cell(u, c, a.format.parsable)).collect());
    }
    out(&t.render(a.format.scripted));
    Ok(())
}
