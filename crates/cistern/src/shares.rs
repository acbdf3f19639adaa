//! The daemon's file sharing protocols as the API sees them
//! (`api::shares::ShareService`): today SMB through the `smb` crate.

use api::shares::ShareService;
use api::{ShareInfo, ShareList, ShareProblem};
use std::sync::Arc;

pub struct Smb(pub Arc<smb::Samba>);

fn engine_error(e: smb::Error) -> dataset::Error {
    match e {
        smb::Error::Engine(e) => e,
        e @ smb::Error::NotShareable { .. } => dataset::Error::InvalidArgument(e.to_string()),
        e => dataset::Error::Io(e.to_string()),
    }
}

fn info(s: &smb::shares::Share) -> ShareInfo {
    ShareInfo {
        protocol: "smb".into(),
        dataset: s.dataset.clone(),
        name: s.name.clone(),
        path: s.path.clone(),
    }
}

impl ShareService for Smb {
    fn protocol(&self) -> &'static str {
        "smb"
    }

    fn refresh(&self) -> dataset::Result<()> {
        self.0.refresh().map_err(engine_error)
    }

    fn share(&self, dataset: Option<&str>) -> dataset::Result<Vec<ShareInfo>> {
        let made = self.0.share(dataset).map_err(engine_error)?;
        Ok(made.iter().map(info).collect())
    }

    fn unshare(&self, dataset: Option<&str>) -> dataset::Result<Vec<ShareInfo>> {
        let gone = self.0.unshare(dataset).map_err(engine_error)?;
        Ok(gone.iter().map(info).collect())
    }

    fn list(&self) -> ShareList {
        ShareList {
            shares: self.0.shares().iter().map(info).collect(),
            problems: self
                .0
                .problems()
                .into_iter()
                .map(|p| ShareProblem {
                    protocol: "smb".into(),
                    dataset: p.dataset,
                    why: p.why,
                })
                .collect(),
        }
    }
}
