//! Subscribers follow the map through pushed deltas: from epoch 0 (catch-up)
//! and from a map fetched mid-stream, on a follower as well as the leader,
//! ending equal to the monitors' own map.

mod common;

use std::time::Duration;

use common::{boot_osds, leader, wait_for, Cluster};
use duplex_map::{ClusterMap, Command};

#[test]
fn subscribers_follow_every_epoch() {
    let cluster = Cluster::new(3, &[]);
    let mut client = cluster.client();
    wait_for("a leader", Duration::from_secs(20), || leader(&cluster, &client).is_some());
    let lead = leader(&cluster, &client).unwrap();
    let follower = *cluster.children.keys().find(|id| **id != lead).unwrap();

    boot_osds(&mut client, 5);
    // One subscriber from scratch on a follower, one from a fetched map on the leader.
    let mut from_scratch = client.subscribe(follower, ClusterMap::new(client.map(follower).unwrap().fsid)).unwrap();
    let fetched = client.map(lead).unwrap();
    let fetched_epoch = fetched.epoch;
    let mut from_fetched = client.subscribe(lead, fetched).unwrap();

    for i in 0..10 {
        client.command(&Command::PoolCreate { name: format!("p{i}"), size: 2, min_size: 1, pg_num: 16 }).unwrap();
    }
    client.command(&Command::MarkDown { id: 3 }).unwrap();
    let target = client.map(lead).unwrap();
    for subscription in [&mut from_scratch, &mut from_fetched] {
        let mut epochs = Vec::new();
        while subscription.map().epoch < target.epoch {
            epochs.push(subscription.next(Duration::from_secs(10)).unwrap());
        }
        assert!(epochs.windows(2).all(|w| w[0] < w[1]), "epochs must only grow: {epochs:?}");
        assert_eq!(subscription.map(), &target, "the followed map differs from the monitor's");
    }
    assert!(fetched_epoch >= 5 && target.epoch == fetched_epoch + 11);
}
