// THROWAWAY (not committed): serve S3 over a fresh pool until killed.
use dataset::*;
use std::sync::Arc;

#[test]
fn serve_forever() {
    let dir = std::path::PathBuf::from(std::env::var("ZZ_DIR").unwrap());
    let port: u16 = std::env::var("ZZ_PORT").unwrap().parse().unwrap();
    let engine = Engine::open(&dir.join("state"), EngineConfig { multihost_interval_ms: 50, ..EngineConfig::default() }).unwrap();
    engine
        .create_pool(PoolSpec {
            name: "tank".into(),
            groups: vec![GroupSpec { kind: GroupKind::Mirror, devices: vec![dir.join("d0"), dir.join("d1")] }],
            create_size: Some(2 << 30),
            force: false,
        })
        .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let l = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let users = Arc::new(s3::access::Users::single("AKTESTCISTERN", "secret-for-tests-only"));
        let cfg = s3::S3Config { parent: "tank".into(), domain: Some("s3.local".into()), ..Default::default() };
        s3::serve(l, engine, cfg, users, std::future::pending::<()>()).await.unwrap();
    });
}
