//! `pico serve` and its signals: the first starts a graceful shutdown, a second one ends the
//! process at once (the real binary, on free ports, state in a temp dir).

#![cfg(unix)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PICO: &str = env!("CARGO_BIN_EXE_pico");
/// Generous: nothing here waits on purpose, but the machine may be busy.
const PATIENCE: Duration = Duration::from_secs(60);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Sends `request` and reads until the end of the response headers (or of the connection).
fn exchange(port: u16, request: &str) -> (TcpStream, String) {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(PATIENCE)).unwrap();
    c.write_all(request.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && c.read(&mut byte).unwrap() == 1 {
        head.push(byte[0]);
    }
    (c, String::from_utf8_lossy(&head).into_owned())
}

fn log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn signal(child: &Child, name: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{name} failed");
}

/// Waits for `done` (checked every 50 ms) up to [`PATIENCE`].
fn wait_for(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// `pico serve` on free ports with its state in `dir` (the protocol port and the admin port).
fn spawn_serve(
    dir: &Path,
    extra: &[&str],
    rust_log: &str,
    stdout: Stdio,
    stderr: Stdio,
) -> (Child, u16, u16) {
    let (port, admin) = (free_port(), free_port());
    let mut cmd = Command::new(PICO);
    for (k, _) in std::env::vars() {
        if k.starts_with("PICO_") {
            cmd.env_remove(k);
        }
    }
    let child = cmd
        .arg("serve")
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
        .args(["--meta-url", &format!("sqlite:{}/meta.db", dir.display())])
        .arg(format!("--storage=-2@file://{}/objects", dir.display()))
        .arg("--no-kafka")
        .args(extra)
        .env("RUST_LOG", rust_log)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap();
    (child, port, admin)
}

/// Waits until the admin listener's `/ready` answers 200.
fn wait_ready(admin: u16) -> bool {
    wait_for(|| {
        TcpStream::connect(("127.0.0.1", admin)).is_ok_and(|mut c| {
            c.set_read_timeout(Some(PATIENCE)).unwrap();
            let _ = c.write_all(b"GET /ready HTTP/1.0\r\n\r\n");
            let mut out = String::new();
            let _ = c.read_to_string(&mut out);
            out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200")
        })
    })
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_second_signal_ends_a_graceful_shutdown_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("server.log");
    let out = std::fs::File::create(&log_path).unwrap();
    // The open SSE response below holds the graceful shutdown for this long.
    let (child, port, admin) = spawn_serve(
        dir.path(),
        &[
            "--shutdown-drain-sec",
            "600",
            "--sse-max-duration-sec",
            "600",
        ],
        "info",
        Stdio::null(),
        out.into(),
    );
    let mut server = Killed(child);
    assert!(
        wait_ready(admin),
        "pico serve never became ready; log:\n{}",
        log(&log_path)
    );

    let (_, created) = exchange(
        port,
        "PUT /s/sig HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert!(created.starts_with("HTTP/1.1 201"), "{created}");
    // An SSE response in flight: the graceful shutdown waits for it.
    let (_sse, head) = exchange(
        port,
        "GET /s/sig?seq=0&live=sse HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    signal(&server.0, "TERM");
    assert!(
        wait_for(|| log(&log_path).contains("SIGTERM received, shutting down")),
        "the SIGTERM was not taken up; log:\n{}",
        log(&log_path)
    );
    let waiting = server.0.try_wait().unwrap();
    assert!(
        waiting.is_none(),
        "the shutdown did not wait for the open response ({waiting:?}), so this test shows \
         nothing; log:\n{}",
        log(&log_path)
    );

    signal(&server.0, "INT");
    let mut status = None;
    wait_for(|| {
        status = server.0.try_wait().unwrap();
        status.is_some()
    });
    let log = log(&log_path);
    let status =
        status.unwrap_or_else(|| panic!("still running after a second signal; log:\n{log}"));
    // 128 + SIGINT, as a shell reports a process ended by Ctrl-C.
    assert_eq!(status.code(), Some(130), "log:\n{log}");
    assert!(
        log.contains("acknowledged appends are safe in the WAL"),
        "{log}"
    );
}

/// A log that cannot be written (stdout and stderr on `/dev/full`, as when the disk under the
/// log file fills) costs the log lines, never the node: it starts, serves, logs at debug on
/// every request, fails requests (a 404, a 409) and shuts down cleanly. Before, the first log
/// line panicked (`eprintln!` in tracing's fallback), and a panic in the metadata committer
/// then panicked again in a destructor: SIGABRT.
#[test]
fn a_log_on_a_full_device_does_not_stop_the_node() {
    let full = Path::new("/dev/full");
    if !full.exists() {
        // Linux has it; CI runs Linux.
        eprintln!("SKIPPED: no /dev/full here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let open = || -> Stdio {
        std::fs::OpenOptions::new()
            .write(true)
            .open(full)
            .unwrap()
            .into()
    };
    let (child, port, admin) = spawn_serve(dir.path(), &[], "debug", open(), open());
    let mut server = Killed(child);
    assert!(wait_ready(admin), "pico serve never became ready");
    // One request on its own connection: the response head.
    let request = |method: &str, path: &str, body: &str| {
        exchange(
            port,
            &format!(
                "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            ),
        )
        .1
    };
    for i in 0..20 {
        let created = request("PUT", &format!("/s/full{i}"), "");
        assert!(created.starts_with("HTTP/1.1 201"), "{created}");
        let appended = request("POST", &format!("/s/full{i}"), "hello");
        assert!(appended.starts_with("HTTP/1.1 20"), "{appended}");
        let missing = request("GET", "/s/nothing-here?seq=0", "");
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    }
    assert!(
        server.0.try_wait().unwrap().is_none(),
        "the node died with its log unwritable"
    );
    signal(&server.0, "TERM");
    let mut status = None;
    wait_for(|| {
        status = server.0.try_wait().unwrap();
        status.is_some()
    });
    let status = status.expect("still running long after a SIGTERM");
    assert!(status.success(), "{status:?}");
}
