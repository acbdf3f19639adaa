//! The router over a real engine on a temporary state directory, driven
//! through the blocking client.

use api::{Client, ClientError};
use dataset::{Engine, EngineConfig, GroupKind, GroupSpec, PoolSpec};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

struct Server {
    url: String,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
    engine: Arc<Engine>,
}

impl Server {
    fn start(state: &Path) -> Server {
        let engine = Engine::open(state, EngineConfig::default()).expect("open engine");
        let (tx, mut rx) = tokio::sync::watch::channel(false);
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let e = engine.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                let state =
                    api::ApiState::new(e).with_metrics(Arc::new(|| "extra_metric 1\n".to_string()));
                api::server::serve(listener, state, async move {
                    let _ = rx.wait_for(|v| *v).await;
                })
                .await
                .unwrap();
            });
        });
        let addr = addr_rx.recv().unwrap();
        Server {
            url: format!("http://{addr}"),
            stop: Some(tx),
            thread: Some(thread),
            engine,
        }
    }

    fn client(&self) -> Client {
        Client::with_timeout(&self.url, Duration::from_secs(60))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The engine may be stuck; do not wait for it.
            return;
        }
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = self.engine.shutdown();
    }
}

fn api_err(e: ClientError) -> (u16, String, String) {
    match e {
        ClientError::Api {
            status,
            kind,
            message,
        } => (status, kind, message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[test]
fn routes_and_error_mapping() {
    let tmp = tempfile::tempdir().unwrap();
    let srv = Server::start(&tmp.path().join("state"));
    let c = srv.client();

    assert_eq!(c.health().unwrap().status, "ok");
    assert!(c.list_pools().unwrap().is_empty());

    let disks = tmp.path().join("disks");
    std::fs::create_dir_all(&disks).unwrap();
    let spec = PoolSpec {
        name: "tank".into(),
        groups: vec![GroupSpec {
            kind: GroupKind::Disk,
            devices: vec![disks.join("d0")],
        }],
        create_size: Some(512 << 20),
        force: false,
    };
    let st = c.create_pool(&spec).unwrap();
    assert_eq!(st.summary.name, "tank");
    let (status, kind, msg) = api_err(c.create_pool(&spec).unwrap_err());
    assert_eq!((status, kind.as_str()), (409, "AlreadyExists"), "{msg}");

    assert_eq!(c.pool_status("tank").unwrap().groups.len(), 1);
    let (status, kind, _) = api_err(c.pool_status("nope").unwrap_err());
    assert_eq!((status, kind.as_str()), (404, "NotFound"));

    let v = c
        .create_volume("tank/v", 32 << 20, &[("compression".into(), "lz4".into())])
        .unwrap();
    assert_eq!(v.name, "tank/v");
    let (status, kind, _) = api_err(
        c.create_volume("tank/w", 32 << 20, &[("compression".into(), "nope".into())])
            .unwrap_err(),
    );
    assert_eq!((status, kind.as_str()), (400, "InvalidArgument"));

    let names: Vec<String> = c
        .list_datasets(None)
        .unwrap()
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert_eq!(names, ["tank", "tank/v"]);
    assert_eq!(c.list_datasets(Some("tank/v")).unwrap().len(), 1);
    assert_eq!(
        c.dataset("tank/v")
            .unwrap()
            .property("compression")
            .unwrap()
            .value,
        "lz4"
    );
    let after = c.set_property("tank/v", "compression", "off").unwrap();
    assert_eq!(after.property("compression").unwrap().value, "off");
    let (status, _, _) = api_err(c.set_property("tank/v", "used", "1").unwrap_err());
    assert!(status == 400 || status == 409, "{status}");
    let (status, _, _) = api_err(c.dataset("tank/none").unwrap_err());
    assert_eq!(status, 404);

    c.destroy("tank/v", &Default::default()).unwrap();
    c.export_pool("tank").unwrap();
    let found = c.importable_pools(std::slice::from_ref(&disks)).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].name, "tank");
    c.import_pool("tank", std::slice::from_ref(&disks), false)
        .unwrap();

    // Last: a scrape that hangs in the engine would wedge the pool for the steps after it.
    let scrape = Client::with_timeout(&srv.url, Duration::from_secs(20));
    let metrics = scrape.metrics().expect("GET /metrics");
    assert!(
        metrics.contains("cistern_pool_txg_commits_total{pool=\"tank\"}"),
        "{metrics}"
    );
    for family in [
        "cistern_device_errors_total{pool=\"tank\",device=",
        "cistern_device_state{pool=\"tank\",device=",
    ] {
        assert!(metrics.contains(family), "{family} missing:\n{metrics}");
    }
    assert!(metrics.ends_with("extra_metric 1\n"), "{metrics}");

    c.destroy_pool("tank").unwrap();
    assert!(c.list_pools().unwrap().is_empty());
}

#[test]
fn rename_inherit_and_user_properties() {
    let tmp = tempfile::tempdir().unwrap();
    let srv = Server::start(&tmp.path().join("state"));
    let c = srv.client();
    let disks = tmp.path().join("disks");
    std::fs::create_dir_all(&disks).unwrap();
    c.create_pool(&PoolSpec {
        name: "tank".into(),
        groups: vec![GroupSpec {
            kind: GroupKind::Disk,
            devices: vec![disks.join("d0")],
        }],
        create_size: Some(512 << 20),
        force: false,
    })
    .unwrap();
    c.create_volume("tank/a", 32 << 20, &[]).unwrap();
    c.snapshot(&["tank/a@20131124_1344".into()], false).unwrap();
    let renamed = c.rename("tank/a", "tank/b", false).unwrap();
    assert_eq!(renamed.len(), 2);
    assert!(renamed.contains(&"tank/b@20131124_1344".to_string()));
    let (status, kind, msg) = api_err(c.rename("tank/b", "tank/b", false).unwrap_err());
    assert_eq!((status, kind.as_str()), (409, "AlreadyExists"), "{msg}");
    assert_eq!(msg, "cannot rename to 'tank/b': dataset already exists");

    c.set_property("tank", "com.example:note", "hi").unwrap();
    c.set_property("tank/b", "compression", "zstd").unwrap();
    let src = |ds: &str, p: &str| {
        c.dataset(ds)
            .unwrap()
            .property(p)
            .map(|p| (p.value.clone(), p.source.clone()))
    };
    assert_eq!(
        src("tank/b", "com.example:note"),
        Some(("hi".into(), "inherited from tank".into()))
    );
    c.inherit("tank/b", "compression", false).unwrap();
    assert_eq!(
        src("tank/b", "compression"),
        Some(("lz4".into(), "default".into()))
    );
    c.inherit("tank", "com.example:note", true).unwrap();
    assert_eq!(src("tank/b", "com.example:note"), None);
    let (status, _, msg) = api_err(c.inherit("tank/b", "volsize", false).unwrap_err());
    assert_eq!(status, 400, "{msg}");
    let (status, _, msg) = api_err(
        c.set_property("tank/b@20131124_1344", "compression", "off")
            .unwrap_err(),
    );
    assert_eq!(status, 400);
    assert!(msg.contains("can not be modified for snapshots"), "{msg}");
}
