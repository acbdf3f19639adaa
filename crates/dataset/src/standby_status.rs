//! `pool status` of a pool this daemon stands by for (`serve --standby`,
//! decision 0048): not imported, so it is described from the tail's progress.

use crate::{DeviceStatus, GroupKind, GroupStatus, PoolStatus, PoolSummary};
use std::path::PathBuf;

pub(crate) fn of(pool: &str) -> Option<PoolStatus> {
    let s = vdev::standby::status(pool)?;
    let size = s.size.unwrap_or(0);
    let mut status = format!(
        "standby: tailing {} (every log record before {} applied, {} since start; owner {}; owner still for {:.0}s)",
        s.location,
        s.next_seq,
        s.records_applied,
        s.owner.as_deref().unwrap_or("unknown"),
        s.idle_secs
    );
    if let Some(after) = s.takeover_after_secs {
        status.push_str(&format!("; automatic takeover after {after}s"));
    }
    if let Some(e) = &s.error {
        status.push_str(&format!("; last error: {e}"));
    }
    Some(PoolStatus {
        summary: PoolSummary {
            name: pool.to_string(),
            guid: 0,
            size,
            allocated: 0,
            free: 0,
            health: "STANDBY".into(),
            txg: 0,
            raw_size: size,
            raw_allocated: 0,
            fragmentation: None,
            bucket: None,
        },
        groups: vec![GroupStatus {
            name: s.location.clone(),
            kind: GroupKind::Disk,
            state: "STANDBY".into(),
            devices: vec![DeviceStatus {
                path: PathBuf::from(&s.location),
                guid: 0,
                state: "STANDBY".into(),
                read_errors: 0,
                write_errors: 0,
                checksum_errors: 0,
                resilvering: false,
                reason: s.error.clone(),
                was: None,
            }],
        }],
        logs: vec![],
        errors: vec![],
        scan: None,
        data_errors: vec![],
        status: Some(status),
        action: Some(format!(
            "cistern pool takeover {pool} (sent to this daemon) makes it the owner"
        )),
        suspended: None,
        memory: None,
        cache: vec![],
    })
}
