//! The test cluster: [`duplex_testkit::LocalCluster`] with this
//! package's `duplex-osd` binary and a pool "test" (size 2, min_size 1).

#![allow(dead_code)]

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use duplex_client::ObjectClient;
use duplex_testkit::{credentials, LocalCluster, LocalOptions};

#[allow(unused_imports)]
pub use duplex_testkit::fsid;

pub struct TestCluster(LocalCluster);

impl Deref for TestCluster {
    type Target = LocalCluster;
    fn deref(&self) -> &LocalCluster {
        &self.0
    }
}

impl DerefMut for TestCluster {
    fn deref_mut(&mut self) -> &mut LocalCluster {
        &mut self.0
    }
}

impl TestCluster {
    pub fn new(osds: u32, pg_num: u32, osd_args: &[&str]) -> TestCluster {
        let options = LocalOptions {
            osd_binary: env!("CARGO_BIN_EXE_duplex-osd").into(),
            osd_prefix_args: Vec::new(),
            dir: None,
            store_bytes: 256 << 20,
            store_partitions: 2,
            // DUPLEX_TEST_OSD_ARGS="--connection-policy lcam --priority-threads 2":
            // these tests under another OSD configuration (docs/RELIABILITY.md).
            osd_args: osd_args
                .iter()
                .map(|s| s.to_string())
                .chain(std::env::var("DUPLEX_TEST_OSD_ARGS").unwrap_or_default().split_whitespace().map(String::from))
                .collect(),
            osd_stderr: true,
            monitor_grace_ms: 20_000,
        };
        // The pool first: OSDs then see it in their first map.
        let cluster = LocalCluster::start(0, options).unwrap();
        cluster.create_pool("test", 2, 1, pg_num).unwrap();
        let mut cluster = TestCluster(cluster);
        for id in 0..osds {
            cluster.start_osd(id);
        }
        cluster
    }

    pub fn start_osd(&mut self, id: u32) {
        self.0.start_osd(id).unwrap();
    }

    pub fn kill_osd(&mut self, id: u32) {
        self.0.kill_osd(id).unwrap();
    }

    pub fn wait_all_up(&self) {
        self.0.wait_all_up(Duration::from_secs(30)).unwrap();
    }

    pub fn metric_sum(&self, name_and_labels: &str) -> f64 {
        self.0.metric_sum(name_and_labels).unwrap()
    }

    pub fn client(&self) -> ObjectClient {
        let mut client = ObjectClient::connect(self.monitors(), credentials("client.test")).unwrap();
        client.timeout = Duration::from_secs(60);
        client
    }

    /// Waits until every primary of `osds` reports no acknowledged write
    /// of an eventual PG that its replicas lack (the gauge is kept by
    /// each OSD's peering tick).
    pub fn wait_replicated(&self, osds: u32) {
        let started = std::time::Instant::now();
        loop {
            let pages: Vec<String> = (0..osds).map(|id| self.0.metrics(id).unwrap()).collect();
            let unreplicated: f64 = pages
                .iter()
                .flat_map(|page| page.lines())
                .filter(|line| line.starts_with("duplex_osd_pg_unreplicated_writes{"))
                .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                .sum();
            let reported = pages.iter().any(|page| page.contains("duplex_osd_pg_unreplicated_writes{"));
            if reported && unreplicated == 0.0 {
                return;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "replicas never caught up ({unreplicated} writes)");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn pool(&self, client: &ObjectClient) -> u32 {
        client.pool_id("test").unwrap()
    }
}
