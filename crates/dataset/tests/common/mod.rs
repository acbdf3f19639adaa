//! Helpers shared by the model tests (`snapshots.rs`, `objects_model.rs`).

use dataset::*;
use std::path::Path;

/// Commits happen when the test (or an admin command) asks.
pub fn config() -> EngineConfig {
    EngineConfig {
        txg_timeout_secs: 3600.0,
        multihost_interval_ms: 50,
        ..EngineConfig::default()
    }
}

/// Pool `tank`: a mirror of two 256 MiB files in `dir`.
pub fn create_pool(engine: &Engine, dir: &Path) {
    engine
        .create_pool(PoolSpec {
            name: "tank".into(),
            groups: vec![GroupSpec {
                kind: GroupKind::Mirror,
                devices: vec![dir.join("d0"), dir.join("d1")],
            }],
            create_size: Some(256 << 20),
            force: false,
        })
        .unwrap();
}

/// A numeric property of a dataset or snapshot, parsed from its `-p` form.
pub fn prop(engine: &Engine, ds: &str, name: &str) -> u64 {
    engine
        .dataset(ds)
        .unwrap()
        .property(name)
        .unwrap_or_else(|| panic!("{ds} has no {name}"))
        .parsable
        .parse()
        .unwrap()
}
