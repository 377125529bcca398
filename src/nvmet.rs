//! Export over NVMe-oF through the kernel's own target (`nvmet`), configured in configfs
//! (issue 19 item 3): `ftlblk export -n N --nvmet tcp:ADDR:PORT`, `ftlblk unexport -n N`,
//! and the exports `ftlblk list` shows. No network code of ours: the kernel serves
//! `/dev/ublkbN` as namespace 1 of an NVMe subsystem on a TCP port.
//!
//! Layout it builds under the configfs root (`/sys/kernel/config/nvmet`; a parameter,
//! so tests run on a directory):
//!
//! ```text
//! subsystems/<nqn>/attr_allow_any_host        1
//! subsystems/<nqn>/namespaces/1/device_path   /dev/ublkbN
//! subsystems/<nqn>/namespaces/1/enable        1
//! ports/<p>/addr_{trtype,adrfam,traddr,trsvcid}   tcp, ipv4|ipv6, ADDR, PORT
//! ports/<p>/subsystems/<nqn> -> ../../../subsystems/<nqn>
//! ```
//!
//! Teardown goes in the reverse order (link, port if unused, namespace disabled and
//! removed, subsystem). The NQN is `nqn.2026-11.io.ftlblk:<uuid of the FTL>`, the same
//! for a device across restarts. Used by `device_cmd` (export, unexport, list, del).

use crate::error::CliError;
use std::path::{Path, PathBuf};

/// Where configfs shows the NVMe target.
pub const CONFIGFS: &str = "/sys/kernel/config/nvmet";

/// The NQN ftlblk gives the subsystem of the FTL with `uuid`.
pub fn nqn_of(uuid: &str) -> String {
    format!("nqn.2026-11.io.ftlblk:{uuid}")
}

/// A transport address: `tcp:ADDR:PORT` (`[v6addr]` in brackets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub addr: String,
    pub port: u16,
    pub ipv6: bool,
}

impl std::str::FromStr for Endpoint {
    type Err = CliError;
    fn from_str(s: &str) -> Result<Self, CliError> {
        let bad = |why: &str| {
            CliError::BadArgs(format!(
                "--nvmet {s:?}: {why} (expected tcp:ADDR:PORT, e.g. tcp:127.0.0.1:4420)"
            ))
        };
        let rest = s
            .strip_prefix("tcp:")
            .ok_or_else(|| bad("only the tcp transport is supported"))?;
        let (addr, port) = rest.rsplit_once(':').ok_or_else(|| bad("no port"))?;
        let port: u16 = port.parse().map_err(|_| bad("the port is not a number"))?;
        let (addr, ipv6) = match addr.strip_prefix('[').and_then(|a| a.strip_suffix(']')) {
            Some(a) => (a, true),
            None => (addr, false),
        };
        let ip: std::net::IpAddr = addr
            .parse()
            .map_err(|_| bad("the address is not an IP address"))?;
        if ip.is_ipv6() != ipv6 {
            return Err(bad("write an IPv6 address in brackets"));
        }
        Ok(Endpoint {
            addr: addr.to_string(),
            port,
            ipv6,
        })
    }
}

/// One export found in configfs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Export {
    pub nqn: String,
    pub device: PathBuf,
    /// `tcp:ADDR:PORT` of each port the subsystem is linked to.
    pub ports: Vec<String>,
}

fn io(what: impl std::fmt::Display, p: &Path, e: std::io::Error) -> CliError {
    CliError::io(format!("{what} {}", p.display()), e)
}

fn write(p: &Path, v: &str) -> Result<(), CliError> {
    std::fs::write(p, v).map_err(|e| io("writing", p, e))
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The configfs tree of the NVMe target, loaded and mounted if it is not there yet.
pub fn ensure_target() -> Result<PathBuf, CliError> {
    let root = PathBuf::from(CONFIGFS);
    if !root.exists() {
        let _ = std::process::Command::new("modprobe")
            .args(["nvmet", "nvmet-tcp"])
            .status();
        if !Path::new("/sys/kernel/config/nvmet").exists()
            && !Path::new("/sys/kernel/config").join("nvmet").exists()
        {
            // configfs itself may be unmounted.
            let _ = std::process::Command::new("mount")
                .args(["-t", "configfs", "none", "/sys/kernel/config"])
                .status();
        }
    }
    if !root.exists() {
        return Err(CliError::Device(format!(
            "{CONFIGFS} missing: the kernel's NVMe target is not available; try `modprobe \
             nvmet nvmet-tcp` (and mount configfs on /sys/kernel/config)"
        )));
    }
    let _ = std::process::Command::new("modprobe")
        .arg("nvmet-tcp")
        .status();
    Ok(root)
}

/// The longest NQN the NVMe specification allows, in bytes.
const NQN_MAX: usize = 223;

/// A subsystem NQN as `--nqn` may give it: `nqn.` and at most 223 bytes of printable
/// characters without `/` (it names a configfs directory: `x/y` built a nested
/// directory no listing or `unexport` saw; found by review, 2026-11-29).
pub fn check_nqn(nqn: &str) -> Result<(), CliError> {
    let bad = |why: &str| {
        CliError::BadArgs(format!(
            "--nqn {nqn:?}: {why} (e.g. nqn.2014-08.org.example:disk1)"
        ))
    };
    if !nqn.starts_with("nqn.") {
        return Err(bad("an NQN starts with \"nqn.\""));
    }
    if nqn.len() > NQN_MAX {
        return Err(bad("longer than 223 bytes"));
    }
    if nqn
        .chars()
        .any(|c| c == '/' || c.is_whitespace() || c.is_control())
    {
        return Err(bad("no '/', spaces or control characters"));
    }
    Ok(())
}

/// What [`export`] created so far, undone in reverse order when a later step fails: a
/// failed export left its subsystem (without a device path: invisible to `list` and
/// `unexport`, and the next export failed on EEXIST) or the new port it made (found by
/// review, 2026-11-29). Only what this call made goes; a port other exports use stays.
#[derive(Default)]
struct Made {
    sub: Option<PathBuf>,
    ns: Option<PathBuf>,
    port: Option<PathBuf>,
    link: Option<PathBuf>,
}

impl Made {
    fn undo(self) {
        if let Some(l) = &self.link {
            let _ = std::fs::remove_file(l);
        }
        if let Some(p) = &self.port {
            let _ = remove_dir(p);
        }
        if let Some(ns) = &self.ns {
            let _ = write(&ns.join("enable"), "0");
            let _ = remove_dir(ns);
        }
        if let Some(sub) = &self.sub {
            let _ = remove_dir(sub);
        }
    }
}

// Test failpoints of [`export`]: the step named here fails; and a hook run with the new
// port's path just before it is created (another export taking that number meanwhile).
#[cfg(test)]
thread_local! {
    static FAIL_AT: std::cell::Cell<Option<&'static str>> = const { std::cell::Cell::new(None) };
    static BEFORE_PORT: std::cell::Cell<Option<fn(&Path)>> = const { std::cell::Cell::new(None) };
}

fn step(_name: &'static str) -> Result<(), CliError> {
    #[cfg(test)]
    if FAIL_AT.with(|f| f.get()) == Some(_name) {
        return Err(CliError::Device(format!("failpoint {_name}")));
    }
    Ok(())
}

/// Exports `device` as namespace 1 of subsystem `nqn` on `ep`, under `root`. On an error
/// nothing it created is left.
pub fn export(root: &Path, nqn: &str, device: &Path, ep: &Endpoint) -> Result<(), CliError> {
    check_nqn(nqn)?;
    if let Some(e) = exports(root).into_iter().find(|e| e.device == device) {
        return Err(CliError::Device(format!(
            "{} is already exported as {} on {}",
            device.display(),
            e.nqn,
            e.ports.join(", ")
        )));
    }
    let mut made = Made::default();
    let done = (|| {
        let sub = root.join("subsystems").join(nqn);
        std::fs::create_dir(&sub).map_err(|e| io("creating", &sub, e))?;
        made.sub = Some(sub.clone());
        write(&sub.join("attr_allow_any_host"), "1")?;
        let ns = sub.join("namespaces").join("1");
        std::fs::create_dir_all(&ns).map_err(|e| io("creating", &ns, e))?;
        made.ns = Some(ns.clone());
        step("device_path")?;
        write(&ns.join("device_path"), &device.display().to_string())?;
        step("enable")?;
        write(&ns.join("enable"), "1")?;
        let port = port_for(root, ep, &mut made)?;
        let links = port.join("subsystems");
        std::fs::create_dir_all(&links).map_err(|e| io("creating", &links, e))?;
        let link = links.join(nqn);
        step("link")?;
        std::os::unix::fs::symlink(&sub, &link).map_err(|e| io("linking", &link, e))?;
        made.link = Some(link);
        step("after link")
    })();
    if done.is_err() {
        made.undo();
    }
    done
}

/// The port directory serving `ep`: an existing one with the same address, or a new one
/// (noted in `made`).
fn port_for(root: &Path, ep: &Endpoint, made: &mut Made) -> Result<PathBuf, CliError> {
    let ports = root.join("ports");
    let mut used = Vec::new();
    if let Ok(rd) = std::fs::read_dir(&ports) {
        for d in rd.flatten() {
            let p = d.path();
            if let Some(n) = d.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) {
                used.push(n);
            }
            if read(&p.join("addr_trtype")) == "tcp"
                && read(&p.join("addr_traddr")) == ep.addr
                && read(&p.join("addr_trsvcid")) == ep.port.to_string()
            {
                return Ok(p);
            }
        }
    }
    // The lowest free number, created with create_dir: an export running beside this one
    // that picked the same number made it first, and this one takes the next (with
    // create_dir_all both used it, and the second's address overwrote the first's).
    let mut id = 1u32;
    let p = loop {
        if used.contains(&id) {
            id += 1;
            continue;
        }
        let p = ports.join(id.to_string());
        #[cfg(test)]
        if let Some(hook) = BEFORE_PORT.with(|h| h.take()) {
            hook(&p);
        }
        match std::fs::create_dir(&p) {
            Ok(()) => break p,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && id < u16::MAX as u32 => {
                id += 1
            }
            Err(e) => return Err(io("creating", &p, e)),
        }
    };
    made.port = Some(p.clone());
    step("port")?;
    write(&p.join("addr_trtype"), "tcp")?;
    write(
        &p.join("addr_adrfam"),
        if ep.ipv6 { "ipv6" } else { "ipv4" },
    )?;
    write(&p.join("addr_traddr"), &ep.addr)?;
    write(&p.join("addr_trsvcid"), &ep.port.to_string())?;
    Ok(p)
}

/// The subsystems under `root` with a namespace, the device each serves and its ports.
pub fn exports(root: &Path) -> Vec<Export> {
    let mut out = Vec::new();
    let Ok(subs) = std::fs::read_dir(root.join("subsystems")) else {
        return out;
    };
    for s in subs.flatten() {
        let nqn = s.file_name().to_string_lossy().to_string();
        let device = read(&s.path().join("namespaces").join("1").join("device_path"));
        if device.is_empty() {
            continue;
        }
        let mut ports = Vec::new();
        if let Ok(rd) = std::fs::read_dir(root.join("ports")) {
            for p in rd.flatten() {
                if p.path().join("subsystems").join(&nqn).exists() {
                    let a = read(&p.path().join("addr_traddr"));
                    let a = if read(&p.path().join("addr_adrfam")) == "ipv6" {
                        format!("[{a}]")
                    } else {
                        a
                    };
                    ports.push(format!(
                        "{}:{a}:{}",
                        read(&p.path().join("addr_trtype")),
                        read(&p.path().join("addr_trsvcid"))
                    ));
                }
            }
        }
        ports.sort();
        out.push(Export {
            nqn,
            device: device.into(),
            ports,
        });
    }
    out.sort_by(|a, b| a.nqn.cmp(&b.nqn));
    out
}

/// Removes every export of `device` under `root`; returns how many there were.
pub fn unexport(root: &Path, device: &Path) -> Result<usize, CliError> {
    let mine: Vec<Export> = exports(root)
        .into_iter()
        .filter(|e| e.device == device)
        .collect();
    for e in &mine {
        let sub = root.join("subsystems").join(&e.nqn);
        if let Ok(rd) = std::fs::read_dir(root.join("ports")) {
            for p in rd.flatten() {
                let link = p.path().join("subsystems").join(&e.nqn);
                if std::fs::symlink_metadata(&link).is_ok() {
                    std::fs::remove_file(&link).map_err(|x| io("unlinking", &link, x))?;
                    // A port no other subsystem uses goes too.
                    let others = std::fs::read_dir(p.path().join("subsystems"))
                        .map(|d| d.count())
                        .unwrap_or(0);
                    if others == 0 {
                        remove_dir(&p.path())?;
                    }
                }
            }
        }
        let ns = sub.join("namespaces").join("1");
        let _ = write(&ns.join("enable"), "0");
        remove_dir(&ns)?;
        remove_dir(&sub)?;
    }
    Ok(mine.len())
}

/// Removes a configfs directory (rmdir; on a plain directory, its files first).
fn remove_dir(p: &Path) -> Result<(), CliError> {
    match std::fs::remove_dir(p) {
        Ok(()) => Ok(()),
        // Not configfs (tests): its attribute files are ordinary files.
        Err(_) if !p.starts_with(CONFIGFS) => {
            std::fs::remove_dir_all(p).map_err(|e| io("removing", p, e))
        }
        Err(e) => Err(io("removing", p, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_and_bad_ones_say_why() {
        let ep: Endpoint = "tcp:127.0.0.1:4420".parse().unwrap();
        assert_eq!(
            (ep.addr.as_str(), ep.port, ep.ipv6),
            ("127.0.0.1", 4420, false)
        );
        let v6: Endpoint = "tcp:[::1]:4420".parse().unwrap();
        assert_eq!((v6.addr.as_str(), v6.ipv6), ("::1", true));
        for (s, want) in [
            ("rdma:1.2.3.4:4420", "tcp"),
            ("tcp:1.2.3.4", "port"),
            ("tcp:1.2.3.4:x", "port"),
            ("tcp:host:4420", "IP address"),
            ("tcp:::1:4420", "brackets"),
        ] {
            let e = s.parse::<Endpoint>().unwrap_err().to_string();
            assert!(e.contains(want), "{s}: {e}");
        }
    }

    #[test]
    fn export_list_and_unexport_on_a_tree() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("subsystems")).unwrap();
        std::fs::create_dir_all(root.join("ports")).unwrap();
        let ep: Endpoint = "tcp:127.0.0.1:4420".parse().unwrap();
        let (a, b) = (Path::new("/dev/ublkb0"), Path::new("/dev/ublkb1"));
        export(root, &nqn_of("aaa"), a, &ep).unwrap();
        export(root, &nqn_of("bbb"), b, &ep).unwrap();
        assert!(
            export(root, &nqn_of("ccc"), a, &ep).is_err(),
            "exported twice"
        );
        let ex = exports(root);
        assert_eq!(ex.len(), 2);
        assert_eq!(ex[0].device, a);
        assert_eq!(ex[0].ports, vec!["tcp:127.0.0.1:4420".to_string()]);
        assert_eq!(read(&root.join("ports/1/addr_adrfam")), "ipv4");
        assert!(
            !root.join("ports/2").exists(),
            "the same address shares one port"
        );
        assert_eq!(
            read(&root.join(format!("subsystems/{}/namespaces/1/enable", nqn_of("aaa")))),
            "1"
        );
        assert_eq!(unexport(root, a).unwrap(), 1);
        assert!(
            root.join("ports/1").exists(),
            "still used by the other export"
        );
        assert_eq!(exports(root).len(), 1);
        assert_eq!(unexport(root, b).unwrap(), 1);
        assert!(!root.join("ports/1").exists(), "an unused port goes");
        assert!(exports(root).is_empty());
        assert_eq!(unexport(root, b).unwrap(), 0);
    }

    /// Every file and directory under `root`, for comparing trees.
    fn tree(root: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut todo = vec![root.to_path_buf()];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                out.push(p.strip_prefix(root).unwrap().display().to_string());
                if e.file_type().unwrap().is_dir() {
                    todo.push(p);
                }
            }
        }
        out.sort();
        out
    }

    /// An export that fails at any step leaves nothing it made: not its subsystem, not
    /// the port it created; a port another export uses stays.
    #[test]
    fn a_failed_export_leaves_nothing_it_made() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("subsystems")).unwrap();
        std::fs::create_dir_all(root.join("ports")).unwrap();
        let shared: Endpoint = "tcp:127.0.0.1:4420".parse().unwrap();
        let other: Endpoint = "tcp:127.0.0.2:4421".parse().unwrap();
        export(root, &nqn_of("aaa"), Path::new("/dev/ublkb0"), &shared).unwrap();
        let before = tree(root);
        for ep in [&shared, &other] {
            for at in ["device_path", "enable", "port", "link", "after link"] {
                if at == "port" && ep == &shared {
                    continue; // an existing port is not created
                }
                FAIL_AT.with(|f| f.set(Some(at)));
                let r = export(root, &nqn_of("bbb"), Path::new("/dev/ublkb1"), ep);
                FAIL_AT.with(|f| f.set(None));
                assert!(r.is_err(), "{at}");
                assert_eq!(tree(root), before, "failed at {at} on {ep:?}");
            }
        }
        // And it works afterwards (no subsystem left to collide with).
        export(root, &nqn_of("bbb"), Path::new("/dev/ublkb1"), &other).unwrap();
        assert_eq!(exports(root).len(), 2);
    }

    /// A port number another export took between this one's listing and its create is
    /// not shared: the next number is used, and the other's address is left.
    #[test]
    fn a_port_number_taken_meanwhile_is_not_shared() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("ports")).unwrap();
        let ep: Endpoint = "tcp:127.0.0.3:4420".parse().unwrap();
        BEFORE_PORT.with(|h| {
            h.set(Some(|p: &Path| {
                std::fs::create_dir(p).unwrap();
                std::fs::write(p.join("addr_traddr"), "10.0.0.1").unwrap();
            }))
        });
        let mut made = Made::default();
        let p = port_for(root, &ep, &mut made).unwrap();
        assert_eq!(p, root.join("ports/2"));
        assert_eq!(read(&root.join("ports/1/addr_traddr")), "10.0.0.1");
        assert_eq!(read(&root.join("ports/2/addr_traddr")), "127.0.0.3");
    }

    #[test]
    fn nqns_are_checked() {
        check_nqn(&nqn_of("0b3c")).unwrap();
        for (bad, why) in [
            ("x/y", "nqn."),
            ("nqn.2014-08.org.example:a/b", "'/'"),
            ("nqn.2014-08.org.example:a b", "spaces"),
        ] {
            let e = check_nqn(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let long = format!("nqn.{}", "a".repeat(220));
        assert!(check_nqn(&long).unwrap_err().to_string().contains("223"));
    }
}
