//! Two "hosts" for partition tests: network namespaces this test creates,
//! joined by one veth pair, so that a partition is `ip link set … down`.
//! Nothing outside them is ever a target. Needs root (CI runs as root).

use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::process::Command;

use super::run_ok;

pub struct Hosts {
    /// Namespace names.
    pub a: String,
    pub b: String,
    pub ip_a: IpAddr,
    pub ip_b: IpAddr,
    veth_a: String,
}

impl Hosts {
    /// Creates namespaces `dxa<pid><n>` and `dxb<pid><n>` (n counts the
    /// hosts this process made: two tests of one binary run at once) with
    /// addresses 10.213.N.1 and 10.213.N.2 on the two ends of a veth pair.
    pub fn create() -> Hosts {
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "the partition tests need root for network namespaces");
        let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 10;
        let pid = std::process::id() % 100_000;
        // Interface names hold 15 bytes: "dxva" and at most 6 digits.
        let tag = format!("{pid}{made}");
        let subnet = (pid * 10 + made) % 250;
        let hosts = Hosts {
            a: format!("dxa{tag}"),
            b: format!("dxb{tag}"),
            ip_a: format!("10.213.{subnet}.1").parse().unwrap(),
            ip_b: format!("10.213.{subnet}.2").parse().unwrap(),
            veth_a: format!("dxva{tag}"),
        };
        let veth_b = format!("dxvb{tag}");
        for ns in [&hosts.a, &hosts.b] {
            run_ok(Command::new("ip").args(["netns", "add", ns]));
            run_ok(Command::new("ip").args(["-n", ns, "link", "set", "lo", "up"]));
        }
        run_ok(Command::new("ip").args([
            "link",
            "add",
            &hosts.veth_a,
            "netns",
            &hosts.a,
            "type",
            "veth",
            "peer",
            "name",
            &veth_b,
            "netns",
            &hosts.b,
        ]));
        for (ns, dev, ip) in [(&hosts.a, &hosts.veth_a, hosts.ip_a), (&hosts.b, &veth_b, hosts.ip_b)] {
            run_ok(Command::new("ip").args(["-n", ns, "addr", "add", &format!("{ip}/24"), "dev", dev]));
            run_ok(Command::new("ip").args(["-n", ns, "link", "set", dev, "up"]));
        }
        hosts
    }

    /// The link between the hosts, to cut and heal from any thread.
    pub fn link(&self) -> Link {
        Link { ns: self.a.clone(), veth: self.veth_a.clone() }
    }

    /// Moves the calling thread into namespace `ns`: its sockets, the
    /// threads it starts and the processes it spawns live there.
    pub fn enter(ns: &str) {
        let file = std::fs::File::open(format!("/run/netns/{ns}")).expect("the namespace exists");
        // SAFETY: setns on an open namespace file; it changes only this thread.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns into {ns}: {}", std::io::Error::last_os_error());
    }

    /// `duplex <args>` run inside namespace `ns`.
    pub fn duplex_in(ns: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", ns]).arg(super::duplex().get_program());
        command
    }
}

#[derive(Clone)]
pub struct Link {
    ns: String,
    veth: String,
}

impl Link {
    /// Nothing crosses in either direction from now on.
    pub fn cut(&self) {
        run_ok(Command::new("ip").args(["-n", &self.ns, "link", "set", &self.veth, "down"]));
    }

    pub fn heal(&self) {
        run_ok(Command::new("ip").args(["-n", &self.ns, "link", "set", &self.veth, "up"]));
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of the veth pair, and so the pair.
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}
